/*
 * test_ple_apply.c - the PLE output stage (src/output/ple_apply.h) on
 * synthetic layers drawn deterministically (rows and weights normal-like,
 * weights ~ N(0, 1/sqrt(K)) in BF16, F16 or F32, norms 1 + N(0, 0.1), taps
 * U(-0.5, 0.5), residuals BF16 values of N(0, 2)):
 *  - every kernel (scalar reference, AVX2, AVX-512) gives the same bits of
 *    residual and state, for every weight type, at widths that fill whole
 *    panels (64) and that leave partial ones, and at the real W = 2560,
 *    with F32 and BF16 residuals, in blocks of one tile of tokens and of
 *    more (the SIMD projections widen 16-bit weights once per block then);
 *  - batch invariance: one call, one call per position, random cuts with
 *    the state carried, any block size and any number of threads give the
 *    same bits of residual and state;
 *  - masked positions: their residual untouched (poisoned rows and residual
 *    are not read), a zero frame entering the state;
 *  - sign(0) = 0: with W_k = 0 every s_j is +0, alpha = 0.5 and (taps zero)
 *    out = x + 0.5 v exactly; ple_alpha of +-0 and of tiny s;
 *  - a BF16 residual stores bf16 of the F32 residual's result;
 *  - the file path: a qwen4exp file written by the GGUF writer opens into
 *    the same layer (same bits) as the same weights from memory; bad
 *    weights are refused naming the tensor;
 *  - bad input: every error path, with residual and state proven unchanged
 *    (or updated exactly up to the failing token, as documented).
 * `test_ple_apply --dump DIR W N SEED` writes a case (weights, rows, mask,
 * residual and state in, residual and state out of a chunked run) for
 * tests/ple_apply_ref.py, the numpy float64 reference (test_ple_apply.sh).
 */
#include <fcntl.h>
#include <math.h>

#include "alloc_shim.h"
#include "testutil.h"
#include "../src/format/gguf.h"
#include "../src/format/ple_file.h"
#include "../src/output/kernels.h"
#include "../src/output/ple_kernels.h"
#include "../src/tools/ple_gen.h"

#define K PLE_K
#define T 4u

/* ------------------------------------------------ draws */

static double uniform(uint64_t *s)
{
    return (double)(tu_rand(s) >> 11) * 0x1p-53;
}

static double normal(uint64_t *s)
{
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u > 0 ? u : 0x1p-60)) * cos(6.283185307179586 * v);
}

/* F32 -> F16 bits, round to nearest even (subnormals included). */
static uint16_t f16_bits(float f)
{
    uint16_t sign = signbit(f) ? 0x8000u : 0;
    float a = fabsf(f);
    if (a >= 65520.0f)
        return sign | 0x7c00u;
    if (a < 0x1p-14f)
        return sign | (uint16_t)nearbyintf(a * 0x1p24f); /* 1024 is the smallest normal */
    int e;
    frexpf(a, &e);
    float m = nearbyintf(ldexpf(a, 11 - e));
    if (m == 2048.0f) {
        m = 1024.0f;
        e++;
    }
    if (e + 14 >= 31)
        return sign | 0x7c00u;
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)m - 1024);
}

/* ------------------------------------------------ fixtures */

struct model {
    struct ple_weights w;
    void *key, *value;
    float *gk, *gq, *gc, *conv;
};

static void *draw_matrix(uint32_t type, size_t n, double sd, uint64_t *s)
{
    void *m = malloc(n * (type == GGML_F32 ? 4 : 2));
    for (size_t i = 0; i < n; i++) {
        float v = (float)(normal(s) * sd);
        if (type == GGML_F32)
            ((float *)m)[i] = v;
        else
            ((uint16_t *)m)[i] = type == GGML_BF16 ? f32_to_bf16_bits(v) : f16_bits(v);
    }
    return m;
}

static float *draw_floats(size_t n, double mean, double sd, uint64_t *s)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(mean + normal(s) * sd);
    return v;
}

static void model_make(struct model *m, uint32_t W, uint32_t kt, uint32_t vt, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    uint64_t s = seed;
    const size_t C = 4 * (size_t)W;
    m->key = draw_matrix(kt, C * K, 1.0 / sqrt((double)K), &s);
    m->value = draw_matrix(vt, (size_t)W * K, 1.0 / sqrt((double)K), &s);
    m->gk = draw_floats(C, 1.0, 0.1, &s);
    m->gq = draw_floats(C, 1.0, 0.1, &s);
    m->gc = draw_floats(C, 1.0, 0.1, &s);
    m->conv = malloc(C * T * sizeof *m->conv);
    for (size_t i = 0; i < C * T; i++)
        m->conv[i] = (float)(uniform(&s) - 0.5);
    m->w = (struct ple_weights){W, T, 1e-6f, kt, vt, m->key, m->value, m->gk, m->gq, m->gc, m->conv};
}

static void model_free(struct model *m)
{
    free(m->key);
    free(m->value);
    free(m->gk);
    free(m->gq);
    free(m->gc);
    free(m->conv);
}

static struct ple_layer *layer_of(const struct model *m)
{
    struct ple_layer *L = NULL;
    engram_error err;
    if (ple_layer_new(&m->w, &L, &err) < 0)
        fprintf(stderr, "ple_layer_new: %s\n", err.msg);
    CHECK(L != NULL);
    return L;
}

