#!/bin/sh
# nccl_device_run.sh BIN OUT - libengram-nccl on a GPU machine, in one call:
# finds NCCL (libnccl.so.2 and nccl.h: a system package, or the pip package
# nvidia-nccl-cu13's nvidia/nccl/), checks cuda/nccl_abi.h against every
# nccl.h found (BIN/nccl_abi_check.c and BIN/nccl_abi.h, compiled here),
# builds the demo model with BIN/engram and runs BIN/test_nccl on it and on
# its own model.  BIN holds test_nccl, nccl_stub.so, nccl_stub_all.so and
# engram built elsewhere (static liburing/jansson/utf8proc, the CUDA
# runtime static); logs go to OUT.  NVLink multicast stays off.
set -u
BIN=$1
OUT=$2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
    date -u; uname -r; nvidia-smi -L; nproc; ldd --version | head -1
    echo "NCCL files:"; find / \( -name 'libnccl.so*' -o -name nccl.h \) -not -path '/proc/*' 2>/dev/null
    echo "MPI: $(command -v mpicc) $(command -v mpirun)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
lib=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
echo "== libnccl.so.2 used: $lib"
echo "== nccl-abi-check"
for h in $(find / -name nccl.h -not -path '/proc/*' -not -path '*/csrc/*' 2>/dev/null); do
    inc=$(dirname "$h")
    gcc -std=c11 -Wall -Wextra -Werror -isystem "$inc" -isystem /usr/local/cuda/include -I"$BIN" \
        -o /tmp/nccl_abi_check "$BIN/nccl_abi_check.c" && /tmp/nccl_abi_check
    echo "nccl-abi-check against $h: rc=$?"
done
export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
"$BIN/engram" build /tmp/m64.gguf --base 20000 --width 64 --fill normal --seed 5 > "$OUT/build.txt" 2>&1
echo "== engram build rc=$?"
tail -2 "$OUT/build.txt"
echo "== test_nccl --model /tmp/m64.gguf"
timeout 300 "$BIN/test_nccl" --stubs "$BIN" --model /tmp/m64.gguf > "$OUT/test_nccl.txt" 2>&1
echo "test_nccl rc=$?"
grep -v "^$" "$OUT/test_nccl.txt" | tail -40
echo "== test_nccl (its own model)"
timeout 200 "$BIN/test_nccl" --stubs "$BIN" > "$OUT/test_nccl_own.txt" 2>&1
echo "test_nccl (own model) rc=$?"
tail -12 "$OUT/test_nccl_own.txt"
pip=$(find / -path '*nvidia/nccl/lib/libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
if [ -n "$pip" ]; then
    echo "== test_nccl with ENGRAM_NCCL_LIBRARY=$pip"
    ENGRAM_NCCL_LIBRARY=$pip timeout 200 "$BIN/test_nccl" --stubs "$BIN" > "$OUT/test_nccl_pip.txt" 2>&1
    echo "test_nccl (pip NCCL) rc=$?"
    tail -12 "$OUT/test_nccl_pip.txt"
fi
