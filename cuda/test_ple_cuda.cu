/*
 * test_ple_cuda.cu - the PLE output stage on the GPU (cuda/ple_cuda.h)
 * against the CPU path (src/output/ple_apply.h, itself checked against a
 * float64 reference by tests/test_ple_apply.sh), on synthetic layers drawn
 * as tests/test_ple_apply.c draws them (rows and weights normal-like,
 * weights ~ N(0, 1/sqrt(2560)), norms 1 + N(0, 0.1), taps U(-0.5, 0.5),
 * residuals BF16 values of N(0, 2), a random starting state, about 1 in 6
 * positions masked, one residual stream of zeros):
 *  - widths 2560 (the real shape, BF16 weights), 40 (BF16) and 37 (F16 keys,
 *    BF16 values: the keys by the GEMV at every n, the values by cuBLAS);
 *    sequences of n = 1, 2, 8, 64, 300 positions;
 *  - each of: one call; random chunks with the state carried (chunks of
 *    1..8 take the GEMV, longer ones cuBLAS); PLE_CUDA_FMA_ONLY; against
 *    the CPU: >= 99.9% of the unmasked outputs within one BF16 step of the
 *    CPU's (a step: the BF16 quantum of max(|cpu|, |gpu|)), all within 4
 *    steps of the update's operands max(|x|, |cpu|, |cpu - x|); the state
 *    the same way (>= 99.9% within one step, all within two steps of
 *    max(|cpu|, the frame's RMS)); masked positions' residual bit for bit
 *    and their frames in the state +0 bit for bit;
 *  - batch invariance of the GEMV path: PLE_CUDA_FMA_ONLY in one call and
 *    in the chunks give the same bits; n <= 8 takes it by default (the same
 *    bits as FMA_ONLY); PLE_CUDA_SERIAL gives the dependent launches' bits;
 *    a BF16 residual gets bf16 of the F32 residual's result, the same state;
 *  - sign(0) = 0: with W_k = 0 (every s = +0) and zero taps, out = (x +
 *    0.5 v) + 0 exactly, v from ple_cuda_project, on the GEMV and cuBLAS
 *    paths;
 *  - masked positions with NaN rows and residual: unread, untouched, the
 *    same results; a NaN residual: that token untouched, named by
 *    ple_cuda_sync (-EDOM), the tokens before it as without it;
 *  - under an error the caller's own failed call left pending: one call
 *    and FMA_ONLY give the same bits, and the error is left pending (not
 *    reported as the library's, not consumed);
 *  - refusals (NULL, alignment, types, flags, F32 weights, other taps);
 *    no cudaMalloc in a call (the call wrapped at link time).
 * Without a GPU (CI, the dev VM): the open fails with -ENODEV naming the
 * reason, the refusals that need no GPU are checked, exit 0.
 * Prints one line per case with its figures and PASS or FAIL; exit 1 on a
 * failure.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "../tests/testutil.h"
#include "cuda_check.h"
#include "ple_cuda.h"

extern "C" {
#include "output/ple_apply.h"
}

static const int KIN = PLE_K; /* 2560 inputs per token */
static const uint32_t TAPS = 4;
static const size_t FR = 9;   /* frames of the state */

/* ------------------------------------------------ cudaMalloc counted */

static long mallocs;
extern "C" {
cudaError_t __real_cudaMalloc(void **p, size_t size);
cudaError_t __wrap_cudaMalloc(void **p, size_t size)
{
    mallocs++;
    return __real_cudaMalloc(p, size);
}
}

/* ------------------------------------------------ draws (as test_ple_apply.c) */

static double uniform(uint64_t *s)
{
    return (double)(tu_rand(s) >> 11) * 0x1p-53;
}

static double normal(uint64_t *s)
{
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u > 0 ? u : 0x1p-60)) * cos(6.283185307179586 * v);
}

static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_val(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* F32 -> F16 bits, round to nearest even (subnormals included). */
static uint16_t f16_bits(float f)
{
    uint16_t sign = signbit(f) ? 0x8000u : 0;
    float a = fabsf(f);
    if (a >= 65520.0f)
        return sign | 0x7c00u;
    if (a < 0x1p-14f)
        return sign | (uint16_t)nearbyintf(a * 0x1p24f);
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
            ((uint16_t *)m)[i] = type == GGML_BF16 ? bf16_bits(v) : f16_bits(v);
    }
    return m;
}

