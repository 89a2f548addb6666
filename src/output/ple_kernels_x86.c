/*
 * ple_kernels_x86.c - AVX2 (+F16C, FMA) and AVX-512 kernels of the PLE
 * output stage, compiled with target attributes and chosen at run time.
 * They compute exactly the order of ple_kernels.c's scalar reference
 * (ple_apply.h):
 *  - projection: vectors run across 16 (8) outputs of a panel, so each
 *    lane is one output's chain of fused multiply-adds in input order; K is
 *    cut into blocks of PLE_KC, the partial sums going through kv between
 *    blocks (a float stored and reloaded continues the same chain).  Each
 *    weight is widened to F32 as it is loaded (BF16: a shift; F16: F16C;
 *    F32 as is), the same value the scalar kernel multiplies;
 *  - Sum16: lane l of one 16-wide accumulator (two 8-wide ones for AVX2)
 *    is partial sum l; lanes past the end keep their partial sums; the tree
 *    adds the upper half onto the lower half four times;
 *  - elementwise steps lane by lane in the scalar order; expf (the gate's
 *    sigmoid, SiLU) stays the C library's, called per value, so that every
 *    kernel has the same bits.
 */
#include <math.h>

#include "ple_kernels.h"
#include "common/cpu.h"

#if ENGRAM_X86_KERNELS
#include <immintrin.h>

#include "tiles_x86.h"

/* The pieces every projection shares: which matrix a global panel is in,
 * its local index, where its outputs go and how many there are. */
struct panel {
    const void *w;          /* the panel's first row, of the matrix's type */
    uint32_t type;
    unsigned ncols;         /* valid outputs                              */
    float *out;             /* kv + the panel's first output              */
};

static INLINE struct panel panel_of(const struct ple_layer *L, unsigned p, float *kv)
{
    int val = p >= L->m[0].panels;
    const struct ple_mat *m = &L->m[val];
    unsigned q = val ? p - L->m[0].panels : p;
    size_t es = m->type == GGML_F32 ? 4 : 2;
    struct panel r;
    r.w = (const uint8_t *)m->w + (size_t)q * PLE_K * PLE_PANEL * es;
    r.type = m->type;
    r.ncols = m->rows - q * PLE_PANEL < PLE_PANEL ? m->rows - q * PLE_PANEL : PLE_PANEL;
    r.out = kv + (val ? L->C : 0) + (size_t)q * PLE_PANEL;
    return r;
}

typedef void (*micro_fn)(const float *const *a, const void *b, unsigned kc, float *c, size_t ld,
                         int first, unsigned ncols);
/* PLE_KC rows of a panel of 16-bit weights (type 0 BF16, 1 F16) widened to
 * F32 into dst. */
typedef void (*widen_fn)(const uint16_t *src, int type, float *dst);

/* The loops around a micro-kernel: panels, K blocks, token tiles.
 * micro[type][mr] with type 0 BF16, 1 F16, 2 F32.  With more than one tile
 * of tokens, a block of 16-bit weights is widened to F32 once (into wbuf)
 * and the F32 micro-kernel reads it for every tile: the same values, one
 * conversion instead of one per tile. */
static INLINE void project_loops(const struct ple_layer *L, const float *const *e, unsigned nt,
                                 float *kv, size_t ld, unsigned p0, unsigned p1,
                                 const micro_fn (*micro)[PLE_MR + 1], widen_fn widen, float *wbuf)
{
    for (unsigned p = p0; p < p1; p++) {
        struct panel P = panel_of(L, p, kv);
        unsigned ti = P.type == GGML_BF16 ? 0 : P.type == GGML_F16 ? 1 : 2;
        size_t es = ti == 2 ? 4 : 2;
        for (unsigned kb = 0; kb < PLE_K; kb += PLE_KC) {
            const void *b = (const uint8_t *)P.w + (size_t)kb * PLE_PANEL * es;
            unsigned tb = ti;
            if (ti != 2 && nt > PLE_MR) {
                widen((const uint16_t *)b, (int)ti, wbuf);
                b = wbuf;
                tb = 2;
            }
            for (unsigned t0 = 0; t0 < nt; t0 += PLE_MR) {
                unsigned mr = nt - t0 < PLE_MR ? nt - t0 : PLE_MR;
                const float *a[PLE_MR];
                for (unsigned r = 0; r < mr; r++)
                    a[r] = e[t0 + r] + kb;
                micro[tb][mr](a, b, PLE_KC, P.out + (size_t)t0 * ld, ld, kb == 0, P.ncols);
            }
        }
    }
}


