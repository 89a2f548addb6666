#!/bin/sh
# issue #25, sitting 25: wsd.cu (the decode projection shaped as cuBLAS's nvjet 256xB kernels, weights as
# wgmma's A from shared memory, ws_gemm's promotion): its time at n = 1..64 against cuBLAS and ws_gemm, and
# whether its bits are ws_gemm's (tokens as A) on the same operands; three runs
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r25; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
for i in 1 2 3; do timeout 120 .gpubin/w/wsd > $R/wsd_$i.txt 2>&1; echo "rc=$?"; cat $R/wsd_$i.txt; done
tar czf $OUT/r25.tgz -C /tmp r25
