#!/usr/bin/python3
"""stalls.py SASS_CSV - run 92's warp stall samples per SASS instruction
(ncu --page source --print-source sass --csv) summed by what the warps were
at: the top instructions, then the samples grouped by kind of instruction."""
import csv, io, re, sys

lines = open(sys.argv[1]).read().splitlines()
start = [i for i, l in enumerate(lines) if l.startswith('"Address"')][0]
print(lines[0][:160])
rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
hdr = rows[0]
A, S, N, X = (hdr.index(k) for k in ("Source", "Warp Stall Sampling (All Samples)",
                                       "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed"))
rows = [r for r in rows[1:] if len(r) > X]
total = sum(int(r[S] or 0) for r in rows)
print("samples %d over %d instructions" % (total, len(rows)))
for r in sorted(rows, key=lambda r: -int(r[S] or 0))[:25]:
    print("%7s %5.1f%%  executed %-8s %s" % (r[S], 100.0 * int(r[S]) / total, r[X], r[A].strip()[:70]))
groups, others = {}, []
waitp, since = None, 99  # the predicate of the last try_wait, instructions since
for r in rows:
    src = r[A].strip()
    since += 1
    m = re.search(r"TRYWAIT (P\d)", src)
    if m:
        waitp, since = m.group(1), 0
    if "CGABAR_WAIT" in src or "CGAERRBAR" in src:
        g = "cluster barrier wait (kernel start or end)"
    elif waitp and since <= 8 and re.match(r"@!%s\s+BRA" % waitp, src):
        g = "branch on an mbarrier try_wait (data or free stage not there)"
    elif "TRYWAIT" in src:
        g = "mbarrier try_wait"
    elif "DEPBAR" in src or "WARPGROUP.ARRIVE" in src:
        g = "wgmma wait / arrive (warpgroup)"
    elif "HGMMA" in src:
        g = "wgmma issue (HGMMA)"
    elif src.startswith("FADD") or " FADD" in src:
        g = "FADD (promotion or epilogue)"
    elif src.startswith("ST") or " STG" in src or src.startswith("@") and "STG" in src:
        g = "global stores"
    else:
        g = "other"
        others.append(r)
    groups[g] = groups.get(g, 0) + int(r[S] or 0)
print("by kind:")
for g, v in sorted(groups.items(), key=lambda x: -x[1]):
    print("%7d %5.1f%%  %s" % (v, 100.0 * v / total, g))
print("the largest of the others:")
for r in sorted(others, key=lambda r: -int(r[S] or 0))[:8]:
    print("%7s %5.1f%%  %s" % (r[S], 100.0 * int(r[S]) / total, r[A].strip()[:70]))
