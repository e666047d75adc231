#!/usr/bin/env bash
# kernels/cuda/k45_i8.cuh's unit on the CPU (tests/unit/k45_i8_sim.cc says how): the header's device
# part, without its #include and its mma.sync (the simulation has its own), and gemv_mma.cuh's
# gm_k45_w / gm_k45_load are cut out by the markers below and built with g++ -std=c++20
# (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/k45_i8
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/k45_i8.cuh
mma=kernels/cuda/gemv_mma.cuh
s1=$(grep -n '^#define MI8_P ' $src | cut -d: -f1)
e1=$(grep -n '^/\* D += A \* B, m16n8k32' $src | cut -d: -f1)
s2=$(grep -n '^/\* the low bytes of a, b, c, d' $src | cut -d: -f1)
e2=$(grep -n '^#endif' $src | tail -1 | cut -d: -f1)
s3=$(grep -n '^template <int T, int R> struct gm_k45_w {' $mma | cut -d: -f1)
e3=$(grep -n '^template <int T, int R, int NG, class LN> GM_HD void gm_k45_math' $mma | cut -d: -f1)
if [ -z "$s1" ] || [ -z "$e1" ] || [ -z "$s2" ] || [ -z "$e2" ] || [ -z "$s3" ] || [ -z "$e3" ]; then
	echo "FAIL: the markers moved ($src: #define MI8_P ... /* D += A * B, m16n8k32, /* the low bytes ... #endif;"
	echo "      $mma: struct gm_k45_w ... gm_k45_math)"
	exit 1
fi
{
	sed -n "${s3},$((e3 - 1))p" $mma
	sed -n "${s1},$((e1 - 1))p" $src
	sed -n "${s2},$((e2 - 1))p" $src
} >"$dir/k45_i8_body.inc"
sim_build k45_i8_sim tests/unit/k45_i8_sim.cc -Wno-unknown-pragmas
exec "$dir/k45_i8_sim" "$@"