static float *draw_floats(size_t n, double mean, double sd, uint64_t *s)
{
    float *v = (float *)malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(mean + normal(s) * sd);
    return v;
}

static void model_make(model *m, uint32_t W, uint32_t kt, uint32_t vt, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    uint64_t s = seed;
    const size_t C = 4 * (size_t)W;
    m->key = draw_matrix(kt, C * KIN, 1.0 / sqrt((double)KIN), &s);
    m->value = draw_matrix(vt, (size_t)W * KIN, 1.0 / sqrt((double)KIN), &s);
    m->gk = draw_floats(C, 1.0, 0.1, &s);
    m->gq = draw_floats(C, 1.0, 0.1, &s);
    m->gc = draw_floats(C, 1.0, 0.1, &s);
    m->conv = (float *)malloc(C * TAPS * sizeof *m->conv);
    for (size_t i = 0; i < C * TAPS; i++)
        m->conv[i] = (float)(uniform(&s) - 0.5);
    m->w = (struct ple_weights){W, TAPS, 1e-6f, kt, vt, m->key, m->value, m->gk, m->gq, m->gc, m->conv};
}

static void model_free(model *m)
{
    free(m->key);
    free(m->value);
    free(m->gk);
    free(m->gq);
    free(m->gc);
    free(m->conv);
}

static struct ple_layer *layer_of(const model *m)
{
    struct ple_layer *L = NULL;
    engram_error err;
    if (ple_layer_new(&m->w, &L, &err) < 0)
        fprintf(stderr, "ple_layer_new: %s\n", err.msg);
    CHECK(L != NULL);
    return L;
}

/* n positions: rows, residual (F32 holding BF16 values), mask (about 1 in
 * 6 masked, never position 0; position 1 unmasked with stream 2 all zeros)
 * and a random starting state. */
struct seq {
    size_t n, C;
    uint16_t *rows;
    float *x;
    uint8_t *mask;
    float *state;
};

static void seq_make(seq *q, uint32_t W, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    q->n = n;
    q->C = 4 * (size_t)W;
    q->rows = (uint16_t *)malloc(n * KIN * 2);
    q->x = (float *)malloc(n * q->C * 4);
    q->mask = (uint8_t *)malloc(n);
    q->state = (float *)malloc(FR * q->C * 4);
    for (size_t i = 0; i < n * KIN; i++)
        q->rows[i] = bf16_bits((float)normal(&s));
    for (size_t i = 0; i < n * q->C; i++)
        q->x[i] = bf16_val(bf16_bits((float)(2.0 * normal(&s))));
    for (size_t t = 0; t < n; t++)
        q->mask[t] = t == 0 || tu_rand(&s) % 6 != 0;
    for (size_t i = 0; i < FR * q->C; i++)
        q->state[i] = (float)normal(&s);
    if (n > 1) {
        q->mask[1] = 1;
        memset(q->x + q->C + 2 * W, 0, W * 4);
    }
}

static void seq_free(seq *q)
{
    free(q->rows);
    free(q->x);
    free(q->mask);
    free(q->state);
}

static int cpu_run(const struct ple_layer *L, const seq *q, float *x_out, float *s_out)
{
    struct ple_apply_opts o = {4, ENGRAM_SIMD_AUTO, 0, NULL, NULL};
    struct ple_applier *a = NULL;
    engram_error err;
    int rc = ple_applier_new(L, &o, &a, &err);
    if (rc == 0) {
        memcpy(x_out, q->x, q->n * q->C * 4);
        memcpy(s_out, q->state, FR * q->C * 4);
        rc = ple_apply(a, q->rows, x_out, ENGRAM_F32, q->mask, q->n, s_out, &err);
    }
    if (rc < 0)
        fprintf(stderr, "CPU ple_apply: %s\n", err.msg);
    ple_applier_free(a);
    return rc;
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 16));
    if (h && bytes)
        CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* The GPU on q in calls cut at cuts[0..ncuts) with the state carried; the
 * residual F32, or BF16 (x_out then gets the BF16 values as F32).
 * Returns ple_cuda_sync's code (or the first apply's failure). */
