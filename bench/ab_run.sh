#!/bin/sh
# ab_run.sh OLD_ENGRAM NEW_ENGRAM ROUNDS MODEL [RUN ARGS...] - `engram run`
# with two binaries on the same model file, alternating (old first in odd
# rounds, new first in even ones), printing prefill and decode tokens/s and
# the residuals' checksum (which must agree: the same arithmetic) per run,
# then each side's median.
#   sh bench/ab_run.sh /tmp/old/build/engram build/engram 3 build/demo.gguf
set -eu
[ $# -ge 4 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
old=$1 new=$2 rounds=$3 model=$4
shift 4
one() { # one LABEL BINARY [RUN ARGS...]
    label=$1 bin=$2
    shift 2
    "$bin" run "$model" --json "$@" 2>/dev/null | /usr/bin/python3 -c "
import json, sys
d = json.load(sys.stdin)
print('%s prefill %.1f tok/s  decode %.1f tok/s  checksum %s' % (sys.argv[1], d['prefill']['tokens_per_s'], d['decode']['tokens_per_s'], d['checksum']))
" "$label"
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "ab_run $(date -u '+%Y-%m-%d %H:%M UTC') $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; model $model; args: $*"
r=1
while [ "$r" -le "$rounds" ]; do
    if [ $((r % 2)) -eq 1 ]; then
        one old "$old" "$@" | tee -a "$out"
        one new "$new" "$@" | tee -a "$out"
    else
        one new "$new" "$@" | tee -a "$out"
        one old "$old" "$@" | tee -a "$out"
    fi
    r=$((r + 1))
done
/usr/bin/python3 - "$out" <<'PY'
import re, statistics, sys
runs = {'old': [], 'new': []}
sums = set()
for line in open(sys.argv[1]):
    m = re.match(r'(old|new) prefill ([\d.]+) tok/s  decode ([\d.]+) tok/s  checksum (\w+)', line)
    if m:
        runs[m.group(1)].append((float(m.group(2)), float(m.group(3))))
        sums.add(m.group(4))
for side in ('old', 'new'):
    p = statistics.median(x[0] for x in runs[side]); d = statistics.median(x[1] for x in runs[side])
    print('median %s: prefill %.1f tok/s, decode %.1f tok/s' % (side, p, d))
po = statistics.median(x[0] for x in runs['old']); pn = statistics.median(x[0] for x in runs['new'])
do = statistics.median(x[1] for x in runs['old']); dn = statistics.median(x[1] for x in runs['new'])
print('new/old: prefill %.3f, decode %.3f; checksums %s' % (pn / po, dn / do, 'all equal' if len(sums) == 1 else 'DIFFER: ' + ' '.join(sorted(sums))))
PY
