#!/usr/bin/env bash
# kernels/cuda/matmul_gemv_res.cu's kernel source on the CPU (tests/unit/gemv_res_sim.cc says how):
# its device part and matmul_impl.cuh's slab decode are cut out by the markers below and built with
# g++ -std=c++20 (std::barrier). `bash tests/unit/test_gemv_res_sim.sh big` runs every case.
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/gemv_res
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/matmul_gemv_res.cu
impl=kernels/cuda/matmul_impl.cuh
start=$(grep -n '^#define RES_NW' $src | cut -d: -f1)
end=$(grep -n '^static int env_int' $src | cut -d: -f1)
s1=$(grep -n '^template <int T> struct g3t;' $impl | cut -d: -f1)
e1=$(grep -n '^__device__ __forceinline__ void g3_cp16' $impl | cut -d: -f1)
s2=$(grep -n '^/\* float of a signed byte' $impl | cut -d: -f1)
e2=$(grep -n '^#endif' $impl | tail -1 | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ] || [ -z "$s1" ] || [ -z "$e1" ] || [ -z "$s2" ] || [ -z "$e2" ]; then
	echo "FAIL: the markers moved ($src: #define RES_NW ... static int env_int; $impl: struct g3t ... g3_cp16, float of a signed byte ... #endif)"
	exit 1
fi
sed -n "${start},$((end - 1))p" $src |
	sed 's/extern __shared__ __align__(16) uint8_t res_tile\[\];/uint8_t *res_tile = sim_dyn;/' >"$dir/gemv_res_body.inc"
if ! grep -q 'res_tile = sim_dyn' "$dir/gemv_res_body.inc"; then
	echo "FAIL: the kernel's dynamic shared memory declaration moved"
	exit 1
fi
{
	sed -n "${s1},$((e1 - 1))p" $impl
	sed -n "${s2},$((e2 - 1))p" $impl
} >"$dir/g3_slab.inc"
sim_build gemv_res_sim tests/unit/gemv_res_sim.cc
exec "$dir/gemv_res_sim" "$@"
