#!/bin/sh
# GPU run of the model's CUDA backend from binaries built elsewhere (builds nothing here):
#   scripts/gpu-model.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR holds tandem, test_gpu_model and lib/ (the shared libraries the device lacks); default
# .carry-backend. Runs tests/model/test_gpu_model (CUDA vs CPU on every tests/data model, graphs vs
# eager), then a short `tandem bench --backend cuda` table (eager and graph decode), then, if time
# is left, the same bench on a GLM-5-width 2-layer file made by `tandem mkmodel`. Logs to OUT_DIR.
set -u
B=${1:-.carry-backend}
O=${2:-${OUT:-/tmp}}
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$O"
date -u | tee "$O/gpu-model.log"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv 2>&1 | tee -a "$O/gpu-model.log"
echo "== test_gpu_model" | tee -a "$O/gpu-model.log"
timeout 200 "$B/test_gpu_model" >"$O/test_gpu_model.log" 2>&1
rc=$?
cat "$O/test_gpu_model.log" >>"$O/gpu-model.log"
cat "$O/test_gpu_model.log"
echo "test_gpu_model rc=$rc" | tee -a "$O/gpu-model.log"
echo "== bench (tests/data models, prompt 256, gen 64)" | tee -a "$O/gpu-model.log"
for m in glm-dsa-tiny-BF16 glm-dsa-tiny-Q4_K_M deepseek2-tiny-Q8_0; do
	for bt in 1 8; do
		echo "-- $m batch $bt" | tee -a "$O/gpu-model.log"
		timeout 40 "$B/tandem" bench -m "tests/data/models/$m.gguf" --backend cuda --prompt 256 --gen 64 \
			--batch $bt --reps 3 --threads 4 2>&1 | tee -a "$O/gpu-model.log"
	done
done
echo "== GLM-5 width, 2 layers (mkmodel q4_k), rank 0 of TP=8 and TP=1" | tee -a "$O/gpu-model.log"
if timeout 150 "$B/tandem" mkmodel --preset glm5 --layers 2 --dense 1 --experts 8 --top-k 2 --type q4_k \
	-o /tmp/glm5-2l.gguf >>"$O/gpu-model.log" 2>&1; then
	for args in "--tp 8 --rank 0 --batch 1" "--tp 8 --rank 0 --batch 16" "--batch 1"; do
		echo "-- glm5-2l $args" | tee -a "$O/gpu-model.log"
		timeout 60 "$B/tandem" bench -m /tmp/glm5-2l.gguf --backend cuda --prompt 512 --gen 32 --reps 3 \
			--threads 8 $args 2>&1 | tee -a "$O/gpu-model.log"
	done
else
	echo "mkmodel failed or timed out" | tee -a "$O/gpu-model.log"
fi
echo "== synthetic GLM-5 (full 78 layers, q4_k), rank 0 of TP=8: decode batch 1 / 16 at ctx 4096" | tee -a "$O/gpu-model.log"
for bt in 1 16; do
	timeout 120 "$B/tandem" bench --synthetic glm5 --tp 8 --rank 0 --backend cuda --ctx 4096 --gen 16 \
		--batch $bt --ubatch 512 --reps 2 --threads 8 2>&1 | tail -n 6 | tee -a "$O/gpu-model.log"
done
date -u | tee -a "$O/gpu-model.log"
