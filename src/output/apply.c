/*
 * apply.c - Engram's output stage (SPEC.md section 8) for n tokens: check
 * the inputs, then per block of tokens project (the GEMM, or a GEMV for one
 * token), gate and update.  Work is split over workers by outputs (the
 * projection) and by tokens (the gate), never inside one sum, so a token's
 * result is the same bits whatever the number of tokens, their blocking and
 * the number of workers.
 *
 * A block runs in phases, each a fork-join over the workers: convert the
 * rows to F32 (BF16 rows only), project, gate-and-check, then write the
 * tokens before the first one that failed the check (all of them when none
 * did).  Checking before writing is what keeps the promise that a failing
 * token and everything after it are left untouched.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "applier.h"
#include "kernels.h"
#include "ple_apply.h"
#include "team.h"
#include "common/util.h"

enum phase { PH_CONVERT, PH_PROJECT, PH_GATE, PH_WRITE };

struct ple_applier;
struct engram_applier {
    const struct engram_layer *L;
    struct ple_applier *ple;   /* a PLE layer's (then nothing below is used) */
    const struct apply_kernels *k;
    unsigned threads, tb;
    engram_fork_join fj;
    void *fj_ctx;
    struct team *team;
    uint64_t bytes;

    /* workspace, allocated once */
    float *e32;            /* [tb][K] rows as F32 (BF16 input)          */
    float *kv;             /* [tb][N]                                   */
    float *g;              /* [tb][S]                                   */
    const float **e;       /* [tb] each token's F32 rows                */
    size_t *tok;           /* [tb] the block's tokens (call indices)    */
    uint8_t *ok;           /* [tb] gate check passed                    */

    /* the block in progress, read by the workers */
    enum phase phase;
    unsigned nt, workers, n_write;
    const void *rows;
    engram_dtype rows_dtype;
    size_t rows_stride;    /* bytes from one token's rows to the next's   */
    uint8_t *res;
    engram_dtype res_dtype;
    size_t res_stride;     /* bytes from one token's residual to the next's */
    float *kv_out;
    size_t kv_ld;
};

/* ------------------------------------------------------------ workers */

static size_t esize(engram_dtype d)
{
    return d == ENGRAM_F32 ? 4 : 2;
}

static void *resid_at(const engram_applier *a, size_t t, unsigned s)
{
    return a->res + t * a->res_stride + (size_t)s * a->L->W * esize(a->res_dtype);
}

/* Token t's 24 rows (K values of the call's rows type). */
static const void *rows_at(const void *rows, size_t stride, size_t t)
{
    return (const uint8_t *)rows + t * stride;
}

/* [lo, hi) of n items for worker w of nw. */
static void share(unsigned n, unsigned w, unsigned nw, unsigned *lo, unsigned *hi)
{
    *lo = (unsigned)((uint64_t)n * w / nw);
    *hi = (unsigned)((uint64_t)n * (w + 1) / nw);
}

static void gate_token(engram_applier *a, unsigned j)
{
    const struct engram_layer *L = a->L;
    const float *kv = a->kv + (size_t)j * L->N;
    int ok = 1;
    for (unsigned s = 0; s < L->S && ok; s++) {
        const void *x = resid_at(a, a->tok[j], s);
        int xb = a->res_dtype == ENGRAM_BF16;
        float r[3];
        a->k->reduce(x, xb, kv + (size_t)s * L->W, L->wq + (size_t)s * L->W, L->W, r);
        float g = gate_value(r[0], r[1], r[2], L->W);
        a->g[(size_t)j * L->S + s] = g;
        ok = isfinite(r[0]) && isfinite(r[1]) && isfinite(r[2]) && isfinite(g) &&
             a->k->update(x, xb, kv + (size_t)L->S * L->W, g, L->W, NULL, 0);
    }
    a->ok[j] = (uint8_t)ok;
}

static void work(void *arg, unsigned w)
{
    engram_applier *a = arg;
    const struct engram_layer *L = a->L;
    unsigned lo, hi;
    switch (a->phase) {
    case PH_CONVERT:
        share(a->nt, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++) {
            const uint16_t *src = rows_at(a->rows, a->rows_stride, a->tok[j]);
            float *dst = a->e32 + (size_t)j * ENGRAM_K;
            for (unsigned i = 0; i < ENGRAM_K; i++)
                dst[i] = bf16_to_f32(src[i]);
        }
        break;
    case PH_PROJECT:
        share(L->panels, w, a->workers, &lo, &hi);
        if (lo < hi)
            a->k->project(L, a->e, a->nt, a->kv_out, a->kv_ld, lo, hi);
        break;
    case PH_GATE:
        share(a->nt, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++)
            gate_token(a, j);
        break;
    case PH_WRITE:
        share(a->n_write, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++)
            for (unsigned s = 0; s < L->S; s++) {
                void *x = resid_at(a, a->tok[j], s);
                int xb = a->res_dtype == ENGRAM_BF16;
                a->k->update(x, xb, a->kv + (size_t)j * L->N + (size_t)L->S * L->W,
                             a->g[(size_t)j * L->S + s], L->W, x, xb);
            }
        break;
    }
}

