#!/bin/sh
# issue #25, sitting 36: is one SM's stream of weights the decode kernel's limit? sm_bw: 100 / 132 / 66 CTAs
# streaming the layer's 314.6 MB with cp.async.bulk rings (as wsd_kernel's producer) and with 16-byte loads
set -u
R=$OUT/r36; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
timeout 120 .gpubin/bw/sm_bw > $R/sm_bw.txt 2>&1; echo "rc=$?"; cat $R/sm_bw.txt
