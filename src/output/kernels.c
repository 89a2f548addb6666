/*
 * kernels.c - the scalar reference kernels of Engram's output stage and
 * the choice of kernels.  These loops *define* the arithmetic (engram.h,
 * "apply"): the SIMD kernels in kernels_x86.c reproduce them bit for bit,
 * which test_apply checks.  Compiled without fast-math or contraction:
 * every fused multiply-add here is an explicit fmaf.
 */
#include <math.h>

#include "kernels.h"
#include "common/cpu.h"

/* ------------------------------------------------------------ conversions */

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (e == 0) {
        /* zero or subnormal: m * 2^-24, exact in F32 */
        v.f = (float)m * 0x1p-24f;
        v.u |= sign;
        return v.f;
    }
    if (e == 31)
        v.u = sign | 0x7f800000u | (m << 13);
    else
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    return v.f;
}

/* ------------------------------------------------------------ projection */

/* kv[o] = fma(e[6143], w[o][6143], ... fma(e[0], w[o][0], +0)): one F32
 * chain per output, in input order. */
static void scalar_project(const struct engram_layer *L, const float *const *e, unsigned nt,
                           float *kv, size_t ld, unsigned p0, unsigned p1)
{
    uint32_t o_end = p1 * PANEL < L->N ? p1 * PANEL : L->N;
    for (unsigned t = 0; t < nt; t++)
        for (uint32_t o = p0 * PANEL; o < o_end; o++) {
            const uint16_t *w = L->w + (size_t)(o / PANEL) * ENGRAM_K * PANEL + o % PANEL;
            float acc = 0.0f;
            for (uint32_t i = 0; i < ENGRAM_K; i++)
                acc = fmaf(e[t][i], f16_to_f32(w[(size_t)i * PANEL]), acc);
            kv[t * ld + o] = acc;
        }
}

/* ------------------------------------------------------------ gate */

static inline float load_x(const void *x, int x_bf16, uint32_t i)
{
    return x_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* Partial sum i mod 16 takes term i; then p[j] += p[j + h] for h = 8, 4, 2, 1. */
static float tree16(float *p)
{
    for (unsigned h = GATE_LANES / 2; h >= 1; h /= 2)
        for (unsigned j = 0; j < h; j++)
            p[j] += p[j + h];
    return p[0];
}

static void scalar_reduce(const void *x, int x_bf16, const float *kv_s, const float *wq_s,
                          uint32_t W, float out[3])
{
    float d[GATE_LANES], sx[GATE_LANES], sk[GATE_LANES];
    for (unsigned l = 0; l < GATE_LANES; l++)
        d[l] = sx[l] = sk[l] = 0.0f;
    for (uint32_t i = 0; i < W; i++) {
        float xi = load_x(x, x_bf16, i);
        float k = bf16_round(kv_s[i]);
        float xw = xi * wq_s[i];
        unsigned l = i % GATE_LANES;
        d[l] = fmaf(xw, k, d[l]);
        sx[l] = fmaf(xi, xi, sx[l]);
        sk[l] = fmaf(k, k, sk[l]);
    }
    out[0] = tree16(d);
    out[1] = tree16(sx);
    out[2] = tree16(sk);
}

static int scalar_update(const void *x, int x_bf16, const float *kv_v, float g, uint32_t W,
                         void *out, int out_bf16)
{
    int ok = 1;
    for (uint32_t i = 0; i < W; i++) {
        float y = bf16_round(fmaf(g, bf16_round(kv_v[i]), load_x(x, x_bf16, i)));
        ok &= isfinite(y) != 0;
        if (!out)
            continue;
        if (out_bf16)
            ((uint16_t *)out)[i] = f32_to_bf16_bits(y);
        else
            ((float *)out)[i] = y;
    }
    return ok;
}

float gate_value(float D, float sxx, float skk, uint32_t W)
{
    const float w = (float)W, eps = 1e-6f;
    float a = 1.0f / sqrtf(sxx / w + eps);
    float b = 1.0f / sqrtf(skk / w + eps);
    float c = 1.0f / sqrtf(w);
    float d = D * a * b * c;
    float z = copysignf(sqrtf(fmaxf(fabsf(d), 1e-6f)), d);
    return 1.0f / (1.0f + expf(-z));
}

const struct apply_kernels apply_kernels_scalar = {scalar_project, scalar_reduce, scalar_update};

static const struct apply_kernels *kernels_of(engram_simd s)
{
    if (!engram_simd_supported(s))
        return NULL;
    /* The AVX2 kernels also need F16C and FMA (every AVX2 CPU so far has
     * them, but they are separate CPUID flags). */
    int f16_fma = cpu_has_f16c_fma();
    switch (s) {
    case ENGRAM_SIMD_SCALAR: return &apply_kernels_scalar;
    case ENGRAM_SIMD_AVX2: return f16_fma && apply_kernels_avx2.project ? &apply_kernels_avx2 : NULL;
    case ENGRAM_SIMD_AVX512:
        return f16_fma && apply_kernels_avx512.project ? &apply_kernels_avx512 : NULL;
    default: return NULL;
    }
}

const struct apply_kernels *apply_kernels_for(engram_simd s)
{
    if (s != ENGRAM_SIMD_AUTO)
        return kernels_of(s);
    /* the library's choice, or the scalar kernels on a CPU with AVX2 but
     * without F16C or FMA */
    const struct apply_kernels *k = kernels_of(engram_simd_selected());
    return k ? k : &apply_kernels_scalar;
}
