/*
 * test_apply.c - Engram's output stage (engram_layer / engram_apply /
 * engram_project) on real models written by the builder (rows quantized
 * from normal-like values, F16 weights), at widths that fill whole weight
 * panels (64) and that leave a partial one (200):
 *  - every kernel (scalar reference, AVX2, AVX-512) gives the same bits for
 *    the projection and for the update, with F32 and BF16 residuals;
 *  - the projection is within the error bound of an F32 sum of exact
 *    products, |kv - sum| <= gamma_K * sum |e_i w_i| (gamma_K = K u / (1 - K u),
 *    u = 2^-24), against a double-precision sum computed here;
 *  - batch invariance: a token's result is the same bits alone, inside a
 *    call of any length, at any position, in any block size, with any number
 *    of threads (the applier's own or a caller's fork-join hook);
 *  - masked tokens are untouched; d = +0 gives sigmoid(0.001);
 *  - engram_apply_strided gives the dense call's bits, reading and writing
 *    nothing between or after the tokens (poison there), and refuses bad
 *    strides naming them;
 *  - bad input: every error path, with the residual proven unchanged (or
 *    updated exactly up to the failing token, as documented);
 *  - a call allocates nothing (counted in plain builds by tests/alloc_shim.c),
 *    and the applier's memory is within ENGRAM_APPLY_WORKSPACE.
 * The numpy float64 reference of the whole path (hash, read, decode,
 * project, gate) is tests/apply_ref.py, run by test_cli.sh.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "alloc_shim.h"
#include "testutil.h"
#include "../src/format/gguf.h"

#define K ENGRAM_K

/* ------------------------------------------------ fixtures */

struct fixture {
    engram_model *m;
    engram_layer *L;
    uint32_t W, S, N;
    char path[512];
};

static int fixture_open(struct fixture *f, const char *name, uint32_t width)
{
    static uint32_t map[3000];
    engram_layout l;
    memset(f, 0, sizeof *f);
    if (tu_layout(&l, map, 3000, 2000, 2000) < 0 ||
        tu_build(name, &l, ENGRAM_FILL_NORMAL, width, f->path, sizeof f->path) < 0)
        return -1;
    engram_error err;
    if (engram_model_open(f->path, &f->m, &err) < 0 || engram_layer_open(f->m, 0, &f->L, &err) < 0) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        return -1;
    }
    engram_layer_info li;
    engram_layer_get_info(f->L, &li);
    f->W = li.width;
    f->S = li.streams;
    f->N = (f->S + 1) * f->W;
    return 0;
}

static void fixture_close(struct fixture *f)
{
    engram_layer_close(f->L);
    engram_model_close(f->m);
}

/* Rows of n tokens of real text-like hashes, read from table 0 (BF16). */
static uint16_t *model_rows(struct fixture *f, size_t n, uint64_t seed)
{
    uint32_t *tok = malloc(n * sizeof *tok), *rows = malloc(n * 48 * sizeof *rows);
    uint32_t *ids = malloc(n * 24 * sizeof *ids);
    uint16_t *out = malloc(n * K * 2);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 400);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(f->m), &h, tok, NULL, n, rows, NULL), 0);
    for (size_t i = 0; i < n; i++)
        memcpy(ids + i * 24, rows + i * 48, 24 * sizeof *ids);
    CHECK_EQ(engram_model_read_bf16(f->m, 0, ids, n * 24, out, NULL), 0);
    free(tok);
    free(rows);
    free(ids);
    return out;
}

