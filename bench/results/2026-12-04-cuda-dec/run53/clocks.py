#!/usr/bin/python3
# run 53: each BENCH_CUDA_LOOP batch (20 calls) beside the nvidia-smi samples taken during it (SM clock, power,
# clock event reasons; 0x4 = software power cap, 0x1 = idle); then the stamps' per-kernel medians per sequence.
# usage: /usr/bin/python3 clocks.py run53/out
import datetime, math, re, statistics as st, sys
d = sys.argv[1] if len(sys.argv) > 1 else 'out'
smi = []
for l in open(d + '/smi.csv').read().splitlines()[1:]:
    f = [x.strip() for x in l.split(',')]
    t = datetime.datetime.strptime(f[0], '%Y/%m/%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
    smi.append((t, int(f[1].split()[0]), float(f[3].split()[0]), f[5]))
out = {}
for l in open(d + '/loop.txt'):
    m = re.match(r'loop (.+?)\s+([\d.]+) ms a call, wall (\d+\.\d+)', l)
    if not m:
        continue
    w, ms, end = m.group(1).strip(), float(m.group(2)), float(m.group(3))
    s = [x for x in smi if end - 20 * ms / 1e3 <= x[0] <= end]
    if s:
        out.setdefault(w, []).append((ms, st.mean(x[1] for x in s), st.mean(x[2] for x in s), {x[3] for x in s}))
for w, v in out.items():
    v.sort()
    n = len(v)
    print(f'{w}: {n} batches; by time per call (min, quartiles, max):')
    for q in (0, n // 4, n // 2, 3 * n // 4, n - 1):
        ms, clk, pw, rs = v[q]
        print(f'   {ms:.3f} ms  SM clock {clk:.0f} MHz  power {pw:.0f} W  reasons {",".join(sorted(rs))}')
    xs, ys = [a[0] for a in v], [a[1] for a in v]
    mx, my = st.mean(xs), st.mean(ys)
    c = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / math.sqrt(sum((a - mx) ** 2 for a in xs) * sum((b - my) ** 2 for b in ys))
    e = st.median(xs) * st.mean(a[2] for a in v)
    print(f'   correlation(time, clock) {c:.2f}; mean clock {my:.0f} MHz, mean power {st.mean(a[2] for a in v):.0f} W;'
          f' median time x mean power = {e:.0f} mJ a call')
seq = {}
for l in open(d + '/stamps.txt'):
    m = re.match(r'stamp (.+?)\s+\d+ ev\s+([\d.]+) us \|(.*)\| span', l)
    if not m:
        continue
    ks = dict((k, float(t)) for k, _, t in re.findall(r'(\w+) ([+-][\d.]+) ([\d.]+)', m.group(3)))
    seq.setdefault(m.group(1).strip(), []).append((float(m.group(2)), ks))
for w, v in seq.items():
    v.sort(key=lambda a: a[0])
    fast, slow = v[: len(v) // 4], v[-(len(v) // 4):]
    names = list(v[0][1])
    f = lambda part, k: st.median(a[1][k] for a in part)
    print(f'stamps, {w}: {len(v)} calls; median us, fastest quarter / slowest quarter of calls: event '
          f'{st.median(a[0] for a in fast):.1f} / {st.median(a[0] for a in slow):.1f}; ' +
          ', '.join(f'{k} {f(fast, k):.1f} / {f(slow, k):.1f}' for k in names))