static int gpu_run(ple_cuda_layer *c, const seq *q, const size_t *cuts, size_t ncuts, unsigned flags, int bf,
                   float *x_out, float *s_out, engram_error *err, cudaStream_t st)
{
    const size_t nx = q->n * q->C;
    uint16_t *xb = NULL;
    void *hx = q->x;
    if (bf) {
        xb = (uint16_t *)malloc(nx * 2 + 2);
        for (size_t i = 0; i < nx; i++)
            xb[i] = bf16_bits(q->x[i]);
        hx = xb;
    }
    uint16_t *d_rows = (uint16_t *)dev_copy(q->rows, q->n * KIN * 2);
    uint8_t *d_mask = (uint8_t *)dev_copy(q->mask, q->n);
    char *d_x = (char *)dev_copy(hx, nx * (bf ? 2 : 4));
    float *d_s = (float *)dev_copy(q->state, FR * q->C * 4);
    const size_t es = bf ? 2 : 4;
    int rc = 0;
    size_t at = 0;
    for (size_t k = 0; k <= ncuts && rc == 0; k++) {
        size_t end = k < ncuts ? cuts[k] : q->n;
        ple_cuda_args a;
        memset(&a, 0, sizeof a);
        a.rows = d_rows + at * KIN;
        a.resid = d_x + at * q->C * es;
        a.resid_dtype = bf ? ENGRAM_BF16 : ENGRAM_F32;
        a.mask = d_mask + at;
        a.state = d_s;
        a.n = (unsigned)(end - at);
        a.stream = st;
        a.flags = flags;
        rc = ple_cuda_apply(c, &a, err);
        at = end;
    }
    if (rc == 0)
        rc = ple_cuda_sync(c, st, err);
    else
        CU(cudaStreamSynchronize(st));
    if (bf) {
        CU(cudaMemcpy(xb, d_x, nx * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nx; i++)
            x_out[i] = bf16_val(xb[i]);
    } else {
        CU(cudaMemcpy(x_out, d_x, nx * 4, cudaMemcpyDeviceToHost));
    }
    CU(cudaMemcpy(s_out, d_s, FR * q->C * 4, cudaMemcpyDeviceToHost));
    CU(cudaFree(d_rows));
    CU(cudaFree(d_mask));
    CU(cudaFree(d_x));
    CU(cudaFree(d_s));
    free(xb);
    return rc;
}

/* ------------------------------------------------ comparison */

/* the BF16 quantum at |a| (normal range; tiny for 0) */
static double ulp_bf16(double a)
{
    a = fabs(a);
    if (a == 0)
        return 0x1p-133;
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1 */
    return ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 7);
}

static int failures_cases;

