/*
 * ple_apply.c - the PLE output stage (ple_apply.h) for n positions of one
 * sequence: check the inputs, then per block of positions project the
 * unmasked tokens' rows (the GEMM, or a GEMV for one token), gate and
 * normalize each token into its frame, convolve each position's frames,
 * and write.  Work is split over workers by outputs (the projection) and
 * by positions (the rest), never inside one sum, so a token's result is
 * the same bits whatever the number of tokens, their blocking and the
 * number of workers.
 *
 * The frames live in a window of F + B frames: the F frames before the
 * block (the state, at the call's start), then the block's own.  The
 * convolution of the block's position j reads window frames F + j - 3 (T -
 * 1 - k), all written before the convolution phase starts, so positions
 * convolve independently.  Outputs are computed into the workspace and
 * checked before any is written: that is what keeps the promise that a
 * failing token, the tokens after it and the state past it are left as
 * they were.
 *
 * ple_apply_many takes one position of each of n sequences instead (a
 * batched decode): the projection and gate are the same per token; a
 * position's taps d > 0 frames back read its own sequence's state
 * (state[i] + (F - d) C), its tap d = 0 its new frame in the window (whose
 * first F frames are then unused); each written sequence's state then
 * moves one frame.  So a sequence's result is the bits ple_apply gives it
 * alone.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ple_kernels.h"
#include "kernels.h"
#include "team.h"
#include "common/util.h"

enum phase { PH_CONVERT, PH_PROJECT, PH_GATE, PH_CONV, PH_WRITE };

struct ple_applier {
    const struct ple_layer *L;
    const struct ple_kernels *k;
    unsigned threads, tb;
    struct team *team;
    engram_fork_join fj;   /* the caller's pool, if any (then no team) */
    void *fj_ctx;
    uint64_t bytes;

    /* workspace, allocated once */
    float *e32;            /* [tb][K] the unmasked tokens' rows as F32      */
    float *kv;             /* [tb][N] their projections                     */
    float *out;            /* [tb][C] outputs by position                   */
    float *win;            /* [F + tb][C] frames                            */
    float *scratch;        /* [threads][2C] per worker                      */
    float *wbuf;           /* [threads][PLE_WBUF] per worker                */
    float *alpha;          /* [tb][4] by position                           */
    const float **e;       /* [tb] the unmasked tokens' rows                */
    int *slot;             /* [tb] position -> its row in kv, or -1 (masked) */
    unsigned *tok;         /* [tb] row in kv -> position                    */
    uint8_t *ok;           /* [tb] by position                              */

    /* the block in progress, read by the workers */
    enum phase phase;
    unsigned workers;
    unsigned np, nt, n_write; /* positions, unmasked tokens, positions to write */
    size_t first;          /* the block's first position in the call        */
    const uint16_t *rows;
    uint8_t *res;
    /* ple_apply_many: position i of the call is sequence i's one position,
     * its rows, residual and state through these (NULL in ple_apply) */
    const uint16_t *const *rows_v;
    void *const *res_v;
    float *const *state_v;
    engram_dtype res_dtype;
};

/* ------------------------------------------------------------ workers */

static size_t xsize(engram_dtype d)
{
    return d == ENGRAM_F32 ? 4 : 2;
}

/* [lo, hi) of n items for worker w of nw. */
static void share(unsigned n, unsigned w, unsigned nw, unsigned *lo, unsigned *hi)
{
    *lo = (unsigned)((uint64_t)n * w / nw);
    *hi = (unsigned)((uint64_t)n * (w + 1) / nw);
}

/* Position j's residual as F32: in place, or converted into buf. */
static const float *resid_f32(const struct ple_applier *a, unsigned j, float *buf)
{
    const struct ple_layer *L = a->L;
    const uint8_t *x = a->res_v ? (const uint8_t *)a->res_v[a->first + j]
                                : a->res + (a->first + j) * L->C * xsize(a->res_dtype);
    if (a->res_dtype == ENGRAM_F32)
        return (const float *)x;
    for (uint32_t c = 0; c < L->C; c++)
        buf[c] = bf16_to_f32(((const uint16_t *)x)[c]);
    return buf;
}