/* A sequence of n positions: rows, residual (F32 holding BF16 values),
 * mask (about 1 in 6 masked, never position 0) and a starting state. */
struct seq {
    size_t n, C, F;
    uint16_t *rows;
    float *x;
    uint8_t *mask;
    float *state;
};

static void seq_make(struct seq *q, const struct ple_layer *L, size_t n, uint64_t seed, int zero_state)
{
    uint64_t s = seed;
    q->n = n;
    q->C = 4 * (size_t)ple_layer_width(L);
    q->F = ple_state_floats(L) / q->C;
    q->rows = malloc(n * K * 2 + 2);
    q->x = malloc(n * q->C * sizeof(float) + 4);
    q->mask = malloc(n + 1);
    q->state = calloc(q->F * q->C + 1, sizeof(float));
    for (size_t i = 0; i < n * K; i++)
        q->rows[i] = f32_to_bf16_bits((float)normal(&s));
    for (size_t i = 0; i < n * q->C; i++)
        q->x[i] = bf16_round((float)(2.0 * normal(&s)));
    for (size_t t = 0; t < n; t++)
        q->mask[t] = t == 0 || tu_rand(&s) % 6 != 0;
    if (!zero_state)
        for (size_t i = 0; i < q->F * q->C; i++)
            q->state[i] = (float)normal(&s);
}

static void seq_free(struct seq *q)
{
    free(q->rows);
    free(q->x);
    free(q->mask);
    free(q->state);
}

/* Applies q in calls cut at cuts[0] < cuts[1] < ... (ncuts of them, each
 * in 1..n-1) with the state carried; x_out [n][C] and state_out get the
 * results.  Returns the first nonzero return code. */