/* GPU (xg, sg) against CPU (xc, sc) on q; prints a line; 1 if it passes. */
static int compare(uint32_t W, const seq *q, const char *what, const float *xc, const float *sc,
                   const float *xg, const float *sg)
{
    const size_t C = q->C;
    long outs = 0, within = 0, same_bits = 0, masked_bad = 0;
    double maxerr = 0, maxops = 0;
    for (size_t t = 0; t < q->n; t++) {
        const float *x = q->x + t * C, *c = xc + t * C, *g = xg + t * C;
        if (!q->mask[t]) {
            masked_bad += memcmp(g, x, C * 4) != 0;
            continue;
        }
        for (size_t i = 0; i < C; i++) {
            double d = fabs((double)g[i] - (double)c[i]);
            outs++;
            within += d <= ulp_bf16(fmax(fabs((double)c[i]), fabs((double)g[i])));
            same_bits += memcmp(&g[i], &c[i], 4) == 0;
            double ops = fmax(fmax(fabs((double)x[i]), fabs((double)c[i])),
                              fabs((double)c[i] - (double)x[i]));
            if (!(d / ulp_bf16(ops) <= maxops))
                maxops = d / ulp_bf16(ops);
            if (!(d <= maxerr))
                maxerr = d;
        }
    }
    long swithin = 0, sbound_bad = 0, sframes_bad = 0;
    double smax = 0;
    for (size_t f = 0; f < FR; f++) {
        const float *c = sc + f * C, *g = sg + f * C;
        double rms = 0;
        for (size_t i = 0; i < C; i++)
            rms += (double)c[i] * c[i];
        rms = sqrt(rms / C);
        long t = (long)q->n - (long)FR + (long)f; /* the position of this frame, if in the call */
        if (t >= 0 && !q->mask[t]) {
            for (size_t i = 0; i < C; i++)
                sframes_bad += ((const uint32_t *)g)[i] != 0; /* +0 exactly */
        }
        for (size_t i = 0; i < C; i++) {
            double d = fabs((double)g[i] - (double)c[i]);
            swithin += d <= ulp_bf16(fmax(fabs((double)c[i]), fabs((double)g[i])));
            sbound_bad += !(d <= 2 * ulp_bf16(fmax(fabs((double)c[i]), rms)));
            if (!(d <= smax))
                smax = d;
        }
    }
    const double pw = outs ? 100.0 * within / outs : 100.0, ps = 100.0 * swithin / (FR * C);
    const int ok = pw >= 99.9 && maxops <= 4.0 && ps >= 99.9 && sbound_bad == 0 && sframes_bad == 0 &&
                   masked_bad == 0;
    printf("W=%-4u n=%-3zu %-34s %7ld outputs: %8.4f%% within one BF16 step of the CPU (%7.3f%% the same "
           "bits), max |err| %.3g, max %.3f steps of the operands; state %8.4f%% within one step, max |err| "
           "%.3g; masked untouched %s  %s\n",
           W, q->n, what, outs, pw, outs ? 100.0 * same_bits / outs : 100.0, maxerr, maxops, ps, smax,
           masked_bad || sframes_bad ? "NO" : "yes", ok ? "PASS" : "FAIL");
    CHECK(ok);
    failures_cases += !ok;
    return ok;
}

