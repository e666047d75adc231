#!/usr/bin/env bash
# kernels/cuda/matmul_multi.cu's mm_multi_mq_kernel warp on the CPU (tests/unit/mq_sim.cc says how): its
# MQ_RB / MQ_PAD, mq_tile_bytes, mq_block_words, mq_pass and the warp's epilogue mq_warp_rows (MM_PART
# wide), and k45_i8.cuh's int8 unit are cut out by their markers and built with g++ -std=c++20
# (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/mq
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
sim_cut_k45 "$dir/k45_i8_body.inc"
src=kernels/cuda/matmul_multi.cu
start=$(grep -n '^#define MQ_RB ' $src | cut -d: -f1)
end=$(grep -n '^/\* A block of NW warps: its MQ_RB rows' $src | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ] || ! grep -q '^#define MM_PART ' $src; then
	echo "FAIL: the markers moved ($src: #define MM_PART, #define MQ_RB ... /* A block of NW warps: its MQ_RB rows)"
	exit 1
fi
# the warps' sums array width (mq_warp_rows' part[][MM_PART]), then the tiles' code through the epilogue
{
	grep '^#define MM_PART ' $src
	sed -n "${start},$((end - 1))p" $src
} >"$dir/mq_body.inc"
# misaligned word loads stop the run where the compiler has UBSan (sim_lib.sh)
san=$(sim_san_align)
sim_build mq_sim tests/unit/mq_sim.cc -Wno-unknown-pragmas $san
exec "$dir/mq_sim" "$@"
