#!/usr/bin/env bash
# Runs the tensor-core GEMV experiment (bench/bench_cuda_gemv_mma.cu) on a GPU machine from binaries
# built on the host; builds nothing there. Two roles:
#   scripts/gpu-gemv-mma.sh stage [DEST]   on the build host: build (CUDA_ARCHS=90 unless set), check
#                                          the host emulation, copy the bench, this script and the
#                                          shared libraries into DEST (default /work/main/.carry)
#   ./gpu-gemv-mma.sh [run]                on the GPU machine, inside the staged folder: check, then
#                                          time (auto tiles, then forced 1 and 2 row tiles per warp),
#                                          logs under $OUT (or ./out)
set -u
cd "$(dirname "$0")"
if [ "${1:-run}" = stage ]; then
	set -e
	cd ..
	DEST=${2:-/work/main/.carry}
	make CUDA_ARCHS="${CUDA_ARCHS:-90}" -j2 build/bench/bench_cuda_gemv_mma
	build/bench/bench_cuda_gemv_mma emu | tail -n 1
	mkdir -p "$DEST/lib"
	cp build/bench/bench_cuda_gemv_mma scripts/gpu-gemv-mma.sh "$DEST"/
	for l in libuv.so.1 libprotobuf-c.so.1 libutf8proc.so.2; do
		[ -e /usr/lib/x86_64-linux-gnu/$l ] && cp -L /usr/lib/x86_64-linux-gnu/$l "$DEST/lib/"
	done
	du -sh "$DEST"
	exit 0
fi
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# cuBLAS is not carried (too large; kcuda's context links it): find the machine's own if needed
if ldd ./bench_cuda_gemv_mma | grep -q 'libcublas.*not found'; then
	d=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
	export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
rc=0
timeout 300 ./bench_cuda_gemv_mma check >"$OUT/gemv_mma_check.log" 2>&1 || rc=$?
grep -E '^seed|^kernel|FAIL|^PASS|^check bad' "$OUT/gemv_mma_check.log"
echo "check rc=$rc ($(grep -c ' ok$' "$OUT/gemv_mma_check.log") cases ok)"
if [ "$rc" = 0 ]; then
	for r in 0 1 2; do
		TANDEM_GM_R=$([ $r = 0 ] || echo $r) timeout 240 ./bench_cuda_gemv_mma time >"$OUT/gemv_mma_time_r$r.log" 2>&1
		echo "== time, row tiles per warp: $([ $r = 0 ] && echo auto || echo $r) (rc $?)"
		sed -n '/^ceiling/,$p' "$OUT/gemv_mma_time_r$r.log"
	done
fi
exit $rc