/* Steps 2 and 3 of ple_apply.h for position j: alpha, and its frame. */
static void gate_position(struct ple_applier *a, unsigned j, float *scratch)
{
    const struct ple_layer *L = a->L;
    const uint32_t W = L->W;
    float *n = a->win + (size_t)(L->frames + j) * L->C;
    if (a->slot[j] < 0) {
        memset(n, 0, (size_t)L->C * sizeof *n);
        a->ok[j] = 1;
        return;
    }
    const float *kv = a->kv + (size_t)a->slot[j] * L->N, *v = kv + L->C;
    const float *x = resid_f32(a, j, scratch);
    float *al = a->alpha + (size_t)j * PLE_STREAMS, G[PLE_STREAMS];
    const float sw = sqrtf((float)W);
    int ok = 1;
    for (unsigned s = 0; s < PLE_STREAMS; s++) {
        size_t o = (size_t)s * W;
        float r[3];
        a->k->gate(kv + o, x + o, L->gk + o, L->gq + o, W, L->eps, r);
        al[s] = ple_alpha(r[2] / sw);
        G[s] = a->k->sumsq(v, al[s], W);
        ok &= isfinite(r[0]) && isfinite(r[1]) && isfinite(r[2]);
    }
    float sgg = ((G[0] + G[1]) + G[2]) + G[3];
    float rn = ple_rsqrt(sgg / (float)L->C + L->eps);
    ok &= isfinite(sgg) != 0;
    for (unsigned s = 0; s < PLE_STREAMS && ok; s++)
        ok &= a->k->frame(v, al[s], rn, L->gc + (size_t)s * W, W, n + (size_t)s * W);
    a->ok[j] = (uint8_t)ok;
}

/* Steps 4 and 5 for position j: its outputs, into a->out. */
static void conv_position(struct ple_applier *a, unsigned j, float *scratch)
{
    const struct ple_layer *L = a->L;
    if (a->slot[j] < 0 || !a->ok[j])
        return;
    const float *tap[PLE_MAX_KERNEL];
    for (uint32_t k = 0; k < L->kernel; k++) {
        size_t d = PLE_DILATION * (L->kernel - 1 - k); /* frames back */
        if (a->state_v && d > 0) /* its own sequence's earlier frames */
            tap[k] = a->state_v[a->first + j] + (L->frames - d) * L->C;
        else
            tap[k] = a->win + (L->frames + j - d) * L->C;
    }
    float *y = scratch + L->C;
    a->k->conv(tap, L->conv, L->kernel, L->C, y);
    const float *x = resid_f32(a, j, scratch);
    const float *v = a->kv + (size_t)a->slot[j] * L->N + L->C;
    float *out = a->out + (size_t)j * L->C;
    int ok = 1;
    for (unsigned s = 0; s < PLE_STREAMS; s++) {
        size_t o = (size_t)s * L->W;
        ok &= a->k->update(x + o, v, a->alpha[(size_t)j * PLE_STREAMS + s], y + o, L->W, out + o);
    }
    a->ok[j] = (uint8_t)ok;
}

static void write_position(struct ple_applier *a, unsigned j)
{
    const struct ple_layer *L = a->L;
    if (a->slot[j] < 0)
        return;
    const float *out = a->out + (size_t)j * L->C;
    uint8_t *x = a->res_v ? (uint8_t *)a->res_v[a->first + j]
                          : a->res + (a->first + j) * L->C * xsize(a->res_dtype);
    if (a->res_dtype == ENGRAM_F32) {
        memcpy(x, out, (size_t)L->C * sizeof *out);
        return;
    }
    for (uint32_t c = 0; c < L->C; c++)
        ((uint16_t *)x)[c] = f32_to_bf16_bits(out[c]);
}

