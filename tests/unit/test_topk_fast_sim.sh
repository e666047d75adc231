#!/usr/bin/env bash
# kernels/cuda/topk_fast.cu's kernel source on the CPU (tests/unit/topk_fast_sim.cc says how): its
# device part is cut out by the two markers below and built with g++ -std=c++20 (std::barrier).
# `bash tests/unit/test_topk_fast_sim.sh big` runs every block shape on every data kind.
set -u
BUILD=${BUILD:-build}
dir=$BUILD/sim/topk_fast
mkdir -p "$dir"
source "$(dirname "$0")/sim_lib.sh"
src=kernels/cuda/topk_fast.cu
start=$(grep -n '^#define TF_CAND' $src | cut -d: -f1)
end=$(grep -n '^static int tf_old' $src | cut -d: -f1)
if [ -z "$start" ] || [ -z "$end" ]; then
	echo "FAIL: the markers of $src's device part moved (#define TF_CAND ... static int tf_old)"
	exit 1
fi
sed -n "${start},$((end - 1))p" $src | sed 's/extern __shared__ uint32_t tf_dyn\[\];/uint32_t *tf_dyn = sim_dyn;/' \
	>"$dir/topk_fast_body.inc"
if ! grep -q 'tf_dyn = sim_dyn' "$dir/topk_fast_body.inc"; then
	echo "FAIL: the kernel's dynamic shared memory declaration moved"
	exit 1
fi
sim_build topk_fast_sim tests/unit/topk_fast_sim.cc
exec "$dir/topk_fast_sim" "$@"