static int same(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

static void bits_line(uint32_t W, size_t n, const char *what, int ok)
{
    printf("W=%-4u n=%-3zu %-60s %s\n", W, n, what, ok ? "PASS" : "FAIL");
    CHECK(ok);
    failures_cases += !ok;
}

/* ------------------------------------------------ the cases */

static void sequences(const model *m, cudaStream_t st)
{
    const uint32_t W = m->w.width;
    struct ple_layer *L = layer_of(m);
    if (!L)
        return;
    ple_cuda_layer *c = NULL;
    engram_error err;
    int rc = ple_cuda_layer_open(L, 0, &c, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "ple_cuda_layer_open: %s\n", err.msg);
        ple_layer_free(L);
        return;
    }
    printf("W=%u: weights %s/%s, %.1f MB on the device\n", W, m->w.key_type == GGML_F16 ? "F16" : "BF16",
           m->w.value_type == GGML_F16 ? "F16" : "BF16", ple_cuda_layer_bytes(c) / 1e6);
    static const size_t ns[5] = {1, 2, 8, 64, 300};
    for (int qi = 0; qi < 5; qi++) {
        seq q;
        seq_make(&q, W, ns[qi], 1000 + W + qi);
        const size_t nx = q.n * q.C, ns_ = FR * q.C;
        float *xc = (float *)malloc(nx * 4), *sc = (float *)malloc(ns_ * 4);
        float *x1 = (float *)malloc(nx * 4), *s1 = (float *)malloc(ns_ * 4);
        float *x2 = (float *)malloc(nx * 4), *s2 = (float *)malloc(ns_ * 4);
        float *x3 = (float *)malloc(nx * 4), *s3 = (float *)malloc(ns_ * 4);
        CHECK_EQ(cpu_run(L, &q, xc, sc), 0);
        /* random cuts: about one position in 7, so chunks of 1..8 (GEMV) and longer (cuBLAS) */
        size_t cuts[400], nc = 0;
        uint64_t s = 77 + q.n;
        for (size_t i = 1; i < q.n; i++)
            if (tu_rand(&s) % 7 == 0 || (q.n <= 8 && i == q.n / 2))
                cuts[nc++] = i;
        long before = mallocs;
        /* one call */
        CHECK_EQ(gpu_run(c, &q, NULL, 0, 0, 0, x1, s1, &err, st), 0);
        compare(W, &q, "one call", xc, sc, x1, s1);
        /* chunks, the state carried */
        CHECK_EQ(gpu_run(c, &q, cuts, nc, 0, 0, x2, s2, &err, st), 0);
        char what[64];
        snprintf(what, sizeof what, "%zu chunks, state carried", nc + 1);
        compare(W, &q, what, xc, sc, x2, s2);
        /* the GEMV path throughout, in one call and in the chunks: the same bits */
        CHECK_EQ(gpu_run(c, &q, NULL, 0, PLE_CUDA_FMA_ONLY, 0, x2, s2, &err, st), 0);
        compare(W, &q, "FMA_ONLY, one call", xc, sc, x2, s2);
        CHECK_EQ(gpu_run(c, &q, cuts, nc, PLE_CUDA_FMA_ONLY, 0, x3, s3, &err, st), 0);
        snprintf(what, sizeof what, "FMA_ONLY: %zu chunks = one call, bit for bit", nc + 1);
        bits_line(W, q.n, what, same(x2, x3, nx * 4) && same(s2, s3, ns_ * 4));
        if (q.n <= PLE_CUDA_GEMV_MAX)
            bits_line(W, q.n, "n <= 8 by default = FMA_ONLY, bit for bit",
                      same(x1, x2, nx * 4) && same(s1, s2, ns_ * 4));
        /* launched serially: the same bits as the dependent launches */
        CHECK_EQ(gpu_run(c, &q, NULL, 0, PLE_CUDA_SERIAL, 0, x3, s3, &err, st), 0);
        bits_line(W, q.n, "PLE_CUDA_SERIAL = dependent launches, bit for bit",
                  same(x1, x3, nx * 4) && same(s1, s3, ns_ * 4));
        /* a BF16 residual: bf16 of the F32 residual's result, the same state */
        CHECK_EQ(gpu_run(c, &q, NULL, 0, 0, 1, x3, s3, &err, st), 0);
        int bok = same(s1, s3, ns_ * 4);
        for (size_t i = 0; i < nx; i++) /* x3: the BF16 results as F32 */
            bok &= q.mask[i / q.C]
                       ? bf16_bits(x1[i]) == bf16_bits(x3[i]) && bf16_val(bf16_bits(x3[i])) == x3[i]
                       : memcmp(&x3[i], &q.x[i], 4) == 0;
        bits_line(W, q.n, "BF16 residual = bf16(F32 residual's), same state", bok);
        CHECK_EQ(mallocs, before + 6 * 4); /* gpu_run's own 4 buffers in each of 6 runs; the calls: none */
        /* under an error the caller's own failed call left pending (a
         * non-sticky one): the same bits, and the error still pending (the
         * library neither reports it as its own nor consumes it); one call
         * takes cuBLAS's GEMM from n = 9, FMA_ONLY the GEMV */
        for (int fo = 0; fo < 2; fo++) {
            (void)cudaSetDevice(1 << 20);
            int set = cudaPeekAtLastError() == cudaErrorInvalidDevice;
            int rc2 = gpu_run(c, &q, NULL, 0, fo ? PLE_CUDA_FMA_ONLY : 0, 0, x3, s3, &err, st);
            int left = cudaGetLastError() == cudaErrorInvalidDevice;
            CHECK_EQ(rc2, 0);
            int bits = fo ? same(x2, x3, nx * 4) && same(s2, s3, ns_ * 4)
                          : same(x1, x3, nx * 4) && same(s1, s3, ns_ * 4);
            snprintf(what, sizeof what, "%s, the caller's error pending: same bits, kept",
                     fo ? "FMA_ONLY" : "one call");
            bits_line(W, q.n, what, rc2 == 0 && set && bits && left);
        }
        free(xc), free(sc), free(x1), free(s1), free(x2), free(s2), free(x3), free(s3);
        seq_free(&q);
    }
    ple_cuda_layer_close(c);
    ple_layer_free(L);
}

/* sign(0) = 0: W_k = 0 makes every s +0, zero taps make y = +0, so out =
 * (x + 0.5 v) + 0 exactly, with the GPU's own v. */