static float bf16f(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

static float f16f(uint16_t h) /* exact, by the definition of binary16 */
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static uint16_t f2bf(float f) /* round to nearest even */
{
    union { float f; uint32_t u; } v = {f};
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* A residual of n tokens: BF16 values of magnitude ~0.1 .. 10, some zeros. */
static float *make_resid(size_t count, uint64_t seed)
{
    float *x = malloc(count * sizeof *x);
    for (size_t i = 0; i < count; i++) {
        uint64_t r = tu_rand(&seed);
        float v = ((float)(r & 0xffff) / 65536.0f - 0.5f) * 8.0f;
        x[i] = (r >> 20) % 97 == 0 ? 0.0f : bf16f(f2bf(v));
    }
    return x;
}

static engram_applier *applier(struct fixture *f, engram_simd simd, unsigned threads, unsigned tb)
{
    engram_apply_opts o = {.threads = threads, .simd = simd, .block_tokens = tb};
    engram_applier *a = NULL;
    engram_error err;
    int rc = engram_applier_new(f->L, &o, &a, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "applier: %s\n", err.msg);
    return a;
}

static const engram_simd kernels[] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512};

/* ------------------------------------------------ kernels agree; bound */

static void kernels_agree(struct fixture *f)
{
    const size_t n = 13;
    uint16_t *rows = model_rows(f, n, 1);
    size_t nkv = n * f->N, nx = n * f->S * f->W;
    float *kv[3], *xf[3];
    uint16_t *xb[3];
    float *x0 = make_resid(nx, 2);
    int have[3] = {0};
    for (int k = 0; k < 3; k++) {
        if (!engram_simd_supported(kernels[k]))
            continue;
        engram_applier *a = applier(f, kernels[k], 1, 0);
        if (!a)
            continue;
        have[k] = 1;
        /* 64 canaries past the outputs (a panel's width) */
        kv[k] = malloc((nkv + 64) * 4);
        for (size_t i = nkv; i < nkv + 64; i++)
            kv[k][i] = -7.0f;
        xf[k] = malloc(nx * 4);
        xb[k] = malloc(nx * 2);
        memcpy(xf[k], x0, nx * 4);
        for (size_t i = 0; i < nx; i++)
            xb[k][i] = f2bf(x0[i]);
        engram_error err;
        CHECK_EQ(engram_project(a, rows, ENGRAM_BF16, n, kv[k], &err), 0);
        int canaries = 1;
        for (size_t i = nkv; i < nkv + 64; i++)
            canaries &= kv[k][i] == -7.0f;
        CHECK(canaries);
        CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, xf[k], ENGRAM_F32, NULL, n, &err), 0);
        CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, xb[k], ENGRAM_BF16, NULL, n, &err), 0);
        /* F32 residual holding BF16 values = BF16 residual, value for value */
        int same = 1;
        for (size_t i = 0; i < nx; i++)
            same &= f2bf(xf[k][i]) == xb[k][i] && bf16f(xb[k][i]) == xf[k][i];
        CHECK(same);
        engram_applier_free(a);
    }
    CHECK(have[0]);
    for (int k = 1; k < 3; k++) {
        if (!have[k])
            continue;
        CHECK(memcmp(kv[k], kv[0], nkv * 4) == 0);
        CHECK(memcmp(xf[k], xf[0], nx * 4) == 0);
        CHECK(memcmp(xb[k], xb[0], nx * 2) == 0);
        printf("W=%u: %s = scalar bit for bit (projection of %zu tokens, updates F32 and BF16)\n",
               f->W, engram_simd_name(kernels[k]), n);
        /* calls of 1..7 tokens: every tile height (1..6 tokens) alone, each
         * its own kernel, against the scalar outputs of the same tokens */
        engram_applier *a = applier(f, kernels[k], 1, 0);
        float *kvn = malloc((7 * f->N + 64) * 4);
        int agree = 1, canaries = 1;
        for (size_t nt = 1; a && kvn && nt <= 7; nt++) {
            for (size_t i = nt * f->N; i < nt * f->N + 64; i++)
                kvn[i] = -7.0f;
            engram_error err;
            CHECK_EQ(engram_project(a, rows, ENGRAM_BF16, nt, kvn, &err), 0);
            agree &= memcmp(kvn, kv[0], nt * f->N * 4) == 0;
            for (size_t i = nt * f->N; i < nt * f->N + 64; i++)
                canaries &= kvn[i] == -7.0f;
        }
        CHECK(agree);
        CHECK(canaries);
        printf("W=%u: %s = scalar bit for bit in calls of 1..7 tokens (every tile height)\n", f->W,
               engram_simd_name(kernels[k]));
        free(kvn);
        engram_applier_free(a);
    }
    /* The bound, against a double-precision sum of the same products, with
     * the weights read straight from the file (engram_kv: output o's 6144
     * F16 inputs contiguous), not through the layer's panels. */
    gguf_file *g = NULL;
    CHECK_EQ(gguf_open(f->path, &g, NULL), 0);
    const gguf_tensor *wt = g ? gguf_find_tensor(g, "blk.1.engram_kv.weight") : NULL;
    CHECK(wt != NULL);
    const double u = 0x1p-24, gamma = K * u / (1 - K * u);
    double worst = 0; /* largest |error| / (gamma * sum |e w|) */
    long beyond = 0, checked = 0;
    uint16_t *wrow = malloc(K * 2);
    for (uint32_t o = 0; wt && o < f->N; o++) {
        CHECK_EQ(pread(g->fd, wrow, K * 2, (off_t)(wt->offset + (uint64_t)o * K * 2)), K * 2);
        for (size_t t = 0; t < n; t++) {
            double sum = 0, mag = 0;
            for (int i = 0; i < K; i++) {
                double p = (double)bf16f(rows[t * K + i]) * (double)f16f(wrow[i]);
                sum += p;
                mag += fabs(p);
            }
            double errv = fabs((double)kv[0][t * f->N + o] - sum), lim = gamma * mag;
            if (errv > lim)
                beyond++;
            if (lim > 0 && errv / lim > worst)
                worst = errv / lim;
            checked++;
        }
    }
    printf("W=%u: projection vs double: %ld outputs, worst error %.3g of the bound gamma_K * sum|e w|, "
           "%ld beyond it\n", f->W, checked, worst, beyond);
    CHECK_EQ(beyond, 0);
    CHECK(checked == (long)(n * f->N));
    free(wrow);
    gguf_close(g);
    for (int k = 0; k < 3; k++)
        if (have[k]) {
            free(kv[k]);
            free(xf[k]);
            free(xb[k]);
        }
    free(x0);
    free(rows);
}

