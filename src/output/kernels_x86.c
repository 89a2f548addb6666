/*
 * kernels_x86.c - AVX2 (+F16C, FMA) and AVX-512 kernels of Engram's output
 * stage, compiled with target attributes and chosen at run time.  They
 * compute exactly the order of kernels.c's scalar reference:
 *  - projection: vectors run across 16 (8) outputs, so each lane is one
 *    output's chain of fused multiply-adds in input order; K is cut into
 *    blocks of KC, the partial sums going through kv between blocks (a float
 *    stored and reloaded continues the same chain); one token (decode)
 *    takes a panel's 64 outputs per input in every instruction set, and
 *    every kernel prefetches the next block while it computes one;
 *  - gate: lane l of one 16-wide accumulator (two 8-wide ones for AVX2) is
 *    partial sum l; the tree adds the upper half onto the lower half four
 *    times.
 */
#include <math.h>

#include "kernels.h"
#include "common/cpu.h"

#if ENGRAM_X86_KERNELS
#include <immintrin.h>

#include "tiles_x86.h"

/* Both 64-byte lines of a panel row (64 F16, 64-byte aligned). */
#define PREFETCH_ROW(p)                                                                        \
    do {                                                                                       \
        _mm_prefetch((const char *)(p), _MM_HINT_T0);                                          \
        _mm_prefetch((const char *)(p) + 64, _MM_HINT_T0);                                     \
    } while (0)


/* ============================================================ AVX-512 */

/* mr tokens x 64 outputs over kc inputs.  a[r] -> token r's inputs of this
 * K block, b -> the panel's rows of this block (64 F16 per input), c ->
 * token 0's first output of the panel (row stride ld); ncols valid outputs.
 * pf -> the rows of the block the loops take next (the same columns), or b
 * where there is none: each step prefetches one row of it, so the next
 * block streams in while this one is computed (the hardware prefetcher
 * alone leaves the core waiting: on the development VM a 4-token AVX2
 * projection took 1.7x as long without it, 26 vs 15 ms at W = 5120).
 * Prefetches do not touch the arithmetic.
 * The accumulators are named variables (not an array) so that every
 * compiler keeps all 24 of them in registers; mr is a constant in each
 * instance (micro512_1 .. _6), so the unused rows compile away. */

TGT_AVX512 static INLINE __mmask16 cols16(unsigned ncols, unsigned q)
{
    int v = (int)ncols - 16 * (int)q;
    return v >= 16 ? (__mmask16)0xffff : v <= 0 ? (__mmask16)0 : (__mmask16)((1u << v) - 1);
}

TGT_AVX512 static INLINE void micro512(const float *const *a, const uint16_t *b,
                                      const uint16_t *pf, unsigned kc, float *c, size_t ld,
                                      const unsigned mr, int first, unsigned ncols)
{
    const __mmask16 m0 = cols16(ncols, 0), m1 = cols16(ncols, 1), m2 = cols16(ncols, 2),
                    m3 = cols16(ncols, 3);
    ROWS6(R512_DECL)
    ROWS6(R512_INIT)
    for (unsigned i = 0; i < kc; i++) {
        const uint16_t *bi = b + (size_t)i * PANEL;
        PREFETCH_ROW(pf + (size_t)i * PANEL);
        __m512 w0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(bi + 0)));
        __m512 w1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(bi + 16)));
        __m512 w2 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(bi + 32)));
        __m512 w3 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(bi + 48)));
        ROWS6(R512_STEP)
    }
    ROWS6(R512_STORE)
}

#define MICRO512(n)                                                                            \
    TGT_AVX512 static void micro512_##n(const float *const *a, const uint16_t *b,              \
                                        const uint16_t *pf, unsigned kc, float *c, size_t ld,  \
                                        int first, unsigned ncols)                             \
    {                                                                                          \
        micro512(a, b, pf, kc, c, ld, n, first, ncols);                                        \
    }
MICRO512(1)
MICRO512(2)
MICRO512(3)
MICRO512(4)
MICRO512(5)
MICRO512(6)

typedef void (*micro_fn)(const float *const *a, const uint16_t *b, const uint16_t *pf,
                         unsigned kc, float *c, size_t ld, int first, unsigned ncols);

static const micro_fn micro512_by_mr[MR + 1] = {NULL, micro512_1, micro512_2, micro512_3,
                                                micro512_4, micro512_5, micro512_6};

