#!/usr/bin/env bash
# Runs every test stage this machine can run, each test in its own process with a timeout, and
# prints a loud SKIP for the stages it cannot (GPU tests without a GPU). Last line:
# "N passed, N failed, N skipped".
#   tests/run.sh          all CPU stages (unit, model, e2e); GPU stages SKIP unless a GPU is present
#   tests/run.sh gpu      only the GPU stages (ops tests, GPU model tests)
set -u
BUILD=${BUILD:-build}
MODE=${1:-all}
TIMEOUT=${TEST_TIMEOUT:-600}
pass=0 fail=0 skip=0
failed=()
logdir="$BUILD/test-logs"
mkdir -p "$logdir"

have_gpu=0
if [ "${CUDA:-0}" = 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
	have_gpu=1
fi

run_one() { # name, command...
	local name=$1; shift
	local log="$logdir/$name.log"
	local t0=$SECONDS
	timeout -k 10 "$TIMEOUT" "$@" >"$log" 2>&1
	local rc=$?
	if [ $rc -eq 0 ]; then
		pass=$((pass + 1)); printf 'PASS  %-40s %4ds\n' "$name" $((SECONDS - t0))
	elif [ $rc -eq 77 ]; then # the test says it cannot run here (e.g. a 2-GPU test on one GPU)
		skip=$((skip + 1)); printf 'SKIP  %-40s *** %s ***\n' "$name" "$(grep -m1 SKIP "$log")"
	else
		fail=$((fail + 1)); failed+=("$name")
		printf 'FAIL  %-40s %4ds (exit %d; log %s)\n' "$name" $((SECONDS - t0)) $rc "$log"
		tail -n 30 "$log" | sed 's/^/      | /'
	fi
}

is_gpu_test() { case "$1" in test_cuda_*|test_ops_*|test_gpu_*) return 0;; esac; return 1; }

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	name=$(basename "$t")
	if is_gpu_test "$name"; then
		if [ $have_gpu = 1 ]; then
			run_one "$name" "$t"
			# the paths an sm_120 GPU (RTX PRO 6000: 99 KB of shared memory a block) takes, on this one
			[ "$name" = test_gpu_model ] && run_one "${name}_smem99k" env TANDEM_CUDA_SMEM_CAP=101376 "$t"
		else skip=$((skip + 1)); echo "SKIP  $name  *** GPU test: no GPU here (run 'make test-gpu' on a GPU machine) ***"; fi
	elif [ "$MODE" != gpu ]; then
		run_one "$name" "$t"
	fi
done

if [ "$MODE" != gpu ]; then
	for s in tests/unit/test_*.sh tests/model/test_*.sh tests/e2e/test_*.sh; do
		[ -f "$s" ] || continue
		n=$(basename "$s" .sh)
		if [ -x "$BUILD/tests/$n" ]; then n="$n.sh"; fi # a binary of the same name has its own log
		run_one "$n" env BUILD="$BUILD" bash "$s"
	done
fi

echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
