#!/usr/bin/env bash
# Deployment pieces: the systemd units pass `systemd-analyze verify` with nothing on stderr; the
# example router config loads (and a typo in a config is refused by name); Prometheus (Debian's
# package, started here on loopback with a temp config) scrapes the router, and `promtool check
# metrics` is clean on its exposition after real traffic; SIGTERM drains and exits 0.
source "$(dirname "$0")/lib.sh"

# --- systemd units: ExecStart pointed at the built binaries (a worker binary not built yet is
# replaced by the router binary so the unit itself is still verified) ---
mkdir -p "$TMP/units"
for u in "$REPO"/deploy/systemd/*.service; do
	name=$(basename "$u")
	bin=$(sed -n 's#^ExecStart=/usr/local/bin/\([a-z-]*\).*#\1#p' "$u")
	target="$REPO/$BUILD/$bin"
	if [ ! -x "$target" ]; then
		echo "NOTE: $bin not built; verifying $name with tandem-router as its ExecStart binary"
		target="$REPO/$BUILD/tandem-router"
	fi
	sed "s#/usr/local/bin/$bin#$target#" "$u" >"$TMP/units/$name"
done
if ! command -v systemd-analyze >/dev/null; then
	e2e_fail "systemd-analyze not installed (scripts/install-deps.sh installs systemd)"
else
	systemd-analyze verify "$TMP"/units/*.service 2>"$TMP/verify.err" >/dev/null
	if [ -s "$TMP/verify.err" ]; then
		e2e_fail "systemd-analyze verify printed to stderr:"; cat "$TMP/verify.err"
	else
		echo "systemd-analyze verify: clean ($(ls "$TMP"/units | tr '\n' ' '))"
	fi
fi

# --- config handling ---
"$REPO/$BUILD/tandem-router" --help | grep -q -- "--n-queue-max" || e2e_fail "--help does not list --n-queue-max"
echo '{"n_queue_maxx": 3}' >"$TMP/typo.json"
if "$REPO/$BUILD/tandem-router" --config "$TMP/typo.json" 2>"$TMP/typo.err"; then
	e2e_fail "a config with an unknown key was accepted"
fi
grep -q "unknown key 'n_queue_maxx'" "$TMP/typo.err" || { e2e_fail "unknown key not named"; cat "$TMP/typo.err"; }

# --- sd_notify: READY=1 once listening, WATCHDOG=1 at half the watchdog interval, STOPPING=1 on
# SIGTERM (what Type=notify + WatchdogSec in the units rely on) ---
python3 - "$REPO/$BUILD/tandem-router" "$(free_port)" "$TMP" <<'PY' || e2e_fail "sd_notify protocol"
import os, signal, socket, subprocess, sys, time
router, port, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(tmp, "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(path); s.settimeout(5)
env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
p = subprocess.Popen([router, "--engine", "sim", "--port", port], env=env, stderr=open(os.path.join(tmp, "notify-router.log"), "w"))
got = []
t0 = time.time()
while time.time() - t0 < 2:
    got.append(s.recv(4096).decode())
ready = any("READY=1" in m for m in got)
dogs = sum(m.count("WATCHDOG=1") for m in got)
p.send_signal(signal.SIGTERM)
stopping = False
try:
    while not stopping:
        stopping = "STOPPING=1" in s.recv(4096).decode()
except socket.timeout:
    pass
rc = p.wait(10)
print("sd_notify: READY=%s, %d watchdog pings in 2 s (interval 0.2 s), STOPPING=%s, exit %d" % (ready, dogs, stopping, rc))
sys.exit(0 if ready and 10 <= dogs <= 30 and stopping and rc == 0 else 1)
PY

# --- router from the example config (sim engine, flags override the file) ---
PORT=$(free_port)
start router "$REPO/$BUILD/tandem-router" --config "$REPO/deploy/examples/router.json" --engine sim \
	--model-path "" --api-keys-file "" --control-token-file "" --port "$PORT"
wait_http "http://127.0.0.1:$PORT/ready" 20 || exit 1
curl -sf "http://127.0.0.1:$PORT/v1/completions" -d '{"model":"glm-5","prompt":"hello","max_tokens":8}' >/dev/null ||
	e2e_fail "completion through the example config failed"
curl -s "http://127.0.0.1:$PORT/v1/completions" -d '{"model":"glm-5","prompt":"x","stream":true,"max_tokens":4}' >/dev/null
curl -s "http://127.0.0.1:$PORT/v1/nothing" >/dev/null

# --- promtool on the exposition ---
curl -sf "http://127.0.0.1:$PORT/metrics" >"$TMP/router.prom" || e2e_fail "GET /metrics failed"
if promtool check metrics <"$TMP/router.prom" >"$TMP/promtool.out" 2>&1; then
	echo "promtool check metrics: clean ($(grep -c '^# TYPE' "$TMP/router.prom") metric families)"
else
	e2e_fail "promtool check metrics:"; cat "$TMP/promtool.out"
fi
grep -q '^tandem_router_requests_total{outcome="done"} 2$' "$TMP/router.prom" || e2e_fail "done counter is not 2"

# --- Prometheus scraping ---
if ! command -v prometheus >/dev/null; then
	e2e_fail "prometheus not installed (scripts/install-deps.sh installs it)"
else
	PPORT=$(free_port)
	cat >"$TMP/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: tandem-router
    static_configs:
      - targets: ["127.0.0.1:$PORT"]
YML
	start prometheus prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
		--web.listen-address="127.0.0.1:$PPORT" --log.level=warn
	wait_http "http://127.0.0.1:$PPORT/-/ready" 60 || exit 1
	ok=0
	for i in $(seq 1 100); do
		if curl -s "http://127.0.0.1:$PPORT/api/v1/query?query=tandem_router_requests_total" |
			grep -q '"outcome":"done".*"2"'; then ok=1; break; fi
		sleep 0.2
	done
	[ $ok = 1 ] && echo "prometheus scraped tandem_router_requests_total{outcome=done} = 2" ||
		e2e_fail "prometheus did not scrape the router's metrics"
	curl -s "http://127.0.0.1:$PPORT/api/v1/targets" | grep -q '"health":"up"' || e2e_fail "router target not up"
	# every query of the Grafana dashboard is valid PromQL and names metrics the router exports
	python3 - "$REPO/deploy/grafana/tandem-serving.json" "http://127.0.0.1:$PPORT" "$TMP/router.prom" <<'PY' || e2e_fail "dashboard queries"
import json, re, sys, urllib.parse, urllib.request
dash, base, prom = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
bad = 0
for p in json.load(open(dash))["panels"]:
    for t in p["targets"]:
        expr = t["expr"].replace("$__rate_interval", "1m")
        r = json.load(urllib.request.urlopen(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        # the control-plane metrics exist only with real workers (engine "workers"), not with sim
        names = set(re.findall(r"tandem_[a-z0-9_]+", expr)) - {"tandem_router_kv_transferred_bytes_total"}
        missing = [n for n in names if not re.search("^" + n + r"(_bucket)?[ {]", prom, re.M)]
        if r.get("status") != "success" or missing:
            bad += 1
            print("dashboard panel %r: %s %s" % (p["title"], r.get("error", ""), missing))
print("dashboard: %d panels, all queries valid" % len(json.load(open(dash))["panels"]) if not bad else "")
sys.exit(1 if bad else 0)
PY
	stop_one prometheus
fi

stop_one router; st=$?
[ $st -eq 0 ] || e2e_fail "router exited $st after SIGTERM"
exit $E2E_FAILED
