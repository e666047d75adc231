# Shared helpers for the end-to-end tests (sourced by tests/e2e/test_*.sh): free ports, starting
# processes with their logs in a temp dir, polling readiness with a deadline, teardown with TERM
# then KILL, and a final check that no process crashed or logged an ERROR line.
set -u
BUILD=${BUILD:-build}
E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$E2E_DIR/../.." && pwd)
# the tests name binaries as $REPO/$BUILD/...: an absolute BUILD becomes relative to the repo
case $BUILD in /*) BUILD=$(realpath -m --relative-to="$REPO" "$BUILD") ;; esac
TMP=$(mktemp -d /tmp/tandem-e2e.XXXXXX)
PIDS=()
NAMES=()
E2E_FAILED=0

e2e_log() { echo "[$(date +%H:%M:%S)] $*"; }
e2e_fail() { echo "E2E FAIL: $*"; E2E_FAILED=1; }

# free_port: a port that binds now, below the kernel's ephemeral range (outgoing connections take their
# source ports from that range, so a port the kernel handed out with bind(0) could be taken by one
# before the worker binds it: decode1-tcp once failed "address already in use" that way) and not
# handed out before in this test ($TMP/ports)
free_port() {
	python3 - "$TMP/ports" <<'PY'
import random, socket, sys
try:
    used = set(int(x) for x in open(sys.argv[1]).read().split())
except OSError:
    used = set()
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
port = 0
for _ in range(1000 if lo > 11000 else 0):
    p = random.randrange(10000, lo)
    if p in used:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        port = p
        break
    except OSError:
        pass
    finally:
        s.close()
if not port:  # no room below the range: any free port
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
open(sys.argv[1], "a").write("%d\n" % port)
print(port)
PY
}

# start NAME CMD...: runs CMD in the background, output to $TMP/NAME.log
start() {
	local name=$1; shift
	"$@" >"$TMP/$name.log" 2>&1 &
	PIDS+=($!)
	NAMES+=("$name")
	e2e_log "started $name (pid $!): $*"
}

pid_of() {
	local i
	for i in "${!NAMES[@]}"; do [ "${NAMES[$i]}" = "$1" ] && echo "${PIDS[$i]}"; done
}

# wait_http URL [seconds]: polls until URL answers 200
wait_http() {
	local url=$1 deadline=$((SECONDS + ${2:-30}))
	while [ $SECONDS -lt $deadline ]; do
		if curl -sf -o /dev/null "$url"; then return 0; fi
		sleep 0.1
	done
	e2e_fail "timed out waiting for $url"
	return 1
}

# stop_one NAME: TERM, wait up to 10 s, then KILL; returns the exit status
stop_one() {
	local pid; pid=$(pid_of "$1")
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null || true
	local i
	for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$pid" 2>/dev/null; then
		e2e_fail "$1 did not exit within 10 s of SIGTERM; killing"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null
}

# Checks every log for crashes and ERROR lines (allowed patterns in E2E_ALLOW_ERRORS, a regex).
check_logs() {
	local f
	for f in "$TMP"/*.log; do
		[ -f "$f" ] || continue
		if grep -E "AddressSanitizer|runtime error:|Segmentation fault|Aborted|assertion failed" "$f" >/dev/null; then
			e2e_fail "crash in $(basename "$f")"; tail -n 40 "$f"
		fi
		if grep -E " ERROR " "$f" | grep -Ev "${E2E_ALLOW_ERRORS:-^\$}" >/dev/null; then
			e2e_fail "ERROR line in $(basename "$f")"; grep -E " ERROR " "$f" | head -5
		fi
	done
}

teardown() {
	local i
	for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do
		local pid=${PIDS[$i]}
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do
		local pid=${PIDS[$i]} n
		for n in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	check_logs
	if [ "$E2E_FAILED" != 0 ]; then
		echo "--- logs in $TMP ---"
		for f in "$TMP"/*.log; do echo "== $f"; tail -n 20 "$f"; done
	else
		rm -rf "$TMP"
	fi
}
trap teardown EXIT

# Installs the OpenAI client into tests/e2e/node_modules once (git-ignored). Returns 1 if npm
# or the registry is unavailable.
ensure_openai() {
	if [ -f "$E2E_DIR/node_modules/openai/package.json" ] &&
		grep -q '"version": "6.49.0"' "$E2E_DIR/node_modules/openai/package.json"; then
		return 0
	fi
	command -v npm >/dev/null || { echo "npm not found"; return 1; }
	(cd "$E2E_DIR" && timeout 300 npm ci --no-audit --no-fund --loglevel=error >"$TMP/npm.log" 2>&1) || {
		cat "$TMP/npm.log"; return 1; }
}
