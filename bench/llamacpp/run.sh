#!/usr/bin/env bash
# Installs node-llama-cpp@3.21.1 into bench/llamacpp/node_modules (git-ignored) and runs the same
# prefill/decode measurement as `tandem bench` on the same GGUF with both engines.
#   [TANDEM_BENCH_FLAGS=--fast] bench/llamacpp/run.sh MODEL [PROMPT] [GEN] [THREADS]
# Note: on CPUs with AMX (Sapphire Rapids), the bundled llama.cpp v0.4.0 loads its AMX variant,
# which repacks Q8_0 weights and then fails GGML_ASSERT(*cur_backend_id != -1) while reserving the
# graph for these models; the variant is moved aside so llama.cpp runs its AVX-512 build instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
model=$1 P=${2:-128} G=${3:-32} T=${4:-2}
if [ ! -d "$here/node_modules/node-llama-cpp" ]; then
	(cd "$here" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
bins=$(ls -d "$here"/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 2>/dev/null || true)
if [ -n "$bins" ] && [ -f "$bins/libggml-cpu-sapphirerapids.so" ]; then
	mv "$bins/libggml-cpu-sapphirerapids.so" "$bins/libggml-cpu-sapphirerapids.so.disabled"
fi
echo "== tandem"
"$top/build/tandem" bench -m "$model" --prompt "$P" --gen "$G" --threads "$T" --json ${TANDEM_BENCH_FLAGS:-}
echo "== llama.cpp"
node "$here/bench.mjs" "$model" --prompt "$P" --gen "$G" --threads "$T"
