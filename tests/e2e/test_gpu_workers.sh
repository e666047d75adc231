#!/usr/bin/env bash
# tandem-prefill and tandem-decode on the CUDA backend (router + 1 prefill + 1 decode, tiny GLM-DSA
# Q8_0, KV over UCX (shared memory in A: the decode pool is a page-locked shm segment; tcp in B)
# staged through pinned host memory), greedy output through the HTTP API compared token for token:
#  A. prefill cuda + decode cuda (graphs off): == `tandem generate --backend cuda` for every prompt
#     (same kernels, same shapes); == the CPU's `tandem generate` for the prompts of <= 8 tokens
#     (every product on the fp32 GEMV path: tests/model/test_gpu_model.c).
#  B. the mixed pair, prefill cpu + decode cuda (graphs on): == the CPU's `tandem generate` for
#     every prompt (CPU prefill is the reference; decode steps are fp32 GEMVs).
# Without a GPU (or a CUDA build) it prints a loud SKIP and exits 77 (tests/run.sh: skipped). GPUW_CPU=1 runs the same
# phases on the CPU with the staged KV path forced on (kv_staged: the model's pool apart from the
# UCX pool, blocks copied by model_kv_upload / model_kv_download): A = both staged, B = staged
# prefill + unstaged decode; every comparison is then with the CPU's `tandem generate`.
source "$(dirname "$0")/lib.sh"
MODEL="$REPO/tests/data/models/glm-dsa-tiny-Q8_0.gguf"
MODEL_ID=glm-dsa-tiny-Q8_0
CPU_MODE=${GPUW_CPU:-0}
export UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n
for b in tandem tandem-router tandem-prefill tandem-decode; do
	[ -x "$REPO/$BUILD/$b" ] || { e2e_fail "$BUILD/$b is not built"; exit 1; }
done
if [ "$CPU_MODE" = 1 ]; then
	# option checks: a bad backend name, and cuda where there is no device, stop with exit 2 naming it
	for bin in tandem-prefill tandem-decode; do
		"$REPO/$BUILD/$bin" --model "$MODEL" --backend gpu --metrics "" 2>"$TMP/bad.err"
		rc=$?
		[ $rc = 2 ] && grep -q "backend 'gpu': expected" "$TMP/bad.err" ||
			e2e_fail "$bin --backend gpu: exit $rc, $(cat "$TMP/bad.err")"
		if ! nvidia-smi -L >/dev/null 2>&1; then
			"$REPO/$BUILD/$bin" --model "$MODEL" --backend cuda --metrics "" 2>"$TMP/bad.err"
			rc=$?
			[ $rc = 2 ] && grep -q "backend cuda: .*\(no CUDA device\|no CUDA\)" "$TMP/bad.err" ||
				e2e_fail "$bin --backend cuda without a GPU: exit $rc, $(cat "$TMP/bad.err")"
		fi
	done
	rm -f "$TMP/bad.err" # its ERROR lines are expected
fi
# TANDEM_GPU_TESTS=1 (make test-gpu, the GPU session's script): a missing GPU is a failure, not a SKIP
skip_or_fail() {
	if [ "${TANDEM_GPU_TESTS:-0}" = 1 ]; then e2e_fail "$1"; exit 1; fi
	echo "SKIP: $1; the CUDA worker e2e test did not run"
	exit 77 # tests/run.sh counts it as skipped
}
if [ "$CPU_MODE" != 1 ]; then
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
		skip_or_fail "no GPU here"
	fi
	if ! "$REPO/$BUILD/tandem" generate -m "$MODEL" --tokens 5,6,7 -n 1 --greedy --ids --backend cuda >/dev/null 2>"$TMP/probe.err"; then
		skip_or_fail "tandem generate --backend cuda fails (CPU-only build?): $(tail -n 1 "$TMP/probe.err")"
	fi
fi

# prompts: 4 of <= 8 tokens (fp32 paths everywhere), 2 longer (40, 150 tokens: several blocks)
python3 - "$TMP/prompts.txt" <<'PY'
import random, sys
rng = random.Random(4242)
with open(sys.argv[1], "w") as f:
    for n in (4, 6, 8, 7, 40, 150):
        print(",".join(str(rng.randint(3, 1000)) for _ in range(n)), 16, file=f)
