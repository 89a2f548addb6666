/*
 * ple_kernels.cuh - the PLE output stage's kernels (cuda/ple_cuda.h; the
 * CPU contract and its arithmetic: src/output/ple_apply.h):
 *  - ple_gemv_kernel<T>: the projection of T = 1..8 tokens on the CUDA
 *    cores, over a range of the [5W][2560] 16-bit weights (BF16 or F16 per
 *    matrix);
 *  - ple_gate_kernel<BF>: one block per token, the token's x, k and v
 *    staged in shared memory, a warp per stream: Skk, Sxx, D, alpha, G as
 *    ple_apply.h's steps 2-3 (Sum16 in its order: 16 lanes, one chain
 *    each, then the 8-4-2-1 tree), Sgg and rn;
 *  - ple_conv_kernel<BF>: frames, the dilated convolution, SiLU and the
 *    update (steps 3-5), one thread per (index i, chunk of 36 positions),
 *    and the state's advance.
 * Every element-wise operation is the CPU's, rounded once (__fmul_rn and
 * __fadd_rn are never contracted into FMAs; fmaf is one FMA); expf as
 * exp in double rounded to float.  BF = the residual is BF16 (else F32).
 */
#ifndef ENGRAM_PLE_KERNELS_CUH
#define ENGRAM_PLE_KERNELS_CUH

#include <stdint.h>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
/* cuda/emulate_ple.cpp compiles these kernels for the host (threads as
 * fibers) and defines this as it must */
#ifndef PLE_EXTERN_SHARED
#define PLE_EXTERN_SHARED extern __shared__
#endif

#define PLE_IN 2560                 /* inputs per token: 16 rows x 160 BF16 */
#define PG_ROWS 4                   /* outputs per warp                     */
#define PG_THREADS 128            /* 4 warps: blocks of 16 outputs (144 registers at T = 8) */
#define PG_CHUNKS (PLE_IN / 256)    /* 8 values x 32 lanes per iteration     */
#define PGATE_THREADS 256           /* all stage; warps 0-3 take a stream each */
#define PCONV_THREADS 128
#define PCONV_CHUNK 36              /* positions per thread (a multiple of 9) */
#define PLE_FRAMES 9                /* 3 (T - 1), T = 4                       */

static_assert(PCONV_CHUNK % PLE_FRAMES == 0 && PCONV_CHUNK >= PLE_FRAMES,
              "a chunk is whole rounds of the frame ring, and only the first reads the state");

/* Programmatic dependent launch (sm_90+; no-ops elsewhere and when a
 * kernel was launched without the attribute). */
__device__ __forceinline__ void ple_pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void ple_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* 16 bytes of weights, streamed: read once, kept out of L1 (where the
 * rows of the tokens stay). */
__device__ __forceinline__ uint4 ple_ld_stream(const uint16_t *p)
{
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
#else
    return *(const uint4 *)p; /* a host build of these kernels (a CPU emulation) */
#endif
}

/* 8 16-bit values (memory order) -> 8 floats, exact. */
template <bool F16> __device__ __forceinline__ void ple_wide8(const uint4 &v, float *f)
{
    const unsigned p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        if (F16) {
            __half2 h = *reinterpret_cast<const __half2 *>(&p[q]);
            float2 g = __half22float2(h);
            f[2 * q] = g.x;
            f[2 * q + 1] = g.y;
        } else {
            f[2 * q] = __uint_as_float(p[q] << 16);
            f[2 * q + 1] = __uint_as_float(p[q] & 0xffff0000u);
        }
    }
}

/* ------------------------------------------------------------ projection */

/* Outputs [o0, o0 + 4) (those below o_hi) for T tokens: lane l takes the
 * input chunks l, l + 32, ... (8 values each, 16-byte loads), one F32 FMA
 * chain per (token, output) in that order, then a fixed xor-shuffle tree
 * adds the 32 lanes.  The order does not depend on T. */