/* ============================================================ AVX-512 */

/* 16 weights of row i (outputs col .. col + 15) as F32. */
TGT_AVX512 static INLINE __m512 wload16(const void *b, size_t at, const int type)
{
    if (type == 0)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)((const uint16_t *)b + at))), 16));
    if (type == 1)
        return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)((const uint16_t *)b + at)));
    return _mm512_load_ps((const float *)b + at);
}

TGT_AVX512 static INLINE __mmask16 cols16(unsigned ncols, unsigned q)
{
    int v = (int)ncols - 16 * (int)q;
    return v >= 16 ? (__mmask16)0xffff : v <= 0 ? (__mmask16)0 : (__mmask16)((1u << v) - 1);
}

/* mr tokens x 64 outputs over kc inputs (the tiles of tiles_x86.h). */
TGT_AVX512 static INLINE void micro512(const float *const *a, const void *b, unsigned kc, float *c,
                                      size_t ld, const unsigned mr, int first, unsigned ncols,
                                      const int type)
{
    const __mmask16 m0 = cols16(ncols, 0), m1 = cols16(ncols, 1), m2 = cols16(ncols, 2),
                    m3 = cols16(ncols, 3);
    ROWS6(R512_DECL)
    ROWS6(R512_INIT)
    for (unsigned i = 0; i < kc; i++) {
        size_t at = (size_t)i * PLE_PANEL;
        __m512 w0 = wload16(b, at, type), w1 = wload16(b, at + 16, type);
        __m512 w2 = wload16(b, at + 32, type), w3 = wload16(b, at + 48, type);
        ROWS6(R512_STEP)
    }
    ROWS6(R512_STORE)
}

#define MICRO512(t, n)                                                                        \
    TGT_AVX512 static void micro512_##t##_##n(const float *const *a, const void *b, unsigned kc, \
                                              float *c, size_t ld, int first, unsigned ncols) \
    {                                                                                         \
        micro512(a, b, kc, c, ld, n, first, ncols, t);                                        \
    }
#define MICRO_TYPE(M, t) M(t, 1) M(t, 2) M(t, 3) M(t, 4) M(t, 5) M(t, 6)
MICRO_TYPE(MICRO512, 0)
MICRO_TYPE(MICRO512, 1)
MICRO_TYPE(MICRO512, 2)
#define MICRO_ROW(p, t) {NULL, p##_##t##_1, p##_##t##_2, p##_##t##_3, p##_##t##_4, p##_##t##_5, p##_##t##_6}

static const micro_fn micro512_by[3][PLE_MR + 1] = {MICRO_ROW(micro512, 0), MICRO_ROW(micro512, 1),
                                                     MICRO_ROW(micro512, 2)};

TGT_AVX512 static void avx512_widen(const uint16_t *src, int type, float *dst)
{
    for (unsigned i = 0; i < PLE_WBUF; i += 16)
        _mm512_store_ps(dst + i, type == 0 ? wload16(src, i, 0) : wload16(src, i, 1));
}

static void avx512_project(const struct ple_layer *L, const float *const *e, unsigned nt, float *kv,
                           size_t ld, unsigned p0, unsigned p1, float *wbuf)
{
    project_loops(L, e, nt, kv, ld, p0, p1, micro512_by, avx512_widen, wbuf);
}

TGT_AVX512 static INLINE __mmask16 tail16(uint32_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

TGT_AVX512 static INLINE float tree512(__m512 v)
{
    __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1));
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

/* |v| < inf for every active lane */
TGT_AVX512 static INLINE __mmask16 finite16(__m512 v, __mmask16 m)
{
    return _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(v), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
}

