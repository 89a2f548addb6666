/*
 * engram_cuda.cu - Engram's output stage on an NVIDIA GPU (engram_cuda.h).
 *
 * Kernels, one per stage, with the CPU path (src/output/kernels.c) as reference:
 *  - gemv1_kernel / gemv_kernel<T>: decode path (n <= 8).  Each warp owns 4
 *    outputs; lane l takes input chunks l, l+32, ... (8 values each, 16-byte
 *    weight loads) with one F32 FMA chain per (token, output); a fixed
 *    xor-shuffle tree then adds the 32 lanes.  One token decodes its codes
 *    in registers as the weights load; 2..8 tokens are decoded once per
 *    block into shared memory.  Same order, same bits, for every T.
 *  - decode16_kernel + ws_gemm_kernel (ws_gemm.cuh): n > 8, rows x 2^-k to
 *    F16 exactly, one F16 GEMM on the tensor cores with sums promoted to
 *    F32 (or cuBLAS's, ENGRAM_CUDA_FAST_SUMS); gemv_list_kernel for tokens
 *    F16 cannot hold.  For the apply, kv leaves the GEMM as BF16 x 2^k.
 *  - gate_kernel (n <= 8: a cluster of 8 blocks per token) and
 *    gate_block_kernel (one block per token): the three sums in a fixed
 *    order, g, a check of the outputs (by bounds, or of every one), then
 *    the update; masked tokens untouched.  Kept small: at B = 1 the
 *    cluster kernel took 24 us (ncu) with inlined ldexpf and integer
 *    divisions in its unrolled loops, 12 us without them (our guess:
 *    instruction fetch on 8 cold SMs).
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram_cuda.h"

namespace cg = cooperative_groups;

#define K ENGRAM_K
#define ROW 264
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
#define GATE_THREADS 256

struct engram_cuda_layer {
    int device;
    uint32_t W, S, N;
    uint16_t *w;             /* [N][K] F16 bits                  */
    float *wq;               /* [S][W]                           */
    float *kv;               /* [BLOCK][N] workspace (F32, or BF16 in its first half) */
    __half *e16;             /* [BLOCK][K] rows x 2^-k, F16      */
    int *kshift;             /* [BLOCK] k of each token          */
    int *wide;               /* [BLOCK] tokens too wide for F16; wide[BLOCK] = count */
    int *status;             /* first non-finite token, INT_MAX  */
    cublasHandle_t blas;
    int tc;                  /* ws_gemm runs here (sm_90a code, maps made) */
    /* the copy engine's maps of e16 (BLOCK rows) and w (ws_maps): 3 x 128
     * bytes, 64-byte aligned inside (calloc aligns to 16) */
    unsigned char maps[3 * sizeof(CUtensorMap) + 64];
    int pdl;                 /* programmatic dependent launch (9.0+) */
    uint64_t bytes;
};

/* c's three maps (ws_maps) */
static CUtensorMap *layer_maps(engram_cuda_layer *c)
{
    return (CUtensorMap *)(((uintptr_t)c->maps + 63) & ~(uintptr_t)63);
}