PY

gen_refs() { # backend out
	: >"$2"
	while read -r csv n; do
		local exp
		exp=$("$REPO/$BUILD/tandem" generate -m "$MODEL" --tokens "$csv" -n "$n" --greedy --ids --threads 2 --backend "$1" 2>"$TMP/generate.err") ||
			{ e2e_fail "tandem generate --backend $1 failed"; cat "$TMP/generate.err"; exit 1; }
		echo "$csv $n $(echo "$exp" | tail -n 1 | tr ' ' ',')" >>"$2"
	done <"$TMP/prompts.txt"
}
gen_refs cpu "$TMP/ref-cpu.txt"
if [ "$CPU_MODE" = 1 ]; then cp "$TMP/ref-cpu.txt" "$TMP/ref-cuda.txt"; else gen_refs cuda "$TMP/ref-cuda.txt"; fi

topology() { # tag, prefill flags, decode flags, UCX transports
	local tag=$1
	export UCX_TLS=$4
	PORT=$(free_port)
	CPORT=$(free_port)
	start "router-$tag" "$REPO/$BUILD/tandem-router" --model-path "$MODEL" --port "$PORT" \
		--control-addr "127.0.0.1:$CPORT" --heartbeat-ms 500
	wait_http "http://127.0.0.1:$PORT/health" 20 || return 1
	DMPORT=$(free_port)
	PMPORT=$(free_port)
	start "decode-$tag" "$REPO/$BUILD/tandem-decode" --router "127.0.0.1:$CPORT" --model "$MODEL" \
		--name "decode-$tag" --threads 2 --metrics "127.0.0.1:$DMPORT" --heartbeat-ms 500 --kv-blocks 64 --max-batch 8 $3
	start "prefill-$tag" "$REPO/$BUILD/tandem-prefill" --router "127.0.0.1:$CPORT" --model "$MODEL" \
		--name "prefill-$tag" --threads 2 --metrics "127.0.0.1:$PMPORT" --heartbeat-ms 500 --local-blocks 16 $2
	local deadline=$((SECONDS + 40))
	while [ $SECONDS -lt $deadline ]; do
		local m; m=$(curl -s "http://127.0.0.1:$PORT/metrics")
		if echo "$m" | grep -q '^tandem_router_workers{role="decode"} 1' &&
			echo "$m" | grep -q '^tandem_router_workers{role="prefill"} 1'; then
			return 0
		fi
		sleep 0.2
	done
	e2e_fail "$tag: workers did not register within 40 s"
	return 1
}

# check tag refs strict_max_len [concurrent]: one request at a time (batch 1, the shapes of tandem
# generate), or all at once (sequences join the running batch at different steps); prompts longer
# than strict_max_len are only reported against refs
check() {
	python3 - "http://127.0.0.1:$PORT" "$MODEL_ID" "$2" "$3" "$1" "${4:-0}" <<'PY' || e2e_fail "$1: greedy output differs (see above)"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, model, refs, strict, tag, conc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1"
bad = 0
lines = open(refs).read().split("\n")[:-1]
if len(lines) != 6:
    sys.exit(f"{tag}: {len(lines)} references, expected 6")
def ask(line):
    csv, n, exp = line.split()
    prompt = [int(x) for x in csv.split(",")]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": int(n), "temperature": 0,
                       "logprobs": 0, "return_tokens_as_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))
with ThreadPoolExecutor(len(lines) if conc else 1) as ex:
    answers = list(ex.map(ask, lines))
for line, r in zip(lines, answers):
    csv, n, exp = line.split()
    prompt = [int(x) for x in csv.split(",")]
    expect = [int(x) for x in exp.split(",") if x]
    ch = r["choices"][0]
    got = [int(t[len("token_id:"):]) for t in ch["logprobs"]["tokens"]]
    ok = got == expect if ch["finish_reason"] == "length" else got == expect[:len(got)]
    same = next((i for i in range(min(len(got), len(expect))) if got[i] != expect[i]), min(len(got), len(expect)))
    must = len(prompt) <= strict
    print(f"{tag}: prompt of {len(prompt):3d} tokens: {'same as' if ok else 'DIFFERS from'} the reference "
          f"({same} of {len(expect)} tokens agree{'' if must else ', reported only'})")
    if not ok and must:
        bad += 1
sys.exit(1 if bad else 0)
PY
}

