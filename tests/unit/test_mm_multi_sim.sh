#!/usr/bin/env bash
# kernels/cuda/matmul_multi.cu's kernel source on the CPU (tests/unit/mm_multi_sim.cc says how): its
# device part and matmul_impl.cuh's slab decode are cut out by the markers below and built with
# g++ -std=c++20 (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/mm_multi
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/matmul_multi.cu
impl=kernels/cuda/matmul_impl.cuh
start=$(grep -n '^#define MM_NW' $src | cut -d: -f1)
end=$(grep -n '^extern "C" bool kcuda_matmul_multi_enabled' $src | cut -d: -f1)
s1=$(grep -n '^template <int T> struct g3t;' $impl | cut -d: -f1)
e1=$(grep -n '^__device__ __forceinline__ void g3_cp16' $impl | cut -d: -f1)
s2=$(grep -n '^/\* float of a signed byte' $impl | cut -d: -f1)
e2=$(grep -n '^#endif' $impl | tail -1 | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ] || [ -z "$s1" ] || [ -z "$e1" ] || [ -z "$s2" ] || [ -z "$e2" ]; then
	echo "FAIL: the markers moved ($src: #define MM_NW ... kcuda_matmul_multi_enabled; $impl: struct g3t ... g3_cp16, float of a signed byte ... #endif)"
	exit 1
fi
sed -n "${start},$((end - 1))p" $src |
	sed 's/extern __shared__ __align__(16) uint8_t mm_tile\[\];/uint8_t *mm_tile = sim_dyn;/' >"$dir/mm_multi_body.inc"
if ! grep -q 'mm_tile = sim_dyn' "$dir/mm_multi_body.inc"; then
	echo "FAIL: the kernel's dynamic shared memory declaration moved"
	exit 1
fi
{
	sed -n "${s1},$((e1 - 1))p" $impl
	sed -n "${s2},$((e2 - 1))p" $impl
} >"$dir/g3_slab.inc"
# k45_i8.cuh's mi8_x (x's int8 parts, the one-token Q8_0 path's input)
k45=kernels/cuda/k45_i8.cuh
s3=$(grep -n '^#define MI8_P ' $k45 | cut -d: -f1)
e3=$(awk -v s="$s3" 'NR > s && /^};/ { print NR; exit }' $k45)
if [ -z "$s3" ] || [ -z "$e3" ]; then
	echo "FAIL: the markers moved ($k45: #define MI8_P ... the end of struct mi8_x)"
	exit 1
fi
sed -n "${s3},${e3}p" $k45 >"$dir/mi8_x.inc"
sim_build mm_multi_sim tests/unit/mm_multi_sim.cc -DTANDEM_CUDA
exec "$dir/mm_multi_sim" "$@"