static int cuda_err(engram_error *err, cudaError_t e, const char *what)
{
    if (err) {
        err->code = -EIO;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return -EIO;
}

static int set_err(engram_error *err, int code, const char *msg)
{
    if (err) {
        err->code = code;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    return code;
}

#define CK(call, what)                                                                       \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return cuda_err(err, e_, what);                                                  \
    } while (0)

extern "C" int engram_cuda_available(engram_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        set_err(err, -ENODEV, e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 0;
    }
    return 1;
}

static int host_reg(void *ctx, void *p, size_t len)
{
    (void)ctx;
    if (cudaHostRegister(p, len, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the buffer is used pageable */
        return -1;
    }
    return 0;
}

static void host_unreg(void *ctx, void *p, size_t len)
{
    (void)ctx;
    (void)len;
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

extern "C" void engram_cuda_host_hooks(engram_host_hooks *h)
{
    h->reg = host_reg;
    h->unreg = host_unreg;
    h->ctx = NULL;
}

/* ------------------------------------------------------------ device helpers */

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

__device__ __forceinline__ float bf16r(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* x * 2^ks rounded once to nearest (as ldexpf would): a multiplication by
 * an exact power of two, 2^ks a normal float. */
__device__ __forceinline__ float pow2scale(float x, int ks)
{
    return x * __int_as_float((ks + 127) << 23); /* |ks| <= 126: see decode16_kernel */
}

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

#include "ws_gemm.cuh"

/* ------------------------------------------------------------ kernels */

/* Two decoded values (BF16, low 16 bits zero) packed into one word, the
 * first in the low half (memory order). */
__device__ __forceinline__ unsigned pack2(float a, float b)
{
    return (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
}

/* Programmatic dependent launch (sm_90+; no-ops elsewhere and when the
 * kernel was launched without the attribute): the decode GEMVs let the
 * gate's blocks be scheduled at once; the gate waits, before its first read
 * of kv, until the GEMV grid has finished and its writes are visible. */
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

/*
 * Decode GEMV of one token: each warp decodes the codes it needs in
 * registers as it loads the weights (no shared memory, no barrier: weight
 * loads start at once).  The same values and the same order of every sum
 * as gemv_kernel below, so the same bits.
 */
__global__ void __launch_bounds__(GEMV1_THREADS)
gemv1_kernel(const uint16_t *__restrict__ w, const uint8_t *__restrict__ raw, const int *d_step,
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
            wv[r] = o0 + r < n_out ? __ldg((const uint4 *)(w + (size_t)(o0 + r) * K + i0))
                                   : make_uint4(0, 0, 0, 0);
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
gemv_kernel(const uint16_t *__restrict__ w, const uint8_t *__restrict__ raw, size_t stride,
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
            wv[r] = o0 + r < n_out ? __ldg((const uint4 *)(w + (size_t)(o0 + r) * K + i0))
                                   : make_uint4(0, 0, 0, 0);
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

/*
 * Prefill path, rows -> F16 exactly.  A token's values are codes of at most
 * 4 significant bits times 2^(scale - 127); with k = (largest scale of a
 * block holding a nonzero code) - 133, every value times 2^-k lies in
 * [2^-24, 448 * 2^6] and is exact in F16 whenever the token's scales span
 * at most 21 (trained tables: a few).  Then one F16 GEMM (exact products,
 * F32 accumulation) gives kv * 2^-k, and the gate scales it back (a power of
 * two: exact).  Wider tokens are listed and projected by the GEMV instead.
 */
#define SPAN_MAX 21
__global__ void __launch_bounds__(ENGRAM_COLUMNS * 8)
decode16_kernel(const uint8_t *__restrict__ raw, size_t stride, __half *e16, int *kshift, int *wide)
{
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
     * in trained tables) so that 2^k would not be a normal float */
    if (smax >= 0 && (smax - smin > SPAN_MAX || smax - 133 < -126)) {
        if (threadIdx.x == 0) {
            kshift[t] = 0;
            wide[atomicAdd(&wide[ENGRAM_CUDA_BLOCK], 1)] = t;
        }
        return;
    }
    int k = smax >= 0 ? smax - 133 : 0;
    uint4 *out = (uint4 *)(e16 + (size_t)t * K + row * 256 + blk * 32);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned w[2] = {q[i].x, q[i].y}, h[4];
#pragma unroll
        for (int p = 0; p < 4; p++) {
            unsigned pair = w[p >> 1] >> (16 * (p & 1)), b0 = pair & 0xffu, b1 = (pair >> 8) & 0xffu;
            __half2 v2 = __floats2half2_rn(decode1(b0, sc - k), decode1(b1, sc - k)); /* exact, see above */
            h[p] = *(unsigned *)&v2;
        }
        out[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
    if (threadIdx.x == 0)
        kshift[t] = k;
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

/* The listed (wide) tokens, one at a time, through the GEMV's arithmetic;
 * their rows of kv are unscaled (k = 0). */
template <typename KV>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_list_kernel(const uint16_t *__restrict__ w, const uint8_t *__restrict__ raw, size_t stride,
                 const int *wide, int n_out, KV *__restrict__ kv, int ldkv)
{
    int count = wide[ENGRAM_CUDA_BLOCK];
    for (int q = 0; q < count; q++) {
        int t = wide[q];
        int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
        int o0 = warp * GEMV_ROWS;
        if (o0 >= n_out)
            return;
        const uint8_t *r = raw + (size_t)t * stride;
        float acc[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < K / 8 / 32; j++) {
            int i0 = (lane + 32 * j) * 8, row = i0 >> 8, col = i0 & 255;
            const uint8_t *rr = r + (size_t)row * ROW;
            int sc = rr[256 + (col >> 5)];
            for (int rw = 0; rw < GEMV_ROWS; rw++) {
                if (o0 + rw >= n_out)
                    break;
                uint4 wv = __ldg((const uint4 *)(w + (size_t)(o0 + rw) * K + i0));
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
            if (lane == 0 && o0 + rw < n_out)
                store_kv(kv + (size_t)t * ldkv + o0 + rw, v);
        }
    }
}

/* kv rows times 2^k (engram_cuda_project's output). */
__global__ void scale_kernel(float *kv, int ld, const int *kshift)
{
    int t = blockIdx.y;
    int k = kshift[t];
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < ld; o += gridDim.x * blockDim.x)
        kv[(size_t)t * ld + o] = pow2scale(kv[(size_t)t * ld + o], k);
}

/* SPEC.md section 8's gate from a stream's three sums (D = sum x w k,
 * Sxx = sum x^2, Skk = sum k^2) at width W; NaN when a sum is not finite
 * (the token is then left untouched).  Both gate kernels call it. */
__device__ __forceinline__ float gate_of(float D, float Sxx, float Skk, int W)
{
    const float wf = (float)W, eps = 1e-6f;
    float dd = D * (1.0f / sqrtf(Sxx / wf + eps)) * (1.0f / sqrtf(Skk / wf + eps)) * (1.0f / sqrtf(wf));
    float z = copysignf(sqrtf(fmaxf(fabsf(dd), 1e-6f)), dd);
    float g = 1.0f / (1.0f + expf(-z));
    return isfinite(D) && isfinite(Sxx) && isfinite(Skk) ? g : __int_as_float(0x7fc00000);
}

__device__ __forceinline__ float load_x(const void *x, int bf16, int i)
{
    if (bf16)
        return __uint_as_float((unsigned)((const unsigned short *)x)[i] << 16);
    return ((const float *)x)[i];
}

/*
 * Gate and update, one token per cluster of GATE_CTAS blocks (Hopper
 * thread-block clusters; at B = 1 one block on one SM was issue-bound).
 * Block r of a cluster takes the columns [r w, (r+1) w) of every stream,
 * w = ceil(W / GATE_CTAS).  Streams go four at a time: each thread keeps the
 * three partial sums (x.q k, x.x, k.k) of each, the 12 are added by
 * xor-shuffle trees within warps and across the warps in warp 0; every
 * block then adds the blocks' sums in rank order through distributed shared
 * memory (the same order, so the same gates, in every block).  Outputs are
 * computed once into registers (GATE_KEEP per thread; beyond that, twice),
 * checked, and written only if no block of the token found one non-finite:
 * the token is written whole or not at all.  Masked tokens: untouched.
 * Launched as a programmatic dependent of the decode GEMV: x, q and the
 * update's x are loaded (and x.x summed) before the wait for kv, v with
 * k after it.  The blocks' verdicts travel with their sums: if every x and
 * scaled v of the token is below 2^126 in magnitude and the gates are
 * finite, every output is finite (|x + g v| < 2^127, 0 <= g <= 1) and the
 * blocks write without a second exchange; otherwise the check above.
 */
#define GATE_CTAS 8

/* The cluster's verdict on a token: 1 if a thread of any of its GATE_CTAS
 * blocks found a non-finite output (bad: this thread's), after which the
 * token is recorded in status (the lowest index wins) and none of its
 * blocks may write it.  Every thread of every block calls it. */
__device__ __forceinline__ int cluster_any_bad(cg::cluster_group &cl, int *sbad, int bad, int rank,
                                               int *status, int token)
{
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0)
        *sbad = bad;
    cl.sync(); /* every block's verdict is in its shared memory */
    int any = 0;
    for (int r = 0; r < GATE_CTAS; r++)
        any |= *cl.map_shared_rank(sbad, r);
    cl.sync(); /* nobody reads another block's shared memory after this */
    if (any && rank == 0 && threadIdx.x == 0)
        atomicMin(status, token);
    return any;
}
#define GATE_GROUP 4
#define GATE_KEEP 12
#ifndef GATE_PRE
#define GATE_PRE 3 /* columns per thread loaded before the wait for kv */
#endif
__global__ void __cluster_dims__(GATE_CTAS, 1, 1) __launch_bounds__(GATE_THREADS)
gate_kernel(const float *__restrict__ kv, int ldkv, const float *__restrict__ wq, void *resid,
            int bf16, const uint8_t *mask, int W, int S, int *status, int token_base,
            const int *d_step, size_t resid_step, const int *kshift)
{
    cg::cluster_group cl = cg::this_cluster();
    const int t = blockIdx.x / GATE_CTAS, rank = (int)cl.block_rank();
    int ks = kshift ? kshift[t] : 0; /* kv rows of the F16 path are kv * 2^-ks */
    if (mask && !mask[t])
        return; /* the whole cluster */
    if (d_step)
        resid = (char *)resid + (size_t)(*d_step) * resid_step;
    __shared__ float sh[GATE_THREADS / 32][3 * GATE_GROUP];
    __shared__ float part[3 * ENGRAM_MAX_STREAMS]; /* this block's sums  */
    __shared__ float gs[ENGRAM_MAX_STREAMS];
    __shared__ int sbad;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int span = (W + GATE_CTAS - 1) / GATE_CTAS, lo = min(W, rank * span),
              cols = min(W, lo + span) - lo;
    const float *kvt = kv + (size_t)t * ldkv, *v = kvt + (size_t)S * W;
    size_t es = bf16 ? 2 : 4;
    char *xt = (char *)resid + (size_t)t * S * W * es;
    /* The update's elements of this thread (with GATE_KEEP or fewer) and
     * their x, loaded before the wait for kv: element e of the block is
     * (stream e / cols, column lo + e % cols), stepped without divisions (a
     * small kernel: fewer instructions to fetch). */
    const int total = S * cols;
    const int keep = total <= GATE_THREADS * GATE_KEEP;
    float y[GATE_KEEP];
    int sq[GATE_KEEP], iq[GATE_KEEP];
    if (keep) {
        int s = cols > 0 ? 0 : S, i = threadIdx.x; /* no columns: no elements */
        if (cols > 0)
            while (i >= cols && s < S) {
                i -= cols;
                s++;
            }
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++) {
            sq[q] = s;
            iq[q] = lo + i;
            y[q] = s < S ? load_x(xt, bf16, s * W + lo + i) : 0.0f;
            i += GATE_THREADS;
            while (i >= cols && s < S) {
                i -= cols;
                s++;
            }
        }
    }
    /* Up to GATE_PRE columns per thread and S <= GATE_GROUP (W = 5120: 640
     * columns a block): x and q, which the GEMV does not write, are loaded
     * before the wait for kv, and x.x summed; the sums' order is the loop's
     * below, so the bits are the same. */
    const int pre = S <= GATE_GROUP && cols <= GATE_PRE * GATE_THREADS;
    float px[GATE_PRE][GATE_GROUP], pq[GATE_PRE][GATE_GROUP], pxx[GATE_GROUP];
#pragma unroll
    for (int s = 0; s < GATE_GROUP; s++) {
        pxx[s] = 0.0f;
#pragma unroll
        for (int j = 0; j < GATE_PRE; j++)
            px[j][s] = pq[j][s] = 0.0f;
    }
    if (pre) {
#pragma unroll
        for (int j = 0; j < GATE_PRE; j++) {
            int i = lo + threadIdx.x + j * GATE_THREADS;
#pragma unroll
            for (int s = 0; s < GATE_GROUP; s++)
                if (s < S && i < lo + cols) {
                    px[j][s] = load_x(xt, bf16, s * W + i);
                    pq[j][s] = wq[(size_t)s * W + i];
                }
        }
#pragma unroll
        for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
            for (int s = 0; s < GATE_GROUP; s++)
                if (s < S && lo + (int)threadIdx.x + j * GATE_THREADS < lo + cols)
                    pxx[s] = fmaf(px[j][s], px[j][s], pxx[s]);
    }
    pdl_wait(); /* kv: the GEMV's */
    /* v of the update's elements, loaded with phase 1's k: one latency; ok:
     * every x and scaled v of this thread below 2^126 in magnitude (and not
     * NaN), so that y = x + g v, 0 <= g <= 1, is finite in F32 and in BF16 */
    float vs[GATE_KEEP];
    int ok = keep;
    if (keep) {
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++)
            vs[q] = sq[q] < S ? v[iq[q]] : 0.0f;
    }
    for (int s0 = 0; s0 < S; s0 += GATE_GROUP) {
        float p[3 * GATE_GROUP];
#pragma unroll
        for (int q = 0; q < 3 * GATE_GROUP; q++)
            p[q] = 0.0f;
        const int ns = min(GATE_GROUP, S - s0);
        if (pre) { /* s0 = 0, the only group */
            float kr[GATE_PRE][GATE_GROUP];
#pragma unroll
            for (int j = 0; j < GATE_PRE; j++) /* every load first: one latency */
#pragma unroll
                for (int s = 0; s < GATE_GROUP; s++) {
                    int i = lo + threadIdx.x + j * GATE_THREADS;
                    kr[j][s] = s < S && i < lo + cols ? kvt[(size_t)s * W + i] : 0.0f;
                }
#pragma unroll
            for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
                for (int s = 0; s < GATE_GROUP; s++)
                    if (s < S && lo + (int)threadIdx.x + j * GATE_THREADS < lo + cols) {
                        float k = bf16r(pow2scale(kr[j][s], ks));
                        p[3 * s] = fmaf(px[j][s] * pq[j][s], k, p[3 * s]);
                        p[3 * s + 2] = fmaf(k, k, p[3 * s + 2]);
                    }
#pragma unroll
            for (int s = 0; s < GATE_GROUP; s++)
                p[3 * s + 1] = pxx[s];
        } else {
#pragma unroll 2
            for (int i = lo + threadIdx.x; i < lo + cols; i += GATE_THREADS) {
                float xv[GATE_GROUP], qv[GATE_GROUP], kr[GATE_GROUP];
#pragma unroll
                for (int s = 0; s < GATE_GROUP; s++) /* every load first: one latency */
                    if (s < ns) {
                        size_t o = (size_t)(s0 + s) * W + i;
                        xv[s] = load_x(xt, bf16, (int)o);
                        qv[s] = wq[o];
                        kr[s] = kvt[o];
                    }
#pragma unroll
                for (int s = 0; s < GATE_GROUP; s++)
                    if (s < ns) {
                        float xi = xv[s], k = bf16r(pow2scale(kr[s], ks));
                        p[3 * s] = fmaf(xi * qv[s], k, p[3 * s]);
                        p[3 * s + 1] = fmaf(xi, xi, p[3 * s + 1]);
                        p[3 * s + 2] = fmaf(k, k, p[3 * s + 2]);
                    }
            }
        }
#pragma unroll
        for (int q = 0; q < 3 * GATE_GROUP; q++)
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                p[q] += __shfl_xor_sync(0xffffffffu, p[q], off);
        if (lane == 0)
#pragma unroll
            for (int q = 0; q < 3 * GATE_GROUP; q++)
                sh[warp][q] = p[q];
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int q = 0; q < 3 * GATE_GROUP; q++) {
                float u = lane < GATE_THREADS / 32 ? sh[lane][q] : 0.0f;
#pragma unroll
                for (int off = 16; off >= 1; off >>= 1)
                    u += __shfl_xor_sync(0xffffffffu, u, off);
                if (lane == q && 3 * s0 + q < 3 * S)
                    part[3 * s0 + q] = u;
            }
        }
        __syncthreads();
    }
    if (keep) {
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++) {
            vs[q] = bf16r(pow2scale(vs[q], ks));
            ok &= sq[q] >= S || (fabsf(y[q]) < 0x1p126f && fabsf(vs[q]) < 0x1p126f);
        }
    }
    __shared__ int sok, allok;
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0)
        sok = ok;
    cl.sync(); /* every block's sums and verdict are in its shared memory */
    __shared__ float tot[3 * ENGRAM_MAX_STREAMS];
    if (threadIdx.x < 3 * S) {
        float u = 0.0f;
        for (int r = 0; r < GATE_CTAS; r++)
            u += *cl.map_shared_rank(&part[threadIdx.x], r);
        tot[threadIdx.x] = u;
    } else if (threadIdx.x == 32 * ((3 * S + 31) / 32)) { /* the first warp past the sums' */
        int a = 1;
        for (int r = 0; r < GATE_CTAS; r++)
            a &= *cl.map_shared_rank(&sok, r);
        allok = a;
    }
    /* done with the other blocks' shared memory: none may exit before all
     * have arrived here (waited for below, on every path) */
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();
    if (threadIdx.x < S)
        gs[threadIdx.x] = gate_of(tot[3 * threadIdx.x], tot[3 * threadIdx.x + 1], tot[3 * threadIdx.x + 2], W);
    __syncthreads();
    /* this block's outputs: all streams, its columns.  Every block of the
     * cluster takes the same branch: allok and gs are the cluster's. */
    int safe = allok;
    for (int q = 0; q < S; q++)
        safe &= isfinite(gs[q]);
    int bad = 0;
    if (keep) {
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++)
            if (sq[q] < S) {
                y[q] = bf16r(fmaf(gs[sq[q]], vs[q], y[q]));
                bad |= !isfinite(y[q]);
            }
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++)
            iq[q] += sq[q] * W; /* the residual's index, for the writes */
        /* safe: finite by the bounds, written without asking the other
         * blocks (which are waited for only before leaving) */
        if (!safe) {
            asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
            if (cluster_any_bad(cl, &sbad, bad, rank, status, token_base + t))
                return;
        }
#pragma unroll
        for (int q = 0; q < GATE_KEEP; q++)
            if (sq[q] < S) {
                if (bf16)
                    ((unsigned short *)xt)[iq[q]] = (unsigned short)(__float_as_uint(y[q]) >> 16);
                else
                    ((float *)xt)[iq[q]] = y[q];
            }
        if (safe)
            asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        return;
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    for (int e = threadIdx.x; e < total; e += GATE_THREADS) {
        int se = e / cols, ie = lo + e - se * cols;
        bad |= !isfinite(bf16r(fmaf(gs[se], bf16r(pow2scale(v[ie], ks)), load_x(xt, bf16, se * W + ie))));
    }
    if (cluster_any_bad(cl, &sbad, bad, rank, status, token_base + t))
        return;
    for (int e = threadIdx.x; e < total; e += GATE_THREADS) {
        int se = e / cols, ie = lo + e - se * cols;
        float yy = bf16r(fmaf(gs[se], bf16r(pow2scale(v[ie], ks)), load_x(xt, bf16, se * W + ie)));
        if (bf16)
            ((unsigned short *)xt)[se * W + ie] = (unsigned short)(__float_as_uint(yy) >> 16);
        else
            ((float *)xt)[se * W + ie] = yy;
    }
}