static void work(void *arg, unsigned w)
{
    struct ple_applier *a = arg;
    const struct ple_layer *L = a->L;
    float *scratch = a->scratch + (size_t)w * 2 * L->C;
    unsigned lo, hi;
    switch (a->phase) {
    case PH_CONVERT:
        share(a->nt, w, a->workers, &lo, &hi);
        for (unsigned u = lo; u < hi; u++) {
            const uint16_t *src = a->rows_v ? a->rows_v[a->first + a->tok[u]]
                                            : a->rows + (a->first + a->tok[u]) * PLE_K;
            float *dst = a->e32 + (size_t)u * PLE_K;
            for (unsigned i = 0; i < PLE_K; i++)
                dst[i] = bf16_to_f32(src[i]);
        }
        break;
    case PH_PROJECT:
        share(L->panels, w, a->workers, &lo, &hi);
        if (lo < hi)
            a->k->project(L, a->e, a->nt, a->kv, L->N, lo, hi, a->wbuf + (size_t)w * PLE_WBUF);
        break;
    case PH_GATE:
        share(a->np, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++)
            gate_position(a, j, scratch);
        break;
    case PH_CONV:
        share(a->np, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++)
            conv_position(a, j, scratch);
        break;
    case PH_WRITE:
        share(a->n_write, w, a->workers, &lo, &hi);
        for (unsigned j = lo; j < hi; j++)
            write_position(a, j);
        break;
    }
}

/* Runs a phase over up to `items` workers. */
static void run_phase(struct ple_applier *a, enum phase ph, unsigned items)
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

void ple_applier_free(struct ple_applier *a)
{
    if (!a)
        return;
    team_free(a->team);
    free(a->e32);
    free(a->kv);
    free(a->out);
    free(a->win);
    free(a->scratch);
    free(a->wbuf);
    free(a->alpha);
    free(a->e);
    free(a->slot);
    free(a->tok);
    free(a->ok);
    free(a);
}

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

int ple_applier_new(const struct ple_layer *L, const struct ple_apply_opts *opts,
                    struct ple_applier **out, engram_error *err)
{
    if (!L || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    struct ple_apply_opts o = {0};
    if (opts)
        o = *opts;
    unsigned threads = o.threads ? o.threads : 1;
    unsigned tb = o.block_tokens ? o.block_tokens : PLE_APPLY_BLOCK;
    if (threads > PLE_APPLY_MAX_THREADS)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%u threads: at most %u", threads,
                       PLE_APPLY_MAX_THREADS);
    if (tb > 65536)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "block of %u positions: at most 65536", tb);
    const struct ple_kernels *k = ple_kernels_for(o.simd);
    if (!k)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "kernels '%s' are not supported here",
                       engram_simd_name(o.simd));
    struct ple_applier *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    a->L = L;
    a->k = k;
    a->threads = threads;
    a->tb = tb;
    const size_t C = L->C;
    size_t floats = (size_t)tb * (PLE_K + L->N + C + PLE_STREAMS) + (L->frames + (size_t)tb) * C +
                    (size_t)threads * (2 * C + PLE_WBUF);
    a->e32 = alloc64((size_t)tb * PLE_K * sizeof(float));
    a->kv = alloc64((size_t)tb * L->N * sizeof(float));
    a->out = alloc64((size_t)tb * C * sizeof(float));
    a->win = alloc64((L->frames + (size_t)tb) * C * sizeof(float));
    a->scratch = alloc64((size_t)threads * 2 * C * sizeof(float));
    a->wbuf = alloc64((size_t)threads * PLE_WBUF * sizeof(float));
    a->alpha = malloc((size_t)tb * PLE_STREAMS * sizeof(float));
    a->e = malloc(tb * sizeof *a->e);
    a->slot = malloc(tb * sizeof *a->slot);
    a->tok = malloc(tb * sizeof *a->tok);
    a->ok = malloc(tb);
    if (!a->e32 || !a->kv || !a->out || !a->win || !a->scratch || !a->wbuf || !a->alpha || !a->e ||
        !a->slot || !a->tok || !a->ok) {
        ple_applier_free(a);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for the workspace");
    }
    for (unsigned u = 0; u < tb; u++)
        a->e[u] = a->e32 + (size_t)u * PLE_K;
    a->fj = o.fork_join;
    a->fj_ctx = o.fork_join_ctx;
    if (threads > 1 && !a->fj) {
        int rc = team_new(threads, &a->team);
        if (rc < 0) {
            ple_applier_free(a);
            return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start %u threads: %s", threads - 1,
                           engram_strerror(rc));
        }
    }
    a->bytes = sizeof *a + floats * sizeof(float) +
               (uint64_t)tb * (sizeof *a->e + sizeof *a->slot + sizeof *a->tok + 1);
    *out = a;
    return 0;
}

