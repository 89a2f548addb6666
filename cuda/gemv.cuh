/*
 * gemv.cuh - the projection on the CUDA cores: kv = W e, F16 weights times
 * decoded rows, every product exact in F32, each output's sum split over
 * the 32 lanes of a warp in a fixed way (F32 FMAs rounded to nearest, then
 * a fixed xor-shuffle tree): the same bits for a token whatever the batch.
 *  - gemv1_kernel: n = 1, the codes decoded in registers as the weights load;
 *  - gemv_kernel<T>: T = 2..8 tokens, decoded once per block into shared
 *    memory;
 *  - gemv_list_kernel: inside the prefill's GEMM path, the tokens too wide
 *    for F16 (listed by decode16_kernel), one at a time; its sums
 *    (gemv_rows) are also those of the decode GEMM's wide tokens
 *    (wsd_kernel, ws_gemm.cuh).
 * Under ENGRAM_CUDA_FMA_ONLY the first two take every n, 8 tokens a launch.
 * Each reads the weights w in the layout `tiled` names (w8_at, common.cuh):
 * the wgmma kernels' k-tiles where they run, row-major elsewhere.
 */
#ifndef ENGRAM_CUDA_GEMV_CUH
#define ENGRAM_CUDA_GEMV_CUH

#include <cuda_fp16.h>

#include "common.cuh"
#include "row_decode.cuh"

#define GEMV_TOKENS 8
#define GEMV_ROWS 4
#define GEMV_THREADS 512
#ifndef GEMV1_THREADS
#define GEMV1_THREADS 256 /* bench/results/2026-12-01-cuda/gemv1/variants.txt */
#endif
#ifndef GEMV1_ROWS
#define GEMV1_ROWS 4 /* outputs per warp (the order of each sum does not depend on it) */
#endif
#ifndef GEMV1_UNROLL
#define GEMV1_UNROLL 3 /* iterations unrolled: weight loads in flight */
#endif
#define GV1_PRAGMA(x) _Pragma(#x)
#define GV1_UNROLL(n) GV1_PRAGMA(unroll n)

/* 8 F16 weights (16 bytes) -> 8 floats, exact. */
__device__ __forceinline__ void halves8(const uint4 &v, float *w)
{
    const __half2 *h = (const __half2 *)&v;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float2 f = __half22float2(h[q]);
        w[2 * q] = f.x;
        w[2 * q + 1] = f.y;
    }
}

/* Two decoded values (BF16, low 16 bits zero) packed into one word, the
 * first in the low half (memory order). */
