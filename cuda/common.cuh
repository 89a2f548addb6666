/*
 * common.cuh - what the CUDA path's kernels share: a row's size, K (the
 * values of a token's 24 rows), BF16 rounding (as F32 and as bits), exact
 * scaling by a power of two, and the two sides of a programmatic dependent
 * launch (the decode projections, the cluster gate in gate.cuh).
 */
#ifndef ENGRAM_CUDA_COMMON_CUH
#define ENGRAM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "engram_cuda.h"

#define K ENGRAM_K
#define ROW 264 /* bytes of a raw row: 256 codes, 8 block scales */

/* Where the wgmma kernels run, the layer's N x K F16 weights lie in
 * k-tiles of 64 inputs, [K / 64][N][64], each output's 128 bytes of a tile
 * with its 16-byte chunks in the order of the 128-byte swizzle (chunk c at
 * c ^ (o % 8)): the R outputs from o0 (a multiple of 8) of a tile are R x
 * 128 contiguous bytes, already as wgmma reads them from shared memory.
 * The index there of the weights of output o from input i0 (a multiple of
 * 8): the one definition of the layout (ws_tile_weights writes it,
 * wsd_kernel copies its tiles, w8_at reads it). */
__host__ __device__ __forceinline__ size_t wt_index(int o, int i0, int N)
{
    return ((size_t)(i0 >> 6) * N + o) * 64 + ((((i0 >> 3) & 7) ^ (o & 7)) << 3);
}

/* The 8 weights of output o from input i0 (a multiple of 8): 16 bytes.
 * tiled 1: wt_index's k-tiles; tiled 0: row-major [N][K] (where cuBLAS and
 * mmv.cuh read them: GPUs without the wgmma kernels). */
__device__ __forceinline__ const uint4 *w8_at(const uint16_t *w, int o, int i0, int N, int tiled)
{
    return (const uint4 *)(w + (tiled ? wt_index(o, i0, N) : (size_t)o * K + i0));
}

/* f rounded to BF16 (to nearest, ties to even) as F32; a NaN kept */
__device__ __forceinline__ float bf16r(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* f as BF16 bits, rounded to nearest even; a NaN stays a NaN (the kv the
 * wgmma GEMM and gemv_list_kernel hand the prefill gate) */
__device__ __forceinline__ unsigned ws_bf16_bits(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* x * 2^ks rounded once to nearest (as ldexpf would): a multiplication by
 * an exact power of two, 2^ks a normal float. */
__device__ __forceinline__ float pow2scale(float x, int ks)
{
    return x * __int_as_float((ks + 127) << 23); /* |ks| <= 126: see decode16_kernel (row_decode.cuh) */
}

/* element i of a residual, BF16 (bf16) or F32, as F32 (the gates' and
 * wsd_kernel's x) */
__device__ __forceinline__ float load_x(const void *x, int bf16, int i)
{
    if (bf16)
        return __uint_as_float((unsigned)((const unsigned short *)x)[i] << 16);
    return ((const float *)x)[i];
}

/* Programmatic dependent launch (sm_90+; no-ops elsewhere and when the
 * kernel was launched without the attribute): the decode projection's last
 * kernel lets the gate's blocks be scheduled at once (decode16_kernel so
 * lets wsd_kernel in); the dependent waits, before its first read of what
 * the grid before it writes, until that grid has finished and its writes
 * are visible. */
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ENGRAM_CUDA_STAMPS (a diagnostic build only, never shipped): the prefill's
 * kernels and the decode's (wsd_kernel 5, gate_kernel 6, and 7 the moment
 * gate_kernel's block 0 is past its wait for the projection, 8 past its
 * block's sums, 9 past the cluster's exchange, 10 past its writes, in its
 * PRE path only: the model's shapes; with wsd_kernel's sums, 8 past the
 * token's sums loaded and added, 9 past v's scaling, the exchange being
 * before the wait) stamp
 * %globaltimer (ns) into eg_stamps[rep][kernel]: [0] block 0's
 * start, [1] the last warp's end (lane 0 of every warp, at every return);
 * rep is eg_rep, advanced between calls by engram_cuda_stamps (op 1, a
 * one-thread kernel).  Where each kernel's time goes inside a sequence of
 * calls, which ncu (kernels one by one, L2 flushed) does not show.  They
 * perturb a little: each warp's end is a load and maybe an atomic on one
 * address, and %globaltimer may tick only every microsecond. */
#ifdef ENGRAM_CUDA_STAMPS
#define EG_REPS 256
#define EG_KERNELS 12
static __device__ unsigned long long eg_stamps[EG_REPS][EG_KERNELS][2];
static __device__ int eg_rep;
__device__ __forceinline__ unsigned long long eg_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct eg_scope {
    unsigned long long *slot;
    __device__ explicit eg_scope(int k) : slot(eg_stamps[*(volatile int *)&eg_rep % EG_REPS][k])
    {
        if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0)
            atomicMin(slot, eg_now());
    }
    __device__ ~eg_scope()
    {
        if (threadIdx.x & 31)
            return;
        unsigned long long t = eg_now();
        if (*(volatile unsigned long long *)(slot + 1) < t)
            atomicMax(slot + 1, t);
    }
};
#define EG_STAMP(k) eg_scope eg_scope_(k)
/* one moment of block 0's thread 0 into slot k (start and end alike) */
#define EG_MARK(k)                                                                                      \
    do {                                                                                                \
        if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0) {                                \
            unsigned long long *s_ = eg_stamps[*(volatile int *)&eg_rep % EG_REPS][k], t_ = eg_now();   \
            atomicMin(s_, t_);                                                                          \
            atomicMax(s_ + 1, t_);                                                                      \
        }                                                                                               \
    } while (0)
#else
#define EG_STAMP(k) ((void)0)
#define EG_MARK(k) ((void)0)
#endif

#endif
