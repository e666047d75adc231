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
	--api-keys-file "$TMP/keys.txt" --n-body-bytes-max 1048576 --sim-step-ms 1 --sim-decode 2 --sim-prefill 2 \
	--n-write-queue-bytes-max 65536
# a second router whose decode pool holds one 400-token request and whose queue holds one more
start router_smallq "$REPO/$BUILD/tandem-router" --engine sim --host 127.0.0.1 --port "$PORT2" \
	--n-queue-max 1 --sim-blocks 8 --sim-block-size 64 --sim-step-ms 2 --header-timeout-ms 300 --idle-timeout-ms 700 --n-conns-max 8
wait_http "http://127.0.0.1:$PORT/ready" 20 || exit 1
wait_http "http://127.0.0.1:$PORT2/ready" 20 || exit 1

# raw sockets against the second router: header timeout (408), idle keep-alive timeout (quiet
# close), pipelined requests answered in order on one connection
python3 - "$PORT2" <<'PY' || e2e_fail "socket-level HTTP checks"
import socket, sys, time
port = int(sys.argv[1])
def conn():
    s = socket.create_connection(("127.0.0.1", port)); s.settimeout(5); return s
def read_all(s):
    out = b""
    while True:
        b = s.recv(65536)
        if not b: return out
        out += b
s = conn(); s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n"); t0 = time.time()
r = read_all(s); dt = time.time() - t0
assert r.startswith(b"HTTP/1.1 408 "), r[:60]
assert 0.2 < dt < 2.0, dt
s = conn(); t0 = time.time(); r = read_all(s); dt = time.time() - t0
assert r == b"" and 0.5 < dt < 3.0, (r, dt)
s = conn(); s.sendall(b"GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\nGET /ready HTTP/1.1\r\nConnection: close\r\n\r\n")
r = read_all(s)
assert r.count(b"HTTP/1.1 200 OK") == 3, r
i1, i2, i3 = r.find(b'{"status":"ok"}'), r.find(b'"object":"list"'), r.find(b'{"status":"ready"}')
assert 0 < i1 < i2 < i3, (i1, i2, i3)
# beyond n_conns_max: 503 with a well-formed OpenAI error, then close
held = [conn() for _ in range(8)]
time.sleep(0.1)
s = conn(); r = read_all(s)
head, _, body = r.partition(b"\r\n\r\n")
assert head.startswith(b"HTTP/1.1 503 "), r[:80]
import json, re
n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
assert n == len(body), (n, len(body))
assert json.loads(body)["error"]["code"] == "overloaded"
for h in held: h.close()
time.sleep(0.2)
print("socket checks: 408 after %.2f s header timeout, idle close, 3 pipelined responses in order, 503 beyond 8 connections" % 0.3)
PY

ROUTER_URL="http://127.0.0.1:$PORT" SMALLQ_URL="http://127.0.0.1:$PORT2" API_KEY=e2e-secret-key \
	NODE_PATH="$E2E_DIR/node_modules" node --test --test-reporter=spec "$E2E_DIR/openai_sim.test.mjs"
rc=$?
[ $rc -eq 0 ] || e2e_fail "node test suite failed ($rc)"

# a client that stops reading its stream (tiny receive window, never reads) is cut off once 64 KiB
# are queued for it beyond the kernel's buffers; its choices are cancelled and their blocks come back
python3 - "$PORT" <<'PY' || e2e_fail "slow reader not cut off"
import re, socket, sys, time, urllib.request
port = int(sys.argv[1])
def metric(name):
    t = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port).read().decode()
    return float(re.search("^" + re.escape(name) + " (.*)$", t, re.M).group(1))
before = metric('tandem_router_requests_total{outcome="cancelled"}')
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", port))
# 16 choices with 5 logprobs each: ~10 KB per decode step, far more than the kernel's socket buffers
body = b'{"model":"sim","prompt":"never read","max_tokens":2000,"n":16,"logprobs":5,"temperature":0,"stream":true}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer e2e-secret-key\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
t0 = time.time()
while time.time() - t0 < 8 and metric('tandem_router_requests_total{outcome="cancelled"}') == before:
    time.sleep(0.1)
after = metric('tandem_router_requests_total{outcome="cancelled"}')
used = metric("tandem_router_kv_blocks_used")
print("slow reader: cancelled after %.1f s, blocks used now %d" % (time.time() - t0, used))
s.close()
sys.exit(0 if after >= before + 1 and used == 0 else 1)
PY
grep -q "client is not reading" "$TMP/router.log" || e2e_fail "no log line for the slow reader"

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