TGT_AVX512 static void avx512_gate(const float *k, const float *x, const float *gk, const float *gq,
                                   uint32_t W, float eps, float out[3])
{
    __m512 pk = _mm512_setzero_ps(), px = pk, pd = pk;
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = tail16(W - i);
        __m512 kv = _mm512_maskz_loadu_ps(m, k + i), xv = _mm512_maskz_loadu_ps(m, x + i);
        pk = _mm512_mask3_fmadd_ps(kv, kv, pk, m);
        px = _mm512_mask3_fmadd_ps(xv, xv, px, m);
    }
    float skk = tree512(pk), sxx = tree512(px), w = (float)W;
    __m512 rk = _mm512_set1_ps(ple_rsqrt(skk / w + eps)), rq = _mm512_set1_ps(ple_rsqrt(sxx / w + eps));
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = tail16(W - i);
        __m512 kh = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, k + i), rk),
                                  _mm512_maskz_loadu_ps(m, gk + i));
        __m512 qh = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rq),
                                  _mm512_maskz_loadu_ps(m, gq + i));
        pd = _mm512_mask3_fmadd_ps(kh, qh, pd, m);
    }
    out[0] = skk;
    out[1] = sxx;
    out[2] = tree512(pd);
}

TGT_AVX512 static float avx512_sumsq(const float *v, float alpha, uint32_t W)
{
    const __m512 al = _mm512_set1_ps(alpha);
    __m512 p = _mm512_setzero_ps();
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = tail16(W - i);
        __m512 g = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(m, v + i));
        p = _mm512_mask3_fmadd_ps(g, g, p, m);
    }
    return tree512(p);
}

TGT_AVX512 static int avx512_frame(const float *v, float alpha, float rn, const float *gc, uint32_t W,
                                   float *n)
{
    const __m512 al = _mm512_set1_ps(alpha), r = _mm512_set1_ps(rn);
    __mmask16 bad = 0;
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = tail16(W - i);
        __m512 g = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(m, v + i));
        __m512 o = _mm512_mul_ps(_mm512_mul_ps(g, r), _mm512_maskz_loadu_ps(m, gc + i));
        bad |= (__mmask16)(m & ~finite16(o, m));
        _mm512_mask_storeu_ps(n + i, m, o);
    }
    return bad == 0;
}

TGT_AVX512 static void avx512_conv(const float *const *tap, const float *w, uint32_t T, uint32_t C,
                                   float *y)
{
    for (uint32_t c = 0; c < C; c += 16) {
        __mmask16 m = tail16(C - c);
        __m512 a = _mm512_setzero_ps();
        for (uint32_t k = 0; k < T; k++)
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + (size_t)k * C + c),
                                _mm512_maskz_loadu_ps(m, tap[k] + c), a);
        _mm512_mask_storeu_ps(y + c, m, a);
    }
    for (uint32_t c = 0; c < C; c++)
        y[c] = ple_silu(y[c]);
}

TGT_AVX512 static int avx512_update(const float *x, const float *v, float alpha, const float *y,
                                    uint32_t W, float *out)
{
    const __m512 al = _mm512_set1_ps(alpha);
    __mmask16 bad = 0;
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = tail16(W - i);
        __m512 g = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(m, v + i));
        __m512 o = _mm512_add_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), g),
                                 _mm512_maskz_loadu_ps(m, y + i));
        bad |= (__mmask16)(m & ~finite16(o, m));
        _mm512_mask_storeu_ps(out + i, m, o);
    }
    return bad == 0;
}

const struct ple_kernels ple_kernels_avx512 = {"avx512",     avx512_project, avx512_gate, avx512_sumsq,
                                               avx512_frame, avx512_conv,    avx512_update};

/* ============================================================ AVX2 */

TGT_AVX2 static INLINE __m256 wload8(const void *b, size_t at, const int type)
{
    if (type == 0)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)((const uint16_t *)b + at))), 16));
    if (type == 1)
        return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)((const uint16_t *)b + at)));
    return _mm256_load_ps((const float *)b + at);
}

/* mr tokens x 16 outputs (one column group of the panel). */

TGT_AVX2 static INLINE void micro256(const float *const *a, const void *b, size_t col, unsigned kc,
                                     float *c, size_t ld, const unsigned mr, int first, unsigned ncols,
                                     const int type)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols), lanes);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8), lanes);
    ROWS6(R256_DECL)
    ROWS6(R256_INIT)
    for (unsigned i = 0; i < kc; i++) {
        size_t at = (size_t)i * PLE_PANEL + col;
        __m256 w0 = wload8(b, at, type), w1 = wload8(b, at + 8, type);
        ROWS6(R256_STEP)
    }
    ROWS6(R256_STORE)
}