/* ------------------------------------------------ batch invariance */

/* A caller's fork-join hook: one pthread per worker beyond the first. */
struct hook_job {
    engram_worker_fn fn;
    void *arg;
    unsigned w;
};
static long hook_calls;

static void *hook_thread(void *p)
{
    struct hook_job *j = p;
    j->fn(j->arg, j->w);
    return NULL;
}

static void hook(void *ctx, unsigned workers, engram_worker_fn fn, void *arg)
{
    (void)ctx;
    hook_calls++;
    pthread_t th[16];
    struct hook_job jobs[16];
    unsigned n = workers < 16 ? workers : 16;
    /* run the workers in reverse order too: the result must not care */
    for (unsigned w = 1; w < n; w++) {
        jobs[w] = (struct hook_job){fn, arg, n - w};
        pthread_create(&th[w], NULL, hook_thread, &jobs[w]);
    }
    fn(arg, 0);
    for (unsigned w = 1; w < n; w++)
        pthread_join(th[w], NULL);
}

static void batch_invariance(struct fixture *f)
{
    /* past one call's limit; under TSan, which checks the threads' and the
     * hook's synchronization (the bits are the other builds' part), 600 */
    const size_t n = TSANITIZED ? 600 : ENGRAM_BATCH_TOKENS + 37;
    uint16_t *rows = model_rows(f, n, 7);
    size_t per = (size_t)f->S * f->W;
    float *x0 = make_resid(n * per, 8), *want = malloc(n * per * 4), *got = malloc(n * per * 4);
    uint8_t *mask = malloc(n);
    uint64_t seed = 9;
    for (size_t t = 0; t < n; t++)
        mask[t] = tu_rand(&seed) % 13 != 0;
    /* Reference: each token alone, one thread, the smallest block. */
    memcpy(want, x0, n * per * 4);
    engram_applier *a1 = applier(f, ENGRAM_SIMD_AUTO, 1, 1);
    engram_error err;
    for (size_t t = 0; t < n; t++)
        CHECK_EQ(engram_apply(a1, rows + t * K, ENGRAM_BF16, want + t * per, ENGRAM_F32, mask + t, 1,
                              &err), 0);
    engram_applier_free(a1);
    const int trials = SANITIZED ? 4 : 16;
    int same = 0;
    for (int trial = 0; trial < trials; trial++) {
        unsigned threads = 1 + (unsigned)(tu_rand(&seed) % 4);
        unsigned tb = trial % 3 == 0 ? 0 : 1 + (unsigned)(tu_rand(&seed) % 300);
        int use_hook = trial % 2;
        engram_apply_opts o = {.threads = threads, .block_tokens = tb,
                               .fork_join = use_hook ? hook : NULL};
        engram_applier *a = NULL;
        CHECK_EQ(engram_applier_new(f->L, &o, &a, &err), 0);
        if (!a)
            continue;
        memcpy(got, x0, n * per * 4);
        /* the sequence cut at random points into calls of 1 .. 2048 tokens */
        size_t at = 0, calls = 0;
        while (at < n) {
            size_t k = 1 + (size_t)(tu_rand(&seed) % (trial % 4 == 3 ? 7 : ENGRAM_BATCH_TOKENS));
            if (k > n - at)
                k = n - at;
            CHECK_EQ(engram_apply(a, rows + at * K, ENGRAM_BF16, got + at * per, ENGRAM_F32,
                                  mask + at, k, &err), 0);
            at += k;
            calls++;
        }
        int ok = memcmp(got, want, n * per * 4) == 0;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "trial %d: %u threads (%s), block %u, %zu calls: outputs differ\n", trial,
                    threads, use_hook ? "hook" : "own", tb, calls);
        same += ok;
        engram_applier_free(a);
    }
    CHECK(hook_calls > 0);
    /* masked tokens: bit for bit untouched */
    int masked_same = 1;
    for (size_t t = 0; t < n; t++)
        if (!mask[t])
            masked_same &= memcmp(want + t * per, x0 + t * per, per * 4) == 0;
    CHECK(masked_same);
    printf("W=%u: batch invariance: %d of %d trials over %zu tokens (random calls of 1..%zu tokens, "
           "1-4 threads, own pool or a caller's hook, blocks of 1..300) equal to token-by-token\n", f->W,
           same, trials, n, n < ENGRAM_BATCH_TOKENS ? n : (size_t)ENGRAM_BATCH_TOKENS);
    free(rows);
    free(x0);
    free(want);
    free(got);
    free(mask);
}

/* ------------------------------------------------ strided = dense */

/* Bytes of a poison that is NaN as BF16 (0xffff) and as F32 (0xffffffff):
 * a strided call that read a byte between tokens would fail with -EDOM or
 * give NaN, and one that wrote there would change it. */
