#!/bin/sh
# device_run.sh BIN OUT - everything issue #11 asks of a GPU machine, in one
# call: the GPU test program, the benchmarks against the card's floors, the
# numpy float64 reference on GPU outputs (tests/test_apply.sh), and engram
# run --device cuda end to end on the machine's own disk.  BIN holds engram,
# test_cuda and bench_cuda built elsewhere (static liburing/jansson/utf8proc;
# cuBLAS and the CUDA runtime from the machine).  Logs go to OUT.
set -u
BIN=$1
OUT=$2
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{
    date -u; uname -r; nvidia-smi -L; nproc; free -g | head -2; df -h /tmp | tail -1
    echo "cublas from: $lib"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
echo "== test_cuda"
"$BIN/test_cuda" > "$OUT/test_cuda.txt" 2>&1; echo "test_cuda rc=$?"; tail -25 "$OUT/test_cuda.txt"
echo "== bench_cuda"
"$BIN/bench_cuda" > "$OUT/bench_cuda.txt" 2>&1; echo "bench_cuda rc=$?"; cat "$OUT/bench_cuda.txt"
echo "== test_apply.sh on the GPU"
mkdir -p /tmp/b && cp "$BIN/engram" "$BIN/engram-cuda.so" /tmp/b/
for dev in cuda-fma cuda; do
    ENGRAM_DEVICE=$dev PY=python3 sh tests/test_apply.sh /tmp/b > "$OUT/test_apply_$dev.txt" 2>&1
    echo "test_apply.sh ($dev) rc=$?"
    grep -E "layer|end to end|gate and|projection|passed|FAIL" "$OUT/test_apply_$dev.txt" | head -30
done
echo "== engram run --device cuda"
/tmp/b/engram build /tmp/m5120.gguf --base 16000 --width 5120 --fill normal --seed 1 > "$OUT/run.txt" 2>&1
for args in "--device cuda" "--device cuda --no-overlap" "--device cuda --no-prefetch" "--device cuda-fma" "--threads 8"; do
    echo "-- engram run /tmp/m5120.gguf --sessions 8 --decode 64 $args" >> "$OUT/run.txt"
    /tmp/b/engram run /tmp/m5120.gguf --sessions 8 --decode 64 $args >> "$OUT/run.txt" 2>&1
done
cat "$OUT/run.txt"
echo "== bench_ds4 (engram's layer beside ds4's route, #25; BIN must hold bench_ds4)"
"$BIN/bench_ds4" > "$OUT/bench_ds4.txt" 2>&1; echo "bench_ds4 rc=$?"; cat "$OUT/bench_ds4.txt"