/* Runs a phase over up to `items` workers. */
static void run_phase(engram_applier *a, enum phase ph, unsigned items)
{
    unsigned nw = a->threads < items ? a->threads : items;
    if (nw == 0)
        return;
    a->phase = ph;
    a->workers = nw;
    if (nw == 1)
        work(a, 0);
    else if (a->fj)
        a->fj(a->fj_ctx, nw, work, a);
    else
        team_run(a->team, nw, work, a);
}

/* ------------------------------------------------------------ set-up */

void engram_applier_free(engram_applier *a)
{
    if (!a)
        return;
    ple_applier_free(a->ple);
    team_free(a->team);
    free(a->e32);
    free(a->kv);
    free(a->g);
    free(a->e);
    free(a->tok);
    free(a->ok);
    free(a);
}

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

int engram_applier_new(const engram_layer *L, const engram_apply_opts *opts, engram_applier **out,
                       engram_error *err)
{
    if (!L || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_apply_opts o = {0};
    if (opts)
        o = *opts;
    unsigned threads = o.threads ? o.threads : engram_default_threads();
    unsigned tb = o.block_tokens ? o.block_tokens : ENGRAM_APPLY_BLOCK;
    if (threads > ENGRAM_APPLY_MAX_THREADS)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%u threads: at most %u", threads,
                       ENGRAM_APPLY_MAX_THREADS);
    if (tb > 65536)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "block of %u tokens: at most 65536", tb);
    if (L->ple) {
        struct ple_apply_opts po = {threads, o.simd, tb, o.fork_join, o.fork_join_ctx};
        engram_applier *a = calloc(1, sizeof *a);
        if (!a)
            return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        int rc = ple_applier_new(L->ple, &po, &a->ple, err);
        if (rc < 0) {
            free(a);
            return rc;
        }
        a->L = L;
        a->threads = threads;
        a->tb = tb;
        a->bytes = sizeof *a + ple_applier_bytes(a->ple);
        *out = a;
        return 0;
    }
    const struct apply_kernels *k = apply_kernels_for(o.simd);
    if (!k)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "kernels '%s' are not supported here",
                       engram_simd_name(o.simd));
    engram_applier *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    a->L = L;
    a->k = k;
    a->threads = threads;
    a->tb = tb;
    a->fj = o.fork_join;
    a->fj_ctx = o.fork_join_ctx;
    a->e32 = alloc64((size_t)tb * ENGRAM_K * sizeof(float));
    a->kv = alloc64((size_t)tb * L->N * sizeof(float));
    a->g = malloc((size_t)tb * L->S * sizeof(float));
    a->e = malloc(tb * sizeof *a->e);
    a->tok = malloc(tb * sizeof *a->tok);
    a->ok = malloc(tb);
    if (!a->e32 || !a->kv || !a->g || !a->e || !a->tok || !a->ok) {
        engram_applier_free(a);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for the workspace");
    }
    if (threads > 1 && !a->fj) {
        int rc = team_new(threads, &a->team);
        if (rc < 0) {
            engram_applier_free(a);
            return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start %u threads: %s", threads - 1,
                           engram_strerror(rc));
        }
    }
    a->bytes = sizeof *a + (uint64_t)tb * (ENGRAM_K * sizeof(float) + (uint64_t)L->N * sizeof(float) +
                                           (uint64_t)L->S * sizeof(float) + sizeof *a->e +
                                           sizeof *a->tok + 1);
    *out = a;
    return 0;
}

uint64_t engram_applier_bytes(const engram_applier *a)
{
    return a ? a->bytes : 0;
}

const engram_layer *applier_layer(const engram_applier *a)
{
    return a->L;
}

/* ------------------------------------------------------------ the calls */

static int bad_args(engram_applier *a, const void *rows, engram_dtype rd, const void *res,
                    engram_dtype xd, size_t n, engram_error *err)
{
    if (!a || (n > 0 && (!rows || !res)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (a->ple)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "a PLE layer carries a convolution state per sequence: engram_apply_seq "
                       "applies it");
    if ((rd != ENGRAM_BF16 && rd != ENGRAM_F32) || (xd != ENGRAM_BF16 && xd != ENGRAM_F32))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "unknown element type");
    return 0;
}

