#!/bin/sh
# issue #25, sitting 85 (session u).  u1 = main at 3aedd3e plus engram_cuda_apply's graphs of decode calls (the
# second sighting of a call's arguments captured into a graph, launched from then on; ENGRAM_CUDA_NO_GRAPH to
# launch kernel by kernel) and test_cuda's graphs(); h1 = main at 3aedd3e (bench only).  pyu = u1's Python modules
# and engram; py0 = the binding at 0f8b562 (module only), for run 84's probe.
# PART=1: test_cuda W = 64 (quick) and test_ple_cuda on u1; the Python GPU tests on pyu (test_graph_capture's first
# run); the probe on py0 and pyu; the decode rows of h1 and u1 in turn, twice.
# PART=2: test_apply.sh (cuda) on u1; test_cuda every fixture on u1; u1's paired prefill.
# carry [".gpubin/h1", ".gpubin/u1", ".gpubin/pyu", ".gpubin/py0"]
set -u
t0=$(date +%s)
RUN=${RUN:-r85}
PART=${PART:-1}
R=/tmp/$RUN; mkdir -p $R
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine$PART.txt 2>&1; cat $R/machine$PART.txt
if [ "$PART" = 1 ]; then
ENGRAM_TEST_CUDA_QUICK=1 timeout 100 .gpubin/u1/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda u1 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: |^graphs" $R/test_cuda_quick.txt | head -12; grep -E "errors:|W=64 plan|graphs \(" $R/test_cuda_quick.txt | cut -c1-400; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 100 .gpubin/u1/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda u1 rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_ple_cuda.txt
sh python/cuda_device_run.sh .gpubin/pyu $R/py > $R/cuda_device_run.txt 2>&1; echo "python tests rc=$? $(( $(date +%s) - t0 ))s"
grep -E "PASS|FAIL|passed|failed|capture|Error|assert" $R/cuda_device_run.txt | head -30
tar czf $OUT/$RUN.tgz -C /tmp $RUN
PY=
for p in /opt/torch/.venv/bin/python3 $(command -v python3); do
  if [ -x "$p" ] && "$p" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then PY=$p; break; fi
done
export ENGRAM_TEST_M64=/tmp/engram_models/m64.gguf
for b in py0 pyu; do
  PYTHONPATH=.gpubin/$b/python timeout 60 "$PY" bench/results/2026-12-04-cuda-dec/run84/probe_capture.py > $R/probe_$b.txt 2>&1
  echo "probe $b rc=$? $(( $(date +%s) - t0 ))s"; cut -c1-300 $R/probe_$b.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in h1 u1; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s %s | ", $1, $2, $3, $11, $13} END {print ""}' | cut -c1-220
    grep -E "a plan\)|32 direct|host's side|NO_GRAPH\)|changing" $f | cut -c1-260
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
else
mkdir -p /tmp/b && cp .gpubin/u1/engram .gpubin/u1/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 60 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 280 .gpubin/u1/test_cuda > $R/test_cuda_u1.txt 2>&1; echo "test_cuda u1 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_u1.txt | head -8; tail -1 $R/test_cuda_u1.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
f=$R/paired_u1.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/u1/bench_cuda > $f 2>&1
echo "paired u1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-150
tar czf $OUT/$RUN.tgz -C /tmp $RUN
fi
