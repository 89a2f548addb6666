#!/bin/sh
# issue #25, sitting 40 (prepared 2026-12-05 when no device was lent): main's test_cuda at c37b369 (h: the
# library of 43fb7a5, unchanged since; the test adds the prefill captured into a CUDA graph), whole.
# run39.sh runs the branch's (epg, 0d4e003: the same test cherry-picked onto e60afd8).
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r40; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
echo "== test_cuda (h, main c37b369)"; timeout 400 .gpubin/h/test_cuda > $R/test_cuda_h.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER|in a graph" $R/test_cuda_h.txt | head -20; tail -1 $R/test_cuda_h.txt
tar czf $OUT/r40.tgz -C /tmp r40