#define POISON 0xff

static int all_poison(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != POISON)
            return 0;
    return 1;
}

/* Token t's values (count of them, dtype d) from dense BF16/F32 sources. */
static void put_values(uint8_t *dst, engram_dtype d, const uint16_t *bf, const float *f32, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (d == ENGRAM_BF16) {
            uint16_t v = bf ? bf[i] : f2bf(f32[i]);
            memcpy(dst + i * 2, &v, 2);
        } else {
            float v = bf ? bf16f(bf[i]) : f32[i];
            memcpy(dst + i * 4, &v, 4);
        }
    }
}

/* engram_apply_strided against engram_apply on the same tokens laid out
 * densely: for n = 1, 3, 130, 300 (blocks of 64 tokens, 2 threads), rows
 * BF16/F32 x residual BF16/F32, no mask and a mask, rows at a decode
 * step's stride (48 rows, table 1's half) and at an odd one, residuals
 * with gaps.  Every residual bit equal, masked tokens untouched, every byte
 * between tokens and past the last one still poison. */
static void strided(struct fixture *f)
{
    /* under TSan (the threads' part: 130 tokens are three blocks of 64 on
     * two threads) the sizes 1 and 300 are the other builds' */
    static const size_t ns_all[] = {1, 3, 130, 300}, ns_tsan[] = {3, 130};
    const size_t *ns = TSANITIZED ? ns_tsan : ns_all;
    const size_t n_ns = TSANITIZED ? 2 : 4;
    const size_t nmax = 300, per = (size_t)f->S * f->W;
    uint16_t *rows = model_rows(f, nmax, 21);
    float *x0 = make_resid(nmax * per, 22);
    uint8_t *mask = malloc(nmax);
    uint64_t seed = 23;
    for (size_t t = 0; t < nmax; t++)
        mask[t] = tu_rand(&seed) % 5 != 0;
    engram_applier *a = applier(f, ENGRAM_SIMD_AUTO, 2, 64);
    engram_error err;
    long calls = 0, equal = 0;
    for (int rd = 0; rd < 2 && a; rd++)
        for (int xd = 0; xd < 2; xd++)
            for (int variant = 0; variant < 2; variant++)
                for (size_t ni = 0; ni < n_ns; ni++)
                    for (int masked = 0; masked < 2; masked++) {
                        engram_dtype rdt = rd ? ENGRAM_F32 : ENGRAM_BF16, xdt = xd ? ENGRAM_F32 : ENGRAM_BF16;
                        size_t re = rd ? 4 : 2, xe = xd ? 4 : 2, n = ns[ni];
                        const uint8_t *m = masked ? mask : NULL;
                        /* variant 0: a step's [n][48][256], table 1's rows
                         * (offset 24 rows); variant 1: 7 elements of gap
                         * after each token, rows from offset 0 */
                        size_t rs = variant ? (K + 7) * re : 2 * K * re, roff = variant ? 0 : K * re;
                        size_t xs = variant ? (per + 3) * xe : 2 * per * xe + 64, xoff = variant ? 0 : 32;
                        size_t rbytes = roff + n * rs + 64, xbytes = xoff + n * xs + 64;
                        uint8_t *rbuf = malloc(rbytes), *xbuf = malloc(xbytes), *xkeep = malloc(xbytes);
                        uint8_t *drows = malloc(n * K * re), *dx = malloc(n * per * xe);
                        memset(rbuf, POISON, rbytes);
                        memset(xbuf, POISON, xbytes);
                        for (size_t t = 0; t < n; t++) {
                            put_values(drows + t * K * re, rdt, rows + t * K, NULL, K);
                            memcpy(rbuf + roff + t * rs, drows + t * K * re, K * re);
                            put_values(dx + t * per * xe, xdt, NULL, x0 + t * per, per);
                            memcpy(xbuf + xoff + t * xs, dx + t * per * xe, per * xe);
                        }
                        memcpy(xkeep, xbuf, xbytes);
                        CHECK_EQ(engram_apply(a, drows, rdt, dx, xdt, m, n, &err), 0);
                        int rc = engram_apply_strided(a, rbuf + roff, rdt, rs, xbuf + xoff, xdt, xs, m, n, &err);
                        CHECK_EQ(rc, 0);
                        if (rc)
                            fprintf(stderr, "strided: %s\n", err.msg);
                        int same = 1, untouched = 1, changed = 0, live = 0;
                        for (size_t t = 0; t < n; t++) {
                            const uint8_t *got = xbuf + xoff + t * xs;
                            same &= memcmp(got, dx + t * per * xe, per * xe) == 0;
                            if (m && !m[t])
                                untouched &= memcmp(got, xkeep + xoff + t * xs, per * xe) == 0;
                            else
                                live++, changed |= memcmp(got, xkeep + xoff + t * xs, per * xe) != 0;
                            /* the gap after each token, residual and rows */
                            untouched &= all_poison(got + per * xe, xs - per * xe);
                            untouched &= all_poison(rbuf + roff + t * rs + K * re, rs - K * re);
                            untouched &= memcmp(rbuf + roff + t * rs, drows + t * K * re, K * re) == 0;
                        }
                        untouched &= all_poison(xbuf, xoff) && all_poison(rbuf, roff);
                        untouched &= all_poison(xbuf + xoff + n * xs, 64) && all_poison(rbuf + roff + n * rs, 64);
                        CHECK(same);
                        CHECK(untouched);
                        CHECK(changed || !live); /* the call did something: unmasked tokens moved */
                        if (!same || !untouched)
                            fprintf(stderr, "strided: rows %s, residual %s, variant %d, n %zu, mask %d: "
                                    "%s\n", rd ? "F32" : "BF16", xd ? "F32" : "BF16", variant, n, masked,
                                    !same ? "differs from dense" : "touched a byte outside its tokens");
                        calls++;
                        equal += same && untouched;
                        free(rbuf);
                        free(xbuf);
                        free(xkeep);
                        free(drows);
                        free(dx);
                    }
    printf("W=%u: strided apply: %ld of %ld calls (n %s, rows and residual BF16/F32, masked or not, "
           "two stride layouts) bit for bit the dense call, poison between and after tokens "
           "untouched\n", f->W, equal, calls, TSANITIZED ? "3/130" : "1/3/130/300");
    CHECK_EQ(calls, (long)(16 * n_ns));

    /* bad strides: -EINVAL naming the argument, nothing written, whatever n */
    size_t n = 3, rs = K * 2, xs = per * 4;
    float *x = malloc(n * per * 4);
    memcpy(x, x0, n * per * 4);
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs - 2, x, ENGRAM_F32, xs, NULL, n, &err), err,
              -EINVAL, "rows_stride 12286 is less than a token's 12288 bytes");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_F32, rs, x, ENGRAM_F32, xs, NULL, 0, &err), err,
              -EINVAL, "rows_stride 12288 is less than a token's 24576 bytes");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs + 1, x, ENGRAM_F32, xs, NULL, n, &err), err,
              -EINVAL, "rows_stride 12289 is not a multiple of the element size (2 bytes)");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs, x, ENGRAM_F32, xs - 4, NULL, n, &err), err,
              -EINVAL, "resid_stride");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs, x, ENGRAM_F32, xs + 2, NULL, n, &err), err,
              -EINVAL, "resid_stride");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs, x, ENGRAM_BF16, xs / 2 - 2, NULL, 1, &err), err,
              -EINVAL, "resid_stride");
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, SIZE_MAX / 2 & ~(size_t)3, x, ENGRAM_F32, xs, NULL, n, &err),
              err, -EINVAL, "rows_stride");
    CHECK(strstr(err.msg, "address space") != NULL);
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, rs, x, ENGRAM_F32, SIZE_MAX / 2 & ~(size_t)3, NULL, n, &err),
              err, -EINVAL, "resid_stride");
    CHECK(strstr(err.msg, "address space") != NULL);
    /* a stride whose product fits a size_t but runs past the top of memory
     * from where the rows are */
    size_t wrap = ((UINTPTR_MAX - (uintptr_t)rows) / 2 + K) & ~(size_t)1;
    CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, wrap, x, ENGRAM_F32, xs, NULL, n, &err), err,
              -EINVAL, "rows_stride");
    CHECK(strstr(err.msg, "end of the address space") != NULL);
    CHECK(memcmp(x, x0, n * per * 4) == 0);
    /* the argument checks engram_apply had come first */
    CHECK_ERR(engram_apply_strided(NULL, rows, ENGRAM_BF16, rs, x, ENGRAM_F32, xs, NULL, n, &err), err,
              -EINVAL, "NULL");
    CHECK_ERR(engram_apply_strided(a, rows, (engram_dtype)9, rs, x, ENGRAM_F32, xs, NULL, n, &err), err,
              -EINVAL, "type");
    free(x);
    engram_applier_free(a);
    free(rows);
    free(x0);
    free(mask);
}

