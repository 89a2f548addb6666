#!/bin/sh
# issue #25, sitting 84 (session t): engram.cuda under torch.cuda.graph capture.  py = this session's tree
# (python/src/cuda.c: an apply on a capturing stream neither waits on nor records the layer's event, and refuses
# what a replay cannot repeat); py0 = the binding before it (main at 0f8b562, module only).  The Python GPU tests
# (python/cuda_device_run.sh: tests/python/test_cuda.py, test_graph_capture new) on py; then probe_capture.py on
# py0 and on py (what a capture does, printed, not asserted); then the decode rows and the paired prefill of e1
# (run 82's build) once, if the card is an H200.
# carry [".gpubin/py", ".gpubin/py0", ".gpubin/e1"]
set -u
t0=$(date +%s)
RUN=${RUN:-r84}
R=/tmp/$RUN; mkdir -p $R
sh python/cuda_device_run.sh .gpubin/py $R > $R/cuda_device_run.txt 2>&1; echo "python tests rc=$? $(( $(date +%s) - t0 ))s"
grep -E "PASS|FAIL|passed|failed|graph capture|Error|assert" $R/cuda_device_run.txt | head -30
tar czf $OUT/$RUN.tgz -C /tmp $RUN
PY=
for p in /opt/torch/.venv/bin/python3 $(command -v python3); do
  if [ -x "$p" ] && "$p" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then PY=$p; break; fi
done
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" ENGRAM_TEST_M64=/tmp/engram_models/m64.gguf
for b in py0 py; do
  PYTHONPATH=.gpubin/$b/python timeout 120 "$PY" bench/results/2026-12-04-cuda-dec/run84/probe_capture.py > $R/probe_$b.txt 2>&1
  echo "probe $b rc=$? $(( $(date +%s) - t0 ))s"; cat $R/probe_$b.txt | cut -c1-300
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
grep -q H200 $R/machine.txt || exit 0   # the benches only on an H200 (none timed since session l)
f=$R/bench_e1.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/e1/bench_cuda > $f 2>&1
echo "bench e1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s | ", $1, $2, $3, $11} END {print ""}' | cut -c1-200
grep -E "a plan\)|CUDA graph\)|32 direct|host's side" $f | cut -c1-220
f=$R/paired_e1.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/e1/bench_cuda > $f 2>&1
echo "paired e1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-150
tar czf $OUT/$RUN.tgz -C /tmp $RUN
