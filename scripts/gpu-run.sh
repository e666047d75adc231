#!/usr/bin/env bash
# Runs the CUDA op tests and benchmarks on a GPU machine from a staged folder (scripts/gpu-stage.sh
# copies the binaries and this script into .carry/), builds nothing there. Logs go to $OUT (or
# ./out). Usage: gpu-run.sh [quick|full] [test|memcheck|bench ...]   (default: all three stages)
set -u
cd "$(dirname "$0")"
MODE=${1:-full}
shift || true
STAGES=${*:-test memcheck bench}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# cuBLAS is not carried (too large): find the machine's own if the loader does not
if ldd ./test_ops_matmul | grep -q 'libcublas.*not found'; then
	d=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
	export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
	echo "cuBLAS from $d"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
ldd ./test_ops_matmul | grep -E 'not found|cublas' || true
summary=()
for st in $STAGES; do
	case $st in
	test)
		for t in ./test_ops_*; do
			n=$(basename "$t")
			t0=$SECONDS
			if [ "$MODE" = quick ]; then TANDEM_OPS_QUICK=1 timeout 300 "$t" >"$OUT/$n.log" 2>&1; else timeout 300 "$t" >"$OUT/$n.log" 2>&1; fi
			rc=$?
			summary+=("$n rc=$rc $((SECONDS - t0))s: $(tail -n 1 "$OUT/$n.log")")
			grep -E '^FAIL|^  ' "$OUT/$n.log" | head -20
		done ;;
	memcheck)
		for t in ./test_ops_*; do
			n=$(basename "$t")
			t0=$SECONDS
			TANDEM_OPS_QUICK=1 timeout 300 compute-sanitizer --tool memcheck --leak-check full "$t" >"$OUT/memcheck.$n.log" 2>&1
			rc=$?
			summary+=("memcheck $n rc=$rc $((SECONDS - t0))s: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.$n.log" | tail -n 1)")
		done ;;
	bench)
		for b in ./bench_cuda_*; do
			n=$(basename "$b")
			t0=$SECONDS
			timeout 400 "$b" $([ "$MODE" = quick ] && echo quick) >"$OUT/$n.log" 2>&1
			summary+=("$n rc=$? $((SECONDS - t0))s")
		done ;;
	esac
done
for b in "$OUT"/bench_cuda_*.log; do [ -f "$b" ] && sed -n '/==== summary/,$p' "$b"; done
echo "==== stages ===="
printf '%s\n' "${summary[@]}"