static int run_cuts(const struct ple_layer *L, const struct ple_apply_opts *o, const struct seq *q,
                    const size_t *cuts, size_t ncuts, float *x_out, float *state_out)
{
    struct ple_applier *a = NULL;
    engram_error err;
    int rc = ple_applier_new(L, o, &a, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        return rc;
    memcpy(x_out, q->x, q->n * q->C * sizeof(float));
    memcpy(state_out, q->state, q->F * q->C * sizeof(float));
    size_t at = 0;
    for (size_t c = 0; c <= ncuts && rc == 0; c++) {
        size_t end = c < ncuts ? cuts[c] : q->n;
        rc = ple_apply(a, q->rows + at * K, x_out + at * q->C, ENGRAM_F32, q->mask + at, end - at,
                       state_out, &err);
        if (rc < 0)
            fprintf(stderr, "ple_apply: %s\n", err.msg);
        at = end;
    }
    ple_applier_free(a);
    return rc;
}

static int run_once(const struct ple_layer *L, const struct ple_apply_opts *o, const struct seq *q,
                    float *x_out, float *state_out)
{
    return run_cuts(L, o, q, NULL, 0, x_out, state_out);
}

static int same(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

/* ------------------------------------------------ kernels and invariance */

static const engram_simd all_simd[3] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512};

/* Every kernel set gives the scalar reference's bits, for every weight type
 * and at widths with whole and partial panels. */
static void test_kernels(void)
{
    static const uint32_t widths[] = {64, 20, 37, 3, 2560};
    static const uint32_t types[3][2] = {{GGML_BF16, GGML_BF16}, {GGML_F16, GGML_BF16}, {GGML_F32, GGML_F16}};
    int ran = 0;
    for (unsigned wi = 0; wi < sizeof widths / sizeof *widths; wi++)
        for (unsigned ti = 0; ti < 3; ti++) {
            if (widths[wi] == 2560 && ti > 0)
                continue; /* the real shape: BF16 weights, as the checkpoint holds them */
            struct model m;
            model_make(&m, widths[wi], types[ti][0], types[ti][1], 100 + wi * 3 + ti);
            struct ple_layer *L = layer_of(&m);
            if (!L) {
                model_free(&m);
                continue;
            }
            struct seq q;
            seq_make(&q, L, widths[wi] == 2560 ? 11 : 23, 7 + wi, 0);
            size_t xb = q.n * q.C * sizeof(float), sb = q.F * q.C * sizeof(float);
            float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
            struct ple_apply_opts o = {1, ENGRAM_SIMD_SCALAR, 8, NULL, NULL};
            CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
            for (int k = 1; k < 3; k++)
                for (unsigned block = 4; block <= 64; block *= 16) { /* 1 tile; 4 */
                    if (!ple_kernels_for(all_simd[k]))
                        continue;
                    o.simd = all_simd[k];
                    o.block_tokens = block;
                    CHECK_EQ(run_once(L, &o, &q, x1, s1), 0);
                    CHECK(same(x0, x1, xb) && same(s0, s1, sb));
                    if (!same(x0, x1, xb) || !same(s0, s1, sb))
                        fprintf(stderr, "  kernels %s differ from scalar at W %u, types %u/%u, block %u\n",
                                engram_simd_name(all_simd[k]), widths[wi], types[ti][0], types[ti][1], block);
                    ran++;
                }
            free(x0), free(s0), free(x1), free(s1);
            seq_free(&q);
            ple_layer_free(L);
            model_free(&m);
        }
    printf("kernels: %d SIMD runs compared with the scalar reference\n", ran);
}

/* One call, per-position calls, random cuts; block sizes; threads. */
static void test_invariance(void)
{
    struct model m;
    model_make(&m, 40, GGML_BF16, GGML_BF16, 5);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    struct seq q;
    seq_make(&q, L, 45, 11, 0);
    size_t xb = q.n * q.C * sizeof(float), sb = q.F * q.C * sizeof(float);
    float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
    struct ple_apply_opts o = {1, ENGRAM_SIMD_AUTO, 64, NULL, NULL};
    CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
    /* every position changed something, masked ones nothing */
    for (size_t t = 0; t < q.n; t++)
        CHECK(same(x0 + t * q.C, q.x + t * q.C, q.C * 4) == !q.mask[t]);
    size_t cuts[64];
    for (size_t i = 0; i + 1 < q.n; i++)
        cuts[i] = i + 1;
    CHECK_EQ(run_cuts(L, &o, &q, cuts, q.n - 1, x1, s1), 0);
    CHECK(same(x0, x1, xb) && same(s0, s1, sb));
    uint64_t s = 99;
    for (int r = 0; r < 30; r++) {
        size_t nc = 0;
        for (size_t i = 1; i < q.n; i++)
            if (tu_rand(&s) % 5 == 0)
                cuts[nc++] = i;
        o.block_tokens = 1 + (unsigned)(tu_rand(&s) % 20);
        o.threads = 1 + (unsigned)(tu_rand(&s) % 3);
        o.simd = all_simd[tu_rand(&s) % 3];
        if (!ple_kernels_for(o.simd))
            o.simd = ENGRAM_SIMD_SCALAR;
        memset(x1, 0, xb);
        CHECK_EQ(run_cuts(L, &o, &q, cuts, nc, x1, s1), 0);
        CHECK(same(x0, x1, xb) && same(s0, s1, sb));
    }
    for (unsigned th = 1; th <= 4; th++) {
        o = (struct ple_apply_opts){th, ENGRAM_SIMD_AUTO, th == 4 ? 3 : 64, NULL, NULL};
        CHECK_EQ(run_once(L, &o, &q, x1, s1), 0);
        CHECK(same(x0, x1, xb) && same(s0, s1, sb));
    }
    /* a token's result does not depend on the tokens beside it in the call:
     * the same token with the same frames before it, alone */
    printf("invariance: one call = per-position calls = 30 random cut sets, blocks 1..20, 1..4 threads\n");
    free(x0), free(s0), free(x1), free(s1);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
}

/* Other numbers of taps (the file's conv_kernel): T = 2 keeps 3 frames,
 * T = 1 none (the state may be NULL); invariance and kernels as for 4. */
static void test_taps(void)
{
    for (uint32_t taps = 1; taps <= 2; taps++) {
        struct model m;
        model_make(&m, 20, GGML_BF16, GGML_BF16, 30 + taps);
        m.w.kernel = taps;
        struct ple_layer *L = layer_of(&m);
        if (!L) {
            model_free(&m);
            continue;
        }
        CHECK_EQ(ple_state_floats(L), 3 * (taps - 1) * 80);
        struct seq q;
        seq_make(&q, L, 17, 40 + taps, 0);
        size_t xb = q.n * q.C * 4, sb = q.F * q.C * 4 + 4;
        float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
        struct ple_apply_opts o = {1, ENGRAM_SIMD_SCALAR, 0, NULL, NULL};
        CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
        size_t cuts[3] = {1, 5, 12};
        for (int k = 0; k < 3; k++) {
            o.simd = all_simd[k];
            if (!ple_kernels_for(o.simd))
                continue;
            CHECK_EQ(run_cuts(L, &o, &q, cuts, 3, x1, s1), 0);
            CHECK(same(x0, x1, xb) && same(s0, s1, sb - 4));
        }
        if (taps == 1) {
            struct ple_applier *a = NULL;
            CHECK_EQ(ple_applier_new(L, NULL, &a, NULL), 0);
            memcpy(x1, q.x, xb);
            CHECK_EQ(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, NULL, NULL), 0);
            CHECK(same(x0, x1, xb));
            ple_applier_free(a);
        }
        free(x0), free(s0), free(x1), free(s1);
        seq_free(&q);
        ple_layer_free(L);
        model_free(&m);
    }
}

/* Masked positions: nothing of theirs is read or written; a zero frame
 * enters the state. */