/* ------------------------------------------------ the gate's edge: d = +0 */

static void zero_stream(struct fixture *f)
{
    uint16_t *rows = model_rows(f, 1, 11);
    size_t per = (size_t)f->S * f->W;
    float *x = make_resid(per, 12), *kv = malloc(f->N * 4);
    for (uint32_t i = 0; i < f->W; i++) { /* stream 1 all +0, stream 2 all -0 */
        x[f->W + i] = 0.0f;
        x[2 * f->W + i] = -0.0f;
    }
    engram_applier *a = applier(f, ENGRAM_SIMD_AUTO, 1, 0);
    engram_error err;
    CHECK_EQ(engram_project(a, rows, ENGRAM_BF16, 1, kv, &err), 0);
    CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, 1, &err), 0);
    /* x = 0: D = Sxx = 0, d = +0, g = sigmoid(0.001) (computed here in double) */
    double g = 1.0 / (1.0 + exp(-0.001));
    long off = 0;
    for (int s = 1; s <= 2; s++)
        for (uint32_t i = 0; i < f->W; i++) {
            float v = bf16f(f2bf(kv[f->S * f->W + i]));
            double want = g * v, got = x[s * f->W + i];
            double step = ldexp(1.0, ilogb(want == 0 ? 1e-30 : want) - 7);
            off += fabs(got - want) > step;
        }
    CHECK_EQ(off, 0);
    free(rows);
    free(x);
    free(kv);
    engram_applier_free(a);
}

