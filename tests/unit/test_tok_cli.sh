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
check "empty input" "$(printf '' | $T tokenize -m $D/models/glm-dsa-tiny-BF16.gguf)" "[]"

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
exit $fail