template <int T, bool F16>
__device__ __forceinline__ void ple_gemv_rows(const uint16_t *__restrict__ w, int o0, int o_hi,
                                              const uint16_t *__restrict__ e, float *__restrict__ kv,
                                              int ldkv, int lane)
{
    float acc[T][PG_ROWS];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < PG_ROWS; r++)
            acc[t][r] = 0.0f;
#pragma unroll 2 /* 8 weight loads of 16 bytes in flight per lane */
    for (int j = 0; j < PG_CHUNKS; j++) {
        const int i0 = (lane + 32 * j) * 8;
        uint4 wv[PG_ROWS];
#pragma unroll
        for (int r = 0; r < PG_ROWS; r++)
            wv[r] = o0 + r < o_hi ? ple_ld_stream(w + (size_t)(o0 + r) * PLE_IN + i0)
                                  : make_uint4(0, 0, 0, 0);
        float wf[PG_ROWS][8];
#pragma unroll
        for (int r = 0; r < PG_ROWS; r++)
            ple_wide8<F16>(wv[r], wf[r]);
#pragma unroll
        for (int t = 0; t < T; t++) {
            float x[8];
            ple_wide8<false>(__ldg((const uint4 *)(e + (size_t)t * PLE_IN + i0)), x);
#pragma unroll
            for (int r = 0; r < PG_ROWS; r++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    acc[t][r] = fmaf(x[k], wf[r][k], acc[t][r]);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < PG_ROWS; r++) {
            float v = acc[t][r];
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0 && o0 + r < o_hi)
                kv[(size_t)t * ldkv + o0 + r] = v;
        }
}

/* kv[t][o] for T tokens (rows e, [T][2560] BF16) and outputs o in
 * [o_lo, o_hi) of w ([5W][2560]: outputs below C = 4W are W_k's, of type
 * F16 if key_f16 else BF16, the rest W_v's).  o_lo and C are multiples of
 * PG_ROWS, so a warp's outputs lie in one matrix. */
template <int T>
__global__ void __launch_bounds__(PG_THREADS)
ple_gemv_kernel(const uint16_t *__restrict__ w, int key_f16, int value_f16, int C, int o_lo, int o_hi,
                const uint16_t *__restrict__ e, float *__restrict__ kv, int ldkv)
{
    ple_pdl_launch_dependents();
    const int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int o0 = o_lo + warp * PG_ROWS;
    if (o0 >= o_hi)
        return;
    if (o0 < C ? key_f16 : value_f16)
        ple_gemv_rows<T, true>(w, o0, o_hi, e, kv, ldkv, lane);
    else
        ple_gemv_rows<T, false>(w, o0, o_hi, e, kv, ldkv, lane);
}

/* ------------------------------------------------------------ gate */

/* expf as exp in double rounded once (the C library's expf is correctly
 * rounded or within a hair of it; CUDA's own expf is within 2 ulps). */
__device__ __forceinline__ float ple_exp(float x)
{
    return (float)exp((double)x);
}

/* ple_apply.h step 2's last line: sign(0) = 0 (s = +-0 gives alpha = 0.5). */
__device__ __forceinline__ float ple_alpha_dev(float s)
{
    float z = s == 0.0f ? 0.0f : copysignf(__fsqrt_rn(fmaxf(fabsf(s), 1e-6f)), s);
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, ple_exp(-z)));
}

/* 1 / sqrt(y): a correctly rounded square root, then a division. */
__device__ __forceinline__ float ple_rsqrt_dev(float y)
{
    return __fdiv_rn(1.0f, __fsqrt_rn(y));
}

/* Sum16's combination (p[l] += p[l + h], h = 8, 4, 2, 1) over lanes 0-15,
 * the result in lane 0; the same shuffles combine lanes 16-31 into lane 16.
 * Every lane of the warp calls it. */
__device__ __forceinline__ float ple_tree16(float p)
{
#pragma unroll
    for (int h = 8; h >= 1; h >>= 1)
        p = __fadd_rn(p, __shfl_down_sync(0xffffffffu, p, h));
    return p;
}

template <bool BF> __device__ __forceinline__ float ple_ldx(const void *x, size_t i)
{
    if (BF)
        return __uint_as_float((unsigned)((const unsigned short *)x)[i] << 16);
    return ((const float *)x)[i];
}