/*
 * Gate and update for n > ENGRAM_CUDA_GEMV_MAX tokens: one block of
 * GATEB_THREADS per token (many tokens keep every SM busy; the cluster
 * kernel's synchronisation would cost more than it saves).  Each stream's
 * columns go in chunks of 8 (the last one short when 8 does not divide W);
 * thread j takes the chunks j, j + GATEB_THREADS, ...  V16: 16-byte loads
 * (W a multiple of 8, the residual 16-byte aligned), else element by
 * element, in the same order: the same bits either way.  The 3 S sums of
 * all streams in one fixed-order block reduction (per thread in column
 * order, xor trees in warps, then the warps' sums in index order), the
 * gates, then the update: written whole or not at all.  The first pass also
 * loads v and checks every x and v against 2^126: if all are below and the
 * gates finite, every output is finite (|x + g v| < 2^127, 0 <= g <= 1) and
 * the token is written at once; otherwise a check pass over the token
 * comes first.
 * KEEP (S <= GATEB_KS, at most GATEB_KC chunks a thread: W <= 5120): this
 * thread's x and v stay in registers from the first pass to the update, so
 * the token's x is read from memory once (re-read, it had been evicted from
 * L2 by the tokens in flight: 2048 tokens, F32 residual, 163 us on the
 * H200 against 150 kept).
 */