/* A stride of n tokens of `need` bytes from base: no token overlaps the
 * next, every element lies at a multiple of its size from base (the
 * kernels read rows and residual in place as arrays of that type), and the
 * last token ends inside the address space, so no offset computed from it
 * wraps. */
static int bad_stride(const void *base, size_t stride, size_t need, size_t elem, size_t n,
                      const char *name, engram_error *err)
{
    if (stride < need)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "%s %zu is less than a token's %zu bytes", name, stride, need);
    if (stride % elem)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "%s %zu is not a multiple of the element size (%zu bytes)", name, stride, elem);
    if (n > 1 && n - 1 > (SIZE_MAX - need) / stride)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "%s %zu: %zu tokens would span more than the address space", name, stride, n);
    if (n > 0 && (uintptr_t)base > UINTPTR_MAX - ((n - 1) * stride + need))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "%s %zu: %zu tokens from %p would run past the end of the address space",
                       name, stride, n, base);
    return 0;
}

/* Rows of token t: every value finite (decoded rows always are). */
static int check_rows(const void *rows, engram_dtype rd, size_t stride, size_t t, engram_error *err)
{
    const void *r = rows_at(rows, stride, t);
    for (unsigned i = 0; i < ENGRAM_K; i++) {
        float v = rd == ENGRAM_F32 ? ((const float *)r)[i] : bf16_to_f32(((const uint16_t *)r)[i]);
        if (!isfinite(v))
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                           "token %zu: row %u value %u is %s (rows must be finite)", t,
                           i / ENGRAM_ROW_VALUES, i % ENGRAM_ROW_VALUES, isnan(v) ? "NaN" : "infinite");
    }
    return 0;
}

static int check_resid(const engram_applier *a, size_t t, engram_error *err)
{
    const struct engram_layer *L = a->L;
    for (unsigned s = 0; s < L->S; s++) {
        const void *x = resid_at(a, t, s);
        for (uint32_t i = 0; i < L->W; i++) {
            float v = a->res_dtype == ENGRAM_F32 ? ((const float *)x)[i]
                                                 : bf16_to_f32(((const uint16_t *)x)[i]);
            if (!isfinite(v))
                return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                               "token %zu stream %u index %u: the residual is %s", t, s, i,
                               isnan(v) ? "NaN" : "infinite");
        }
    }
    return 0;
}

/* Sets up the block of tokens tok[0..nt) for the projection: F32 rows are
 * read in place, BF16 rows converted (gathered from their strides) into
 * the block's F32 panel. */
static void block_rows(engram_applier *a)
{
    if (a->rows_dtype == ENGRAM_F32) {
        for (unsigned j = 0; j < a->nt; j++)
            a->e[j] = rows_at(a->rows, a->rows_stride, a->tok[j]);
        return;
    }
    for (unsigned j = 0; j < a->nt; j++)
        a->e[j] = a->e32 + (size_t)j * ENGRAM_K;
    run_phase(a, PH_CONVERT, a->nt);
}

int engram_apply_strided(engram_applier *a, const void *rows, engram_dtype rows_dtype,
                         size_t rows_stride, void *residual, engram_dtype resid_dtype,
                         size_t resid_stride, const uint8_t *mask, size_t n, engram_error *err)
{
    int rc = bad_args(a, rows, rows_dtype, residual, resid_dtype, n, err);
    if (rc < 0)
        return rc;
    const struct engram_layer *L = a->L;
    size_t re = esize(rows_dtype), xe = esize(resid_dtype);
    if ((rc = bad_stride(rows, rows_stride, ENGRAM_K * re, re, n, "rows_stride", err)) < 0 ||
        (rc = bad_stride(residual, resid_stride, (size_t)L->S * L->W * xe, xe, n, "resid_stride",
                         err)) < 0)
        return rc;
    a->rows = rows;
    a->rows_dtype = rows_dtype;
    a->rows_stride = rows_stride;
    a->res = residual;
    a->res_dtype = resid_dtype;
    a->res_stride = resid_stride;
    for (size_t t = 0; t < n; t++) {
        if (mask && !mask[t])
            continue;
        if ((rc = check_rows(rows, rows_dtype, rows_stride, t, err)) < 0 ||
            (rc = check_resid(a, t, err)) < 0)
            return rc;
    }
    size_t t = 0;
    while (t < n) {
        a->nt = 0;
        for (; t < n && a->nt < a->tb; t++)
            if (!mask || mask[t])
                a->tok[a->nt++] = t;
        if (a->nt == 0)
            break;
        block_rows(a);
        a->kv_out = a->kv;
        a->kv_ld = L->N;
        run_phase(a, PH_PROJECT, L->panels);
        run_phase(a, PH_GATE, a->nt);
        unsigned bad = 0;
        while (bad < a->nt && a->ok[bad])
            bad++;
        a->n_write = bad;
        run_phase(a, PH_WRITE, bad);
        if (bad < a->nt)
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                           "token %zu: the projection or gate is not finite (F32 overflow); "
                           "tokens before it were updated, it and later ones were not",
                           a->tok[bad]);
    }
    return 0;
}