/* An output stored: F32, or BF16 rounded to nearest even (o finite). */
template <bool BF> __device__ __forceinline__ void ple_stx(void *x, size_t i, float o)
{
    if (BF) {
        unsigned u = __float_as_uint(o);
        u += 0x7fffu + ((u >> 16) & 1u);
        ((unsigned short *)x)[i] = (unsigned short)(u >> 16);
    } else {
        ((float *)x)[i] = o;
    }
}

#define PLE_STAGE_BATCH 8 /* loads in flight per thread while staging */

/* n floats from global memory into shared memory by the whole block,
 * 16-byte loads when both sides allow, PLE_STAGE_BATCH in flight per
 * thread. */
__device__ __forceinline__ void ple_stage(const float *__restrict__ src, float *dst, int n)
{
    const int nt = (int)blockDim.x;
    if (((uintptr_t)src & 15) == 0 && ((uintptr_t)dst & 15) == 0 && (n & 3) == 0) {
        const float4 *s4 = (const float4 *)src;
        float4 *d4 = (float4 *)dst;
        const int n4 = n / 4;
        for (int q0 = (int)threadIdx.x; q0 < n4; q0 += PLE_STAGE_BATCH * nt) {
            float4 r[PLE_STAGE_BATCH];
#pragma unroll
            for (int u = 0; u < PLE_STAGE_BATCH; u++)
                if (q0 + u * nt < n4)
                    r[u] = s4[q0 + u * nt];
#pragma unroll
            for (int u = 0; u < PLE_STAGE_BATCH; u++)
                if (q0 + u * nt < n4)
                    d4[q0 + u * nt] = r[u];
        }
        return;
    }
    for (int q0 = (int)threadIdx.x; q0 < n; q0 += PLE_STAGE_BATCH * nt) {
        float r[PLE_STAGE_BATCH];
#pragma unroll
        for (int u = 0; u < PLE_STAGE_BATCH; u++)
            if (q0 + u * nt < n)
                r[u] = src[q0 + u * nt];
#pragma unroll
        for (int u = 0; u < PLE_STAGE_BATCH; u++)
            if (q0 + u * nt < n)
                dst[q0 + u * nt] = r[u];
    }
}

/* The residual's n values (F32 or BF16) as F32 into shared memory. */
template <bool BF> __device__ __forceinline__ void ple_stage_x(const void *__restrict__ x, float *dst, int n)
{
    if (!BF) {
        ple_stage((const float *)x, dst, n);
        return;
    }
    const unsigned short *xb = (const unsigned short *)x;
    const int nt = (int)blockDim.x;
    for (int q0 = (int)threadIdx.x; q0 < n; q0 += PLE_STAGE_BATCH * nt) {
        unsigned short r[PLE_STAGE_BATCH];
#pragma unroll
        for (int u = 0; u < PLE_STAGE_BATCH; u++)
            if (q0 + u * nt < n)
                r[u] = xb[q0 + u * nt];
#pragma unroll
        for (int u = 0; u < PLE_STAGE_BATCH; u++)
            if (q0 + u * nt < n)
                dst[q0 + u * nt] = __uint_as_float((unsigned)r[u] << 16);
    }
}

/* Shared memory of ple_gate_kernel: x [4W], k [4W], v [W] floats (k and v
 * 16 floats further on: the two halves of a warp reading k and x hit other
 * banks). */
__host__ __device__ constexpr size_t ple_gate_smem(int W)
{
    return (9 * (size_t)W + 32) * sizeof(float);
}

/*
 * One block per position t of the call's block (256 threads).  Masked:
 * flag[t] = 0, nothing read.  Otherwise the token's x (before the wait for
 * kv: the projection does not write the residual), k and v are staged in
 * shared memory by the whole block, then warp j < 4 takes stream j, each
 * Sum16 chain l one lane: Skk_j (lanes 0-15) and Sxx_j (lanes 16-31) at
 * once; rk, rq; kh = (k rk) gamma_k and qh = (x rq) gamma_q computed in
 * place by the whole block; D_j (lanes 0-15); alpha_j; G_j.  Thread 0:
 * Sgg = ((G_0 + G_1) + G_2) + G_3, rn, and flag[t] = 1 (ok) or 2 (a sum
 * not finite: the token is not written, and is recorded in status).
 * Writes alpha[t][4], rn[t], flag[t].
 */
