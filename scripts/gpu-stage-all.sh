#!/usr/bin/env bash
# Stages everything one GPU session runs (scripts/gpu-all.sh) into DEST (default .carry-all), for a
# GPU machine that builds nothing: the CUDA build's binaries, stripped and packed as bins.tar.xz
# (laid out like a build folder, so the e2e scripts run them with BUILD=DEST/b), the shared
# libraries the device image lacks, and gpu-all.sh itself. The tree + carry must stay under 64 MiB.
#   make BUILD=build-cuda CUDA_ARCHS=90 -j2 all && scripts/gpu-stage-all.sh
# ONLY="tandem tests/test_ops_mla ..." (paths inside BUILD) stages just those binaries: packing all
# ~735 MB takes ~10 minutes of one core, a few binaries 1-2 minutes.
set -eu
cd "$(dirname "$0")/.."
DEST=${1:-.carry-all}
BUILD=${BUILD:-build-cuda}
rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/stage/tests" "$DEST/stage/bench"
if [ -n "${ONLY:-}" ]; then
	for f in $ONLY; do
		strip -o "$DEST/stage/$f" "$BUILD/$f"
	done
else
	for f in tandem tandem-router tandem-prefill tandem-decode; do
		[ -x "$BUILD/$f" ] && strip -o "$DEST/stage/$f" "$BUILD/$f"
	done
	for f in "$BUILD"/tests/test_gpu_* "$BUILD"/tests/test_ops_*; do # only what runs on the GPU (size)
		[ -x "$f" ] && strip -o "$DEST/stage/tests/$(basename "$f")" "$f"
	done
	for f in "$BUILD"/bench/bench_cuda_* "$BUILD"/bench/bench_upload; do
		[ -x "$f" ] && strip -o "$DEST/stage/bench/$(basename "$f")" "$f"
	done
fi
# one big dictionary: the binaries share ~30 MB of identical CUDA code each (37 MB -> 5 MB)
tar -C "$DEST/stage" -cf - . | xz -T2 --lzma2=preset=6,dict=256MiB >"$DEST/bins.tar.xz"
rm -rf "$DEST/stage"
for l in libuv.so.1 libprotobuf-c.so.1 libutf8proc.so.2; do
	[ -e /usr/lib/x86_64-linux-gnu/$l ] && cp -L /usr/lib/x86_64-linux-gnu/$l "$DEST/lib/"
done
cp scripts/gpu-all.sh "$DEST/"
du -sh "$DEST" "$DEST"/*