/* One token x the whole panel (64 outputs in 8 accumulators): a GEMV
 * keeps 8 independent chains in flight instead of 2, which is what lets
 * decode stream the weights at memory speed. */
#define W256_DECL(g) __m256i m##g = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8 * g), lanes); \
    __m256 c##g = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + 8 * g, m##g);
#define W256_STEP(g) c##g = _mm256_fmadd_ps(x, wload8(b, at + 8 * g, type), c##g);
#define W256_STORE(g) _mm256_maskstore_ps(c + 8 * g, m##g, c##g);
#define GROUPS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

TGT_AVX2 static INLINE void micro256_row(const float *a0, const void *b, unsigned kc, float *c,
                                         int first, unsigned ncols, const int type)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    GROUPS8(W256_DECL)
    for (unsigned i = 0; i < kc; i++) {
        size_t at = (size_t)i * PLE_PANEL;
        __m256 x = _mm256_broadcast_ss(a0 + i);
        GROUPS8(W256_STEP)
    }
    GROUPS8(W256_STORE)
}

#define MICRO256(t, n)                                                                           \
    TGT_AVX2 static void micro256_##t##_##n(const float *const *a, const void *b, unsigned kc,   \
                                            float *c, size_t ld, int first, unsigned ncols)      \
    {                                                                                            \
        if (n == 1) {                                                                            \
            micro256_row(a[0], b, kc, c, first, ncols, t);                                       \
            return;                                                                              \
        }                                                                                        \
        /* the panel's four 16-wide column groups in turn */                                     \
        for (unsigned g = 0; g < PLE_PANEL / 16 && 16 * g < ncols; g++)                          \
            micro256(a, b, 16 * g, kc, c + 16 * g, ld, n, first, ncols - 16 * g, t);             \
    }
MICRO_TYPE(MICRO256, 0)
MICRO_TYPE(MICRO256, 1)
MICRO_TYPE(MICRO256, 2)

static const micro_fn micro256_by[3][PLE_MR + 1] = {MICRO_ROW(micro256, 0), MICRO_ROW(micro256, 1),
                                                     MICRO_ROW(micro256, 2)};

TGT_AVX2 static void avx2_widen(const uint16_t *src, int type, float *dst)
{
    for (unsigned i = 0; i < PLE_WBUF; i += 8)
        _mm256_store_ps(dst + i, type == 0 ? wload8(src, i, 0) : wload8(src, i, 1));
}

static void avx2_project(const struct ple_layer *L, const float *const *e, unsigned nt, float *kv,
                         size_t ld, unsigned p0, unsigned p1, float *wbuf)
{
    project_loops(L, e, nt, kv, ld, p0, p1, micro256_by, avx2_widen, wbuf);
}

TGT_AVX2 static INLINE __m256i mask8(uint32_t left)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* fma into acc only where m is set (the others keep their partial sums) */
TGT_AVX2 static INLINE __m256 fma_masked(__m256 a, __m256 b, __m256 acc, __m256i m)
{
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(a, b, acc), _mm256_castsi256_ps(m));
}