template <bool BF>
__global__ void __launch_bounds__(PGATE_THREADS)
ple_gate_kernel(const float *__restrict__ kv, int ldkv, const void *__restrict__ resid,
                const uint8_t *__restrict__ mask, const float *__restrict__ gk,
                const float *__restrict__ gq, int W, float eps, float *__restrict__ alpha,
                float *__restrict__ rn, uint8_t *__restrict__ flag, int *status, int t_base)
{
    PLE_EXTERN_SHARED float4 ple_smem4[];
    float *sx = (float *)ple_smem4, *sk = sx + 4 * (size_t)W + 16, *sv = sk + 4 * (size_t)W + 16;
    __shared__ float sr[2][4], sg[4];
    __shared__ int sok[4];
    ple_pdl_launch_dependents();
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l = lane & 15;
    if (mask && !mask[t]) {
        ple_pdl_wait(); /* nothing written before the kernels ahead have finished */
        if (threadIdx.x == 0)
            flag[t] = 0;
        return;
    }
    const int C = 4 * W;
    const float wf = (float)W;
    ple_stage_x<BF>((const char *)resid + (size_t)t * C * (BF ? 2 : 4), sx, C);
    ple_pdl_wait();
    ple_stage(kv + (size_t)t * ldkv, sk, C);
    ple_stage(kv + (size_t)t * ldkv + C, sv, W);
    __syncthreads();
    if (warp < 4) {
        const int j = warp;
        const float *a = (lane < 16 ? sk : sx) + (size_t)j * W;
        float p = 0.0f;
#pragma unroll 8
        for (int i = l; i < W; i += 16)
            p = fmaf(a[i], a[i], p);
        p = ple_tree16(p);
        const float skk = __shfl_sync(0xffffffffu, p, 0), sxx = __shfl_sync(0xffffffffu, p, 16);
        if (lane == 0) {
            sr[0][j] = ple_rsqrt_dev(__fadd_rn(__fdiv_rn(skk, wf), eps));
            sr[1][j] = ple_rsqrt_dev(__fadd_rn(__fdiv_rn(sxx, wf), eps));
            sok[j] = isfinite(skk) && isfinite(sxx);
        }
    }
    __syncthreads();
    if ((W & 3) == 0) { /* 16-byte loads of the norms (4 values lie in one stream), 8 in flight */
        float4 *k4 = (float4 *)sk, *x4 = (float4 *)sx;
        const float4 *gk4 = (const float4 *)gk, *gq4 = (const float4 *)gq;
#pragma unroll 4
        for (int q = threadIdx.x; q < C / 4; q += PGATE_THREADS) {
            const int j = 4 * q / W;
            const float rk = sr[0][j], rq = sr[1][j];
            const float4 a = gk4[q], b = gq4[q];
            float4 k = k4[q], x = x4[q];
            k.x = __fmul_rn(__fmul_rn(k.x, rk), a.x);
            k.y = __fmul_rn(__fmul_rn(k.y, rk), a.y);
            k.z = __fmul_rn(__fmul_rn(k.z, rk), a.z);
            k.w = __fmul_rn(__fmul_rn(k.w, rk), a.w);
            x.x = __fmul_rn(__fmul_rn(x.x, rq), b.x);
            x.y = __fmul_rn(__fmul_rn(x.y, rq), b.y);
            x.z = __fmul_rn(__fmul_rn(x.z, rq), b.z);
            x.w = __fmul_rn(__fmul_rn(x.w, rq), b.w);
            k4[q] = k;
            x4[q] = x;
        }
    } else {
#pragma unroll 1
        for (int j = 0; j < 4; j++) {
            const float rk = sr[0][j], rq = sr[1][j];
            float *kj = sk + (size_t)j * W, *xj = sx + (size_t)j * W;
            const float *gkj = gk + (size_t)j * W, *gqj = gq + (size_t)j * W;
#pragma unroll 4
            for (int i = threadIdx.x; i < W; i += PGATE_THREADS) {
                kj[i] = __fmul_rn(__fmul_rn(kj[i], rk), gkj[i]);
                xj[i] = __fmul_rn(__fmul_rn(xj[i], rq), gqj[i]);
            }
        }
    }
    __syncthreads();
    if (warp < 4) {
        const int j = warp;
        const float *kh = sk + (size_t)j * W, *qh = sx + (size_t)j * W;
        float p = 0.0f;
        if (lane < 16) {
#pragma unroll 8
            for (int i = l; i < W; i += 16)
                p = fmaf(kh[i], qh[i], p);
        }
        p = ple_tree16(p);
        const float D = __shfl_sync(0xffffffffu, p, 0);
        const float a = ple_alpha_dev(__fdiv_rn(D, __fsqrt_rn(wf)));
        p = 0.0f;
        if (lane < 16) {
#pragma unroll 8
            for (int i = l; i < W; i += 16) {
                const float g = __fmul_rn(a, sv[i]);
                p = fmaf(g, g, p);
            }
        }
        p = ple_tree16(p);
        if (lane == 0) {
            sg[j] = p;
            sok[j] = sok[j] && isfinite(D);
            alpha[(size_t)t * 4 + j] = a;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float sgg = __fadd_rn(__fadd_rn(__fadd_rn(sg[0], sg[1]), sg[2]), sg[3]);
        const float r = ple_rsqrt_dev(__fadd_rn(__fdiv_rn(sgg, (float)C), eps));
        const int ok = sok[0] && sok[1] && sok[2] && sok[3] && isfinite(sgg);
        rn[t] = r;
        flag[t] = ok ? 1 : 2;
        if (!ok)
            atomicMin(status, t_base + t);
    }
}

/* ------------------------------------------------------------ convolution and update */

/* Position t's frame at index i of the 4 streams: +0 if masked, else
 * ((alpha_s v_i) rn) gamma_conv (g: gamma_conv of the 4 channels). */
__device__ __forceinline__ void ple_frame4(const float *__restrict__ kv, int ldkv, size_t C, int i,
                                           const float *__restrict__ alpha, const float *__restrict__ rn,
                                           const uint8_t *__restrict__ flag, int t, const float *g,
                                           float *out)
{
    if (flag[t] == 0) {
#pragma unroll
        for (int s = 0; s < 4; s++)
            out[s] = 0.0f;
        return;
    }
    const float v = kv[(size_t)t * ldkv + C + i], r = rn[t];
    const float4 a4 = *(const float4 *)(alpha + (size_t)t * 4);
    const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
    for (int s = 0; s < 4; s++)
        out[s] = __fmul_rn(__fmul_rn(__fmul_rn(a[s], v), r), g[s]);
}

/*
 * Thread (i, chunk): index i of the 4 streams (channels sW + i) for the
 * positions [t0, t0 + 36) of the block's n.  The last 9 frames ride in
 * registers, ring[u] holding the frame of the position t with t = u mod 9
 * (unrolled 9 at a time, so every index is a constant): taps t - 9, t - 6,
 * t - 3 are ring[u], ring[(u + 3) % 9], ring[(u + 6) % 9] before position
 * t's own frame replaces ring[u].  The first chunk starts from the state
 * (read before the wait: no kernel of this call writes it), the others
 * from the 9 frames before them, recomputed.  An unmasked position: a =
 * the taps' FMA chain (oldest first, from +0), y = a / (1 + exp(-a)),
 * out = (x + alpha v) + y, written if the gate found it ok and out is
 * finite (else recorded).  At the end the first chunk's threads advance
 * the state of their 4 channels: frame f becomes old frame f + n (f + n <
 * 9) or the frame of position f + n - 9; only they ever read the state,
 * and each reads a frame before anything overwrites it.
 */
template <bool BF>
__global__ void __launch_bounds__(PCONV_THREADS)
ple_conv_kernel(const float *__restrict__ kv, int ldkv, void *resid, const float *__restrict__ alpha,
                const float *__restrict__ rn, const uint8_t *__restrict__ flag,
                const float *__restrict__ gc, const float *__restrict__ taps, float *state, int W, int n,
                int *status, int t_base)
{
    ple_pdl_launch_dependents();
    const int i = (int)(blockIdx.x * PCONV_THREADS + threadIdx.x), t0 = (int)blockIdx.y * PCONV_CHUNK;
    if (i >= W)
        return;
    const size_t C = 4 * (size_t)W;
    float w0[4], w1[4], w2[4], w3[4], g[4];
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const size_t c = (size_t)s * W + i;
        w0[s] = taps[c];
        w1[s] = taps[C + c];
        w2[s] = taps[2 * C + c];
        w3[s] = taps[3 * C + c];
        g[s] = gc[c];
    }
    float ring[PLE_FRAMES][4];
    if (t0 == 0) {
#pragma unroll
        for (int f = 0; f < PLE_FRAMES; f++)
#pragma unroll
            for (int s = 0; s < 4; s++)
                ring[f][s] = state[(size_t)f * C + (size_t)s * W + i];
    }
    ple_pdl_wait();
    if (t0 > 0) {
#pragma unroll
        for (int f = 0; f < PLE_FRAMES; f++)
            ple_frame4(kv, ldkv, C, i, alpha, rn, flag, t0 - PLE_FRAMES + f, g, ring[f]);
    }
    const int tend = min(n, t0 + PCONV_CHUNK);
#pragma unroll 1
    for (int tb = t0; tb < tend; tb += PLE_FRAMES) {
#pragma unroll
        for (int u = 0; u < PLE_FRAMES; u++) {
            const int t = tb + u;
            if (t < tend) {
                const int fl = flag[t];
                float nt[4];
                if (fl == 0) {
#pragma unroll
                    for (int s = 0; s < 4; s++)
                        nt[s] = 0.0f;
                } else {
                    const float v = kv[(size_t)t * ldkv + C + i], r = rn[t];
                    const float4 a4 = *(const float4 *)(alpha + (size_t)t * 4);
                    const float a[4] = {a4.x, a4.y, a4.z, a4.w};
                    int bad = 0;
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        const float gs = __fmul_rn(a[s], v);
                        nt[s] = __fmul_rn(__fmul_rn(gs, r), g[s]);
                        /* taps t - 9, t - 6, t - 3, t, oldest first, from +0 */
                        float ac = fmaf(w0[s], ring[u][s], 0.0f);
                        ac = fmaf(w1[s], ring[(u + 3) % PLE_FRAMES][s], ac);
                        ac = fmaf(w2[s], ring[(u + 6) % PLE_FRAMES][s], ac);
                        ac = fmaf(w3[s], nt[s], ac);
                        const float y = __fdiv_rn(ac, __fadd_rn(1.0f, ple_exp(-ac)));
                        const size_t xi = (size_t)t * C + (size_t)s * W + i;
                        const float o = __fadd_rn(__fadd_rn(ple_ldx<BF>(resid, xi), gs), y);
                        if (fl == 1 && isfinite(o))
                            ple_stx<BF>(resid, xi, o);
                        else
                            bad = 1;
                    }
                    if (bad && fl == 1)
                        atomicMin(status, t_base + t);
                }
#pragma unroll
                for (int s = 0; s < 4; s++)
                    ring[u][s] = nt[s];
            }
        }
    }
    if (t0 == 0) {
#pragma unroll 1
        for (int f = 0; f < PLE_FRAMES; f++) {
            float val[4];
            if (f + n < PLE_FRAMES) {
#pragma unroll
                for (int s = 0; s < 4; s++)
                    val[s] = state[(size_t)(f + n) * C + (size_t)s * W + i];
            } else {
                ple_frame4(kv, ldkv, C, i, alpha, rn, flag, f + n - PLE_FRAMES, g, val);
            }
#pragma unroll
            for (int s = 0; s < 4; s++)
                state[(size_t)f * C + (size_t)s * W + i] = val[s];
        }
    }
}

#endif
