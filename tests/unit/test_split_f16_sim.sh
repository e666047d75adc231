#!/usr/bin/env bash
# kernels/cuda/matmul_gemm.cu's split fp16 GEMM numerics on the CPU (tests/unit/split_f16_sim.cc says how):
# its scale and split functions are cut out by the two markers below and built with g++ (_Float16 for
# the device's __half).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/split_f16
mkdir -p "$dir"
src=kernels/cuda/matmul_gemm.cu
start=$(grep -n '^/\* the scale exponent e for a largest |value|' $src | cut -d: -f1)
end=$(grep -n '^__device__ __forceinline__ void split_max_commit' $src | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ]; then
	echo "FAIL: the markers of $src's split functions moved (/* the scale exponent e ... split_max_commit)"
	exit 1
fi
sed -n "${start},$((end - 1))p" $src >"$dir/split_f16.inc"
if ! ${CXX:-g++} -std=c++17 -O1 -I. -I"$dir" -o "$dir/split_f16_sim" tests/unit/split_f16_sim.cc 2>"$dir/build.log"; then
	if ! echo 'int main() { _Float16 h = (_Float16)1.5f; return (int)(float)h - 1; }' |
		${CXX:-g++} -x c++ -o "$dir/f16_probe" - 2>/dev/null; then
		echo "SKIP: no _Float16 in ${CXX:-g++}"
		exit 77
	fi
	cat "$dir/build.log"
	echo "FAIL: tests/unit/split_f16_sim.cc does not build"
	exit 1
fi
exec "$dir/split_f16_sim" "$@"