#define GATEB_THREADS 320
#define GATEB_WARPS (GATEB_THREADS / 32)
#define GATEB_BIG 8.5070592e37f /* 2^126 */
#define GATEB_KS 4
#define GATEB_KC 2
#ifndef GATEB_MINB
#define GATEB_MINB 2 /* blocks an SM at least: 102 registers, a few spilled (1: 126, 205 us) */
#endif

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The lim (<= 8) values from i on into o[0..lim) (the rest 0); V16: lim is
 * 8 and p + i 16-byte aligned. */
template <bool V16> __device__ __forceinline__ void ld_f32(const float *p, size_t i, int lim, float *o)
{
    if (V16) {
        float4 a = __ldg((const float4 *)(p + i)), b = __ldg((const float4 *)(p + i) + 1);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < lim ? p[i + e] : 0.0f;
    }
}

template <bool V16>
__device__ __forceinline__ void ld_bf16(const unsigned short *p, size_t i, int lim, float *o)
{
    if (V16) {
        uint4 a = *(const uint4 *)(p + i);
        unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            o[2 * q] = __uint_as_float(w[q] << 16);
            o[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < lim ? __uint_as_float((unsigned)p[i + e] << 16) : 0.0f;
    }
}

/* keys or values as the gate takes them: BF16(kv x 2^ks) from F32 kv, or as
 * stored (BF16 kv, already scaled and rounded: the same values) */
template <bool V16>
__device__ __forceinline__ void ld_kv(const float *kv, size_t i, int lim, int ks, float *o)
{
    ld_f32<V16>(kv, i, lim, o);
#pragma unroll
    for (int e = 0; e < 8; e++)
        o[e] = bf16r(pow2scale(o[e], ks));
}

template <bool V16>
__device__ __forceinline__ void ld_kv(const unsigned short *kv, size_t i, int lim, int, float *o)
{
    ld_bf16<V16>(kv, i, lim, o);
}

template <bool V16> __device__ __forceinline__ void ld_x(const void *x, int bf16, size_t i, int lim, float *o)
{
    if (bf16)
        ld_bf16<V16>((const unsigned short *)x, i, lim, o);
    else
        ld_f32<V16>((const float *)x, i, lim, o);
}

template <bool V16> __device__ __forceinline__ void st_x(void *x, int bf16, size_t i, int lim, const float *y)
{
    if (bf16) {
        unsigned short *p = (unsigned short *)x + i;
        if (V16) {
            unsigned w[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                w[q] = (__float_as_uint(y[2 * q]) >> 16) | (__float_as_uint(y[2 * q + 1]) & 0xffff0000u);
            *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < lim)
                    p[e] = (unsigned short)(__float_as_uint(y[e]) >> 16);
        }
    } else {
        float *p = (float *)x + i;
        if (V16) {
            ((float4 *)p)[0] = make_float4(y[0], y[1], y[2], y[3]);
            ((float4 *)p)[1] = make_float4(y[4], y[5], y[6], y[7]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < lim)
                    p[e] = y[e];
        }
    }
}

template <typename KV, bool V16, bool KEEP>
__global__ void __launch_bounds__(GATEB_THREADS, GATEB_MINB)
gate_block_kernel(const KV *__restrict__ kv, int ldkv, const float *__restrict__ wq, void *resid,
                  int bf16, const uint8_t *mask, int W, int S, int *status, int token_base,
                  const int *kshift)
{
    int t = blockIdx.x;
    int ks = kshift ? kshift[t] : 0;
    if (mask && !mask[t])
        return;
    /* warp w's sums of stream s: part[(3 s + j) * GATEB_WARPS + w], j = 0 d, 1 xx, 2 kk */
    __shared__ float part[3 * ENGRAM_MAX_STREAMS * GATEB_WARPS];
    __shared__ float gs[ENGRAM_MAX_STREAMS];
    const KV *kvt = kv + (size_t)t * ldkv, *v = kvt + (size_t)S * W;
    size_t es = bf16 ? 2 : 4;
    char *xt = (char *)resid + (size_t)t * S * W * es;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = (W + 7) / 8;
    int small = 1; /* every x and v this thread loads is below 2^126 */
    float xk[KEEP ? GATEB_KS * GATEB_KC : 1][8], vk[KEEP ? GATEB_KC : 1][8];
#pragma unroll
    for (int s = 0; s < (KEEP ? GATEB_KS : ENGRAM_MAX_STREAMS); s++) {
        if (s >= S)
            break;
        const void *x = xt + (size_t)s * W * es;
        float d = 0.0f, sx = 0.0f, sk = 0.0f;
#pragma unroll
        for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
            int c = threadIdx.x + j * GATEB_THREADS;
            if (c >= chunks)
                break;
            int lim = V16 ? 8 : min(8, W - 8 * c);
            float xtmp[8], q[8], k[8];
            float *xi = KEEP ? xk[s * GATEB_KC + j] : xtmp;
            ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
            ld_f32<V16>(wq, (size_t)s * W + (size_t)c * 8, lim, q);
            ld_kv<V16>(kvt, (size_t)s * W + (size_t)c * 8, lim, ks, k);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (e >= lim)
                    break;
                d = fmaf(xi[e] * q[e], k[e], d);
                sx = fmaf(xi[e], xi[e], sx);
                sk = fmaf(k[e], k[e], sk);
                small &= fabsf(xi[e]) < GATEB_BIG;
            }
        }
        d = warp_sum(d);
        sx = warp_sum(sx);
        sk = warp_sum(sk);
        if (lane == 0) {
            part[(3 * s + 0) * GATEB_WARPS + warp] = d;
            part[(3 * s + 1) * GATEB_WARPS + warp] = sx;
            part[(3 * s + 2) * GATEB_WARPS + warp] = sk;
        }
    }