static void sign_zero(cudaStream_t st)
{
    const uint32_t W = 16;
    model m;
    model_make(&m, W, GGML_BF16, GGML_BF16, 8);
    memset(m.key, 0, 4 * (size_t)W * KIN * 2);
    memset(m.conv, 0, 4 * (size_t)W * TAPS * 4);
    struct ple_layer *L = layer_of(&m);
    ple_cuda_layer *c = NULL;
    engram_error err;
    if (!L || ple_cuda_layer_open(L, 0, &c, &err) < 0) {
        CHECK(0);
        model_free(&m);
        ple_layer_free(L);
        return;
    }
    static const size_t ns[2] = {3, 20}; /* the GEMV, cuBLAS */
    for (int k = 0; k < 2; k++) {
        seq q;
        seq_make(&q, W, ns[k], 13 + k);
        memset(q.mask, 1, q.n);
        const size_t nx = q.n * q.C;
        float *x1 = (float *)malloc(nx * 4), *s1 = (float *)malloc(FR * q.C * 4);
        float *kv = (float *)malloc(q.n * 5 * W * 4);
        CHECK_EQ(gpu_run(c, &q, NULL, 0, 0, 0, x1, s1, &err, st), 0);
        uint16_t *d_rows = (uint16_t *)dev_copy(q.rows, q.n * KIN * 2);
        float *d_kv = (float *)dev_copy(NULL, q.n * 5 * W * 4);
        ple_cuda_args a;
        memset(&a, 0, sizeof a);
        a.rows = d_rows;
        a.n = (unsigned)q.n;
        a.stream = st;
        CHECK_EQ(ple_cuda_project(c, &a, d_kv, &err), 0);
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(kv, d_kv, q.n * 5 * W * 4, cudaMemcpyDeviceToHost));
        int ok = 1, kzero = 1;
        for (size_t t = 0; t < q.n; t++) {
            for (size_t o = 0; o < 4 * W; o++)
                kzero &= kv[t * 5 * W + o] == 0.0f; /* +0 by the GEMV; cuBLAS may give -0: s = +0 anyway */
            for (uint32_t s = 0; s < 4; s++)
                for (uint32_t i = 0; i < W; i++) {
                    volatile float h = 0.5f * kv[t * 5 * W + 4 * W + i];
                    volatile float xg = q.x[t * q.C + s * W + i] + h;
                    ok &= x1[t * q.C + s * W + i] == xg + 0.0f;
                }
        }
        char what[80];
        snprintf(what, sizeof what, "sign(0) = 0 (%s): k = +0, out = (x + 0.5 v) + 0 exactly",
                 k ? "cuBLAS" : "GEMV");
        bits_line(W, q.n, what, ok && kzero);
        CU(cudaFree(d_rows));
        CU(cudaFree(d_kv));
        free(x1), free(s1), free(kv);
        seq_free(&q);
    }
    ple_cuda_layer_close(c);
    ple_layer_free(L);
    model_free(&m);
}

/* Masked positions' rows and residual unread (NaN there changes nothing);
 * a NaN in an unmasked residual: that token untouched, named by sync. */
