#!/usr/bin/env bash
# Long prefills through tandem-router (built-in simulated engine, prefill 10 ms per prompt token):
#  - the prefill deadline grows with the prompt: with --prefill-timeout-ms 500 and
#    --prefill-us-per-token 20000 a 150-token prompt (1.5 s of prefill) gets 3.5 s and completes;
#    with the per-token budget 0 (the old fixed deadline) the same request fails with a timeout;
#  - while it prefills, the stream gets SSE comments ": keep-alive" every --sse-keepalive-ms
#    (200 ms here: at least 4 in 1.5 s, all before the first data event), and none with 0.
source "$(dirname "$0")/lib.sh"

PORT=$(free_port)
PORT0=$(free_port)
start router "$REPO/$BUILD/tandem-router" --engine sim --host 127.0.0.1 --port "$PORT" \
	--sim-prefill-us-per-token 10000 --sim-step-ms 1 --prefill-timeout-ms 500 \
	--prefill-us-per-token 20000 --sse-keepalive-ms 200
start router_fixed "$REPO/$BUILD/tandem-router" --engine sim --host 127.0.0.1 --port "$PORT0" \
	--sim-prefill-us-per-token 10000 --sim-step-ms 1 --prefill-timeout-ms 500 \
	--prefill-us-per-token 0 --sse-keepalive-ms 0
wait_http "http://127.0.0.1:$PORT/ready" 20 || exit 1
wait_http "http://127.0.0.1:$PORT0/ready" 20 || exit 1

# a prompt of exactly 150 token ids
PROMPT=$(python3 -c 'print(",".join(str(3 + i % 200) for i in range(150)))')
BODY="{\"model\":\"sim\",\"prompt\":[$PROMPT],\"max_tokens\":4,\"temperature\":0,\"stream\":true}"

t0=$(date +%s.%N)
curl -sN -m 20 "http://127.0.0.1:$PORT/v1/completions" -d "$BODY" >"$TMP/long.out"
t1=$(date +%s.%N)
echo "long prompt with a per-token budget: $(python3 -c "print('%.2f' % ($t1 - $t0))") s," \
	"$(grep -c '^: keep-alive$' "$TMP/long.out") keep-alive comments"
tail -c 200 "$TMP/long.out" | grep -q 'data: \[DONE\]' || e2e_fail "long prefill did not complete: $(head -c 300 "$TMP/long.out")"
grep -q '"error"' "$TMP/long.out" && e2e_fail "long prefill ended with an error: $(grep '"error"' "$TMP/long.out" | head -1)"
python3 - "$TMP/long.out" <<'PY' || e2e_fail "keep-alive comments: fewer than 4 before the first data event"
import sys
lines = open(sys.argv[1]).read().split("\n")
first = next(i for i, l in enumerate(lines) if l.startswith("data: "))
n = sum(1 for l in lines[:first] if l == ": keep-alive")
print("keep-alives before the first data event:", n)
sys.exit(0 if n >= 4 else 1)
PY

# the same request with a fixed 500 ms deadline: fails as a timeout, and no comments are sent
curl -sN -m 20 "http://127.0.0.1:$PORT0/v1/completions" -d "$BODY" >"$TMP/fixed.out"
echo "fixed deadline: $(head -c 300 "$TMP/fixed.out")"
grep -q '"error"' "$TMP/fixed.out" || e2e_fail "a 1.5 s prefill passed a fixed 500 ms deadline"
grep -q '^: keep-alive' "$TMP/fixed.out" && e2e_fail "keep-alive comments sent with --sse-keepalive-ms 0"

# non-streaming responses carry no comments (they are plain JSON)
NS="{\"model\":\"sim\",\"prompt\":[$PROMPT],\"max_tokens\":4,\"temperature\":0}"
curl -s -m 20 "http://127.0.0.1:$PORT/v1/completions" -d "$NS" >"$TMP/ns.out"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["choices"][0]["finish_reason"]=="length", j' \
	"$TMP/ns.out" || e2e_fail "non-streaming long prefill: $(head -c 300 "$TMP/ns.out")"
exit $E2E_FAILED