/* The loops around a micro-kernel: panels, K blocks, token tiles. */
static INLINE void project_loops(const struct engram_layer *L, const float *const *e, unsigned nt,
                                 float *kv, size_t ld, unsigned p0, unsigned p1,
                                 const micro_fn *micro)
{
    for (unsigned p = p0; p < p1; p++) {
        unsigned ncols = L->N - p * PANEL < PANEL ? L->N - p * PANEL : PANEL;
        const uint16_t *wp = L->w + (size_t)p * ENGRAM_K * PANEL;
        for (unsigned kb = 0; kb < ENGRAM_K; kb += KC) {
            const uint16_t *b = wp + (size_t)kb * PANEL;
            /* the next block: the panel's next, then the next panel's first
             * (panels are contiguous); none after this worker's last */
            const uint16_t *pf = kb + KC < ENGRAM_K || p + 1 < p1 ? b + (size_t)KC * PANEL : b;
            for (unsigned t0 = 0; t0 < nt; t0 += MR) {
                unsigned mr = nt - t0 < MR ? nt - t0 : MR;
                const float *a[MR];
                for (unsigned r = 0; r < mr; r++)
                    a[r] = e[t0 + r] + kb;
                micro[mr](a, b, pf, KC, kv + (size_t)t0 * ld + p * PANEL, ld, kb == 0, ncols);
            }
        }
    }
}

static void avx512_project(const struct engram_layer *L, const float *const *e, unsigned nt,
                           float *kv, size_t ld, unsigned p0, unsigned p1)
{
    project_loops(L, e, nt, kv, ld, p0, p1, micro512_by_mr);
}

/* x as F32 (16 lanes) from F32 or BF16 storage. */
TGT_AVX512 static INLINE __m512 load_x16(const void *x, int x_bf16, uint32_t i, __mmask16 m)
{
    if (x_bf16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)x + i);
}

/* bf16(v) as F32, round to nearest even (finite and infinite inputs; NaN
 * stays NaN). */
TGT_AVX512 static INLINE __m512 bf16_round16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i q = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)),
                                _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, r, q));
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

TGT_AVX512 static void avx512_reduce(const void *x, int x_bf16, const float *kv_s,
                                     const float *wq_s, uint32_t W, float out[3])
{
    __m512 d = _mm512_setzero_ps(), sx = d, sk = d;
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = W - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (W - i)) - 1);
        __m512 xi = load_x16(x, x_bf16, i, m);
        __m512 k = bf16_round16(_mm512_maskz_loadu_ps(m, kv_s + i));
        __m512 xw = _mm512_mul_ps(xi, _mm512_maskz_loadu_ps(m, wq_s + i));
        /* inactive lanes keep their partial sums (a +0 term would turn a
         * -0 partial into +0) */
        d = _mm512_mask3_fmadd_ps(xw, k, d, m);
        sx = _mm512_mask3_fmadd_ps(xi, xi, sx, m);
        sk = _mm512_mask3_fmadd_ps(k, k, sk, m);
    }
    out[0] = tree512(d);
    out[1] = tree512(sx);
    out[2] = tree512(sk);
}

TGT_AVX512 static int avx512_update(const void *x, int x_bf16, const float *kv_v, float g,
                                    uint32_t W, void *out, int out_bf16)
{
    const __m512 gv = _mm512_set1_ps(g);
    __mmask16 bad = 0;
    for (uint32_t i = 0; i < W; i += 16) {
        __mmask16 m = W - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (W - i)) - 1);
        __m512 v = bf16_round16(_mm512_maskz_loadu_ps(m, kv_v + i));
        __m512 y = bf16_round16(_mm512_fmadd_ps(gv, v, load_x16(x, x_bf16, i, m)));
        /* |y| < inf is false for inf and NaN */
        bad |= (__mmask16)(m & ~_mm512_cmp_ps_mask(_mm512_abs_ps(y),
                                                    _mm512_set1_ps(INFINITY), _CMP_LT_OQ));
        if (!out)
            continue;
        if (out_bf16)
            _mm256_mask_storeu_epi16((uint16_t *)out + i, m,
                                     _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(y), 16)));
        else
            _mm512_mask_storeu_ps((float *)out + i, m, y);
    }
    return bad == 0;
}

const struct apply_kernels apply_kernels_avx512 = {avx512_project, avx512_reduce, avx512_update};

/* ============================================================ AVX2 */

/* mr tokens x 16 outputs (columns col .. col+15 of the panel); named
 * accumulators as in micro512. */