int engram_apply(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                 engram_dtype resid_dtype, const uint8_t *mask, size_t n, engram_error *err)
{
    /* the dense layout; strides of 0 for a NULL applier, which
     * engram_apply_strided refuses before it looks at them */
    size_t rs = ENGRAM_K * esize(rows_dtype);
    size_t xs = a ? (size_t)a->L->S * a->L->W * esize(resid_dtype) : 0;
    return engram_apply_strided(a, rows, rows_dtype, rs, residual, resid_dtype, xs, mask, n, err);
}

int engram_project(engram_applier *a, const void *rows, engram_dtype rows_dtype, size_t n,
                   float *kv, engram_error *err)
{
    int rc = bad_args(a, rows, rows_dtype, kv, ENGRAM_F32, n, err);
    if (rc < 0)
        return rc;
    size_t rs = ENGRAM_K * esize(rows_dtype);
    for (size_t t = 0; t < n; t++)
        if ((rc = check_rows(rows, rows_dtype, rs, t, err)) < 0)
            return rc;
    a->rows = rows;
    a->rows_dtype = rows_dtype;
    a->rows_stride = rs;
    const struct engram_layer *L = a->L;
    for (size_t t = 0; t < n;) {
        a->nt = 0;
        size_t first = t;
        for (; t < n && a->nt < a->tb; t++)
            a->tok[a->nt++] = t;
        block_rows(a);
        a->kv_out = kv + first * L->N;
        a->kv_ld = L->N;
        run_phase(a, PH_PROJECT, L->panels);
    }
    return 0;
}

int engram_apply_seq(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                     engram_dtype resid_dtype, const uint8_t *mask, size_t n, float *state,
                     engram_error *err)
{
    if (!a)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (!a->ple) /* V4.1: no state beyond the residual */
        return engram_apply(a, rows, rows_dtype, residual, resid_dtype, mask, n, err);
    if (rows_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "rows of type %d: a PLE layer takes its rows as BF16 (as stored)",
                       (int)rows_dtype);
    return ple_apply(a->ple, rows, residual, resid_dtype, mask, n, state, err);
}

int engram_apply_seqs(engram_applier *a, size_t n, const void *const *rows, engram_dtype rows_dtype,
                      void *const *residuals, engram_dtype resid_dtype, const uint8_t *mask,
                      float *const *states, engram_error *err)
{
    if (!a || (n > 0 && (!rows || !residuals)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (!a->ple) { /* V4.1: no state; one call per token */
        for (size_t i = 0; i < n; i++) {
            int rc = engram_apply(a, rows[i], rows_dtype, residuals[i], resid_dtype, mask ? mask + i : NULL,
                                  1, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (rows_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "rows of type %d: a PLE layer takes its rows as BF16 (as stored)", (int)rows_dtype);
    return ple_apply_many(a->ple, n, (const uint16_t *const *)rows, residuals, resid_dtype, mask, states,
                          err);
}

int applier_seqs_done(engram_applier *a, size_t n, const void *const *rows, void *const *residuals,
                      engram_dtype resid_dtype, const uint8_t *mask, float *const *states, size_t *done,
                      engram_error *err)
{
    *done = 0;
    if (!a || !a->ple)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "not a PLE applier");
    return ple_apply_many_done(a->ple, n, (const uint16_t *const *)rows, residuals, resid_dtype, mask,
                               states, done, err);
}

int applier_seqs_check(engram_applier *a, size_t n, const void *const *rows, void *const *residuals,
                       engram_dtype resid_dtype, const uint8_t *mask, float *const *states, size_t *bad,
                       engram_error *err)
{
    *bad = 0;
    if (!a || !a->ple)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "not a PLE applier");
    return ple_check_many(a->ple, n, (const uint16_t *const *)rows, residuals, resid_dtype, mask, states,
                          bad, err);
}