static void test_masked(void)
{
    struct model m;
    model_make(&m, 24, GGML_BF16, GGML_BF16, 6);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    struct seq q;
    seq_make(&q, L, 12, 12, 0);
    for (size_t t = 0; t < q.n; t++)
        q.mask[t] = t < 6;
    size_t xb = q.n * q.C * sizeof(float), sb = q.F * q.C * sizeof(float);
    float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
    struct ple_apply_opts o = {1, ENGRAM_SIMD_AUTO, 5, NULL, NULL};
    CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
    /* poison the masked positions' rows (NaN) and residual (NaN bits) */
    struct seq p = q;
    p.rows = malloc(q.n * K * 2);
    p.x = malloc(xb);
    memcpy(p.rows, q.rows, q.n * K * 2);
    memcpy(p.x, q.x, xb);
    for (size_t i = 6 * K; i < q.n * K; i++)
        p.rows[i] = 0x7fc1;
    for (size_t i = 6 * q.C; i < q.n * q.C; i++)
        p.x[i] = NAN;
    CHECK_EQ(run_once(L, &o, &p, x1, s1), 0);
    CHECK(same(x0, x1, 6 * q.C * 4) && same(s0, s1, sb));
    CHECK(same(x1 + 6 * q.C, p.x + 6 * q.C, 6 * q.C * 4)); /* the NaNs, bit for bit */
    /* 6 masked positions after 6 tokens, F = 9: the state is the last 3
     * frames of the tokens, then 6 zero frames */
    float *s6 = malloc(sb);
    q.n = 6;
    CHECK_EQ(run_once(L, &o, &q, x1, s6), 0);
    CHECK(same(s0, s6 + 6 * q.C, 3 * q.C * 4));
    int zero = 1;
    for (size_t i = 3 * q.C; i < 9 * q.C; i++)
        zero &= s0[i] == 0.0f && !signbit(s0[i]);
    CHECK(zero);
    /* a masked position between tokens still counts as a step of time:
     * masking position 2 changes the later tokens (their taps move) but not
     * the earlier ones */
    q.n = 12;
    for (size_t t = 0; t < q.n; t++)
        q.mask[t] = t != 2;
    CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
    q.mask[2] = 1;
    CHECK_EQ(run_once(L, &o, &q, x1, s1), 0);
    CHECK(same(x0, x1, 2 * q.C * 4));
    /* dilation 3: positions 3 and 4 never read frame 2, position 5 does */
    CHECK(same(x0 + 3 * q.C, x1 + 3 * q.C, 2 * q.C * 4));
    CHECK(!same(x0 + 5 * q.C, x1 + 5 * q.C, q.C * 4));
    printf("masked: residual untouched and unread, zero frames in the state\n");
    free(x0), free(s0), free(x1), free(s1), free(s6);
    free(p.rows), free(p.x);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
}

/* sign(0) = 0. */
static void test_sign_zero(void)
{
    CHECK(ple_alpha(0.0f) == 0.5f);
    CHECK(ple_alpha(-0.0f) == 0.5f);
    /* |s| below 1e-6 is lifted to sqrt(1e-6) = 0.001 with its sign */
    CHECK(ple_alpha(1e-30f) == ple_alpha(1e-6f) && ple_alpha(1e-6f) > 0.5f);
    CHECK(ple_alpha(-1e-30f) == ple_alpha(-1e-6f) && ple_alpha(-1e-6f) < 0.5f);
    /* end to end: W_k = 0 makes k = 0 and every s_j = +0; zero taps make
     * y = SiLU(+0) = +0; so out = (x + 0.5 v) + 0 with v = W_v e */
    const uint32_t W = 16;
    struct model m;
    model_make(&m, W, GGML_BF16, GGML_BF16, 8);
    memset(m.key, 0, 4 * (size_t)W * K * 2);
    memset(m.conv, 0, 4 * (size_t)W * T * sizeof(float));
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    struct seq q;
    seq_make(&q, L, 3, 13, 0);
    memset(q.mask, 1, q.n);
    size_t xb = q.n * q.C * sizeof(float), sb = q.F * q.C * sizeof(float);
    float *x1 = malloc(xb), *s1 = malloc(sb);
    for (int k = 0; k < 3; k++) {
        struct ple_apply_opts o = {1, all_simd[k], 0, NULL, NULL};
        if (!ple_kernels_for(o.simd))
            continue;
        CHECK_EQ(run_once(L, &o, &q, x1, s1), 0);
        int ok = 1;
        for (size_t t = 0; t < q.n; t++)
            for (uint32_t i = 0; i < W; i++) {
                float v = 0.0f;
                for (uint32_t j = 0; j < K; j++)
                    v = fmaf(bf16_to_f32(q.rows[t * K + j]), bf16_to_f32(((uint16_t *)m.value)[(size_t)i * K + j]), v);
                for (uint32_t s = 0; s < 4; s++) {
                    size_t c = t * q.C + s * W + i;
                    ok &= x1[c] == (q.x[c] + 0.5f * v) + 0.0f;
                }
            }
        CHECK(ok);
    }
    /* and a zero residual stream: Sxx = 0, q = 0, D = +0 exactly */
    float k[37], x[37], g[37], r[3];
    for (int i = 0; i < 37; i++)
        k[i] = (float)(i - 18) * 0.25f, x[i] = 0.0f, g[i] = 1.0f;
    ple_kernels_scalar.gate(k, x, g, g, 37, 1e-6f, r);
    CHECK(r[1] == 0.0f && r[2] == 0.0f && !signbit(r[2]));
    printf("sign(0) = 0: alpha = 0.5 end to end\n");
    free(x1), free(s1);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
}

/* A BF16 residual: bf16 of what the F32 residual gets (its inputs being
 * BF16 values), every kernel. */
