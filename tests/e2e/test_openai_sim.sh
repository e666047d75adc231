#!/usr/bin/env bash
# The official OpenAI Node client (openai@6.49.0) against tandem-router serving the built-in
# simulated engine: completions and chat, streaming and not, stop strings, max_tokens, seeds, n=2,
# logprobs, usage, OpenAI-shaped errors (404 model, 400 JSON/context, 401 key, 405, 413, 429),
# 64 concurrent streams and a client disconnect freeing its KV blocks. Router only: the same
# suite against real prefill/decode processes is test_openai_workers.sh.
source "$(dirname "$0")/lib.sh"
ensure_openai || { echo "SKIP: cannot install the openai npm package"; exit 1; }

PORT=$(free_port)
PORT2=$(free_port)
echo "e2e-secret-key" >"$TMP/keys.txt"
start router "$REPO/$BUILD/tandem-router" --engine sim --host 127.0.0.1 --port "$PORT" \
	--api-keys-file "$TMP/keys.txt" --n-body-bytes-max 1048576 --sim-step-ms 1 --sim-decode 2 --sim-prefill 2
# a second router whose decode pool holds one 400-token request and whose queue holds one more
start router_smallq "$REPO/$BUILD/tandem-router" --engine sim --host 127.0.0.1 --port "$PORT2" \
	--n-queue-max 1 --sim-blocks 8 --sim-block-size 64 --sim-step-ms 2
wait_http "http://127.0.0.1:$PORT/ready" 20 || exit 1
wait_http "http://127.0.0.1:$PORT2/ready" 20 || exit 1

ROUTER_URL="http://127.0.0.1:$PORT" SMALLQ_URL="http://127.0.0.1:$PORT2" API_KEY=e2e-secret-key \
	NODE_PATH="$E2E_DIR/node_modules" node --test --test-reporter=spec "$E2E_DIR/openai_sim.test.mjs"
rc=$?
[ $rc -eq 0 ] || e2e_fail "node test suite failed ($rc)"

# SIGTERM drains: an in-flight stream still completes, new requests are refused, exit 0
curl -sN "http://127.0.0.1:$PORT/v1/completions" -H "Authorization: Bearer e2e-secret-key" \
	-d '{"model":"sim","prompt":"drain me","max_tokens":400,"temperature":0,"stream":true}' >"$TMP/drain.out" &
CURL=$!
sleep 0.1
kill -TERM "$(pid_of router)"
sleep 0.05
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" || true)
[ "$code" = 000 ] || e2e_fail "router still accepts connections while draining (got $code)"
wait "$CURL"
tail -c 200 "$TMP/drain.out" | grep -q 'data: \[DONE\]' || e2e_fail "in-flight stream cut by the drain"
[ "$(grep -c '"finish_reason":"length"' "$TMP/drain.out")" = 1 ] || e2e_fail "drained stream did not finish normally"
stop_one router; st=$?
[ $st -eq 0 ] || e2e_fail "router exit status $st after SIGTERM"
grep -q "draining" "$TMP/router.log" || e2e_fail "router did not log draining"
exit $E2E_FAILED
