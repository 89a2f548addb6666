import sys, re, collections, statistics as S
pat = re.compile(r'^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+block:(\w+):\s+(.*)$')
ev = []
for line in sys.stdin:
    m = pat.match(line)
    if m: ev.append((float(m.group(4)), m.group(5), m.group(1).strip(), int(m.group(3)), m.group(6)))
ins = {}; iss = {}; lat = []; qwait = []; issuers = collections.Counter(); unplug = collections.Counter()
cpu_issue = collections.Counter(); cpu_comp = collections.Counter()
t0 = None; t1 = None; inflight = 0; area = 0; last = None; n = 0
gaps=[]; lastiss=None; burst=[]; cur=0
for t, kind, comm, cpu, rest in ev:
    if kind == 'block_unplug':
        unplug[rest.split()[-1]] += 1; continue
    mm = re.search(r'\(\) (\d+) \+ (\d+)', rest)
    if not mm: continue
    sec, nsec = int(mm.group(1)), int(mm.group(2))
    if nsec > 2: continue
    key = sec
    if kind == 'block_rq_insert': ins[key] = t
    elif kind == 'block_rq_issue':
        iss[key] = t; issuers[comm.split('/')[0][:10]] += 1; cpu_issue[cpu]+=1
        if key in ins: qwait.append(t - ins.pop(key))
        if lastiss is not None and t - lastiss < 5e-6: cur += 1
        else:
            if cur: burst.append(cur)
            cur = 1
        lastiss = t
        if last is not None: area += inflight * (t - last)
        inflight += 1; last = t
        if t0 is None: t0 = t
    elif kind == 'block_rq_complete' and key in iss:
        cpu_comp[cpu]+=1
        lat.append(t - iss.pop(key)); n += 1
        area += inflight * (t - last); inflight -= 1; last = t; t1 = t
q = sorted(lat)
print("reads %d over %.3f s = %.0f/s; device lat mean %.1f us p50 %.1f p90 %.1f; mean inflight %.2f" % (
    n, t1 - t0, n / (t1 - t0), 1e6 * S.mean(lat), 1e6 * q[len(q)//2], 1e6*q[int(len(q)*.9)], area / (t1 - t0)))
if qwait: print("insert->issue mean %.1f us, p90 %.1f" % (1e6*S.mean(qwait), 1e6*sorted(qwait)[int(len(qwait)*.9)]))
print("issuers", issuers.most_common(4), "issue cpus", dict(cpu_issue), "complete cpus", dict(cpu_comp))
print("unplug counts", unplug.most_common(8))
b=collections.Counter(burst); print("issue bursts (<5us apart) sizes", sorted(b.items())[:12], "mean %.2f" % (S.mean(burst)))