static void test_bf16_residual(void)
{
    struct model m;
    model_make(&m, 20, GGML_BF16, GGML_F16, 9);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    struct seq q;
    seq_make(&q, L, 9, 14, 0);
    size_t nx = q.n * q.C, sb = q.F * q.C * sizeof(float);
    float *x0 = malloc(nx * 4), *s0 = malloc(sb), *s1 = malloc(sb);
    uint16_t *xb = malloc(nx * 2);
    for (int k = 0; k < 3; k++) {
        struct ple_apply_opts o = {2, all_simd[k], 4, NULL, NULL};
        if (!ple_kernels_for(o.simd))
            continue;
        CHECK_EQ(run_once(L, &o, &q, x0, s0), 0);
        for (size_t i = 0; i < nx; i++)
            xb[i] = f32_to_bf16_bits(q.x[i]);
        struct ple_applier *a = NULL;
        CHECK_EQ(ple_applier_new(L, &o, &a, NULL), 0);
        memcpy(s1, q.state, sb);
        CHECK_EQ(ple_apply(a, q.rows, xb, ENGRAM_BF16, q.mask, q.n, s1, NULL), 0);
        int ok = 1;
        for (size_t i = 0; i < nx; i++)
            ok &= xb[i] == f32_to_bf16_bits(x0[i]);
        CHECK(ok && same(s0, s1, sb));
        ple_applier_free(a);
    }
    free(x0), free(s0), free(s1), free(xb);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
}

/* ------------------------------------------------ the file path */

struct fill_ctx {
    const void *data;
    size_t bytes;
};

static int fill_bytes(void *ctx, int fd, uint64_t off, uint64_t bytes)
{
    const struct fill_ctx *f = ctx;
    if (bytes != f->bytes)
        return -EINVAL;
    return pwrite(fd, f->data, bytes, (off_t)off) == (ssize_t)bytes ? 0 : -EIO;
}

static int write_ple_file(const char *path, const struct model *m)
{
    const uint32_t W = m->w.width;
    struct ple_layout l;
    if (ple_layout_generate(0, 1000, 248320u, 248044u, PLE_NO_IMAGE, &l, NULL) < 0)
        return -1;
    gguf_writer *w = gguf_writer_new(3, 32);
    gguf_w_str(w, "general.architecture", "qwen4exp");
    uint32_t layers[1] = {1};
    gguf_w_array(w, "qwen4exp.ple.layers", GGUF_U32, layers, 1);
    gguf_w_u32(w, "qwen4exp.ple.ngram_size", 3);
    gguf_w_u32(w, "qwen4exp.ple.heads_per_ngram", 8);
    gguf_w_u32(w, "qwen4exp.ple.conv_kernel", T);
    gguf_w_u32(w, "qwen4exp.vocab_size", l.vocab);
    gguf_w_u32(w, "qwen4exp.ple.eos_token_id", l.eos);
    uint64_t off[16], sz[16];
    for (int h = 0; h < 16; h++)
        off[h] = l.offsets[h], sz[h] = l.sizes[h];
    gguf_w_array(w, "qwen4exp.ple.layer_multipliers", GGUF_U64, l.multipliers, 3);
    gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_U64, off, 16);
    gguf_w_array(w, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, sz, 16);
    gguf_w_u32(w, "qwen4exp.embedding_length_per_layer_input", 160);
    gguf_w_scalar(w, "qwen4exp.attention.layer_norm_rms_epsilon", GGUF_F32, &m->w.eps);
    uint64_t dt[2] = {160, l.rows}, dk[2] = {K, 4 * W}, dv[2] = {K, W}, dn[1] = {4 * W}, dc[2] = {T, 4 * W};
    size_t ks = m->w.key_type == GGML_F32 ? 4 : 2, vs = m->w.value_type == GGML_F32 ? 4 : 2;
    struct fill_ctx fk = {m->key, 4 * (size_t)W * K * ks}, fv = {m->value, (size_t)W * K * vs};
    struct fill_ctx f1 = {m->gk, 4 * (size_t)W * 4}, f2 = {m->gq, 4 * (size_t)W * 4},
                    f3 = {m->gc, 4 * (size_t)W * 4}, fc = {m->conv, 4 * (size_t)W * T * 4};
    gguf_w_tensor(w, "per_layer_token_embd.weight", GGML_BF16, 2, dt, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_key.weight", m->w.key_type, 2, dk, 0, fill_bytes, &fk);
    gguf_w_tensor(w, "blk.1.ple_value.weight", m->w.value_type, 2, dv, 0, fill_bytes, &fv);
    gguf_w_tensor(w, "blk.1.ple_norm_key.weight", GGML_F32, 1, dn, 0, fill_bytes, &f1);
    gguf_w_tensor(w, "blk.1.ple_norm_query.weight", GGML_F32, 1, dn, 0, fill_bytes, &f2);
    gguf_w_tensor(w, "blk.1.ple_norm_conv.weight", GGML_F32, 1, dn, 0, fill_bytes, &f3);
    gguf_w_tensor(w, "blk.1.ple_conv1d.weight", GGML_F32, 2, dc, 0, fill_bytes, &fc);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    engram_error err;
    int rc = fd < 0 ? -errno : gguf_w_write_fd(w, fd, &err);
    if (rc < 0 && fd >= 0)
        fprintf(stderr, "write %s: %s\n", path, err.msg);
    if (fd >= 0)
        close(fd);
    gguf_writer_free(w);
    return rc;
}

