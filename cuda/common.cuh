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

#endif
