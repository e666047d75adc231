#!/usr/bin/env bash
# The example worker configurations in deploy/examples load (every key known, every value valid):
# each worker is started from its file with the engine overridden to "trivial" (the model paths
# there do not exist here) and no router reachable, must log its start-up line, and must exit 0 on
# SIGTERM (drain with nothing in flight). Also: an unknown key and a bad flag value are refused
# with exit 2 and a message naming them.
set -u
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for f in deploy/examples/prefill*.json deploy/examples/decode*.json; do
	case $f in *prefill*) bin=$BUILD/tandem-prefill ;; *) bin=$BUILD/tandem-decode ;; esac
	log="$tmp/$(basename "$f").log"
	"$bin" --config "$f" --engine trivial --router "unix:$tmp/no-router.sock" --metrics 127.0.0.1:0 \
		--auth-token-file /dev/null --auth-token x 2>"$log" &
	pid=$!
	sleep 0.3
	# /dev/null as token file is refused (empty): the worker must have exited 2 naming the file
	wait $pid; rc=$?
	if [ $rc -ne 2 ] || ! grep -q "token file /dev/null" "$log"; then
		echo "FAIL $f: empty token file not refused (rc $rc)"; cat "$log"; fail=1
	fi
	echo "secret-token" >"$tmp/token"
	"$bin" --config "$f" --engine trivial --router "unix:$tmp/no-router.sock" --metrics 127.0.0.1:0 \
		--auth-token-file "$tmp/token" 2>"$log" &
	pid=$!
	ok=0
	for _ in $(seq 50); do
		if grep -q "engine trivial" "$log"; then ok=1; break; fi
		sleep 0.1
	done
	kill -TERM $pid
	wait $pid; rc=$?
	if [ $ok -ne 1 ] || [ $rc -ne 0 ]; then
		echo "FAIL $f: started=$ok exit=$rc"; cat "$log"; fail=1
	else
		echo "ok   $f"
	fi
done
echo '{"name": "x", "bogus_key": 1}' >"$tmp/bad.json"
out=$("$BUILD/tandem-decode" --config "$tmp/bad.json" 2>&1); rc=$?
if [ $rc -ne 2 ] || ! grep -q "unknown key 'bogus_key'" <<<"$out"; then echo "FAIL unknown key: $rc $out"; fail=1; fi
out=$("$BUILD/tandem-prefill" --max-batch 0 2>&1); rc=$?
if [ $rc -ne 2 ] || ! grep -q "max_batch" <<<"$out"; then echo "FAIL range: $rc $out"; fail=1; fi
out=$("$BUILD/tandem-prefill" --no-such-flag 1 2>&1); rc=$?
if [ $rc -ne 2 ] || ! grep -q "unknown flag '--no-such-flag'" <<<"$out"; then echo "FAIL flag: $rc $out"; fail=1; fi
"$BUILD/tandem-decode" --help | grep -q -- "--kv-blocks" || { echo "FAIL --help"; fail=1; }
exit $fail