#pragma unroll
    for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
        int c = threadIdx.x + j * GATEB_THREADS;
        if (c >= chunks)
            break;
        int lim = V16 ? 8 : min(8, W - 8 * c);
        float vtmp[8];
        float *vv = KEEP ? vk[j] : vtmp;
        ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            small &= fabsf(vv[e]) < GATEB_BIG; /* 0 past lim */
    }
    small = __syncthreads_and(small); /* also: every part[] is written */
    if (threadIdx.x < (unsigned)S) {
        int s = threadIdx.x;
        float sum[3];
        for (int j = 0; j < 3; j++) {
            const float *p = part + (3 * s + j) * GATEB_WARPS;
            float a = p[0];
            for (int q = 1; q < GATEB_WARPS; q++)
                a += p[q];
            sum[j] = a;
        }
        gs[s] = gate_of(sum[0], sum[1], sum[2], W);
    }
    __syncthreads();
    int gok = 1;
    for (int s = 0; s < S; s++)
        gok &= isfinite(gs[s]);
    if (!(small && gok)) { /* the check pass: any non-finite output, and none is written */
        int bad = 0;
        for (int s = 0; s < S; s++) {
            const void *x = xt + (size_t)s * W * es;
            for (int c = threadIdx.x; c < chunks; c += GATEB_THREADS) {
                int lim = V16 ? 8 : min(8, W - 8 * c);
                float xi[8], vv[8];
                ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
                ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    bad |= !isfinite(bf16r(fmaf(gs[s], vv[e], xi[e]))); /* 0 past lim */
            }
        }
        if (__syncthreads_or(bad)) {
            if (threadIdx.x == 0)
                atomicMin(status, token_base + t);
            return;
        }
    }
