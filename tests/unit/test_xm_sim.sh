#!/usr/bin/env bash
# kernels/cuda/matmul_multi.cu's mm_xm_kernel warp on the CPU (tests/unit/xm_sim.cc says how): its
# XM_SB and xm_warp, matmul_impl.cuh's g3_q8_bytes and k45_i8.cuh's int8 unit are cut out by their markers
# and built with g++ -std=c++20 (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/xm
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
sim_cut_k45 "$dir/k45_i8_body.inc"
src=kernels/cuda/matmul_multi.cu
impl=kernels/cuda/matmul_impl.cuh
start=$(grep -n '^/\* One warp.s products over its slab' $src | cut -d: -f1)
end=$(grep -n '^/\* dynamic shared memory: per warp' $src | cut -d: -f1)
s1=$(grep -n '^/\* Quarter u % 4 of 32-element block u / 4' $impl | cut -d: -f1)
e1=$(grep -n '^/\* One Q8_0 row.s slab at p' $impl | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ] || [ -z "$s1" ] || [ -z "$e1" ] || ! grep -q '^#define XM_SB ' $src; then
	echo "FAIL: the markers moved ($src: #define XM_SB, /* One warp's products ... /* dynamic shared memory: per warp;"
	echo "      $impl: /* Quarter u % 4 of 32-element block u / 4 ... /* One Q8_0 row's slab at p)"
	exit 1
fi
{
	grep '^#define XM_SB ' $src
	sed -n "${s1},$((e1 - 1))p" $impl
	sed -n "${start},$((end - 1))p" $src
} >"$dir/xm_body.inc"
# misaligned word loads stop the run where the compiler has UBSan (sim_lib.sh)
san=$(sim_san_align)
sim_build xm_sim tests/unit/xm_sim.cc -Wno-unknown-pragmas $san
exec "$dir/xm_sim" "$@"
