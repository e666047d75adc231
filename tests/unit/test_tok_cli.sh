#!/usr/bin/env bash
# `tandem tokenize`: ids for reference strings equal HF's (tests/data/tokenizer/expected_ids_*),
# --bos adds DeepSeek's BOS, bad arguments / files / input exit 2 with one line naming the problem.
set -u
BUILD=${BUILD:-build}
T=$BUILD/tandem
D=tests/data
fail=0
check() { # what, got, want
	if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2' want '$3'"; fail=1; else echo "ok   $1"; fi
}
expected() { # file, case id -> "[a, b, c]" as printed by tandem tokenize
	grep -o "{\"id\":$2,\"ids\":\[[0-9,]*\]" "$1" | sed 's/.*"ids":\[\(.*\)\]/[\1]/; s/,/, /g'
}
# case 1 "Hello world", case 6 the quick brown fox, case 298 literal special tokens
check "tiny-glm case 1" "$(printf 'Hello world' | $T tokenize -m $D/models/glm-dsa-tiny-BF16.gguf)" \
	"$(expected $D/tokenizer/expected_ids_tiny-glm.json 1)"
check "tiny-ds case 6" "$(printf 'The quick brown fox jumps over the lazy dog.' | $T tokenize -m $D/models/deepseek2-tiny-BF16.gguf)" \
	"$(expected $D/tokenizer/expected_ids_tiny-ds.json 6)"
check "deepseek-v3 case 298" "$(printf '<|user|>hi<|assistant|>' | $T tokenize -m $D/tokenizer/deepseek-v3-vocab.gguf)" \
	"$(expected $D/tokenizer/expected_ids_deepseek-v3.json 298)"
want_bos="$(expected $D/tokenizer/expected_ids_deepseek-v3.json 1 | sed 's/^\[/[0, /')"
check "deepseek-v3 --bos" "$(printf 'Hello world' | $T tokenize -m $D/tokenizer/deepseek-v3-vocab.gguf --bos)" "$want_bos"
check "--bos with BOS text: one BOS" "$(printf '<｜begin▁of▁sentence｜>Hello world' | $T tokenize -m $D/tokenizer/deepseek-v3-vocab.gguf --bos)" "$want_bos"
check "empty input" "$(printf '' | $T tokenize -m $D/models/glm-dsa-tiny-BF16.gguf)" "[]"

# --chat: MODEL-SPEC §6.1 example, rendered with a configured format; DeepSeek-V3's own template
msgs='[{"role":"system","content":"You are a helpful assistant"},{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi there"},{"role":"user","content":"How are you?"}]'
check "chat glm5 render" "$(printf '%s' "$msgs" | $T tokenize -m $D/models/glm-dsa-tiny-BF16.gguf --chat --format glm5 --render)" \
	'[gMASK]<sop><|system|>You are a helpful assistant<|user|>Hello<|assistant|></think>Hi there<|user|>How are you?<|assistant|><think>'
check "chat glm5 thinking off" "$(printf '%s' "$msgs" | $T tokenize -m $D/models/glm-dsa-tiny-BF16.gguf --chat --format glm5 --think off --render)" \
	'[gMASK]<sop><|system|>You are a helpful assistant<|user|>Hello<|assistant|></think>Hi there<|user|>How are you?<|assistant|></think>'
check "chat deepseek-v3 render" "$(printf '%s' "$msgs" | $T tokenize -m $D/tokenizer/deepseek-v3-vocab.gguf --chat --render)" \
	'<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>How are you?<｜Assistant｜>'
ids=$(printf '%s' "$msgs" | $T tokenize -m $D/tokenizer/deepseek-v3-vocab.gguf --chat)
check "chat deepseek-v3 ids start with one BOS" "$(printf '%s' "$ids" | grep -o '^\[0, ' ; printf '%s' "$ids" | grep -o '[[ ]0,' | wc -l)" '[0, 
1'

bad() { # what, stdin, args...
	local what=$1 in=$2; shift 2
	local err rc
	err=$(printf "$in" | $T tokenize "$@" 2>&1 >/dev/null); rc=$?
	if [ $rc -ne 2 ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [ -z "$err" ]; then
		echo "FAIL $what: rc $rc, stderr '$err'"; fail=1
	else
		echo "ok   $what: $err"
	fi
}
bad "no model" "x"
bad "missing file" "x" -m /nonexistent.gguf
bad "not a gguf" "x" -m README.md
bad "unknown option" "x" -m $D/models/glm-dsa-tiny-BF16.gguf --frobnicate
bad "invalid utf-8" '\xff\xfe' -m $D/models/glm-dsa-tiny-BF16.gguf
bad "chat: not json" 'hello' -m $D/models/glm-dsa-tiny-BF16.gguf --chat
bad "chat: bad role" '[{"role":"wizard","content":"x"}]' -m $D/models/glm-dsa-tiny-BF16.gguf --chat
bad "chat: no template" '[{"role":"user","content":"x"}]' -m $D/models/deepseek2-tiny-BF16.gguf --chat
bad "chat: unknown format" '[{"role":"user","content":"x"}]' -m $D/models/glm-dsa-tiny-BF16.gguf --chat --format llama3
bad "render without chat" 'x' -m $D/models/glm-dsa-tiny-BF16.gguf --render
exit $fail