TGT_AVX2 static INLINE void micro256(const float *const *a, const uint16_t *b,
                                     const uint16_t *pf, unsigned kc, float *c, size_t ld,
                                     const unsigned mr, int first, unsigned ncols)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols), lanes);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8), lanes);
    ROWS6(R256_DECL)
    ROWS6(R256_INIT)
    for (unsigned i = 0; i < kc; i++) {
        const uint16_t *bi = b + (size_t)i * PANEL;
        /* one line of the row: the passes of columns 0-31 take the first,
         * those of 32-63 the second */
        _mm_prefetch((const char *)(pf + (size_t)i * PANEL), _MM_HINT_T0);
        __m256 w0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 0)));
        __m256 w1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 8)));
        ROWS6(R256_STEP)
    }
    ROWS6(R256_STORE)
}

#define MICRO256(n)                                                                            \
    TGT_AVX2 static void micro256_##n(const float *const *a, const uint16_t *b,                \
                                      const uint16_t *pf, unsigned kc, float *c, size_t ld,    \
                                      int first, unsigned ncols)                               \
    {                                                                                          \
        /* the panel's four 16-wide column groups in turn */                                   \
        for (unsigned g = 0; g < PANEL / 16 && 16 * g < ncols; g++)                            \
            micro256(a, b + 16 * g, pf + 16 * g, kc, c + 16 * g, ld, n, first, ncols - 16 * g); \
    }
MICRO256(4)
MICRO256(5)
MICRO256(6)

/* One token x the panel's 64 outputs, each input's 64 weights taken at
 * once: eight 8-wide accumulators, so eight independent chains hide the
 * FMA's latency and the panel is read in one pass (micro256 takes a 16-wide
 * group per pass: four passes over the block, two chains each).  Each lane
 * is still one output's chain in input order, so the bits are micro256's.
 * The decode GEMV's kernel. */
TGT_AVX2 static void micro256_1x64(const float *const *a, const uint16_t *b,
                                   const uint16_t *pf, unsigned kc, float *c, size_t ld, int first,
                                   unsigned ncols)
{
    (void)ld;
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#define COL8_MASK(q) const __m256i m##q = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8 * (q)), lanes);
#define COL8_INIT(q) __m256 c##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + 8 * (q), m##q);
#define COL8_STEP(q) c##q = _mm256_fmadd_ps(x, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 8 * (q)))), c##q);
#define COL8_STORE(q) _mm256_maskstore_ps(c + 8 * (q), m##q, c##q);
#define COLS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
    COLS8(COL8_MASK)
    COLS8(COL8_INIT)
    const float *a0 = a[0];
    for (unsigned i = 0; i < kc; i++) {
        const uint16_t *bi = b + (size_t)i * PANEL;
        PREFETCH_ROW(pf + (size_t)i * PANEL);
        const __m256 x = _mm256_broadcast_ss(a0 + i);
        COLS8(COL8_STEP)
    }
    COLS8(COL8_STORE)
#undef COL8_MASK
#undef COL8_INIT
#undef COL8_STEP
#undef COL8_STORE
#undef COLS8
}

/* Two tokens x 32 outputs (columns col .. col+31 of the panel): eight
 * 8-wide accumulators, so eight independent chains (micro256's two tokens
 * x 16 outputs have four, and wait on the FMA's latency), in two passes
 * over the block.  Each lane one output's chain in input order: micro256's
 * bits. */
TGT_AVX2 static INLINE void micro256_2x32(const float *const *a, const uint16_t *b,
                                          const uint16_t *pf, unsigned kc, float *c, size_t ld,
                                          int first, unsigned ncols)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#define C2_MASK(q) const __m256i m##q = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8 * (q)), lanes);
#define C2_INIT(q)                                                                             \
    __m256 c0##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + 8 * (q), m##q);         \
    __m256 c1##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + ld + 8 * (q), m##q);
#define C2_STEP(q)                                                                             \
    {                                                                                          \
        __m256 w = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 8 * (q))));            \
        c0##q = _mm256_fmadd_ps(x0, w, c0##q);                                                 \
        c1##q = _mm256_fmadd_ps(x1, w, c1##q);                                                 \
    }