/* Opens the file and its layer; NULL (and rc) on failure. */
static struct ple_layer *open_file_layer(const char *path, int *rc, engram_error *err)
{
    gguf_file *g = NULL;
    struct ple_layer *L = NULL;
    struct ple_file f;
    *rc = gguf_open(path, &g, err);
    if (*rc == 0 && (*rc = ple_file_read(g, &f, err)) == 0)
        *rc = ple_layer_open(g, &f, &L, err);
    gguf_close(g);
    return L;
}

static void test_file(void)
{
    struct model m;
    model_make(&m, 12, GGML_BF16, GGML_F16, 15);
    char path[300];
    tu_path(path, sizeof path, "ple.gguf");
    CHECK_EQ(write_ple_file(path, &m), 0);
    int rc;
    engram_error err;
    struct ple_layer *Lf = open_file_layer(path, &rc, &err), *Lm = layer_of(&m);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "open: %s\n", err.msg);
    if (Lf && Lm) {
        CHECK_EQ(ple_layer_bytes(Lf), ple_layer_bytes(Lm));
        CHECK(same(Lf->m[0].w, Lm->m[0].w, Lm->m[0].bytes) && same(Lf->m[1].w, Lm->m[1].w, Lm->m[1].bytes));
        CHECK(same(Lf->conv, Lm->conv, 4 * 12 * T * 4) && same(Lf->gq, Lm->gq, 4 * 12 * 4));
        struct seq q;
        seq_make(&q, Lm, 10, 16, 0);
        size_t xb = q.n * q.C * 4, sb = q.F * q.C * 4;
        float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
        struct ple_apply_opts o = {1, ENGRAM_SIMD_AUTO, 0, NULL, NULL};
        CHECK_EQ(run_once(Lm, &o, &q, x0, s0), 0);
        CHECK_EQ(run_once(Lf, &o, &q, x1, s1), 0);
        CHECK(same(x0, x1, xb) && same(s0, s1, sb));
        free(x0), free(s0), free(x1), free(s1);
        seq_free(&q);
    }
    ple_layer_free(Lf);
    ple_layer_free(Lm);
    /* a NaN weight in the file: refused naming the tensor and element */
    ((uint16_t *)m.value)[3 * K + 5] = 0x7e00; /* F16 NaN */
    CHECK_EQ(write_ple_file(path, &m), 0);
    Lf = open_file_layer(path, &rc, &err);
    CHECK(Lf == NULL);
    CHECK_ERR(rc, err, -EBADMSG, "blk.1.ple_value.weight': element [3][5]");
    /* and from memory */
    struct ple_layer *L = NULL;
    rc = ple_layer_new(&m.w, &L, &err);
    CHECK_ERR(rc, err, -EBADMSG, "ple_value': element [3][5]");
    ((uint16_t *)m.value)[3 * K + 5] = 0;
    m.gc[7] = INFINITY;
    rc = ple_layer_new(&m.w, &L, &err);
    CHECK_ERR(rc, err, -EBADMSG, "ple_norm_conv': element [0][7]");
    m.gc[7] = 1.0f;
    m.w.key_type = GGML_Q8_0;
    rc = ple_layer_new(&m.w, &L, &err);
    CHECK_ERR(rc, err, -EINVAL, "not BF16, F16 or F32");
    m.w.key_type = GGML_BF16;
    m.w.kernel = 0;
    rc = ple_layer_new(&m.w, &L, &err);
    CHECK_ERR(rc, err, -EINVAL, "taps");
    m.w.kernel = T;
    m.w.width = 0;
    rc = ple_layer_new(&m.w, &L, &err);
    CHECK_ERR(rc, err, -EINVAL, "width 0");
    CHECK(L == NULL);
    CHECK_ERR(ple_layer_new(NULL, &L, &err), err, -EINVAL, "NULL");
    unlink(path);
    model_free(&m);
}

/* ple_layer_describe / ple_layer_export (what the GPU path uploads): the
 * weights as given, in their types, at widths with whole and partial
 * panels. */
static void test_export(void)
{
    static const uint32_t widths[2] = {37, 64};
    static const uint32_t types[2][2] = {{GGML_F32, GGML_F16}, {GGML_BF16, GGML_BF16}};
    for (int q = 0; q < 2; q++) {
        struct model m;
        model_make(&m, widths[q], types[q][0], types[q][1], 21 + q);
        struct ple_layer *L = layer_of(&m);
        if (!L) {
            model_free(&m);
            continue;
        }
        struct ple_weights d;
        ple_layer_describe(L, &d);
        CHECK(d.width == m.w.width && d.kernel == T && d.eps == m.w.eps && d.key_type == types[q][0] &&
              d.value_type == types[q][1] && !d.key && !d.value && !d.conv);
        const size_t C = 4 * (size_t)widths[q], ks = types[q][0] == GGML_F32 ? 4 : 2,
                     vs = types[q][1] == GGML_F32 ? 4 : 2;
        void *key = malloc(C * K * ks), *value = malloc(C / 4 * K * vs);
        float *n3 = malloc(3 * C * 4), *conv = malloc(C * T * 4);
        ple_layer_export(L, key, value, n3, n3 + C, n3 + 2 * C, conv);
        CHECK(same(key, m.key, C * K * ks) && same(value, m.value, C / 4 * K * vs));
        CHECK(same(n3, m.gk, C * 4) && same(n3 + C, m.gq, C * 4) && same(n3 + 2 * C, m.gc, C * 4));
        CHECK(same(conv, m.conv, C * T * 4));
        ple_layer_export(L, NULL, NULL, NULL, NULL, NULL, NULL); /* all skipped */
        free(key), free(value), free(n3), free(conv);
        ple_layer_free(L);
        model_free(&m);
    }
    printf("export: the weights back as given (F32/F16, BF16; partial and whole panels)\n");
}

