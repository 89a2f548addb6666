#!/bin/sh
# issue #25, sitting 33: gemm_variants, ws_gemm_kernel with consumer 1 started WS_LAG k-tiles behind consumer 0
# (gvBN_LAG), a CTA per tile (all) or persistent (pers), against h = HEAD (3b4689d); two rounds alternating
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r33; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do
  for v in h:all 176_0:all 176_0:pers 176_2:all 176_2:pers 192_2:all 176_1:pers 176_3:pers; do
    b=${v%%:*}; m=${v##*:}; e=""; [ $m = all ] && e="GV_GRID_ALL=1"
    if [ $b = h ]; then x=.gpubin/h/gv; else x=.gpubin/g/gv$b; fi
    f=$R/gv_${b}_${m}_$round.txt; env $e timeout 120 $x > $f 2>&1; echo "== $b $m .$round rc=$? $(( $(date +%s) - t0 ))s"
    grep -E "^n=" $f | sed -E 's/\| unwritten 0 of [0-9]+, BF16 out differs 0 \| BF16 flips.*\| bits/| bits/' | cut -c1-150
  done
done
tar czf $OUT/r33.tgz -C /tmp r33