/* ------------------------------------------------ bad input */

static void errors(struct fixture *f)
{
    const size_t n = 10;
    uint16_t *rows = model_rows(f, n, 13);
    size_t per = (size_t)f->S * f->W;
    float *x0 = make_resid(n * per, 14), *x = malloc(n * per * 4);
    engram_applier *a = applier(f, ENGRAM_SIMD_AUTO, 2, 4);
    engram_error err;
#define UNCHANGED() CHECK(memcmp(x, x0, n * per * 4) == 0)
    memcpy(x, x0, n * per * 4);
    CHECK_ERR(engram_apply(a, NULL, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_apply(a, rows, (engram_dtype)7, x, ENGRAM_F32, NULL, n, &err), err, -EINVAL, "type");
    CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, 0, &err), 0);
    UNCHANGED();
    /* NaN / infinity in the residual of an unmasked token: nothing written */
    x[7 * per + 2 * f->W + 5] = NAN;
    CHECK_ERR(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err), err, -EDOM,
              "token 7 stream 2 index 5");
    x[7 * per + 2 * f->W + 5] = x0[7 * per + 2 * f->W + 5];
    UNCHANGED();
    x[3 * per] = -INFINITY;
    CHECK_ERR(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err), err, -EDOM,
              "token 3 stream 0 index 0: the residual is infinite");
    x[3 * per] = x0[3 * per];
    UNCHANGED();
    /* ... but a masked token is not looked at */
    uint8_t mask[10];
    memset(mask, 1, sizeof mask);
    mask[4] = 0;
    x[4 * per + 1] = NAN;
    CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, mask, n, &err), 0);
    CHECK(isnan(x[4 * per + 1]));
    memcpy(x, x0, n * per * 4);
    /* non-finite rows: nothing written */
    uint16_t keep = rows[6 * K + 300];
    rows[6 * K + 300] = 0x7fc0; /* NaN */
    CHECK_ERR(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err), err, -EDOM,
              "token 6: row 1 value 44 is NaN");
    UNCHANGED();
    float *kv = malloc(n * f->N * 4);
    memset(kv, 0x55, n * f->N * 4);
    CHECK_ERR(engram_project(a, rows, ENGRAM_BF16, n, kv, &err), err, -EDOM, "token 6");
    CHECK(((uint8_t *)kv)[0] == 0x55 && ((uint8_t *)kv)[n * f->N * 4 - 1] == 0x55);
    /* projection's own argument checks: nothing written */
    CHECK_ERR(engram_project(NULL, rows, ENGRAM_BF16, n, kv, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_project(a, NULL, ENGRAM_BF16, n, kv, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_project(a, rows, ENGRAM_BF16, n, NULL, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_project(a, rows, (engram_dtype)7, n, kv, &err), err, -EINVAL, "type");
    CHECK(((uint8_t *)kv)[0] == 0x55 && ((uint8_t *)kv)[n * f->N * 4 - 1] == 0x55);
    rows[6 * K + 300] = keep;
    /* Overflow in the computation (rows of ~1e36 make kv infinite): -EDOM
     * naming the token; earlier tokens updated exactly, it and later ones
     * untouched.  Token 5 of 10, blocks of 4 tokens, 2 threads. */
    float *big = malloc(n * K * 4);
    for (size_t i = 0; i < n * K; i++)
        big[i] = bf16f(rows[i]);
    for (int i = 0; i < K; i++)
        big[5 * K + i] = 1e36f;
    float *want = malloc(n * per * 4);
    memcpy(want, x0, n * per * 4);
    engram_applier *a1 = applier(f, ENGRAM_SIMD_AUTO, 1, 0);
    CHECK_EQ(engram_apply(a1, big, ENGRAM_F32, want, ENGRAM_F32, NULL, 5, &err), 0);
    CHECK_ERR(engram_apply(a, big, ENGRAM_F32, x, ENGRAM_F32, NULL, n, &err), err, -EDOM,
              "token 5: the projection or gate is not finite");
    CHECK(memcmp(x, want, 5 * per * 4) == 0);
    CHECK(memcmp(x + 5 * per, x0 + 5 * per, 5 * per * 4) == 0);
    free(big);
    free(want);
    free(kv);
    engram_applier_free(a1);
    /* options */
    engram_apply_opts o = {.threads = ENGRAM_APPLY_MAX_THREADS + 1};
    engram_applier *bad = (engram_applier *)0x1;
    CHECK_ERR(engram_applier_new(f->L, &o, &bad, &err), err, -EINVAL, "threads");
    CHECK(bad == (engram_applier *)0x1);
    CHECK_ERR(engram_applier_new(NULL, NULL, &bad, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_applier_new(f->L, NULL, NULL, &err), err, -EINVAL, "NULL");
    o = (engram_apply_opts){.block_tokens = 65537};
    CHECK_ERR(engram_applier_new(f->L, &o, &bad, &err), err, -EINVAL, "block of 65537 tokens");
    CHECK(bad == (engram_applier *)0x1);
    engram_layer *L = (engram_layer *)0x1;
    CHECK_ERR(engram_layer_open(f->m, 2, &L, &err), err, -EINVAL, "table 2");
    CHECK_ERR(engram_layer_open(NULL, 0, &L, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_layer_open(f->m, 0, NULL, &err), err, -EINVAL, "NULL");
    CHECK(L == (engram_layer *)0x1);
    engram_applier_free(NULL);
    engram_layer_close(NULL);
#undef UNCHANGED
    engram_applier_free(a);
    free(rows);
    free(x0);
    free(x);
}

/* A model without projection weights opens and reads; the layer says what
 * is missing.  Weights holding NaN or infinity are refused, naming them. */
static void weights(void)
{
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 2000), 0);
    char path[512];
    CHECK_EQ(tu_build("noweights.gguf", &l, ENGRAM_FILL_NORMAL, 0, path, sizeof path), 0);
    engram_model *m = NULL;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    engram_layer *L = (engram_layer *)0x1;
    CHECK_ERR(engram_layer_open(m, 1, &L, &err), err, -ENOENT, "blk.14.engram_kv.weight");
    CHECK(L == (engram_layer *)0x1);
    engram_model_close(m);
    /* poison one weight, then one norm */
    CHECK_EQ(tu_build("poison.gguf", &l, ENGRAM_FILL_NORMAL, 16, path, sizeof path), 0);
    gguf_file *g = NULL;
    CHECK_EQ(gguf_open(path, &g, NULL), 0);
    const gguf_tensor *kv = gguf_find_tensor(g, "blk.14.engram_kv.weight");
    const gguf_tensor *kn = gguf_find_tensor(g, "blk.1.engram_k_norm.weight");
    uint64_t kv_off = kv->offset, kn_off = kn->offset;
    gguf_close(g);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint16_t nan16 = 0x7e00;
    CHECK_EQ(pwrite(fd, &nan16, 2, (off_t)(kv_off + (3 * K + 17) * 2)), 2);
    float inf = INFINITY;
    CHECK_EQ(pwrite(fd, &inf, 4, (off_t)(kn_off + (2 * 16 + 9) * 4)), 4);
    close(fd);
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    CHECK_ERR(engram_layer_open(m, 1, &L, &err), err, -EBADMSG, "'blk.14.engram_kv.weight': element [3][17]");
    CHECK_ERR(engram_layer_open(m, 0, &L, &err), err, -EBADMSG,
              "'blk.1.engram_k_norm.weight': element [2][9]");
    CHECK(L == (engram_layer *)0x1);
    engram_model_close(m);
}

/* ------------------------------------------------ memory */

static void memory(struct fixture *f)
{
    const size_t n = 300;
    uint16_t *rows = model_rows(f, n, 15);
    size_t per = (size_t)f->S * f->W;
    float *x = make_resid(n * per, 16);
    uint16_t *xb = malloc(n * per * 2);
    for (size_t i = 0; i < n * per; i++)
        xb[i] = f2bf(x[i]);
    float *kv = malloc(n * f->N * 4);
    for (unsigned threads = 1; threads <= 3; threads += 2) {
        engram_applier *a = applier(f, ENGRAM_SIMD_AUTO, threads, 0);
        if (!a)
            continue;
        uint64_t bytes = engram_applier_bytes(a);
        CHECK(bytes <= ENGRAM_APPLY_WORKSPACE(f->W, f->S, ENGRAM_APPLY_BLOCK));
        CHECK(bytes >= (uint64_t)ENGRAM_APPLY_BLOCK * (f->N + K) * 4);
        engram_error err;
#if !SANITIZED
        alloc_counted = 0;
        alloc_counting = 1;
#endif
        CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err), 0);
        CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, xb, ENGRAM_BF16, NULL, n, &err), 0);
        CHECK_EQ(engram_project(a, rows, ENGRAM_BF16, n, kv, &err), 0);
