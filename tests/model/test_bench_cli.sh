#!/usr/bin/env bash
# `tandem bench` decode without a prefill (--kv-fill random), packed prompts (--pack) and the issue-4
# matrix (--matrix) on the CPU backend with glm-dsa-tiny-Q8_0 (the CUDA rows are the same code with
# device memory).
# Expected numbers are derived from tests/data/models/glm-dsa-tiny.config.json, not from a run:
# KV read per sequence and step (bf16) = 2 B x (3 layers x min(top-k 16, ctx) x (kv_lora 256 +
# rope 32) + 2 full indexer layers x ctx x index_head_dim 64): ctx 400 -> 130048 B; batch 4 ->
# 0.52 MB, printed "0.5". Weights per step at batch 1 must equal the plain bench's figure (two
# independent sums over the tensor table).
set -u
BUILD=${BUILD:-build}
T=$BUILD/tandem
M=tests/data/models/glm-dsa-tiny-Q8_0.gguf
fail=0
check() { # what, got, want
	if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2' want '$3'"; fail=1; else echo "ok   $1"; fi
}

out=$($T bench -m $M --kv-fill random --ctx 300 --gen 4 --batch 2 --threads 1 --reps 1 2>&1)
check "kv-fill: no prefill line" "$(echo "$out" | grep -c '^prefill  none: KV random-filled to position 300')" 1
check "kv-fill: decode ran" "$(echo "$out" | awk '/^decode/ { print ($4 > 0) }')" 1
w1=$(echo "$out" | awk '/^decode/ { print $8 }')

mx=$($T bench -m $M --matrix --matrix-batch 1,4 --matrix-ctx 128,400 --matrix-prefill 256 --gen 3 --threads 1 2>&1)
echo "$mx"
check "matrix: 4 cells" "$(echo "$mx" | awk '$1 ~ /^[0-9]+$/ && NF == 9' | wc -l)" 4
check "matrix: batch 4 ctx 400 KV MB" "$(echo "$mx" | awk '$1 == 4 && $2 == 400 { print $7 }')" 0.5
check "matrix: batch 1 weights MB = plain bench" "$(echo "$mx" | awk '$1 == 1 && $2 == 128 { print $6 }')" "$(printf '%.1f' "$w1" 2>/dev/null)"
check "matrix: prefill line" "$(echo "$mx" | grep -c '^prefill  256 tokens (ubatch 256)')" 1

# --pack: 4 prompts of 48 back to back in steps of <= 128 rows -> 2 steps (128 + 64: the first holds
# sequences 0-2, the second the end of 2 and all of 3); without it one sequence a step -> 4
pk=$($T bench -m $M --batch 4 --prompt 48 --ubatch 128 --pack --gen 2 --threads 1 --reps 1 2>&1)
check "pack: 2 steps" "$(echo "$pk" | grep -c '^prefill .*(2 steps of <= 128 tokens, prompts packed)')" 1
check "pack: decode ran" "$(echo "$pk" | awk '/^decode/ { print ($4 > 0) }')" 1
up=$($T bench -m $M --batch 4 --prompt 48 --ubatch 128 --gen 2 --threads 1 --reps 1 2>&1)
check "no pack: 4 steps" "$(echo "$up" | grep -c '^prefill .*(4 steps of <= 48 tokens, one sequence a step)')" 1
pj=$($T bench -m $M --batch 3 --prompt 40 --pack --gen 1 --threads 1 --reps 1 --json 2>/dev/null)
check "pack: json, ubatch = all prompts" "$(echo "$pj" | grep -c '"pack":1,"prefill_steps":1,')" 1
$T bench -m $M --pack --kv-fill random >/dev/null 2>&1
check "--pack with --kv-fill exits 2" "$?" 2
$T bench -m $M --kv-fill zeros >/dev/null 2>&1
check "bad --kv-fill exits 2" "$?" 2
$T bench -m $M --profile >/dev/null 2>&1
check "--profile without cuda exits 2" "$?" 2
$T bench -m $M --matrix --matrix-batch 1,x >/dev/null 2>&1
check "bad --matrix-batch exits 2" "$?" 2
exit $fail
