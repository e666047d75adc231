#!/usr/bin/env bash
# Router + 2 tandem-prefill + 2 tandem-decode real processes on loopback (CPU, tiny GLM-DSA Q8_0,
# KV over UCX with UCX_NET_DEVICES=lo), driven by the official OpenAI client:
#  - greedy output equals `tandem generate --greedy --ids`, once with UCX_TLS=tcp and once with
#    shared memory (UCX_TLS=sm);
#  - 64 concurrent streams, the OpenAI API surface, client disconnect freeing KV blocks;
#  - Prometheus scrapes all three roles and promtool is clean on every exposition;
#  - a decode worker whose KV layout differs is refused at registration, naming the difference;
#  - a decode worker killed mid-stream (its streams get an error event, others complete), then a
#    prefill worker killed with work queued (its requests are re-prefilled on the other) on the
#    same workers, over TCP and over shared memory.
source "$(dirname "$0")/lib.sh"
ensure_openai || { echo "cannot install the openai npm package"; exit 1; }
MODEL="$REPO/tests/data/models/glm-dsa-tiny-Q8_0.gguf"
MODEL_ID=glm-dsa-tiny-Q8_0
export UCX_NET_DEVICES=lo
export UCX_WARN_UNUSED_ENV_VARS=n
for b in tandem tandem-router tandem-prefill tandem-decode; do
	[ -x "$REPO/$BUILD/$b" ] || { e2e_fail "$BUILD/$b is not built"; exit 1; }
done

# --- references: prompts as token ids and their greedy continuations from the model core ---
python3 - "$TMP/prompts.txt" <<'PY'
import random, sys
rng = random.Random(1234)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        n = rng.randint(4, 40)
        print(" ".join(str(rng.randint(3, 1000)) for _ in range(n)), 16 + (i % 3) * 8, file=f)
    print(" ".join(str(rng.randint(3, 1000)) for _ in range(320)), 16, file=f)
