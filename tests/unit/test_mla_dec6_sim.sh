#!/usr/bin/env bash
# kernels/cuda/mla_attn_dec6.cu's kernel source on the CPU (tests/unit/mla_dec6_sim.cc says how): its
# device part is cut out by the two markers below and built with g++ -std=c++20 (std::barrier).
# `bash tests/unit/test_mla_dec6_sim.sh SEED` runs it with another seed.
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/mla_dec6
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/mla_attn_dec6.cu
start=$(grep -n '^#define D6_THREADS' $src | cut -d: -f1)
end=$(grep -n '^/\* launches of this kernel' $src | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ]; then
	echo "FAIL: the markers of $src's device part moved (#define D6_THREADS ... /* launches of this kernel)"
	exit 1
fi
sed -n "${start},$((end - 1))p" $src |
	sed 's/extern __shared__ __align__(16) uint8_t d6_sm\[\];/uint8_t *d6_sm = sim_blk->smem;/' \
		>"$dir/mla_dec6_body.inc"
if ! grep -q 'd6_sm = sim_blk->smem' "$dir/mla_dec6_body.inc"; then
	echo "FAIL: the kernel's dynamic shared memory declaration moved"
	exit 1
fi
# mla_attn_merge.cuh includes <cooperative_groups.h>: the simulation defines its own cluster_group
echo '/* empty: tests/unit/mla_dec6_sim.cc defines the cluster it needs */' >"$dir/cooperative_groups.h"
sim_build mla_dec6_sim tests/unit/mla_dec6_sim.cc
exec "$dir/mla_dec6_sim" "$@"