#pragma unroll
    for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
        int c = threadIdx.x + j * GATEB_THREADS;
        if (c >= chunks)
            break;
        int lim = V16 ? 8 : min(8, W - 8 * c);
        float vtmp[8];
        float *vv = KEEP ? vk[j] : vtmp;
        if (!KEEP)
            ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
        for (int s = 0; s < (KEEP ? GATEB_KS : ENGRAM_MAX_STREAMS); s++) {
            if (s >= S)
                break;
            void *x = xt + (size_t)s * W * es;
            float xtmp[8], y[8];
            float *xi = KEEP ? xk[s * GATEB_KC + j] : xtmp;
            if (!KEEP)
                ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
#pragma unroll
            for (int e = 0; e < 8; e++)
                y[e] = bf16r(fmaf(gs[s], vv[e], xi[e]));
            st_x<V16>(x, bf16, (size_t)c * 8, lim, y);
        }
    }
}

/* ------------------------------------------------------------ host side */

extern "C" void engram_cuda_layer_close(engram_cuda_layer *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    cudaFree(c->w);
    cudaFree(c->wq);
    cudaFree(c->kv);
    cudaFree(c->e16);
    cudaFree(c->kshift);
    cudaFree(c->wide);
    cudaFree(c->status);
    if (c->blas)
        cublasDestroy(c->blas);
    free(c);
}

extern "C" uint64_t engram_cuda_layer_bytes(const engram_cuda_layer *c)
{
    return c->bytes;
}

static int open_on_device(engram_cuda_layer *c, const engram_layer *L, engram_error *err)
{
    if (!engram_cuda_available(err))
        return -ENODEV;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    size_t nw = (size_t)c->N * K, blk = ENGRAM_CUDA_BLOCK;
    CK(cudaMalloc(&c->w, nw * 2), "cudaMalloc (weights)");
    CK(cudaMalloc(&c->wq, (size_t)c->S * c->W * 4), "cudaMalloc (norms)");
    CK(cudaMalloc(&c->kv, blk * c->N * 4), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->e16, blk * K * 2), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->kshift, blk * sizeof(int)), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->wide, (blk + 1) * sizeof(int)), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->status, sizeof(int)), "cudaMalloc (status)");
    /* the wgmma GEMM where this device runs sm_90a code; its copy maps then
     * (a driver that runs this runtime has cuTensorMapEncodeTiled, and the
     * maps' arguments are fixed: a failure is the driver's, and named) */
    c->tc = ws_probe(c->status);
    if (c->tc && ws_maps(layer_maps(c), c->e16, blk, c->w, c->N) < 0)
        return set_err(err, -EIO, "cuTensorMapEncodeTiled failed or is missing from the driver");
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device),
       "cudaDeviceGetAttribute");
    c->pdl = major >= 9;
    c->bytes = nw * 2 + (uint64_t)c->S * c->W * 4 + blk * c->N * 4 + blk * K * 2 +
               (2 * blk + 2) * sizeof(int);
    uint16_t *hw = (uint16_t *)malloc(nw * 2);
    float *hq = (float *)malloc((size_t)c->S * c->W * 4);
    if (!hw || !hq) {
        free(hw);
        free(hq);
        return set_err(err, -ENOMEM, "out of host memory for the upload");
    }
    engram_layer_export(L, hw, hq);
    cudaError_t e1 = cudaMemcpy(c->w, hw, nw * 2, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(c->wq, hq, (size_t)c->S * c->W * 4, cudaMemcpyHostToDevice);
    free(hw);
    free(hq);
    CK(e1, "cudaMemcpy (weights)");
    CK(e2, "cudaMemcpy (norms)");
    int big = INT_MAX;
    CK(cudaMemcpy(c->status, &big, sizeof big, cudaMemcpyHostToDevice), "cudaMemcpy (status)");
    CK(cudaDeviceSynchronize(), "upload");
    /* T tokens' decoded rows in shared memory: T x 12 KiB (over the 48 KiB
     * default from T = 5) */
#define SMEM(T)                                                                                \
    CK(cudaFuncSetAttribute(gemv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, T * K * 2), \
       "cudaFuncSetAttribute")
    SMEM(2); SMEM(3); SMEM(4); SMEM(5); SMEM(6); SMEM(7); SMEM(8);
#undef SMEM
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS)
        return set_err(err, -EIO, "cublasCreate failed");
    /* split-K partial sums at F32, never narrower */
    if (cublasSetMathMode(c->blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) !=
        CUBLAS_STATUS_SUCCESS)
        return set_err(err, -EIO, "cublasSetMathMode failed");
    return 0;
}

