#!/usr/bin/env bash
# Stages the CUDA test and bench binaries plus gpu-run.sh into <dest> (default: the .carry/ folder
# of /work/main, which the device tool sends along) for a GPU machine that builds nothing.
# Build first: make CUDA_ARCHS=90 build/tests/test_ops_* build/bench/bench_cuda_*
set -eu
cd "$(dirname "$0")/.."
DEST=${1:-/work/main/.carry}
BUILD=${BUILD:-build}
rm -rf "$DEST"
mkdir -p "$DEST/lib"
cp "$BUILD"/tests/test_ops_* "$BUILD"/bench/bench_cuda_* scripts/gpu-run.sh "$DEST"/
# libraries the GPU image may lack (the binaries link cudart statically; cuBLAS comes from there)
for l in libuv.so.1 libprotobuf-c.so.1 libutf8proc.so.2; do
	[ -e /usr/lib/x86_64-linux-gnu/$l ] && cp -L /usr/lib/x86_64-linux-gnu/$l "$DEST/lib/"
done
du -sh "$DEST"