#if !SANITIZED
        alloc_counting = 0;
        printf("W=%u: %u thread(s): applier holds %llu bytes (bound %llu); allocations during "
               "three calls of %zu tokens: %ld\n", f->W, threads, (unsigned long long)bytes,
               (unsigned long long)ENGRAM_APPLY_WORKSPACE(f->W, f->S, ENGRAM_APPLY_BLOCK), n, alloc_counted);
        CHECK_EQ(alloc_counted, 0);
#endif
        engram_applier_free(a);
    }
    free(rows);
    free(x);
    free(xb);
    free(kv);
}

/* ------------------------------------------------ default threads */

/* An applier made with threads 0 (or no options) has one worker per CPU
 * this process may run on, the caller included: it starts that many
 * threads less one, counted in /proc/self/task against the affinity mask
 * counted here; pinned to one CPU it starts none, to two CPUs one.  Its
 * results are a one-thread applier's bits. */
static void default_threads(struct fixture *f)
{
    cpu_set_t all;
    CPU_ZERO(&all);
    CHECK_EQ(sched_getaffinity(0, sizeof all, &all), 0);
    long cpus = CPU_COUNT(&all);
    if (cpus > (long)ENGRAM_APPLY_MAX_THREADS)
        cpus = ENGRAM_APPLY_MAX_THREADS; /* the default's cap */
    long base = tu_task_count();
    CHECK(cpus >= 1 && base >= 1);
    const size_t n = 7;
    uint16_t *rows = model_rows(f, n, 21);
    size_t nx = n * f->S * f->W;
    float *x0 = make_resid(nx, 22), *x1 = malloc(nx * 4), *xd = malloc(nx * 4);
    engram_error err;
    engram_applier *one = applier(f, ENGRAM_SIMD_AUTO, 1, 0);
    memcpy(x1, x0, nx * 4);
    CHECK_EQ(engram_apply(one, rows, ENGRAM_BF16, x1, ENGRAM_F32, NULL, n, &err), 0);
    engram_applier_free(one);
    /* the CPU sets to try: every CPU, the first one alone, the first two */
    cpu_set_t sets[3];
    long counts[3] = {cpus, 1, cpus >= 2 ? 2 : 0};
    sets[0] = all;
    CPU_ZERO(&sets[1]);
    CPU_ZERO(&sets[2]);
    for (int c = 0, got = 0; c < CPU_SETSIZE && got < 2; c++)
        if (CPU_ISSET(c, &all)) {
            if (got == 0)
                CPU_SET(c, &sets[1]);
            CPU_SET(c, &sets[2]);
            got++;
        }
    for (int k = 0; k < 3; k++) {
        if (counts[k] == 0)
            continue;
        CHECK_EQ(sched_setaffinity(0, sizeof sets[k], &sets[k]), 0);
        CHECK_EQ(engram_default_threads(), (unsigned)counts[k]);
        for (int with_opts = 0; with_opts < 2; with_opts++) {
            engram_apply_opts o = {.threads = 0};
            engram_applier *a = NULL;
            CHECK_EQ(engram_applier_new(f->L, with_opts ? &o : NULL, &a, &err), 0);
            if (!a)
                continue;
            long started = tu_task_count() - base;
            CHECK_EQ(started, counts[k] - 1);
            memcpy(xd, x0, nx * 4);
            CHECK_EQ(engram_apply(a, rows, ENGRAM_BF16, xd, ENGRAM_F32, NULL, n, &err), 0);
            CHECK(memcmp(xd, x1, nx * 4) == 0);
            engram_applier_free(a);
            CHECK_EQ(tu_task_count_settled(base), base);
            if (with_opts)
                printf("W=%u: %ld CPU(s) in the affinity mask: threads 0 and no options each start "
                       "%ld thread(s) beside the caller; the results are 1 thread's bits\n",
                       f->W, counts[k], started);
        }
    }
    CHECK_EQ(sched_setaffinity(0, sizeof all, &all), 0);
    free(rows);
    free(x0);
    free(x1);
    free(xd);
}