/* ------------------------------------------------ errors */

static void test_errors(void)
{
    struct model m;
    model_make(&m, 16, GGML_BF16, GGML_BF16, 17);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    struct seq q;
    seq_make(&q, L, 6, 18, 0);
    for (size_t t = 0; t < q.n; t++)
        q.mask[t] = 1;
    size_t xb = q.n * q.C * 4, sb = q.F * q.C * 4;
    float *x0 = malloc(xb), *s0 = malloc(sb), *x1 = malloc(xb), *s1 = malloc(sb);
    struct ple_applier *a = NULL;
    engram_error err;
    CHECK_EQ(ple_applier_new(L, NULL, &a, &err), 0);
    if (!a)
        return;
    /* refusals before anything: residual and state unchanged */
#define UNCHANGED() CHECK(same(x1, q.x, xb) && same(s1, q.state, sb))
#define RESET() (memcpy(x1, q.x, xb), memcpy(s1, q.state, sb))
    RESET();
    q.rows[3 * K + 170] = 0x7f80; /* +inf: token 3, row 1, value 10 */
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EDOM,
              "token 3: row 1 value 10 is infinite");
    UNCHANGED();
    q.mask[3] = 0; /* masked: not read */
    CHECK_EQ(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), 0);
    q.mask[3] = 1;
    q.rows[3 * K + 170] = 0;
    RESET();
    x1[4 * q.C + 2 * 16 + 9] = NAN;
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EDOM,
              "token 4 stream 2 index 9: the residual is NaN");
    CHECK(same(x1, q.x, 4 * q.C * 4) && same(s1, q.state, sb));
    RESET();
    s1[2 * q.C + 5] = -INFINITY;
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EDOM,
              "frame 2 channel 5 is infinite");
    CHECK(same(x1, q.x, xb));
    RESET();
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_RAW, q.mask, q.n, s1, &err), err, -EINVAL, "F32 or BF16");
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, NULL, &err), err, -EINVAL, "NULL");
    CHECK_ERR(ple_apply(a, NULL, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EINVAL, "NULL");
    CHECK_ERR(ple_apply(NULL, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EINVAL, "NULL");
    UNCHANGED();
    CHECK_EQ(ple_apply(a, NULL, NULL, ENGRAM_F32, NULL, 0, s1, &err), 0); /* nothing to do */
    UNCHANGED();
    /* overflow at token 3 (x^2 overflows Sxx): tokens 0..2 updated exactly
     * as a call of them alone, the state the one after them, 3 and 4..5
     * untouched */
    RESET();
    for (size_t c = 0; c < q.C; c++)
        x1[3 * q.C + c] = 3e19f;
    float *x3 = malloc(xb);
    memcpy(x3, x1, xb);
    CHECK_ERR(ple_apply(a, q.rows, x1, ENGRAM_F32, q.mask, q.n, s1, &err), err, -EDOM, "token 3:");
    q.n = 3;
    CHECK_EQ(run_once(L, NULL, &q, x0, s0), 0);
    CHECK(same(x1, x0, 3 * q.C * 4) && same(s1, s0, sb));
    CHECK(same(x1 + 3 * q.C, x3 + 3 * q.C, 3 * q.C * 4));
    q.n = 6;
    /* applier options */
    struct ple_applier *b = NULL;
    struct ple_apply_opts o = {PLE_APPLY_MAX_THREADS + 1, ENGRAM_SIMD_AUTO, 0, NULL, NULL};
    CHECK_ERR(ple_applier_new(L, &o, &b, &err), err, -EINVAL, "threads");
    o = (struct ple_apply_opts){1, (engram_simd)77, 0, NULL, NULL};
    CHECK_ERR(ple_applier_new(L, &o, &b, &err), err, -EINVAL, "not supported");
    CHECK_ERR(ple_applier_new(NULL, NULL, &b, &err), err, -EINVAL, "NULL");
    CHECK(b == NULL);
    ple_applier_free(NULL);
    ple_layer_free(NULL);
#undef UNCHANGED
#undef RESET
    free(x0), free(s0), free(x1), free(s1), free(x3);
    ple_applier_free(a);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
}

/* The workspace is what the header says, whatever n; a call allocates
 * nothing (counted in plain builds). */
static void test_memory(void)
{
    struct model m;
    const uint32_t W = 256;
    model_make(&m, W, GGML_BF16, GGML_BF16, 19);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return;
    CHECK_EQ(ple_layer_bytes(L), sizeof *L + (size_t)(4 * W / 64 + W / 64) * 64 * K * 2 + 7 * 4 * (size_t)W * 4);
    struct ple_apply_opts o = {2, ENGRAM_SIMD_AUTO, 16, NULL, NULL};
    struct ple_applier *a = NULL;
    CHECK_EQ(ple_applier_new(L, &o, &a, NULL), 0);
    const uint64_t C = 4 * W, floats = 16 * (K + 5 * W + C + 4) + (9 + 16) * C + 2 * (2 * C + 16384);
    uint64_t got = ple_applier_bytes(a);
    CHECK(got >= floats * 4 && got <= floats * 4 + 16 * 32 + 4096);
    struct seq q;
    seq_make(&q, L, 40, 20, 0);
    alloc_counted = 0;
    alloc_counting = 1;
    CHECK_EQ(ple_apply(a, q.rows, q.x, ENGRAM_F32, q.mask, q.n, q.state, NULL), 0);
    alloc_counting = 0;
    CHECK_EQ(alloc_counted, 0);
    printf("memory: applier %llu bytes (W %u, 16 positions a block, 2 threads); %ld allocations in a call "
           "of %zu positions%s\n", (unsigned long long)got, W, (long)alloc_counted, q.n,
           SANITIZED ? " (not counted under a sanitizer)" : "");
    seq_free(&q);
    ple_applier_free(a);
    ple_layer_free(L);
    model_free(&m);
}

/* ------------------------------------------------ the reference case */

static int write_file(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, bytes, f) == bytes;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "cannot write %s\n", path);
    return ok ? 0 : -1;
}

