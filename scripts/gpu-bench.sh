#!/bin/sh
# The issue-4 bench matrix on one GPU from binaries built elsewhere (builds nothing here):
#   scripts/gpu-bench.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR holds tandem, test_ops_moe, test_ops_head_gemv and lib/ (the shared libraries the device
# lacks); default .carry-backend. Runs, each under its own timeout (a missing test binary is skipped):
#   1. test_ops_moe (the sorted batched-decode MoE path against the CPU and the pair kernels) and
#      test_ops_head_gemv (the one-launch k_b / v_b products against the CPU);
#   2. synthetic GLM-5, rank 0 of TP=8: decode batch 1/8/32/128 x context 4k/32k (KV random-filled,
#      bf16; cells that do not fit are skipped with the bytes), eager vs graphs, read rate vs the
#      copy rate, an 8k prefill vs the bf16 tensor-core rate, then the per-op profile of every cell;
#   3. the same matrix for synthetic DeepSeek-V3 (rank 0 of TP=8), without the profile.
# Logs to OUT_DIR/gpu-bench.log (and one file per step). About 90 s on an H200.
set -u
B=${1:-.carry-backend}
O=${2:-${OUT:-/tmp}}
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$O"
L="$O/gpu-bench.log"
date -u | tee "$L"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv 2>&1 | tee -a "$L"
step() { # name, timeout, command...
	n=$1 t=$2
	shift 2
	echo "== $n: $*" | tee -a "$L"
	s=$(date +%s)
	timeout "$t" "$@" >"$O/$n.log" 2>&1
	rc=$?
	cat "$O/$n.log" >>"$L"
	tail -n 80 "$O/$n.log"
	echo "$n rc=$rc ($(($(date +%s) - s)) s)" | tee -a "$L"
}
for t in test_ops_moe test_ops_head_gemv; do
	if [ -x "$B/$t" ]; then step $t 60 "$B/$t"; else echo "$t: not in $B, skipped" | tee -a "$L"; fi
done
step glm5_matrix 240 "$B/tandem" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda --matrix --gen 8 --profile
step ds3_matrix 180 "$B/tandem" bench --synthetic deepseek3 --tp 8 --rank 0 --backend cuda --matrix --gen 8
date -u | tee -a "$L"