int main(void)
{
    struct fixture f;
    if (fixture_open(&f, "apply64.gguf", 64) == 0) {
        if (!TSANITIZED)
            kernels_agree(&f);
        batch_invariance(&f);
        strided(&f);
        if (!TSANITIZED)
            zero_stream(&f);
        errors(&f);
        memory(&f);
        default_threads(&f);
        fixture_close(&f);
    } else {
        CHECK(0);
    }
    /* What follows runs on the caller's thread alone (the kernels against
     * each other and the bound, the gate's edge, weights refused): under
     * TSan it is the other builds' part (testutil.h), and so are the
     * kernels_agree and zero_stream above. */
    if (!TSANITIZED) {
        /* a width that leaves the last weight panel partial (N = 1000) */
        if (fixture_open(&f, "apply200.gguf", 200) == 0) {
            kernels_agree(&f);
            if (!SANITIZED)
                batch_invariance(&f);
            zero_stream(&f);
            fixture_close(&f);
        } else {
            CHECK(0);
        }
        /* N = 150: the last panel has 22 outputs, not a multiple of the
         * kernels' 8- and 16-wide vectors */
        if (fixture_open(&f, "apply30.gguf", 30) == 0) {
            kernels_agree(&f);
            zero_stream(&f);
            fixture_close(&f);
        } else {
            CHECK(0);
        }
        weights();
    }
    tu_cleanup();
    return tu_finish("test_apply");
}