uint64_t ple_applier_bytes(const struct ple_applier *a)
{
    return a ? a->bytes : 0;
}

/* ------------------------------------------------------------ the call */

/* Sequence `seq`'s state (ple_apply_many: seq >= 0 names it) is finite. */
static int check_state(const struct ple_layer *L, const float *state, long seq, engram_error *err)
{
    const size_t C = L->C;
    for (size_t f = 0; f < L->frames; f++)
        for (size_t c = 0; c < C; c++)
            if (!isfinite(state[f * C + c])) {
                if (seq >= 0)
                    return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                                   "sequence %ld: the state's frame %zu channel %zu is %s", seq, f, c,
                                   isnan(state[f * C + c]) ? "NaN" : "infinite");
                return err_set(err, -EDOM, ENGRAM_NO_OFFSET, "the state's frame %zu channel %zu is %s", f,
                               c, isnan(state[f * C + c]) ? "NaN" : "infinite");
            }
    return 0;
}

/* One unmasked token's rows and residual are finite; t names it. */
static int check_token(const struct ple_layer *L, const uint16_t *r, const void *x, engram_dtype rd,
                       const char *what, size_t t, engram_error *err)
{
    for (unsigned i = 0; i < PLE_K; i++)
        if ((r[i] & 0x7f80u) == 0x7f80u)
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                           "%s %zu: row %u value %u is %s (rows must be finite)", what, t,
                           i / PLE_ROW_VALUES, i % PLE_ROW_VALUES, (r[i] & 0x7fu) ? "NaN" : "infinite");
    for (size_t c = 0; c < L->C; c++) {
        float v = rd == ENGRAM_F32 ? ((const float *)x)[c] : bf16_to_f32(((const uint16_t *)x)[c]);
        if (!isfinite(v))
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET, "%s %zu stream %zu index %zu: the residual is %s",
                           what, t, c / L->W, c % L->W, isnan(v) ? "NaN" : "infinite");
    }
    return 0;
}

static int check_inputs(const struct ple_applier *a, const uint16_t *rows, const void *residual,
                        engram_dtype rd, const uint8_t *mask, size_t n, const float *state,
                        engram_error *err)
{
    const struct ple_layer *L = a->L;
    int rc = check_state(L, state, -1, err);
    for (size_t t = 0; t < n && rc == 0; t++)
        if (!mask || mask[t])
            rc = check_token(L, rows + t * PLE_K, (const uint8_t *)residual + t * L->C * xsize(rd), rd,
                             "token", t,
                             err);
    return rc;
}

/* The block of positions from t0 (at most tb of the call's n): project
 * the unmasked ones, gate, convolve, and write the positions before the
 * first that failed; returns how many were written (a->np if all). */
static unsigned run_block(struct ple_applier *a, const uint8_t *mask, size_t t0, size_t n)
{
    a->first = t0;
    a->np = n - t0 < a->tb ? (unsigned)(n - t0) : a->tb;
    a->nt = 0;
    for (unsigned j = 0; j < a->np; j++) {
        a->slot[j] = -1;
        if (!mask || mask[t0 + j]) {
            a->slot[j] = (int)a->nt;
            a->tok[a->nt++] = j;
        }
    }
    if (a->nt > 0) {
        run_phase(a, PH_CONVERT, a->nt);
        run_phase(a, PH_PROJECT, a->L->panels);
    }
    run_phase(a, PH_GATE, a->np);
    run_phase(a, PH_CONV, a->np);
    unsigned bad = 0;
    while (bad < a->np && a->ok[bad])
        bad++;
    a->n_write = bad;
    run_phase(a, PH_WRITE, bad);
    return bad;
}

