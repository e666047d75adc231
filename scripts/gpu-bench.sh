#!/usr/bin/env bash
# The issue-4 bench matrix on one GPU from binaries built elsewhere (builds nothing here):
#   scripts/gpu-bench.sh [BIN_DIR] [OUT_DIR]          (BIN_DIR default .carry-backend)
#   TANDEM=path/to/tandem bash scripts/gpu-bench.sh     (as scripts/gpu-all.sh calls it; the test
#                                                       binaries are then looked for in its tests/)
# Runs, each under its own timeout (about 100 s in all on an H200; a missing binary is skipped):
#   1. test_ops_head_gemv: the one-launch k_b / v_b products against the CPU (test_ops_moe, which
#      checks the sorted batched-decode MoE path, is run by gpu-all.sh; here when given BIN_DIR);
#   2. synthetic GLM-5, rank 0 of TP=8: decode batch 1/8/32/128 x context 4k/32k (KV random-filled,
#      bf16; cells that do not fit are skipped with the bytes), eager vs graphs, weight+KV read rate
#      vs the copy rate, an 8k prefill vs the bf16 tensor-core rate, then the per-op profile
#      (eager, events around every op) of every cell;
#   3. the same matrix for synthetic DeepSeek-V3 (rank 0 of TP=8) with a 2k prefill (its attention
#      is dense: an 8k one is mostly the MLA prefill kernel), without the profile;
#   4. GLM-5 batch 1 at 4k once more, profiled in graph replay (event nodes captured into the
#      graph: per-op times without host launch gaps).
# Logs to OUT_DIR/gpu-bench.log and one file per step.
set -u
B=${1:-.carry-backend}
O=${2:-${OUT:-/tmp}}
T=${TANDEM:-$B/tandem}
TD=$B
[ -n "${TANDEM:-}" ] && TD=$(dirname "$TANDEM")/tests
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$O"
L="$O/gpu-bench.log"
date -u | tee "$L"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv 2>&1 | tee -a "$L"
step() { # name, timeout, command...
	local n=$1 t=$2
	shift 2
	echo "== $n: $*" | tee -a "$L"
	local s=$SECONDS
	timeout -k 3 "$t" "$@" >"$O/$n.log" 2>&1
	local rc=$?
	cat "$O/$n.log" >>"$L"
	tail -n 60 "$O/$n.log"
	echo "$n rc=$rc ($((SECONDS - s)) s)" | tee -a "$L"
}
for t in test_ops_head_gemv test_ops_moe; do
	[ -n "${TANDEM:-}" ] && continue # gpu-all.sh runs both op tests itself
	if [ -x "$TD/$t" ]; then step $t 20 env TANDEM_OPS_QUICK=1 "$TD/$t"; else echo "$t: not in $TD, skipped" | tee -a "$L"; fi
done
step glm5_matrix 60 "$T" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda --matrix --gen 6 --profile
step ds3_matrix 30 "$T" bench --synthetic deepseek3 --tp 8 --rank 0 --backend cuda --matrix --gen 4 \
	--matrix-prefill 2048
step glm5_graph_profile 20 "$T" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda --kv-fill random \
	--ctx 4096 --gen 12 --batch 1 --reps 1 --profile-graphs
# fused small ops (issue #4) against the parts one by one: graph ms/step and nodes per step, batch 1
for f in 1 0; do
	step glm5_b1_fuse$f 20 env TANDEM_FUSE=$f "$T" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda \
		--kv-fill random --ctx 4096 --gen 12 --batch 1 --reps 1
done
date -u | tee -a "$L"
