#!/usr/bin/env bash
# One GPU session's checks and timings, most important first, from binaries staged by
# scripts/gpu-stage-all.sh (builds nothing). Every step has its own timeout and the whole run a
# budget (BUDGET seconds, default 300): a step that would start past it is skipped and listed.
# Logs go to $OUT/logs.tar.gz, the table of steps to $OUT/summary.txt (and stdout, last).
#   bash .carry-all/gpu-all.sh .carry-all        (run from the repository root)
set -u
C=${1:-.carry-all}
O=${OUT:-/tmp/gpu-out}
BUDGET=${BUDGET:-300}
L=/tmp/gpu-logs
rm -rf "$L" && mkdir -p "$L" "$O"
mkdir -p "$C/b" && tar -C "$C/b" -xJf "$C/bins.tar.xz"
B=$C/b
export LD_LIBRARY_PATH="$PWD/$C/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$B/tandem" | grep -q 'libcublas.*not found'; then
	d=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
	export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
export NCCL_NVLS_ENABLE=0
# TP over GPUs dlopens libnccl.so.2: point at it when the loader's cache does not know it
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
	n=$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
	[ -n "$n" ] && export TANDEM_NCCL_LIB=$n
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
T0=$SECONDS
SUMMARY=()

# step NAME LIMIT CMD...: runs CMD with its output in $L/NAME.log, records rc, time and last line
step() {
	local name=$1 limit=$2
	shift 2
	local left=$((BUDGET - (SECONDS - T0)))
	if [ "$left" -lt 8 ]; then
		SUMMARY+=("$(printf '%-34s SKIPPED (run budget spent)' "$name")")
		return
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	local t=$SECONDS
	echo "== $name (limit ${limit}s)"
	timeout -k 3 "$limit" "$@" >"$L/$name.log" 2>&1
	local rc=$?
	SUMMARY+=("$(printf '%-34s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - t)) "$(tail -n 1 "$L/$name.log" | cut -c1-110)")")
}
# gpu2 NAME LIMIT CMD...: a step that needs two GPUs
gpu2() {
	if [ "$NGPU" -ge 2 ]; then step "$@"; else SUMMARY+=("$(printf '%-34s SKIPPED (%d GPU)' "$1" "$NGPU")"); fi
}

{
	date -u
	nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
	nvidia-smi topo -m 2>/dev/null
} >"$L/machine.log" 2>&1
cat "$L/machine.log"

# ---- correctness first ----
step test_gpu_model 60 "$B/tests/test_gpu_model"
for t in mla indexer; do
	[ -x "$B/tests/test_ops_$t" ] && step "test_ops_$t" 60 "$B/tests/test_ops_$t"
done
gpu2 test_gpu_tp 60 "$B/tests/test_gpu_tp"
[ -x "$B/tests/test_gpu_workers" ] && step test_gpu_workers 60 "$B/tests/test_gpu_workers"
[ -f tests/e2e/test_gpu_workers.sh ] && step test_gpu_workers_sh 90 env BUILD="$B" TANDEM_GPU_TESTS=1 bash tests/e2e/test_gpu_workers.sh
for t in moe matmul rowops sample; do
	[ -x "$B/tests/test_ops_$t" ] && step "test_ops_$t" 40 env TANDEM_OPS_QUICK=1 "$B/tests/test_ops_$t"
done

# ---- timings ----
if [ -f scripts/gpu-bench.sh ]; then
	step gpu_bench 120 env TANDEM="$B/tandem" bash scripts/gpu-bench.sh
else
	step synth_glm5_b1 60 "$B/tandem" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda --ctx 4096 \
		--gen 16 --batch 1 --ubatch 512 --reps 2 --threads 8
fi
[ -x "$B/bench/bench_cuda_attn" ] && step bench_cuda_attn 40 "$B/bench/bench_cuda_attn" 20
gpu2 bench_cuda_allreduce 40 "$B/bench/bench_cuda_allreduce"
gpu2 synth_glm5_tp2 60 "$B/tandem" bench --synthetic glm5 --layers 8 --dense 1 --tp 2 --backend cuda \
	--ctx 4096 --gen 16 --batch 1 --ubatch 512 --reps 2 --threads 8
step anchor_glm5_4l_tp1 40 "$B/tandem" bench --synthetic glm5 --layers 4 --dense 1 --type q4_k --backend cuda \
	--prompt 512 --gen 64 --batch 1 --reps 3 --threads 8
[ -x "$B/bench/bench_cuda_gemv_mma" ] && step bench_cuda_gemv_mma 40 "$B/bench/bench_cuda_gemv_mma"
step synth_ds3_b1 60 "$B/tandem" bench --synthetic deepseek3 --tp 8 --rank 0 --backend cuda --ctx 4096 \
	--gen 16 --batch 1 --ubatch 512 --reps 2 --threads 8
if command -v compute-sanitizer >/dev/null; then
	for t in mla indexer; do
		[ -x "$B/tests/test_ops_$t" ] && step "memcheck_$t" 60 env TANDEM_OPS_QUICK=1 \
			compute-sanitizer --tool memcheck "$B/tests/test_ops_$t"
	done
fi

{
	echo "==== gpu-all.sh: $NGPU GPU(s), $((SECONDS - T0)) s of a ${BUDGET} s budget"
	printf '%s\n' "${SUMMARY[@]}"
} | tee "$O/summary.txt"
tar -C "$L" -czf "$O/logs.tar.gz" .