int ple_apply(struct ple_applier *a, const uint16_t *rows, void *residual, engram_dtype resid_dtype,
              const uint8_t *mask, size_t n, float *state, engram_error *err)
{
    if (!a || (n > 0 && (!rows || !residual)) || (!state && a->L->frames > 0))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (resid_dtype != ENGRAM_F32 && resid_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "residual type %d: F32 or BF16 only", (int)resid_dtype);
    int rc = check_inputs(a, rows, residual, resid_dtype, mask, n, state, err);
    if (rc < 0)
        return rc;
    const struct ple_layer *L = a->L;
    const size_t C = L->C, F = L->frames;
    a->rows = rows;
    a->res = residual;
    a->res_dtype = resid_dtype;
    a->rows_v = NULL;
    a->res_v = NULL;
    a->state_v = NULL;
    if (F > 0)
        memcpy(a->win, state, F * C * sizeof(float));
    for (size_t t0 = 0; t0 < n; t0 += a->np) {
        unsigned bad = run_block(a, mask, t0, n);
        if (bad < a->np) {
            /* the state after the last token written: the F frames before it */
            if (F > 0)
                memcpy(state, a->win + (size_t)bad * C, F * C * sizeof(float));
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                           "token %zu: the projection, gate, frame or output is not finite (F32 "
                           "overflow); tokens before it were updated, it and later ones were not",
                           t0 + bad);
        }
        memmove(a->win, a->win + (size_t)a->np * C, F * C * sizeof(float));
    }
    if (F > 0)
        memcpy(state, a->win, F * C * sizeof(float));
    return 0;
}

int ple_check_many(const struct ple_applier *a, size_t n, const uint16_t *const *rows,
                   void *const *residual, engram_dtype resid_dtype, const uint8_t *mask,
                   float *const *state, size_t *bad, engram_error *err)
{
    const struct ple_layer *L = a->L;
    for (size_t i = 0; i < n; i++) {
        *bad = i;
        int rc = L->frames > 0 ? check_state(L, state[i], (long)i, err) : 0;
        if (rc == 0 && (!mask || mask[i]))
            rc = check_token(L, rows[i], residual[i], resid_dtype, "sequence", i, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int ple_apply_many(struct ple_applier *a, size_t n, const uint16_t *const *rows, void *const *residual,
                   engram_dtype resid_dtype, const uint8_t *mask, float *const *state, engram_error *err)
{
    return ple_apply_many_done(a, n, rows, residual, resid_dtype, mask, state, NULL, err);
}

int ple_apply_many_done(struct ple_applier *a, size_t n, const uint16_t *const *rows,
                        void *const *residual, engram_dtype resid_dtype, const uint8_t *mask,
                        float *const *state, size_t *done, engram_error *err)
{
    size_t dummy;
    if (!done)
        done = &dummy;
    *done = 0;
    if (!a || (n > 0 && (!rows || !residual || (!state && a->L->frames > 0))))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (resid_dtype != ENGRAM_F32 && resid_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "residual type %d: F32 or BF16 only", (int)resid_dtype);
    const struct ple_layer *L = a->L;
    const size_t C = L->C, F = L->frames;
    for (size_t i = 0; i < n; i++)
        if ((!mask || mask[i]) && (!rows[i] || !residual[i]))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "sequence %zu: NULL %s", i,
                           !rows[i] ? "rows" : "residual");
        else if (F > 0 && !state[i])
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "sequence %zu: NULL state", i);
    size_t bad_seq;
    int rc = ple_check_many(a, n, rows, residual, resid_dtype, mask, state, &bad_seq, err);
    if (rc < 0)
        return rc;
    a->rows = NULL;
    a->res = NULL;
    a->res_dtype = resid_dtype;
    a->rows_v = rows;
    a->res_v = residual;
    a->state_v = state;
    for (size_t t0 = 0; t0 < n; t0 += a->np) {
        unsigned bad = run_block(a, mask, t0, n);
        /* each written sequence's state moves one frame: its new one last */
        for (unsigned j = 0; j < bad && F > 0; j++) {
            float *st = state[t0 + j];
            memmove(st, st + C, (F - 1) * C * sizeof *st);
            memcpy(st + (F - 1) * C, a->win + (F + j) * C, C * sizeof *st);
        }
        *done = t0 + bad;
        if (bad < a->np) {
            a->rows_v = NULL, a->res_v = NULL, a->state_v = NULL;
            return err_set(err, -EDOM, ENGRAM_NO_OFFSET,
                           "sequence %zu: the projection, gate, frame or output is not finite (F32 "
                           "overflow); the sequences before it were updated, it and later ones were not",
                           t0 + bad);
        }
    }
    a->rows_v = NULL, a->res_v = NULL, a->state_v = NULL;
    return 0;
}