static void nonfinite(cudaStream_t st)
{
    const uint32_t W = 40;
    model m;
    model_make(&m, W, GGML_BF16, GGML_BF16, 9);
    struct ple_layer *L = layer_of(&m);
    ple_cuda_layer *c = NULL;
    engram_error err;
    if (!L || ple_cuda_layer_open(L, 0, &c, &err) < 0) {
        CHECK(0);
        model_free(&m);
        ple_layer_free(L);
        return;
    }
    for (int path = 0; path < 2; path++) { /* 12 positions: one call of the GEMV (FMA_ONLY), of cuBLAS */
        const unsigned fl = path ? 0 : PLE_CUDA_FMA_ONLY;
        seq q;
        seq_make(&q, W, 12, 31);
        memset(q.mask, 1, q.n);
        q.mask[7] = 0;
        const size_t nx = q.n * q.C, nsb = FR * q.C * 4;
        float *x0 = (float *)malloc(nx * 4), *s0 = (float *)malloc(nsb), *x1 = (float *)malloc(nx * 4),
              *s1 = (float *)malloc(nsb);
        CHECK_EQ(gpu_run(c, &q, NULL, 0, fl, 0, x0, s0, &err, st), 0);
        for (size_t i = 7 * KIN; i < 8 * (size_t)KIN; i++)
            q.rows[i] = 0x7fc1;
        for (size_t i = 7 * q.C; i < 8 * q.C; i++)
            q.x[i] = NAN;
        int rc = gpu_run(c, &q, NULL, 0, fl, 0, x1, s1, &err, st);
        CHECK_EQ(rc, 0);
        bits_line(W, q.n,
                  path ? "masked NaN rows/residual unread (cuBLAS)"
                       : "masked NaN rows/residual unread (GEMV)",
                  rc == 0 && same(x0, x1, 7 * q.C * 4) && same(x1 + 7 * q.C, q.x + 7 * q.C, q.C * 4) &&
                      same(x0 + 8 * q.C, x1 + 8 * q.C, 4 * q.C * 4) && same(s0, s1, nsb));
        q.x[5 * q.C + 1 * W + 3] = NAN;
        rc = gpu_run(c, &q, NULL, 0, fl, 0, x1, s1, &err, st);
        int ok = rc == -EDOM && err.code == -EDOM && strstr(err.msg, "token 5:") != NULL &&
                 same(x0, x1, 5 * q.C * 4) && same(x1 + 5 * q.C, q.x + 5 * q.C, q.C * 4);
        if (!ok)
            fprintf(stderr, "  rc %d: %s\n", rc, err.msg);
        bits_line(W, q.n,
                  path ? "NaN residual: token 5 untouched, named (cuBLAS)"
                       : "NaN residual: token 5 untouched, named (GEMV)",
                  ok);
        /* the error is cleared by the sync that reported it */
        CHECK_EQ(ple_cuda_sync(c, st, &err), 0);
        free(x0), free(s0), free(x1), free(s1);
        seq_free(&q);
    }
    ple_cuda_layer_close(c);
    ple_layer_free(L);
    model_free(&m);
}

