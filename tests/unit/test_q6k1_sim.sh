#!/usr/bin/env bash
# kernels/cuda/matmul_q6k1.cu's kernel source on the CPU (tests/unit/q6k1_sim.cc says how): its device
# part, k45_i8.cuh's x parts (mi8_x, mi8_quant, mi8_stage) and cuda_common.cuh's 2-byte-aligned word
# loads are cut out by the markers below and built with g++ -std=c++20 (std::barrier).
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/q6k1
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/matmul_q6k1.cu
k45=kernels/cuda/k45_i8.cuh
cc=kernels/cuda/cuda_common.cuh
s0=$(grep -n '^#define Q6BPW' $src | cut -d: -f1)
e0=$(grep -n '^/\* ---- host' $src | cut -d: -f1)
s1=$(grep -n '^#define MI8_P ' $k45 | cut -d: -f1)
e1=$(grep -n '^/\* D += A \* B, m16n8k32' $k45 | cut -d: -f1)
s2=$(grep -n '^/\* the low bytes of a, b, c, d' $k45 | cut -d: -f1)
e2=$(grep -n '^/\* The same unit made by a producer' $k45 | cut -d: -f1)
s3=$(grep -n '^__device__ __forceinline__ uint16_t kc_ld16' $cc | cut -d: -f1)
s4=$(grep -n '^template <int N> __device__ __forceinline__ void kc_ldw_a2' $cc | cut -d: -f1)
e4=$(grep -n '^/\* Same for 4-byte-aligned' $cc | cut -d: -f1)
for v in "$s0" "$e0" "$s1" "$e1" "$s2" "$e2" "$s3" "$s4" "$e4"; do
	if [ -z "$v" ]; then
		echo "FAIL: the markers moved ($src: #define Q6BPW ... /* ---- host; $k45: #define MI8_P ... /* D += A * B,"
		echo "      /* the low bytes ... /* The same unit made by a producer; $cc: kc_ld16, kc_ldw_a2 ... /* Same for 4-byte)"
		exit 1
	fi
done
{
	sed -n "${s1},$((e1 - 1))p" $k45
	sed -n "${s2},$((e2 - 1))p" $k45
	sed -n "${s3},$((s3 + 3))p" $cc
	sed -n "${s4},$((e4 - 1))p" $cc
	sed -n "${s0},$((e0 - 1))p" $src |
		sed 's/extern __shared__ __align__(16) uint8_t q6_smem\[\];/uint8_t *q6_smem = sim_dyn;/'
} >"$dir/q6k1_body.inc"
if ! grep -q 'q6_smem = sim_dyn' "$dir/q6k1_body.inc"; then
	echo "FAIL: the kernel's dynamic shared memory declaration moved"
	exit 1
fi
sim_build q6k1_sim tests/unit/q6k1_sim.cc -Wno-unknown-pragmas $(sim_san_align)
exec "$dir/q6k1_sim" "$@"