extern "C" int engram_cuda_layer_open(const engram_layer *L, int device, engram_cuda_layer **out,
                                      engram_error *err)
{
    if (!L || !out)
        return set_err(err, -EINVAL, "NULL argument");
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    engram_cuda_layer *c = (engram_cuda_layer *)calloc(1, sizeof *c);
    if (!c)
        return set_err(err, -ENOMEM, "out of memory");
    c->device = device;
    c->W = li.width;
    c->S = li.streams;
    c->N = (li.streams + 1) * li.width;
    int rc = open_on_device(c, L, err);
    if (rc < 0) {
        engram_cuda_layer_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int check_args(const engram_cuda_layer *c, const engram_cuda_args *a, int need_resid,
                      engram_error *err)
{
    if (!c || !a || !a->raw || (need_resid && !a->resid))
        return set_err(err, -EINVAL, "NULL argument");
    if (need_resid && a->resid_dtype != ENGRAM_BF16 && a->resid_dtype != ENGRAM_F32)
        return set_err(err, -EINVAL, "the residual is BF16 or F32");
    if (a->raw_stride && (a->raw_stride < (size_t)ENGRAM_COLUMNS * ROW || a->raw_stride % 8))
        return set_err(err, -EINVAL, "raw_stride: at least 24 x 264 bytes, a multiple of 8");
    if (a->d_step && a->n > ENGRAM_CUDA_GEMV_MAX)
        return set_err(err, -EINVAL, "d_step is for the decode path (n <= 8)");
    if ((uintptr_t)a->raw % 8 || a->raw_step % 8)
        return set_err(err, -EINVAL, "raw and raw_step: multiples of 8 bytes");
    if (a->flags & ~(unsigned)(ENGRAM_CUDA_FMA_ONLY | ENGRAM_CUDA_FAST_SUMS | ENGRAM_CUDA_SERIAL_GATE))
        return set_err(err, -EINVAL, "unknown flags");
    return 0;
}

/* kv (n x N, F32) = e16 (n x K) x W^T on the tensor cores through cuBLAS:
 * exact products, the tensor cores' own sums (ENGRAM_CUDA_FAST_SUMS). */
static int cublas_gemm(engram_cuda_layer *c, unsigned n, float *kv, cudaStream_t st, engram_error *err)
{
    cublasSetStream(c->blas, st);
    const float one = 1.0f, zero = 0.0f;
    /* column-major: kv^T (N x n) = W (N x K, stored as K x N) ^T x E^T (K x n) */
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)c->N, (int)n, K, &one,
                                    c->w, CUDA_R_16F, K, c->e16, CUDA_R_16F, K, &zero, kv,
                                    CUDA_R_32F, (int)c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char m[96];
        snprintf(m, sizeof m, "cublasGemmEx failed (status %d)", (int)s);
        return set_err(err, -EIO, m);
    }
    return 0;
}

/* kv for tokens [0, n) of a (n <= one block), F32 in kv, or where the
 * tensor-core GEMM runs and bf16 is set, BF16 kv x 2^k in kv's first half
 * (*bf16 cleared otherwise); *scaled: F32 kv x 2^-k (kshift) */
static int project_block(engram_cuda_layer *c, const engram_cuda_args *a, const uint8_t *raw,
                         unsigned n, float *kv, cudaStream_t st, int *scaled, int *bf16,
                         engram_error *err)
{
    *scaled = 0;
    int want16 = *bf16;
    *bf16 = 0;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    if (n <= ENGRAM_CUDA_GEMV_MAX || (a->flags & ENGRAM_CUDA_FMA_ONLY)) {
        unsigned warps = (c->N + GEMV_ROWS - 1) / GEMV_ROWS;
        unsigned blocks = (warps * 32 + GEMV_THREADS - 1) / GEMV_THREADS;
        for (unsigned t0 = 0; t0 < n; t0 += GEMV_TOKENS) {
            unsigned k = n - t0 < GEMV_TOKENS ? n - t0 : GEMV_TOKENS;
            const uint8_t *r = raw + (size_t)t0 * stride;
            float *o = kv + (size_t)t0 * c->N;
            if (k == 1) {
                unsigned w1 = (c->N + GEMV1_ROWS - 1) / GEMV1_ROWS;
                unsigned b1 = (w1 * 32 + GEMV1_THREADS - 1) / GEMV1_THREADS;
                gemv1_kernel<<<b1, GEMV1_THREADS, 0, st>>>(c->w, r, a->d_step, a->raw_step,
                                                            (int)c->N, o);
                CK(cudaGetLastError(), "gemv1_kernel");
                continue;
            }
            switch (k) {
#define CASE(T)                                                                                \
    case T:                                                                                    \
        gemv_kernel<T><<<blocks, GEMV_THREADS, T * K * 2, st>>>(c->w, r, stride, a->d_step,     \
                                                               a->raw_step,                      \
                                                        (int)c->N, o, (int)c->N);              \
        break;
                CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
            }
            CK(cudaGetLastError(), "gemv_kernel");
        }
        return 0;
    }
    CK(cudaMemsetAsync(c->wide + ENGRAM_CUDA_BLOCK, 0, sizeof(int), st), "cudaMemsetAsync");
    decode16_kernel<<<n, ENGRAM_COLUMNS * 8, 0, st>>>(raw, stride, c->e16, c->kshift, c->wide);
    CK(cudaGetLastError(), "decode16_kernel");
    unsigned warps = (c->N + GEMV_ROWS - 1) / GEMV_ROWS;
    unsigned lb = (warps * 32 + GEMV_THREADS - 1) / GEMV_THREADS;
    if (!(a->flags & ENGRAM_CUDA_FAST_SUMS) && c->tc) {
        /* exact products, sums promoted to F32 every 256 products */
        CK(ws_gemm(layer_maps(c), (int)n, (int)c->N, want16, kv, c->kshift, st), "ws_gemm_kernel");
        if (want16) {
            gemv_list_kernel<unsigned short><<<lb, GEMV_THREADS, 0, st>>>(
                c->w, raw, stride, c->wide, (int)c->N, (unsigned short *)kv, (int)c->N);
            CK(cudaGetLastError(), "gemv_list_kernel");
            *bf16 = 1;
            return 0;
        }
    } else {
        int rc = cublas_gemm(c, n, kv, st, err);
        if (rc < 0)
            return rc;
    }
    gemv_list_kernel<float><<<lb, GEMV_THREADS, 0, st>>>(c->w, raw, stride, c->wide, (int)c->N,
                                                         kv, (int)c->N);
    CK(cudaGetLastError(), "gemv_list_kernel");
    *scaled = 1;
    return 0;
}

