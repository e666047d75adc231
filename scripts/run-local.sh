#!/usr/bin/env bash
# `make run`: the main job on one machine: router + one prefill + one decode worker on the CPU
# backend with the bundled tiny model, the router on 127.0.0.1:8000.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-tests/data/models/glm-dsa-tiny-Q8_0.gguf}
for b in tandem-router tandem-prefill tandem-decode; do
	if [ ! -x "$BUILD/$b" ]; then
		echo "run-local: $BUILD/$b is not built yet (the serving plane is issue 3); showing the model core instead" >&2
		exec "$BUILD/tandem" generate -m "$MODEL" -p "Hello" -n 16 --greedy
	fi
done
exec "$BUILD/tandem-router" --local --model "$MODEL"