stop_topology() {
	for n in "prefill-$1" "decode-$1" "router-$1"; do
		stop_one "$n" || e2e_fail "$n exited $? after SIGTERM"
	done
}

if [ "$CPU_MODE" = 1 ]; then
	A_PF="--kv-staged true" A_DC="--kv-staged true --kv-upload-step-kb 100"
	B_PF="--kv-staged true" B_DC=""
	A_STRICT_CPU=100000 A_STRICT_CONC=100000 REF2=cpu-again
else
	A_PF="--backend cuda --max-seq-len 512" A_DC="--backend cuda --graphs 0 --max-seq-len 512 --kv-upload-step-kb 100"
	B_PF="" B_DC="--backend cuda --graphs 1 --max-seq-len 512"
	A_STRICT_CPU=8 A_STRICT_CONC=0 REF2=cuda
fi

# --- A. both workers on the device (CPU mode: both staged); decode uploads one prompt block per
# step (--kv-upload-step-kb below one block), so sequences join the batch over several steps ---
topology a "$A_PF" "$A_DC" sm,self || exit 1
check "a-vs-generate-$REF2" "$TMP/ref-cuda.txt" 100000
check a-vs-generate-cpu "$TMP/ref-cpu.txt" "$A_STRICT_CPU"
# all six at once: on the CPU batched decode is exact; on the GPU a batch of several sequences
# takes other GEMV shapes than batch 1, so that comparison is reported only
check a-concurrent-vs-generate-cpu "$TMP/ref-cpu.txt" "$A_STRICT_CONC" 1
# staging metrics: decode copied the prompt blocks of 3 x 6 requests (1,1,1,1,1,3 blocks each) into
# its model pool; prefill timed its device -> host copies
bb=$(grep -o 'KV pool 64 blocks x [0-9]* bytes' "$TMP/decode-a.log" | awk '{print $6}')
staged=$(curl -s "http://127.0.0.1:$DMPORT/metrics" | awk '/^tandem_decode_kv_staged_bytes_total/ {print $2}')
[ -n "$bb" ] && [ "$staged" = "$((24 * bb))" ] && echo "decode staged $staged bytes = 24 blocks of $bb" ||
	e2e_fail "tandem_decode_kv_staged_bytes_total is '$staged', expected 24 blocks of '$bb' bytes"
n_dl=$(curl -s "http://127.0.0.1:$PMPORT/metrics" | awk '/^tandem_prefill_kv_stage_seconds_count/ {print $2}')
[ "${n_dl:-0}" -ge 18 ] && echo "prefill staged blocks in $n_dl copies" ||
	e2e_fail "tandem_prefill_kv_stage_seconds_count is '$n_dl', expected >= 18 (one per request at least)"
stop_topology a
grep -q "KV staged" "$TMP/decode-a.log" || e2e_fail "decode-a did not stage its KV"
grep -q "KV staged" "$TMP/prefill-a.log" || e2e_fail "prefill-a did not stage its KV"
grep -h "KV staged\|slower" "$TMP/decode-a.log" "$TMP/prefill-a.log" | sed 's/^/  /'

# --- B. the mixed pair: prefill on the CPU, decode on the device (CPU mode: staged prefill,
# unstaged decode); the same KV layout fingerprint on both sides ---
topology b "$B_PF" "$B_DC" tcp || exit 1
check b-vs-generate-cpu "$TMP/ref-cpu.txt" 100000
stop_topology b
grep -h "fingerprint" "$TMP/decode-b.log" | head -1 | sed 's/^/  /'
exit $E2E_FAILED