/* Refusals; those before the device are checked without a GPU too. */
static void refusals(ple_cuda_layer *c, void *d_buf)
{
    engram_error err;
    model m;
    model_make(&m, 8, GGML_F32, GGML_BF16, 3);
    struct ple_layer *L = layer_of(&m);
    ple_cuda_layer *o = (ple_cuda_layer *)0x1;
    if (L)
        CHECK_ERR(ple_cuda_layer_open(L, 0, &o, &err), err, -ENOTSUP, "'ple_key' is F32");
    ple_layer_free(L);
    m.w.key_type = GGML_BF16;
    free(m.key);
    m.key = calloc(4 * 8 * (size_t)KIN, 2);
    m.w.key = m.key;
    m.w.kernel = 2;
    L = layer_of(&m);
    if (L)
        CHECK_ERR(ple_cuda_layer_open(L, 0, &o, &err), err, -ENOTSUP, "2 taps");
    ple_layer_free(L);
    CHECK(o == (ple_cuda_layer *)0x1);
    CHECK_ERR(ple_cuda_layer_open(NULL, 0, &o, &err), err, -EINVAL, "NULL");
    model_free(&m);
    ple_cuda_args a;
    memset(&a, 0, sizeof a);
    a.n = 1;
    CHECK_ERR(ple_cuda_apply(NULL, &a, &err), err, -EINVAL, "NULL");
    CHECK_ERR(ple_cuda_project(NULL, &a, NULL, &err), err, -EINVAL, "NULL");
    CHECK_ERR(ple_cuda_sync(NULL, NULL, &err), err, -EINVAL, "NULL");
    ple_cuda_layer_close(NULL);
    CHECK_EQ(ple_cuda_layer_bytes(NULL), 0);
    if (!c)
        return;
    /* a width whose token does not fit the gate's shared memory (9W floats) */
    {
        const uint32_t W = 8192;
        static const float one = 1.0f;
        void *kz = calloc((size_t)5 * W * KIN, 2);
        float *f = (float *)calloc((size_t)4 * W * 7, 4);
        for (size_t i = 0; i < (size_t)4 * W * 3; i++)
            f[i] = one;
        const uint16_t *vz = (const uint16_t *)kz + (size_t)4 * W * KIN;
        struct ple_weights w = {W, TAPS, 1e-6f, GGML_BF16, GGML_BF16, kz, vz, f, f + 4 * W, f + 8 * W, f + 12 * W};
        struct ple_layer *Lw = NULL;
        if (kz && f && ple_layer_new(&w, &Lw, &err) == 0) {
            CHECK_ERR(ple_cuda_layer_open(Lw, 0, &o, &err), err, -ENOTSUP, "shared memory");
            ple_layer_free(Lw);
        } else {
            CHECK(0);
        }
        free(kz);
        free(f);
    }
    CHECK_ERR(ple_cuda_apply(c, NULL, &err), err, -EINVAL, "NULL");
    CHECK_ERR(ple_cuda_apply(c, &a, &err), err, -EINVAL, "NULL");
    char *d = (char *)d_buf;
    a.rows = (const uint16_t *)(d + 2);
    a.resid = d;
    a.state = (float *)d;
    a.resid_dtype = ENGRAM_F32;
    CHECK_ERR(ple_cuda_apply(c, &a, &err), err, -EINVAL, "16-byte");
    a.rows = (const uint16_t *)d;
    a.resid_dtype = ENGRAM_RAW;
    CHECK_ERR(ple_cuda_apply(c, &a, &err), err, -EINVAL, "F32 or BF16");
    a.resid_dtype = ENGRAM_F32;
    a.resid = d + 2;
    CHECK_ERR(ple_cuda_apply(c, &a, &err), err, -EINVAL, "misaligned");
    a.resid = d;
    a.flags = 0x80;
    CHECK_ERR(ple_cuda_apply(c, &a, &err), err, -EINVAL, "flags");
    a.flags = 0;
    CHECK_ERR(ple_cuda_project(c, &a, NULL, &err), err, -EINVAL, "NULL kv");
    a.n = 0;
    CHECK_EQ(ple_cuda_apply(c, &a, &err), 0); /* nothing to do */
    CHECK_EQ(ple_cuda_sync(c, NULL, &err), 0);
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
        printf("no CUDA device: %s\n", why);
        model m;
        model_make(&m, 16, GGML_BF16, GGML_BF16, 1);
        struct ple_layer *L = layer_of(&m);
        ple_cuda_layer *c = (ple_cuda_layer *)0x1;
        engram_error err;
        if (L) {
            int rc = ple_cuda_layer_open(L, 0, &c, &err);
            CHECK_EQ(rc, -ENODEV);
            CHECK(err.code == -ENODEV && strstr(err.msg, why) != NULL);
            CHECK(c == (ple_cuda_layer *)0x1);
            printf("ple_cuda_layer_open: %s\n", err.msg);
        }
        ple_layer_free(L);
        model_free(&m);
        refusals(NULL, NULL);
        return tu_finish("test_ple_cuda (no GPU: the refusals only)");
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("test_ple_cuda on %s (%d SMs, compute capability %d.%d)\n", prop.name, prop.multiProcessorCount,
           prop.major, prop.minor);
    cudaStream_t st;
    CU(cudaStreamCreate(&st));
    {
        model m;
        model_make(&m, 16, GGML_BF16, GGML_BF16, 2);
        struct ple_layer *L = layer_of(&m);
        ple_cuda_layer *c = NULL;
        engram_error err;
        void *d = dev_copy(NULL, 1 << 16);
        if (L && ple_cuda_layer_open(L, 0, &c, &err) == 0) {
            refusals(c, d);
            ple_cuda_layer_close(c);
        } else {
            CHECK(0);
        }
        CU(cudaFree(d));
        ple_layer_free(L);
        model_free(&m);
    }
    static const struct {
        uint32_t W, kt, vt;
    } models[3] = {{2560, GGML_BF16, GGML_BF16}, {40, GGML_BF16, GGML_BF16}, {37, GGML_F16, GGML_BF16}};
    for (int k = 0; k < 3; k++) {
        model m;
        model_make(&m, models[k].W, models[k].kt, models[k].vt, 500 + k);
        sequences(&m, st);
        model_free(&m);
    }
    sign_zero(st);
    nonfinite(st);
    CU(cudaStreamDestroy(st));
    printf("%s: %d case%s failed\n", failures_cases ? "FAIL" : "PASS", failures_cases,
           failures_cases == 1 ? "" : "s");
    return tu_finish("test_ple_cuda");
}
