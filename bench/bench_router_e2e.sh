#!/usr/bin/env bash
# End-to-end serving throughput on CPU: router + 1 prefill + 1 decode (tiny GLM-DSA Q8_0, KV over
# UCX shared memory), N concurrent streaming completions of MAXTOK tokens each, for N in 1 8 64.
# Reports generated tokens/s (sum over streams / wall time, best of ROUNDS), and for reference the
# model core alone: `tandem generate` of the same length in one process (no serving plane).
#   bench/bench_router_e2e.sh [maxtok] [rounds]
set -euo pipefail
BUILD=${BUILD:-build}
MAXTOK=${1:-64}
ROUNDS=${2:-2}
MODEL=${MODEL:-tests/data/models/glm-dsa-tiny-Q8_0.gguf}
THREADS=${THREADS:-1}
export UCX_NET_DEVICES=lo UCX_TLS=${UCX_TLS:-sm} UCX_WARN_UNUSED_ENV_VARS=n
TMP=$(mktemp -d)
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(fp); CPORT=$(fp)
"$BUILD/tandem-router" --model-path "$MODEL" --port "$PORT" --control-addr "127.0.0.1:$CPORT" --log-level warn \
	>"$TMP/router.log" 2>&1 &
P1=$!
sleep 0.3
"$BUILD/tandem-decode" --router "127.0.0.1:$CPORT" --model "$MODEL" --name d0 --threads "$THREADS" --metrics "" \
	--log-level warn >"$TMP/decode.log" 2>&1 &
P2=$!
"$BUILD/tandem-prefill" --router "127.0.0.1:$CPORT" --model "$MODEL" --name p0 --threads "$THREADS" --metrics "" \
	--log-level warn >"$TMP/prefill.log" 2>&1 &
P3=$!
trap 'kill -TERM $P3 $P2 $P1 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
for i in $(seq 1 300); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/ready" && break; sleep 0.1; done
ID=$(curl -s "http://127.0.0.1:$PORT/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')

one() { # index -> prints completion_tokens
	curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d \
		"{\"model\":\"$ID\",\"prompt\":\"Request $1 says hello to the serving benchmark\",\"max_tokens\":$MAXTOK,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" |
		sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p'
}
export -f one
export PORT ID MAXTOK
one 0 >/dev/null # warm-up
printf "%-8s %12s %10s %14s\n" streams tokens wall_s tokens_per_s
for N in 1 8 64; do
	best=0
	for r in $(seq 1 "$ROUNDS"); do
		t0=$(date +%s.%N)
		tok=$(seq 1 "$N" | xargs -P "$N" -I{} bash -c 'one {}' | awk '{s+=$1} END {print s+0}')
		t1=$(date +%s.%N)
		rate=$(python3 -c "print('%.1f' % ($tok / ($t1 - $t0)))")
		wall=$(python3 -c "print('%.2f' % ($t1 - $t0))")
		if python3 -c "import sys; sys.exit(0 if $rate > $best else 1)"; then best=$rate; btok=$tok; bwall=$wall; fi
	done
	printf "%-8s %12s %10s %14s\n" "$N" "$btok" "$bwall" "$best"
done
t0=$(date +%s.%N)
"$BUILD/tandem" generate -m "$MODEL" -p "Request 0 says hello to the serving benchmark" -n "$MAXTOK" --greedy --ids \
	--threads "$THREADS" >/dev/null 2>&1
t1=$(date +%s.%N)
python3 -c "print('model core alone (tandem generate, load + prefill + $MAXTOK tokens): %.2f s = %.1f tokens/s' % ($t1 - $t0, $MAXTOK / ($t1 - $t0)))"
