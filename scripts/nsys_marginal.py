#!/usr/bin/env python3
"""Per-kernel marginal cost of a decode step from an nsys kernel trace (the method of
docs/PERFORMANCE.md since session 9, as a script).

  nsys profile -o /tmp/p --cuda-graph-trace=node tandem bench ... --gen 12
  nsys stats --report cuda_gpu_trace --format csv -o /tmp/p /tmp/p.nsys-rep
  scripts/nsys_marginal.py /tmp/p_cuda_gpu_trace.csv [--tail 0.3] [--layers 78]
or, where `nsys stats` is missing (the lent H200 has only the nsys bundled with Nsight Compute,
/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys, which leaves a .qdstrm: convert it with
../linux-desktop-glibc_2_11_3-x64/QdstrmImporter -i /tmp/p.qdstrm (it needs libdw.so.1 and
libelf.so.1, copied from Debian into the carry), then nsys export --type sqlite -o /tmp/p.sqlite
/tmp/p.nsys-rep):
  scripts/nsys_marginal.py /tmp/p.sqlite

Only the last TAIL fraction of the kernels (the graph replays) counts. A kernel's marginal cost is its
end minus the latest end of any kernel before it (by start time), floored at 0: under PDL kernels
overlap, so durations overstate what each adds to the step, and marginals sum to the busy time. Rows:
kernel name (template arguments cut) and grid, median marginal and duration in us, calls, and the
marginal a layer (sum over the tail / layers / steps, where --steps is the number of replays in the
tail; unset: calls of the most frequent kernel / layers). Last: the busy time and the idle time
(gaps with no kernel running) over the tail."""
import csv
import sqlite3
import statistics
import sys


def short(name):
    n = name.split('(')[0]
    if '<' in n:
        n = n.split('<')[0]
    return n.replace('void ', '').strip()


def csv_rows(path):
    """the rows of an `nsys stats --report cuda_gpu_trace --format csv` file"""
    with open(path, newline='') as f:
        yield from csv.DictReader(f)


def sqlite_rows(path):
    """the kernel rows of an `nsys export --type sqlite` file, keyed as in the csv report"""
    db = sqlite3.connect(path)
    names = dict(db.execute('select id, value from StringIds'))
    cols = [c[1] for c in db.execute('pragma table_info(CUPTI_ACTIVITY_KIND_KERNEL)')]
    nm = 'demangledName' if 'demangledName' in cols else 'shortName'
    q = 'select start, end, %s, gridX, gridY, gridZ from CUPTI_ACTIVITY_KIND_KERNEL' % nm
    for st, en, n, gx, gy, gz in db.execute(q):
        yield {'Start (ns)': st, 'Duration (ns)': en - st, 'Name': names.get(n, '?'),
               'GrdX': gx, 'GrdY': gy, 'GrdZ': gz}


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path = args[0]
    tail, layers, steps_arg = 0.3, 78, None
    i = 1
    while i < len(args):
        if args[i] == '--tail':
            tail = float(args[i + 1])
            i += 2
        elif args[i] == '--layers':
            layers = int(args[i + 1])
            i += 2
        elif args[i] == '--steps':
            steps_arg = float(args[i + 1])
            i += 2
        else:
            print('unknown argument', args[i])
            return 2
    rows = []
    for r in sqlite_rows(path) if path.endswith('.sqlite') else csv_rows(path):
        try:
            st, du = int(r['Start (ns)']), int(r['Duration (ns)'])
        except (KeyError, ValueError):
            continue
        name = r.get('Name', '')
        if 'memcpy' in name.lower() or 'memset' in name.lower():
            continue
        grid = '%sx%sx%s' % (r.get('GrdX', '?'), r.get('GrdY', '?'), r.get('GrdZ', '?'))
        rows.append((st, st + du, short(name), grid))
    if not rows:
        print('no kernels in', path)
        return 1
    rows.sort()
    rows = rows[int(len(rows) * (1 - tail)):]
    t0, t1 = rows[0][0], max(r[1] for r in rows)
    last_end = rows[0][0]
    busy = 0
    stats = {}
    for st, en, name, grid in rows:
        marg = max(0, en - max(last_end, st))
        busy += marg
        last_end = max(last_end, en)
        s = stats.setdefault((name, grid), ([], []))
        s[0].append(marg)
        s[1].append(en - st)
    top = max(len(v[0]) for v in stats.values())
    # unset: the most frequent kernel's calls a layer; a kernel run twice a layer (GLM-5's two norms)
    # halves the per-layer column, so pass --steps when the kernel mix is known
    steps = steps_arg if steps_arg else top / layers
    print('%-40s %-14s %8s %8s %6s %9s' % ('kernel', 'grid', 'marg_us', 'dur_us', 'calls', 'us/layer'))
    out = []
    for (name, grid), (m, d) in stats.items():
        out.append((sum(m) / 1000.0 / layers / steps, name, grid, statistics.median(m) / 1000.0,
                    statistics.median(d) / 1000.0, len(m)))
    out.sort(reverse=True)
    tot = 0.0
    for per_layer, name, grid, mm, dd, n in out:
        tot += per_layer
        if per_layer < 0.05:
            continue
        print('%-40s %-14s %8.2f %8.2f %6d %9.2f' % (name[:40], grid, mm, dd, n, per_layer))
    span = (t1 - t0) / 1000.0
    print('tail: %.1f us, busy %.1f us (%.1f%%), idle %.1f us; %.1f steps of %d layers; %.2f us a layer' %
          (span, busy / 1000.0, 100.0 * busy / 1000.0 / span, span - busy / 1000.0, steps, layers, tot))
    return 0


if __name__ == '__main__':
    sys.exit(main())