__device__ __forceinline__ unsigned pack2(float a, float b)
{
    return (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
}

/*
 * Decode GEMV of one token: each warp decodes the codes it needs in
 * registers as it loads the weights (no shared memory, no barrier: weight
 * loads start at once).  The same values and the same order of every sum
 * as gemv_kernel below, so the same bits.
 */
__global__ void __launch_bounds__(GEMV1_THREADS)
gemv1_kernel(const uint16_t *__restrict__ w, int tiled, const uint8_t *__restrict__ raw, const int *d_step,
             size_t raw_step, int n_out, float *__restrict__ kv)
{
    pdl_launch_dependents();
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    int o0 = warp * GEMV1_ROWS;
    if (o0 >= n_out)
        return;
    float acc[GEMV1_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV1_ROWS; r++)
        acc[r] = 0.0f;
    GV1_UNROLL(GEMV1_UNROLL) /* more weight loads in flight */
    for (int j = 0; j < K / 8 / 32; j++) {
        int i0 = (lane + 32 * j) * 8, col = i0 & 255;
        uint4 wv[GEMV1_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV1_ROWS; r++)
            wv[r] = o0 + r < n_out ? __ldg(w8_at(w, o0 + r, i0, n_out, tiled)) : make_uint4(0, 0, 0, 0);
        const uint8_t *rr = raw + (size_t)j * ROW; /* chunk j of every lane is row j */
        uint2 codes = *(const uint2 *)(rr + col);
        int sc = rr[256 + (col >> 5)];
        float e[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            e[k] = decode1(((k < 4 ? codes.x : codes.y) >> (8 * (k & 3))) & 0xffu, sc);
#pragma unroll
        for (int r = 0; r < GEMV1_ROWS; r++) {
            float wf[8];
            halves8(wv[r], wf);
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[r] = fmaf(e[k], wf[k], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV1_ROWS; r++) {
        float v = acc[r];
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && o0 + r < n_out)
            kv[o0 + r] = v;
    }
}

/*
 * Decode GEMV.  The block first decodes its T tokens' rows into shared
 * memory (BF16 bits, T x 12 KiB: each value decoded once per block of 64
 * outputs rather than once per warp), then each warp owns 4 outputs: lane l
 * takes input chunks l, l+32, ... (8 values; chunk j of all lanes is row j),
 * 16-byte weight loads, one F32 FMA chain per (token, output), and a fixed
 * xor-shuffle tree adds the 32 lanes.  The order of every sum is the same
 * for any T: a token's bits do not depend on its batch.
 */
template <int T>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(const uint16_t *__restrict__ w, int tiled, const uint8_t *__restrict__ raw, size_t stride,
            const int *d_step, size_t raw_step, int n_out, float *__restrict__ kv, int ldkv)
{
    extern __shared__ uint4 smem[];
    unsigned *es = (unsigned *)smem; /* [T][K/2] pairs of BF16 */
    pdl_launch_dependents();
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    for (int q = threadIdx.x; q < T * (K / 4); q += GEMV_THREADS) {
        int t = q / (K / 4), i = (q % (K / 4)) * 4, row = i >> 8, col = i & 255;
        const uint8_t *rr = raw + (size_t)t * stride + (size_t)row * ROW;
        unsigned c = *(const unsigned *)(rr + col);
        int sc = rr[256 + (col >> 5)];
        uint2 o;
        o.x = pack2(decode1(c & 0xffu, sc), decode1((c >> 8) & 0xffu, sc));
        o.y = pack2(decode1((c >> 16) & 0xffu, sc), decode1(c >> 24, sc));
        *(uint2 *)(es + (size_t)t * (K / 2) + i / 2) = o;
    }
    __syncthreads();
    int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    int o0 = warp * GEMV_ROWS;
    if (o0 >= n_out)
        return;
    float acc[T][GEMV_ROWS];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
            acc[t][r] = 0.0f;
#pragma unroll 3 /* more weight loads in flight */
    for (int j = 0; j < K / 8 / 32; j++) {
        int i0 = (lane + 32 * j) * 8;
        uint4 wv[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
            wv[r] = o0 + r < n_out ? __ldg(w8_at(w, o0 + r, i0, n_out, tiled)) : make_uint4(0, 0, 0, 0);
        float wf[GEMV_ROWS][8];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
            halves8(wv[r], wf[r]);
#pragma unroll
        for (int t = 0; t < T; t++) {
            uint4 ev = *(const uint4 *)(es + (size_t)t * (K / 2) + i0 / 2);
            unsigned p[4] = {ev.x, ev.y, ev.z, ev.w};
            float e[8];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                e[2 * q] = __uint_as_float(p[q] << 16);
                e[2 * q + 1] = __uint_as_float(p[q] & 0xffff0000u);
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    acc[t][r] = fmaf(e[k], wf[r][k], acc[t][r]);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            float v = acc[t][r];
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0 && o0 + r < n_out)
                kv[(size_t)t * ldkv + o0 + r] = v;
        }
}

/* kv as F32, or (for the gate) as BF16 rounded to nearest, a NaN kept */
__device__ __forceinline__ void store_kv(float *p, float v)
{
    *p = v;
}

__device__ __forceinline__ void store_kv(unsigned short *p, float v)
{
    *p = (unsigned short)ws_bf16_bits(v);
}

/* One token's outputs o0 .. o0 + GEMV_ROWS - 1 (those below n_out) by one
 * warp, from its raw rows r: lane l takes the values (l + 32 j) x 8 .. + 7,
 * F32 FMAs in order, then the xor-shuffle tree; every lane ends with the
 * sums in s.  The one arithmetic of the wide tokens, in the prefill
 * (gemv_list_kernel) and in the decode GEMM (wsd_kernel). */
__device__ __forceinline__ void gemv_rows(const uint16_t *__restrict__ w, int tiled, const uint8_t *r, int o0,
                                          int n_out, int lane, float *s)
{
    float acc[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < K / 8 / 32; j++) {
        int i0 = (lane + 32 * j) * 8, row = i0 >> 8, col = i0 & 255;
        const uint8_t *rr = r + (size_t)row * ROW;
        int sc = rr[256 + (col >> 5)];
        for (int rw = 0; rw < GEMV_ROWS; rw++) {
            if (o0 + rw >= n_out)
                break;
            uint4 wv = __ldg(w8_at(w, o0 + rw, i0, n_out, tiled));
            float wf[8];
            halves8(wv, wf);
            for (int kk = 0; kk < 8; kk++)
                acc[rw] = fmaf(decode1(rr[col + kk], sc), wf[kk], acc[rw]);
        }
    }
    for (int rw = 0; rw < GEMV_ROWS; rw++) {
        float v = acc[rw];
        for (int off = 16; off >= 1; off >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, off);
        s[rw] = v;
    }
}

/* The listed (wide) tokens, one at a time, through the GEMV's arithmetic;
 * their rows of kv are unscaled (k = 0). */
template <typename KV>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_list_kernel(const uint16_t *__restrict__ w, int tiled, const uint8_t *__restrict__ raw, size_t stride,
                 const int *wide, int n_out, KV *__restrict__ kv, int ldkv)
{
    EG_STAMP(2);
    int count = wide[ENGRAM_CUDA_BLOCK];
    for (int q = 0; q < count; q++) {
        int t = wide[q];
        int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
        int o0 = warp * GEMV_ROWS;
        if (o0 >= n_out)
            return;
        float s[GEMV_ROWS];
        gemv_rows(w, tiled, raw + (size_t)t * stride, o0, n_out, lane, s);
        for (int rw = 0; rw < GEMV_ROWS; rw++)
            if (lane == 0 && o0 + rw < n_out)
                store_kv(kv + (size_t)t * ldkv + o0 + rw, s[rw]);
    }
}

#endif