#define C2_STORE(q)                                                                            \
    _mm256_maskstore_ps(c + 8 * (q), m##q, c0##q);                                             \
    _mm256_maskstore_ps(c + ld + 8 * (q), m##q, c1##q);
#define COLS4(X) X(0) X(1) X(2) X(3)
    COLS4(C2_MASK)
    COLS4(C2_INIT)
    const float *a0 = a[0], *a1 = a[1];
    for (unsigned i = 0; i < kc; i++) {
        const uint16_t *bi = b + (size_t)i * PANEL;
        /* the row's line holding these 32 columns */
        _mm_prefetch((const char *)(pf + (size_t)i * PANEL), _MM_HINT_T0);
        const __m256 x0 = _mm256_broadcast_ss(a0 + i), x1 = _mm256_broadcast_ss(a1 + i);
        COLS4(C2_STEP)
    }
    COLS4(C2_STORE)
#undef C2_MASK
#undef C2_INIT
#undef C2_STEP
#undef C2_STORE
#undef COLS4
}

TGT_AVX2 static void micro256_2(const float *const *a, const uint16_t *b, const uint16_t *pf,
                                unsigned kc, float *c, size_t ld, int first, unsigned ncols)
{
    /* the panel's two 32-wide column groups in turn */
    for (unsigned g = 0; g < PANEL / 32 && 32 * g < ncols; g++)
        micro256_2x32(a, b + 32 * g, pf + 32 * g, kc, c + 32 * g, ld, first, ncols - 32 * g);
}

/* Three tokens x 32 outputs: twelve accumulators (twelve chains, where
 * micro256's 3 x 16 has six and waits on the FMA's latency), two passes
 * over the block; the 32 columns' weights are converted 16 at a time so
 * that accumulators, weights and the broadcast input fit the 16 registers.
 * Each lane one output's chain in input order: micro256's bits. */
TGT_AVX2 static INLINE void micro256_3x32(const float *const *a, const uint16_t *b,
                                          const uint16_t *pf, unsigned kc, float *c, size_t ld,
                                          int first, unsigned ncols)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#define C3_MASK(q) const __m256i m##q = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols - 8 * (q)), lanes);
#define C3_INIT(q)                                                                             \
    __m256 c0##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + 8 * (q), m##q);         \
    __m256 c1##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + ld + 8 * (q), m##q);    \
    __m256 c2##q = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + 2 * ld + 8 * (q), m##q);
/* columns 8q .. 8q+15: two weight vectors, then each token's two FMAs.
 * The inputs are broadcast again in each half, from pointers the compiler
 * cannot see are the same (the empty asm): kept from the first half, the
 * three inputs would push an accumulator out of the 16 registers. */
#define C3_HALF(q, r)                                                                          \
    {                                                                                          \
        const float *p0 = a0 + i, *p1 = a1 + i, *p2 = a2 + i;                                  \
        __asm__("" : "+r"(p0), "+r"(p1), "+r"(p2));                                            \
        const __m256 wa = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 8 * (q))));    \
        const __m256 wb = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(bi + 8 * (r))));    \
        __m256 x = _mm256_broadcast_ss(p0);                                                    \
        c0##q = _mm256_fmadd_ps(x, wa, c0##q);                                                 \
        c0##r = _mm256_fmadd_ps(x, wb, c0##r);                                                 \
        x = _mm256_broadcast_ss(p1);                                                           \
        c1##q = _mm256_fmadd_ps(x, wa, c1##q);                                                 \
        c1##r = _mm256_fmadd_ps(x, wb, c1##r);                                                 \
        x = _mm256_broadcast_ss(p2);                                                           \
        c2##q = _mm256_fmadd_ps(x, wa, c2##q);                                                 \
        c2##r = _mm256_fmadd_ps(x, wb, c2##r);                                                 \
    }
