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
A, S, X = (hdr.index(k) for k in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"))
rows = [r for r in rows[1:] if len(r) > X]
total = sum(int(r[S] or 0) for r in rows)
print("samples %d over %d instructions" % (total, len(rows)))
for r in sorted(rows, key=lambda r: -int(r[S] or 0))[:25]:
    print("%7s %5.1f%%  executed %-8s %s" % (r[S], 100.0 * int(r[S]) / total, r[X], r[A].strip()[:70]))
groups, others = {}, []
at = {int(r[hdr.index("Address")], 16): i for i, r in enumerate(rows)}  # address -> row


def to_wait(src):
    """a branch whose target begins a try_wait retry (a TRYWAIT or a
    sleeping SYNCS within its first four instructions)"""
    m = re.search(r"BRA .*?(0x[0-9a-f]+)", src)
    if not m or int(m.group(1), 16) not in at:
        return False
    i = at[int(m.group(1), 16)]
    return any("TRYWAIT" in rows[j][A] or "NANOSLEEP.SYNCS" in rows[j][A] for j in range(i, min(i + 4, len(rows))))


for r in rows:
    src = r[A].strip()
    if "CGABAR_WAIT" in src or "CGAERRBAR" in src:
        g = "cluster barrier wait (kernel start or end)"
    elif "BRA" in src and to_wait(src):
        g = "branch to an mbarrier try_wait retry (data or free stage not there)"
    elif "NANOSLEEP.SYNCS" in src:
        g = "sleep in an mbarrier retry"
    elif "TRYWAIT" in src:
        g = "mbarrier try_wait"
    elif "DEPBAR" in src or "WARPGROUP.ARRIVE" in src:
        g = "wgmma wait / arrive (warpgroup)"
    elif "HGMMA" in src:
        g = "wgmma issue (HGMMA)"
    elif src.startswith("FADD") or " FADD" in src:
        g = "FADD (promotion or epilogue)"
    elif src.startswith("ST") or "STG" in src:
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