PY
echo "[" >"$TMP/refs.json"
first=1
while read -r line; do
	n=${line##* }
	ids=${line% *}
	csv=${ids// /,}
	exp=$("$REPO/$BUILD/tandem" generate -m "$MODEL" --tokens "$csv" -n "$n" --greedy --ids --threads 1 2>"$TMP/generate.err") ||
		{ e2e_fail "tandem generate failed"; cat "$TMP/generate.err"; exit 1; }
	exp=$(echo "$exp" | tail -n 1)
	[ $first = 1 ] || echo "," >>"$TMP/refs.json"
	first=0
	echo "{\"prompt\":[$csv],\"n\":$n,\"expect\":[${exp// /,}]}" >>"$TMP/refs.json"
done <"$TMP/prompts.txt"
echo "]" >>"$TMP/refs.json"
echo "references: $(grep -c prompt "$TMP/refs.json") prompts from tandem generate"

topology() { # tag ucx_tls
	local tag=$1
	export UCX_TLS=$2
	PORT=$(free_port)
	CPORT=$(free_port)
	# the control plane requires the shared token (file on both sides, as deployed)
	echo "control-$tag-$RANDOM$RANDOM" >"$TMP/token-$tag"
	start "router-$tag" "$REPO/$BUILD/tandem-router" --model-path "$MODEL" --port "$PORT" \
		--control-addr "127.0.0.1:$CPORT" --heartbeat-ms 500 --control-token-file "$TMP/token-$tag"
	wait_http "http://127.0.0.1:$PORT/health" 20 || return 1
	MPORTS=()
	DECODE_PIDS=""
	PREFILL_PIDS=""
	for i in 0 1; do
		local mp; mp=$(free_port); MPORTS+=("$mp")
		start "decode$i-$tag" "$REPO/$BUILD/tandem-decode" --router "127.0.0.1:$CPORT" --model "$MODEL" \
			--name "decode-$i" --threads 1 --metrics "127.0.0.1:$mp" --heartbeat-ms 500 \
			--auth-token-file "$TMP/token-$tag"
		DECODE_PIDS="$DECODE_PIDS $(pid_of "decode$i-$tag")"
		mp=$(free_port); MPORTS+=("$mp")
		start "prefill$i-$tag" "$REPO/$BUILD/tandem-prefill" --router "127.0.0.1:$CPORT" --model "$MODEL" \
			--name "prefill-$i" --threads 1 --metrics "127.0.0.1:$mp" --heartbeat-ms 500 \
			--auth-token-file "$TMP/token-$tag"
		PREFILL_PIDS="$PREFILL_PIDS $(pid_of "prefill$i-$tag")"
	done
	DECODE_PIDS=${DECODE_PIDS# }
	PREFILL_PIDS=${PREFILL_PIDS# }
	# ready = all four registered
	local deadline=$((SECONDS + 60))
	while [ $SECONDS -lt $deadline ]; do
		if curl -s "http://127.0.0.1:$PORT/metrics" | grep -q '^tandem_router_workers{role="decode"} 2' &&
			curl -s "http://127.0.0.1:$PORT/metrics" | grep -q '^tandem_router_workers{role="prefill"} 2'; then
			return 0
		fi
		sleep 0.2
	done
	e2e_fail "workers did not all register within 60 s"
	return 1
}

run_node() { # phase
	ROUTER_URL="http://127.0.0.1:$PORT" MODEL_ID=$MODEL_ID REFS="$TMP/refs.json" PHASE=$1 \
		DECODE_PIDS="$DECODE_PIDS" PREFILL_PIDS="$PREFILL_PIDS" PREFILL_MPORTS="${MPORTS[1]} ${MPORTS[3]}" DECODE_MPORTS="${MPORTS[0]} ${MPORTS[2]}" NODE_PATH="$E2E_DIR/node_modules" \
		node --test --test-reporter=spec "$E2E_DIR/openai_workers.test.mjs" || e2e_fail "node phase $1 failed"
}

stop_topology() { # tag
	for n in "prefill1-$1" "prefill0-$1" "decode1-$1" "decode0-$1" "router-$1"; do
		stop_one "$n"; local st=$?
		# a worker the test killed on purpose exits by signal; everything else drains to 0
		if [ $st -ne 0 ] && [ $st -ne 137 ]; then e2e_fail "$n exited $st after SIGTERM"; fi
	done
}

# --- 1. greedy over TCP, then the full API surface, Prometheus and the layout refusal ---
topology tcp tcp || exit 1
run_node greedy
grep -h "lanes" "$TMP"/prefill*-tcp.log | head -2
run_node full

# promtool on every process's exposition, then Prometheus scraping all of them
for target in "$PORT" "${MPORTS[@]}"; do
	curl -sf "http://127.0.0.1:$target/metrics" >"$TMP/m-$target.prom" || e2e_fail "no /metrics on port $target"
	promtool check metrics <"$TMP/m-$target.prom" >"$TMP/promtool-$target.out" 2>&1 ||
		{ e2e_fail "promtool check metrics on port $target"; cat "$TMP/promtool-$target.out"; }
done
PPORT=$(free_port)
{
	echo "global: {scrape_interval: 1s}"
	echo "scrape_configs:"
	echo "  - job_name: router"
	echo "    static_configs: [{targets: [\"127.0.0.1:$PORT\"]}]"
	echo "  - job_name: workers"
	echo "    static_configs: [{targets: [$(printf '"127.0.0.1:%s",' "${MPORTS[@]}" | sed 's/,$//')]}]"
} >"$TMP/prom.yml"
start prometheus prometheus --config.file="$TMP/prom.yml" --storage.tsdb.path="$TMP/tsdb" \
	--web.listen-address="127.0.0.1:$PPORT" --log.level=warn
wait_http "http://127.0.0.1:$PPORT/-/ready" 60
up=0
for i in $(seq 1 100); do
	up=$(curl -s "http://127.0.0.1:$PPORT/api/v1/targets?state=active" | grep -o '"health":"up"' | wc -l)
	[ "$up" -ge 5 ] && break
	sleep 0.2
done
[ "$up" -ge 5 ] && echo "prometheus: all 5 targets (router, 2 prefill, 2 decode) up" || e2e_fail "prometheus: only $up of 5 targets up"
stop_one prometheus

# a decode worker with a different KV dtype (bf16; the others use the default f32) is refused at
# registration with the field named, and says so in its own log
start decode-bf16 "$REPO/$BUILD/tandem-decode" --router "127.0.0.1:$CPORT" --model "$MODEL" --name decode-bf16 \
	--threads 1 --kv-dtype bf16 --metrics "" --auth-token-file "$TMP/token-tcp"
for i in $(seq 1 100); do grep -q "decode-bf16 refused" "$TMP/router-tcp.log" && break; sleep 0.1; done
if grep -q "worker decode-bf16 refused: KV layout differs: dtype is bf16 on decode-bf16 but f32 on" "$TMP/router-tcp.log"; then
	echo "layout mismatch refused: $(grep -o 'worker decode-bf16 refused.*' "$TMP/router-tcp.log" | head -1)"
else
	e2e_fail "decode with a different KV layout was not refused with the dtype named"
	grep decode-bf16 "$TMP/router-tcp.log" | head -3
fi
grep -q "dtype is bf16" "$TMP/decode-bf16.log" || e2e_fail "the refused decode worker did not log the reason"
grep -h "decode-bf16" "$TMP/decode-bf16.log" | grep -i "refused\|mismatch\|LAYOUT" | head -2
stop_one decode-bf16

# a decode worker dies mid-stream, then a prefill worker dies with work queued, on the same
# workers: the surviving prefill worker keeps serving after its endpoint to the dead decode
# worker failed (this used to corrupt its heap: garbage block ids in later batches)
run_node killdecode
run_node killprefill
stop_topology tcp

# --- 2. the same over shared memory: greedy, a decode death, then a prefill death ---
topology sm sm || exit 1
run_node greedy
grep -h "lanes" "$TMP"/prefill*-sm.log | head -2
run_node killdecode
run_node killprefill
stop_topology sm

# the only ERROR lines allowed are the ones the kills and the refusal cause
E2E_ALLOW_ERRORS='decode-bf16|LAYOUT_MISMATCH|refused|lost|closed|unreachable|TRANSFER|transfer|Connection reset|Endpoint timeout|UCX|ucp|kvx'
exit $E2E_FAILED
