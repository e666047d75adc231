#!/usr/bin/env bash
# tandem vs llama.cpp (CPU) on the same GGUFs: prefill and decode tokens/s, best of R runs per engine
# (this machine is shared, so the best run is the least disturbed one), as a markdown table.
#   [TANDEM_BENCH_FLAGS=--fast] bench/llamacpp/compare.sh "MODEL1 MODEL2 ..." [PROMPT] [GEN] [THREADS_LIST] [R]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
models=$1 P=${2:-128} G=${3:-64} TL=${4:-"1 2"} R=${5:-2}
out=$(mktemp)
for T in $TL; do
	for r in $(seq 1 "$R"); do
		for m in $models; do
			"$here/run.sh" "$m" "$P" "$G" "$T" 2>/dev/null | grep '^{' >>"$out" || true
		done
	done
done
python3 - "$out" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    eng = 'llama' if 'engine' in r else 'tandem'
    k = (r['model'].split('/')[-1], r['threads'], eng)
    b = best.setdefault(k, [0.0, 0.0])
    b[0] = max(b[0], r['prefill_tok_s']); b[1] = max(b[1], r['decode_tok_s'])
print("| model | threads | tandem prefill tok/s | llama.cpp prefill tok/s | ratio | tandem decode tok/s | llama.cpp decode tok/s | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (m, t, e), v in sorted(best.items()):
    if e != 'tandem' or (m, t, 'llama') not in best:
        continue
    l = best[(m, t, 'llama')]
    print(f"| {m} | {t} | {v[0]:.1f} | {l[0]:.1f} | {v[0]/l[0]:.2f} | {v[1]:.1f} | {l[1]:.1f} | {v[1]/l[1]:.2f} |")
PY
rm -f "$out"