#define C3_STORE(q)                                                                            \
    _mm256_maskstore_ps(c + 8 * (q), m##q, c0##q);                                             \
    _mm256_maskstore_ps(c + ld + 8 * (q), m##q, c1##q);                                        \
    _mm256_maskstore_ps(c + 2 * ld + 8 * (q), m##q, c2##q);
#define COLS4(X) X(0) X(1) X(2) X(3)
    COLS4(C3_MASK)
    COLS4(C3_INIT)
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2];
    for (unsigned i = 0; i < kc; i++) {
        const uint16_t *bi = b + (size_t)i * PANEL;
        _mm_prefetch((const char *)(pf + (size_t)i * PANEL), _MM_HINT_T0);
        C3_HALF(0, 1)
        C3_HALF(2, 3)
    }
    COLS4(C3_STORE)
#undef C3_MASK
#undef C3_INIT
#undef C3_HALF
#undef C3_STORE
#undef COLS4
}

TGT_AVX2 static void micro256_3(const float *const *a, const uint16_t *b, const uint16_t *pf,
                                unsigned kc, float *c, size_t ld, int first, unsigned ncols)
{
    for (unsigned g = 0; g < PANEL / 32 && 32 * g < ncols; g++)
        micro256_3x32(a, b + 32 * g, pf + 32 * g, kc, c + 32 * g, ld, first, ncols - 32 * g);
}

static const micro_fn micro256_by_mr[MR + 1] = {NULL, micro256_1x64, micro256_2, micro256_3,
                                                micro256_4, micro256_5, micro256_6};

static void avx2_project(const struct engram_layer *L, const float *const *e, unsigned nt,
                         float *kv, size_t ld, unsigned p0, unsigned p1)
{
    project_loops(L, e, nt, kv, ld, p0, p1, micro256_by_mr);
}

TGT_AVX2 static INLINE __m256 load_x8(const void *x, int x_bf16, uint32_t i, __m256i m)
{
    if (x_bf16) {
        /* lanes past the end read as 0; the callers keep them out of every
         * sum and every store */
        const uint16_t *p = (const uint16_t *)x + i;
        int mask = _mm256_movemask_ps(_mm256_castsi256_ps(m));
        __m128i h;
        if (mask == 0xff) {
            h = _mm_loadu_si128((const __m128i *)p);
        } else {
            uint16_t buf[8] = {0};
            for (unsigned l = 0; l < 8; l++)
                if (mask & (1 << l))
                    buf[l] = p[l];
            h = _mm_loadu_si128((const __m128i *)buf);
        }
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_maskload_ps((const float *)x + i, m);
}

TGT_AVX2 static INLINE __m256 bf16_round8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256i q = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)),
                                _mm256_set1_epi32(0x400000));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan);
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

TGT_AVX2 static INLINE __m256i mask8(uint32_t left)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* fma into acc only where m is set (the others keep their partial sums). */
TGT_AVX2 static INLINE __m256 fma_masked(__m256 a, __m256 b, __m256 acc, __m256i m)
{
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(a, b, acc), _mm256_castsi256_ps(m));
}

TGT_AVX2 static void avx2_reduce(const void *x, int x_bf16, const float *kv_s, const float *wq_s,
                                 uint32_t W, float out[3])
{
    __m256 d[2], sx[2], sk[2];
    for (unsigned h = 0; h < 2; h++)
        d[h] = sx[h] = sk[h] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < W; i += 16)
        for (unsigned h = 0; h < 2; h++) {
            uint32_t at = i + 8 * h;
            if (at >= W)
                break;
            __m256i m = mask8(W - at);
            __m256 xi = load_x8(x, x_bf16, at, m);
            __m256 k = bf16_round8(_mm256_maskload_ps(kv_s + at, m));
            __m256 xw = _mm256_mul_ps(xi, _mm256_maskload_ps(wq_s + at, m));
            d[h] = fma_masked(xw, k, d[h], m);
            sx[h] = fma_masked(xi, xi, sx[h], m);
            sk[h] = fma_masked(k, k, sk[h], m);
        }
    out[0] = tree256(d[0], d[1]);
    out[1] = tree256(sx[0], sx[1]);
    out[2] = tree256(sk[0], sk[1]);
}

TGT_AVX2 static int avx2_update(const void *x, int x_bf16, const float *kv_v, float g, uint32_t W,
                                void *out, int out_bf16)
{
    const __m256 gv = _mm256_set1_ps(g);
    const __m256 inf = _mm256_set1_ps(INFINITY);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int bad = 0;
    for (uint32_t i = 0; i < W; i += 8) {
        __m256i m = mask8(W - i);
        __m256 v = bf16_round8(_mm256_maskload_ps(kv_v + i, m));
        __m256 y = bf16_round8(_mm256_fmadd_ps(gv, v, load_x8(x, x_bf16, i, m)));
        __m256 fin = _mm256_cmp_ps(_mm256_and_ps(y, absmask), inf, _CMP_LT_OQ);
        bad |= _mm256_movemask_ps(_mm256_andnot_ps(fin, _mm256_castsi256_ps(m)));
        if (!out)
            continue;
        if (out_bf16) {
            uint32_t lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_srli_epi32(_mm256_castps_si256(y), 16));
            uint32_t n = W - i < 8 ? W - i : 8;
            for (uint32_t l = 0; l < n; l++)
                ((uint16_t *)out)[i + l] = (uint16_t)lanes[l];
        } else {
            _mm256_maskstore_ps((float *)out + i, m, y);
        }
    }
    return bad == 0;
}

const struct apply_kernels apply_kernels_avx2 = {avx2_project, avx2_reduce, avx2_update};

#else
const struct apply_kernels apply_kernels_avx2 = {0};
const struct apply_kernels apply_kernels_avx512 = {0};
#endif
