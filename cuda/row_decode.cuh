/*
 * row_decode.cuh - rows to values on the GPU (SPEC.md section 7): a raw row
 * is 256 E4M3 codes and 8 E8M0 block scales, 264 bytes.  decode1 gives one
 * value rounded to BF16, for the GEMVs that decode as they load
 * (gemv.cuh); decode16_kernel writes each token's rows x 2^-k as F16 for
 * the tensor-core GEMM (ws_gemm.cuh) and lists (prefill) or flags (decode)
 * the tokens F16 cannot hold, and scale_kernel puts 2^k back into
 * engram_cuda_project's F32 output of more than 64 tokens (the apply's
 * gate and the decode GEMM do it themselves).
 */
#ifndef ENGRAM_CUDA_ROW_DECODE_CUH
#define ENGRAM_CUDA_ROW_DECODE_CUH

#include <cuda_fp16.h>

#include "common.cuh"

/* One value of a row (SPEC section 7), rounded to BF16 as F32.  Rows were
 * checked to decode: no NaN code, no scale 255, no overflow.  The value's
 * significand has at most 4 bits, so where the result is a normal float it
 * is built exactly with integer operations (and is already a BF16 value);
 * only results below 2^-126 (scales under 10) take ldexpf and rounding. */
__device__ __noinline__ float decode_slow(unsigned mm, int ex, unsigned sign)
{
    float v = ldexpf((float)mm, ex); /* exact: >= 2^-136, <= 4 bits */
    unsigned u = __float_as_uint(v);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u | sign);
}

__device__ __forceinline__ float decode1(unsigned c, int sc)
{
    unsigned e = (c >> 3) & 15u, m = c & 7u, sign = (c & 0x80u) << 24;
    unsigned mm = e ? 8u + m : m; /* |v| = mm * 2^ex */
    int ex = (e ? (int)e - 10 : -9) + sc - 127;
    if (mm == 0)
        return __uint_as_float(sign);
    int lead = 31 - __clz((int)mm);
    int field = lead + ex + 127;
    if (field < 1)
        return decode_slow(mm, ex, sign);
    return __uint_as_float(sign | ((unsigned)field << 23) | ((mm << (23 - lead)) & 0x7fffffu));
}

/* two E4M3 codes (low byte first) -> two F16 values, exact (compute
 * capability 8.9 and up; decode16_kernel's and mmv.cuh's) */
__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned c)
{
    unsigned r;
    unsigned short h = (unsigned short)c;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
    return r;
}

/*
 * Prefill path, rows -> F16 exactly.  A token's values are codes of at most
 * 4 significant bits times 2^(scale - 127); with k = (largest scale of a
 * block holding a nonzero code) - 133, every value times 2^-k lies in
 * [2^-24, 448 * 2^6] and is exact in F16 whenever the token's scales span
 * at most 21 (trained tables: a few).  Then one F16 GEMM (exact products,
 * F32 accumulation) gives kv * 2^-k, and the gate scales it back (a power of
 * two: exact).  Wider tokens, and those with a nonzero block of scale
 * under 3 (values SPEC section 7 rounds to BF16, which F16 x 2^-k would
 * hold exactly), are projected by the GEMV's sums instead: with
 * flag NULL listed in wide (wide[ENGRAM_CUDA_BLOCK] the count, zeroed
 * before), else flag[t] = 1 (0 for the others: every token's flag is
 * written, nothing to clear first).
 */
#define SPAN_MAX 21
__global__ void __launch_bounds__(ENGRAM_COLUMNS * 8)
decode16_kernel(const uint8_t *__restrict__ raw, size_t stride, const int *d_step, size_t raw_step, __half *e16,
                int *kshift, int *wide, int *flag)
{
    EG_STAMP(0);
    pdl_launch_dependents(); /* the decode GEMM (wsd_kernel) asks for its weights meanwhile */
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    /* thread j: block j & 7 (32 codes, 8-byte loads; raw and stride are
     * multiples of 8) of row j >> 3 */
    int t = blockIdx.x, row = threadIdx.x >> 3, blk = threadIdx.x & 7;
    const uint8_t *rr = raw + (size_t)t * stride + row * ROW;
    __shared__ int smax, smin;
    if (threadIdx.x == 0) {
        smax = -1;
        smin = 1000;
    }
    uint2 q[4];
    unsigned nz = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        q[i] = *(const uint2 *)(rr + blk * 32 + 8 * i);
        nz |= (q[i].x | q[i].y) & 0x7f7f7f7fu;
    }
    int sc = rr[256 + blk];
    __syncthreads();
    if (nz) {
        atomicMax(&smax, sc);
        atomicMin(&smin, sc);
    }
    __syncthreads();
    /* too wide for F16, or k below -126 (block scales under 2^-120: not
     * in trained tables) so that 2^k would not be a normal float, or a
     * nonzero block with a scale under 3, whose values SPEC section 7
     * rounds to BF16 (below 2^-133's step; here they would be exact): the
     * GEMV's sums take these tokens, decode1's values */
    if (smax >= 0 && (smax - smin > SPAN_MAX || smax - 133 < -126 || smin < 3)) {
        if (threadIdx.x == 0) {
            kshift[t] = 0;
            if (flag)
                flag[t] = 1;
            else
                wide[atomicAdd(&wide[ENGRAM_CUDA_BLOCK], 1)] = t;
        }
        return;
    }
    int k = smax >= 0 ? smax - 133 : 0;
    uint4 *out = (uint4 *)(e16 + (size_t)t * K + row * 256 + blk * 32);
    /* a code pair to F16 by the hardware's conversion (exact: E4M3 is a
     * subset of F16), to F32, times 2^(sc - 127 - k) (a normal float: in
     * [2^-15, 2^6] for a block with a nonzero code; clamped for an all-zero
     * block, whose values stay +-0), then to F16: every product is exact,
     * so no rounding in either route, and the bits are those of
     * __floats2half2_rn(decode1(b0, sc - k), decode1(b1, sc - k)) for every
     * code pair and every sc - k a row can reach (run 49's dec16_probe,
     * source in bench/results/2026-12-04-cuda-dec/run48/src), with far
     * fewer instructions (2048 tokens: 31.8 -> 20.1 us on an H200, run 47;
     * 37.9 -> 23.7 on an H100, run 49).  A NaN code (a row that was not
     * checked, outside engram_cuda.h's contract) gives NaN here, which the
     * apply's gate reports and engram_cuda_project returns, where decode1
     * would give 480. */
    float f = __int_as_float(min(max(sc - k, 1), 254) << 23);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned w[2] = {q[i].x, q[i].y}, h[4];
#pragma unroll
        for (int p = 0; p < 4; p++) {
            unsigned r = e4m3x2_f16x2(w[p >> 1] >> (16 * (p & 1)));
            float2 x = __half22float2(*(__half2 *)&r);
            __half2 v2 = __floats2half2_rn(x.x * f, x.y * f);
            h[p] = *(unsigned *)&v2;
        }
        out[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
    if (threadIdx.x == 0) {
        kshift[t] = k;
        if (flag)
            flag[t] = 0;
    }
}

/* kv rows times 2^k (engram_cuda_project's output past the decode path). */
__global__ void scale_kernel(float *kv, int ld, const int *kshift)
{
    EG_STAMP(4);
    int t = blockIdx.y;
    int k = kshift[t];
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < ld; o += gridDim.x * blockDim.x)
        kv[(size_t)t * ld + o] = pow2scale(kv[(size_t)t * ld + o], k);
}

#endif
