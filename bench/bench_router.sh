#!/usr/bin/env bash
# Router overhead: requests/s and latency percentiles of the router alone, with the built-in
# simulated engine set to zero compute (prefill 0 us/token, transfer 0 ms), driven by wrk over
# loopback. What is measured is the router's own work per request: HTTP parse, JSON decode,
# tokenization, admission/placement, the state machine, JSON/SSE encoding.
#   bench/bench_router.sh [seconds] [connections]
# Prints one line per case: name, requests/s, p50, p99 (ms). Needs Debian's wrk.
set -euo pipefail
BUILD=${BUILD:-build}
DUR=${1:-10}
CONNS=${2:-64}
command -v wrk >/dev/null || { echo "bench_router: wrk is not installed (apt-get install wrk)"; exit 1; }
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BUILD/tandem-router" --engine sim --port "$PORT" --sim-prefill-us-per-token 0 --sim-transfer-ms 0 \
	--sim-step-ms 1 --sim-blocks 100000 --n-queue-max 100000 --log-level warn >"$TMP/router.log" 2>&1 &
RPID=$!
trap 'kill -TERM $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$TMP"' EXIT
for i in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/ready" && break; sleep 0.05; done

post() { # file body
	cat >"$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$2'
LUA
}
post "$TMP/c1.lua" '{"model":"sim","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":1,"temperature":0}'
post "$TMP/chat1.lua" '{"model":"sim","messages":[{"role":"user","content":"The quick brown fox jumps over the lazy dog"}],"max_tokens":1}'
post "$TMP/s16.lua" '{"model":"sim","prompt":"The quick brown fox","max_tokens":16,"temperature":0,"stream":true}'

run() { # name url [script]
	local name=$1 url=$2 script=${3:-}
	local out
	local thr=2; [ "$CONNS" -lt 2 ] && thr=1
	out=$(wrk -t$thr -c"$CONNS" -d"${DUR}s" --latency ${script:+-s "$script"} "$url")
	local rps p50 p99 errs
	rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
	p50=$(echo "$out" | awk '$1=="50%" {print $2}')
	p99=$(echo "$out" | awk '$1=="99%" {print $2}')
	errs=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
	printf '%-38s %10s req/s   p50 %8s   p99 %8s   non-2xx %s\n' "$name" "$rps" "$p50" "$p99" "${errs:-0}"
}
echo "router overhead, $CONNS connections, ${DUR}s each, wrk -t2, $(nproc) cores shared by wrk and the router"
run "GET /health (HTTP floor)" "http://127.0.0.1:$PORT/health"
run "POST /v1/completions max_tokens=1" "http://127.0.0.1:$PORT/v1/completions" "$TMP/c1.lua"
run "POST /v1/chat/completions max_tokens=1" "http://127.0.0.1:$PORT/v1/chat/completions" "$TMP/chat1.lua"
run "stream max_tokens=16 (1 ms sim steps)" "http://127.0.0.1:$PORT/v1/completions" "$TMP/s16.lua"
grep -E " (ERROR|WARN) " "$TMP/router.log" | head -5 || true
