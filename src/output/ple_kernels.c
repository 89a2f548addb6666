/*
 * ple_kernels.c - the scalar reference kernels of the PLE output stage and
 * the choice of kernels.  These loops *define* the arithmetic written in
 * ple_apply.h; the SIMD kernels in ple_kernels_x86.c reproduce them bit for
 * bit, which test_ple_apply checks.  Compiled without fast-math or
 * contraction: every fused multiply-add here is an explicit fmaf.
 */
#include <math.h>

#include "ple_kernels.h"
#include "kernels.h"
#include "common/cpu.h"

/* ------------------------------------------------------------ projection */

static float weight_at(const struct ple_mat *m, size_t idx)
{
    switch (m->type) {
    case GGML_BF16: return bf16_to_f32(((const uint16_t *)m->w)[idx]);
    case GGML_F16: return f16_to_f32(((const uint16_t *)m->w)[idx]);
    default: return ((const float *)m->w)[idx];
    }
}

/* p_o = fma(e[K-1], w[o][K-1], ... fma(e[0], w[o][0], +0)): one chain per
 * output, in input order. */
static void scalar_project(const struct ple_layer *L, const float *const *e, unsigned nt, float *kv,
                           size_t ld, unsigned p0, unsigned p1, float *wbuf)
{
    (void)wbuf;
    for (unsigned p = p0; p < p1; p++) {
        int val = p >= L->m[0].panels;
        const struct ple_mat *m = &L->m[val];
        unsigned q = val ? p - L->m[0].panels : p;
        uint32_t o0 = q * PLE_PANEL, ncols = m->rows - o0 < PLE_PANEL ? m->rows - o0 : PLE_PANEL;
        size_t base = (size_t)q * PLE_K * PLE_PANEL;
        float *out = kv + (val ? L->C : 0) + o0;
        for (unsigned t = 0; t < nt; t++)
            for (uint32_t j = 0; j < ncols; j++) {
                float acc = 0.0f;
                for (uint32_t i = 0; i < PLE_K; i++)
                    acc = fmaf(e[t][i], weight_at(m, base + (size_t)i * PLE_PANEL + j), acc);
                out[t * ld + j] = acc;
            }
    }
}

/* ------------------------------------------------------------ reductions */

/* Sum16's combination: p[l] += p[l + h] for h = 8, 4, 2, 1. */
static float tree16(float *p)
{
    for (unsigned h = PLE_LANES / 2; h >= 1; h /= 2)
        for (unsigned l = 0; l < h; l++)
            p[l] += p[l + h];
    return p[0];
}

static void scalar_gate(const float *k, const float *x, const float *gk, const float *gq, uint32_t W,
                        float eps, float out[3])
{
    float pk[PLE_LANES], px[PLE_LANES], pd[PLE_LANES];
    for (unsigned l = 0; l < PLE_LANES; l++)
        pk[l] = px[l] = pd[l] = 0.0f;
    for (uint32_t i = 0; i < W; i++) {
        pk[i % PLE_LANES] = fmaf(k[i], k[i], pk[i % PLE_LANES]);
        px[i % PLE_LANES] = fmaf(x[i], x[i], px[i % PLE_LANES]);
    }
    float skk = tree16(pk), sxx = tree16(px), w = (float)W;
    float rk = ple_rsqrt(skk / w + eps), rq = ple_rsqrt(sxx / w + eps);
    for (uint32_t i = 0; i < W; i++) {
        float kh = (k[i] * rk) * gk[i], qh = (x[i] * rq) * gq[i];
        pd[i % PLE_LANES] = fmaf(kh, qh, pd[i % PLE_LANES]);
    }
    out[0] = skk;
    out[1] = sxx;
    out[2] = tree16(pd);
}

static float scalar_sumsq(const float *v, float alpha, uint32_t W)
{
    float p[PLE_LANES];
    for (unsigned l = 0; l < PLE_LANES; l++)
        p[l] = 0.0f;
    for (uint32_t i = 0; i < W; i++) {
        float g = alpha * v[i];
        p[i % PLE_LANES] = fmaf(g, g, p[i % PLE_LANES]);
    }
    return tree16(p);
}

/* ------------------------------------------------------------ elementwise */

static int scalar_frame(const float *v, float alpha, float rn, const float *gc, uint32_t W, float *n)
{
    int ok = 1;
    for (uint32_t i = 0; i < W; i++) {
        n[i] = ((alpha * v[i]) * rn) * gc[i];
        ok &= isfinite(n[i]) != 0;
    }
    return ok;
}

static void scalar_conv(const float *const *tap, const float *w, uint32_t T, uint32_t C, float *y)
{
    for (uint32_t c = 0; c < C; c++) {
        float a = 0.0f;
        for (uint32_t k = 0; k < T; k++)
            a = fmaf(w[(size_t)k * C + c], tap[k][c], a);
        y[c] = ple_silu(a);
    }
}

static int scalar_update(const float *x, const float *v, float alpha, const float *y, uint32_t W,
                         float *out)
{
    int ok = 1;
    for (uint32_t i = 0; i < W; i++) {
        float o = (x[i] + alpha * v[i]) + y[i];
        ok &= isfinite(o) != 0;
        out[i] = o;
    }
    return ok;
}

/* ------------------------------------------------------------ shared scalars */

float ple_alpha(float s)
{
    /* sign(0) = 0: s = +0 or -0 gives z = +0 and alpha = 0.5 */
    float z = s == 0.0f ? 0.0f : copysignf(sqrtf(fmaxf(fabsf(s), 1e-6f)), s);
    return 1.0f / (1.0f + expf(-z));
}

float ple_silu(float a)
{
    return a / (1.0f + expf(-a));
}

const struct ple_kernels ple_kernels_scalar = {"scalar",     scalar_project, scalar_gate, scalar_sumsq,
                                               scalar_frame, scalar_conv,    scalar_update};

static const struct ple_kernels *kernels_of(engram_simd s)
{
    if (!engram_simd_supported(s))
        return NULL;
    /* the SIMD kernels also convert F16 weights with F16C and use FMA */
    int f16_fma = cpu_has_f16c_fma();
    switch (s) {
    case ENGRAM_SIMD_SCALAR: return &ple_kernels_scalar;
    case ENGRAM_SIMD_AVX2: return f16_fma && ple_kernels_avx2.project ? &ple_kernels_avx2 : NULL;
    case ENGRAM_SIMD_AVX512: return f16_fma && ple_kernels_avx512.project ? &ple_kernels_avx512 : NULL;
    default: return NULL;
    }
}

const struct ple_kernels *ple_kernels_for(engram_simd s)
{
    if (s != ENGRAM_SIMD_AUTO)
        return kernels_of(s);
    const struct ple_kernels *k = kernels_of(engram_simd_selected());
    return k ? k : &ple_kernels_scalar;
}
