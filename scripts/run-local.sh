#!/usr/bin/env bash
# `make run`: router + one prefill + one decode worker on this machine, CPU backend, the bundled
# tiny model; the router listens on 127.0.0.1:8000 (API) and 127.0.0.1:9100 (control). Ctrl-C
# stops all three (SIGTERM: each drains and exits). Overrides: MODEL, PORT, CONTROL.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-tests/data/models/glm-dsa-tiny-Q8_0.gguf}
PORT=${PORT:-8000}
CONTROL=${CONTROL:-127.0.0.1:9100}
LOGDIR=${LOGDIR:-$BUILD/run-logs}
mkdir -p "$LOGDIR"

[ -x "$BUILD/tandem-router" ] || { echo "run-local: $BUILD/tandem-router is not built (run make)" >&2; exit 1; }
pids=()
cleanup() {
	trap - INT TERM EXIT
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	echo "run-local: stopped (logs in $LOGDIR)"
}
trap cleanup INT TERM EXIT

if [ -x "$BUILD/tandem-prefill" ] && [ -x "$BUILD/tandem-decode" ]; then
	"$BUILD/tandem-router" --config deploy/examples/router-local.json --model-path "$MODEL" --port "$PORT" \
		--control-addr "$CONTROL" &
	pids+=($!)
	sleep 0.3
	"$BUILD/tandem-decode" --router "$CONTROL" --model "$MODEL" --name decode-0 --metrics 127.0.0.1:9301 \
		>"$LOGDIR/decode-0.log" 2>&1 &
	pids+=($!)
	"$BUILD/tandem-prefill" --router "$CONTROL" --model "$MODEL" --name prefill-0 --metrics 127.0.0.1:9201 \
		>"$LOGDIR/prefill-0.log" 2>&1 &
	pids+=($!)
	what="router + prefill-0 + decode-0 (worker logs: $LOGDIR)"
else
	echo "run-local: tandem-prefill/tandem-decode are not built yet: serving the router with its built-in" >&2
	echo "           simulated engine (the model's tokenizer and chat template, simulated tokens)" >&2
	"$BUILD/tandem-router" --engine sim --model-path "$MODEL" --port "$PORT" &
	pids+=($!)
	what="router with the simulated engine"
fi

for i in $(seq 1 300); do
	curl -sf -o /dev/null "http://127.0.0.1:$PORT/ready" && break
	sleep 0.1
done
if ! curl -sf -o /dev/null "http://127.0.0.1:$PORT/ready"; then
	echo "run-local: not ready after 30 s; see $LOGDIR" >&2
	exit 1
fi
id=$(curl -s "http://127.0.0.1:$PORT/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
cat <<MSG

tandem is serving $id on http://127.0.0.1:$PORT ($what). Try:

  curl http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$id","messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'

  curl -N http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$id","prompt":"The capital of France is","max_tokens":16,"temperature":0,"stream":true}'

Metrics: http://127.0.0.1:$PORT/metrics   Ctrl-C stops everything.
MSG
wait "${pids[0]}"