/* W, N, seed: BF16 weights, a random start state, about 1 in 6 positions
 * masked, one token with a zero residual stream (s = +0), applied in
 * random chunks with 2 threads. */
static int dump(const char *dir, uint32_t W, size_t n, uint64_t seed)
{
    struct model m;
    model_make(&m, W, GGML_BF16, GGML_BF16, seed);
    struct ple_layer *L = layer_of(&m);
    if (!L)
        return 1;
    struct seq q;
    seq_make(&q, L, n, seed + 1, 0);
    memset(q.x + 1 * q.C + 2 * W, 0, W * sizeof(float)); /* token 1 stream 2: zeros */
    q.mask[1] = 1;
    size_t xb = q.n * q.C * 4, sb = q.F * q.C * 4, cuts[64], nc = 0;
    uint64_t s = seed + 2;
    for (size_t i = 1; i < n && nc < 64; i++)
        if (tu_rand(&s) % 7 == 0)
            cuts[nc++] = i;
    float *x1 = malloc(xb), *s1 = malloc(sb);
    struct ple_apply_opts o = {2, ENGRAM_SIMD_AUTO, 16, NULL, NULL};
    int rc = run_cuts(L, &o, &q, cuts, nc, x1, s1);
    const size_t C = q.C;
    char meta[200];
    snprintf(meta, sizeof meta, "W %u\nT %u\nN %zu\neps %.9g\nchunks %zu\n", W, T, n, (double)m.w.eps, nc + 1);
    if (rc < 0 || write_file(dir, "meta", meta, strlen(meta)) < 0 ||
        write_file(dir, "key.bf16", m.key, C * K * 2) < 0 ||
        write_file(dir, "value.bf16", m.value, (size_t)W * K * 2) < 0 ||
        write_file(dir, "norm_key.f32", m.gk, C * 4) < 0 || write_file(dir, "norm_query.f32", m.gq, C * 4) < 0 ||
        write_file(dir, "norm_conv.f32", m.gc, C * 4) < 0 || write_file(dir, "conv.f32", m.conv, C * T * 4) < 0 ||
        write_file(dir, "rows.bf16", q.rows, n * K * 2) < 0 || write_file(dir, "mask.u8", q.mask, n) < 0 ||
        write_file(dir, "x_in.f32", q.x, xb) < 0 || write_file(dir, "state_in.f32", q.state, sb) < 0 ||
        write_file(dir, "x_out.f32", x1, xb) < 0 || write_file(dir, "state_out.f32", s1, sb) < 0)
        rc = -1;
    printf("dumped W %u, %zu positions in %zu chunks, kernels %s\n", W, n, nc + 1,
           ple_kernels_for(ENGRAM_SIMD_AUTO)->name);
    free(x1), free(s1);
    seq_free(&q);
    ple_layer_free(L);
    model_free(&m);
    return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--dump"))
        return dump(argv[2], (uint32_t)strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10),
                    strtoull(argv[5], NULL, 10));
    if (argc != 1) {
        fprintf(stderr, "usage: test_ple_apply [--dump DIR W N SEED]\n");
        return 2;
    }
    printf("kernels: %s (auto)\n", ple_kernels_for(ENGRAM_SIMD_AUTO)->name);
    /* the kernels against the scalar reference run on the caller's thread
     * alone (threads = 1): the other builds' part (TSANITIZED, testutil.h) */
    if (!TSANITIZED)
        test_kernels();
    test_invariance();
    test_taps();
    test_masked();
    test_sign_zero();
    test_bf16_residual();
    test_file();
    test_export();
    test_errors();
    test_memory();
    tu_cleanup();
    return tu_finish("test_ple_apply");
}