/* Partials 0..7 in lo, 8..15 in hi. */
TGT_AVX2 static INLINE float tree256(__m256 lo, __m256 hi)
{
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

/* lanes of m where v is not finite, as a movemask */
TGT_AVX2 static INLINE int notfinite8(__m256 v, __m256i m)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 fin = _mm256_cmp_ps(_mm256_and_ps(v, absmask), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
    return _mm256_movemask_ps(_mm256_andnot_ps(fin, _mm256_castsi256_ps(m)));
}

TGT_AVX2 static void avx2_gate(const float *k, const float *x, const float *gk, const float *gq,
                               uint32_t W, float eps, float out[3])
{
    __m256 pk[2], px[2], pd[2];
    for (unsigned h = 0; h < 2; h++)
        pk[h] = px[h] = pd[h] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < W; i += 16)
        for (unsigned h = 0; h < 2 && i + 8 * h < W; h++) {
            uint32_t at = i + 8 * h;
            __m256i m = mask8(W - at);
            __m256 kv = _mm256_maskload_ps(k + at, m), xv = _mm256_maskload_ps(x + at, m);
            pk[h] = fma_masked(kv, kv, pk[h], m);
            px[h] = fma_masked(xv, xv, px[h], m);
        }
    float skk = tree256(pk[0], pk[1]), sxx = tree256(px[0], px[1]), w = (float)W;
    __m256 rk = _mm256_set1_ps(ple_rsqrt(skk / w + eps)), rq = _mm256_set1_ps(ple_rsqrt(sxx / w + eps));
    for (uint32_t i = 0; i < W; i += 16)
        for (unsigned h = 0; h < 2 && i + 8 * h < W; h++) {
            uint32_t at = i + 8 * h;
            __m256i m = mask8(W - at);
            __m256 kh = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(k + at, m), rk),
                                      _mm256_maskload_ps(gk + at, m));
            __m256 qh = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + at, m), rq),
                                      _mm256_maskload_ps(gq + at, m));
            pd[h] = fma_masked(kh, qh, pd[h], m);
        }
    out[0] = skk;
    out[1] = sxx;
    out[2] = tree256(pd[0], pd[1]);
}

TGT_AVX2 static float avx2_sumsq(const float *v, float alpha, uint32_t W)
{
    const __m256 al = _mm256_set1_ps(alpha);
    __m256 p[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (uint32_t i = 0; i < W; i += 16)
        for (unsigned h = 0; h < 2 && i + 8 * h < W; h++) {
            uint32_t at = i + 8 * h;
            __m256i m = mask8(W - at);
            __m256 g = _mm256_mul_ps(al, _mm256_maskload_ps(v + at, m));
            p[h] = fma_masked(g, g, p[h], m);
        }
    return tree256(p[0], p[1]);
}

TGT_AVX2 static int avx2_frame(const float *v, float alpha, float rn, const float *gc, uint32_t W,
                               float *n)
{
    const __m256 al = _mm256_set1_ps(alpha), r = _mm256_set1_ps(rn);
    int bad = 0;
    for (uint32_t i = 0; i < W; i += 8) {
        __m256i m = mask8(W - i);
        __m256 g = _mm256_mul_ps(al, _mm256_maskload_ps(v + i, m));
        __m256 o = _mm256_mul_ps(_mm256_mul_ps(g, r), _mm256_maskload_ps(gc + i, m));
        bad |= notfinite8(o, m);
        _mm256_maskstore_ps(n + i, m, o);
    }
    return bad == 0;
}

TGT_AVX2 static void avx2_conv(const float *const *tap, const float *w, uint32_t T, uint32_t C,
                               float *y)
{
    for (uint32_t c = 0; c < C; c += 8) {
        __m256i m = mask8(C - c);
        __m256 a = _mm256_setzero_ps();
        for (uint32_t k = 0; k < T; k++)
            a = _mm256_fmadd_ps(_mm256_maskload_ps(w + (size_t)k * C + c, m),
                                _mm256_maskload_ps(tap[k] + c, m), a);
        _mm256_maskstore_ps(y + c, m, a);
    }
    for (uint32_t c = 0; c < C; c++)
        y[c] = ple_silu(y[c]);
}

TGT_AVX2 static int avx2_update(const float *x, const float *v, float alpha, const float *y, uint32_t W,
                                float *out)
{
    const __m256 al = _mm256_set1_ps(alpha);
    int bad = 0;
    for (uint32_t i = 0; i < W; i += 8) {
        __m256i m = mask8(W - i);
        __m256 g = _mm256_mul_ps(al, _mm256_maskload_ps(v + i, m));
        __m256 o = _mm256_add_ps(_mm256_add_ps(_mm256_maskload_ps(x + i, m), g),
                                 _mm256_maskload_ps(y + i, m));
        bad |= notfinite8(o, m);
        _mm256_maskstore_ps(out + i, m, o);
    }
    return bad == 0;
}

const struct ple_kernels ple_kernels_avx2 = {"avx2",     avx2_project, avx2_gate,  avx2_sumsq,
                                             avx2_frame, avx2_conv,    avx2_update};

#else
const struct ple_kernels ple_kernels_avx2 = {0};
const struct ple_kernels ple_kernels_avx512 = {0};
#endif