extern "C" int engram_cuda_project(engram_cuda_layer *c, const engram_cuda_args *a, float *kv,
                                   engram_error *err)
{
    int rc = check_args(c, a, 0, err);
    if (rc < 0 || !kv)
        return rc < 0 ? rc : set_err(err, -EINVAL, "NULL kv");
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    cudaStream_t st = (cudaStream_t)a->stream;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    for (unsigned t0 = 0; t0 < a->n; t0 += ENGRAM_CUDA_BLOCK) {
        unsigned k = a->n - t0 < ENGRAM_CUDA_BLOCK ? a->n - t0 : ENGRAM_CUDA_BLOCK;
        int scaled, bf16 = 0;
        float *out = kv + (size_t)t0 * c->N;
        if ((rc = project_block(c, a, a->raw + (size_t)t0 * stride, k, out, st, &scaled, &bf16,
                                err)) < 0)
            return rc;
        if (scaled) {
            scale_kernel<<<dim3(16, k), 256, 0, st>>>(out, (int)c->N, c->kshift);
            CK(cudaGetLastError(), "scale_kernel");
        }
    }
    return 0;
}

extern "C" int engram_cuda_apply(engram_cuda_layer *c, const engram_cuda_args *a, engram_error *err)
{
    int rc = check_args(c, a, 1, err);
    if (rc < 0)
        return rc;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    cudaStream_t st = (cudaStream_t)a->stream;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    size_t es = a->resid_dtype == ENGRAM_BF16 ? 2 : 4;
    for (unsigned t0 = 0; t0 < a->n; t0 += ENGRAM_CUDA_BLOCK) {
        unsigned k = a->n - t0 < ENGRAM_CUDA_BLOCK ? a->n - t0 : ENGRAM_CUDA_BLOCK;
        int scaled, kv16 = k > ENGRAM_CUDA_GEMV_MAX;
        if ((rc = project_block(c, a, a->raw + (size_t)t0 * stride, k, c->kv, st, &scaled, &kv16,
                                err)) < 0)
            return rc;
        char *resid = (char *)a->resid + (size_t)t0 * c->S * c->W * es;
        const uint8_t *mk = a->mask ? a->mask + t0 : NULL;
        int bf = a->resid_dtype == ENGRAM_BF16;
        if (k <= ENGRAM_CUDA_GEMV_MAX) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(k * GATE_CTAS);
            cfg.blockDim = dim3(GATE_THREADS);
            cfg.stream = st;
            cudaLaunchAttribute at[1] = {};
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = c->pdl && !(a->flags & ENGRAM_CUDA_SERIAL_GATE) ? 1 : 0;
            CK(cudaLaunchKernelEx(&cfg, gate_kernel, (const float *)c->kv, (int)c->N,
                                  (const float *)c->wq, (void *)resid, bf, mk, (int)c->W, (int)c->S,
                                  c->status, (int)t0, a->d_step, a->resid_step,
                                  (const int *)(scaled ? c->kshift : NULL)),
               "gate_kernel");
        } else {
            /* 16-byte loads: W a multiple of 8, the residual 16-byte aligned
             * (the workspace and the norms are) */
            int vec = !(c->W % 8) && !((uintptr_t)a->resid % 16);
            const unsigned short *k16 = (const unsigned short *)c->kv;
            const int *ksh = scaled ? c->kshift : NULL;
            int W = (int)c->W, S = (int)c->S, N = (int)c->N;
            int keep = S <= GATEB_KS && (W + 7) / 8 <= GATEB_KC * GATEB_THREADS;
#define GATEB(KVT, V, KVP, KS)                                                                  \
    do {                                                                                        \
        if (keep)                                                                               \
            gate_block_kernel<KVT, V, true><<<k, GATEB_THREADS, 0, st>>>(                       \
                KVP, N, c->wq, resid, bf, mk, W, S, c->status, (int)t0, KS);                   \
        else                                                                                    \
            gate_block_kernel<KVT, V, false><<<k, GATEB_THREADS, 0, st>>>(                      \
                KVP, N, c->wq, resid, bf, mk, W, S, c->status, (int)t0, KS);                   \
    } while (0)
            if (kv16 && vec)
                GATEB(unsigned short, true, k16, NULL);
            else if (kv16)
                GATEB(unsigned short, false, k16, NULL);
            else if (vec)
                GATEB(float, true, c->kv, ksh);
            else
                GATEB(float, false, c->kv, ksh);
#undef GATEB
            CK(cudaGetLastError(), "gate_block_kernel");
        }
    }
    return 0;
}

extern "C" int engram_cuda_sync(engram_cuda_layer *c, void *stream, engram_error *err)
{
    if (!c)
        return set_err(err, -EINVAL, "NULL argument");
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    CK(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    int first = INT_MAX, big = INT_MAX;
    CK(cudaMemcpy(&first, c->status, sizeof first, cudaMemcpyDeviceToHost), "cudaMemcpy (status)");
    if (first == INT_MAX)
        return 0;
    CK(cudaMemcpy(c->status, &big, sizeof big, cudaMemcpyHostToDevice), "cudaMemcpy (status)");
    if (err) {
        err->code = -EDOM;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg,
                 "token %d: the residual or the result is not finite; that token was left "
                 "untouched (others were updated)", first);
    }
    return -EDOM;
}
