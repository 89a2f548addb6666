/*
 * session.c - sessions and their decode steps (engram.h, "sessions"):
 * open, close (which never waits), history, restore; a step begins by
 * hashing its tokens and queueing the session for the I/O thread
 * (rounds.c), is waited for per table (timed too), and ends by commit or
 * abort.  Nothing is written into a step's buffer after commit, abort or
 * close return (rounds.c writes only for the live step generation).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_int.h"
#include "codec/rowcodec.h"
#include "common/util.h"
#include "output/applier.h"

int engram_session_open(engram_pool *p, engram_session **out, engram_error *err)
{
    if (!p || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_session *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    s->p = p;
    engram_history_reset(&s->hist);
    if (p->ple) {
        engram_ple_history h;
        engram_ple_history_reset(p->m, &h);
        s->hist = serve_hist_of_ple(&h);
    }
    pthread_mutex_init(&s->mu, NULL);
    pool_cond_init(&s->cv);
    if (p->tent_floats) { /* the committed state starts at +0 */
        s->conv = calloc(p->frames * p->frame_floats, sizeof *s->conv);
        s->conv_tent = malloc(p->tent_floats * sizeof *s->conv_tent);
        if (!s->conv || !s->conv_tent) {
            serve_session_free(s);
            return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET,
                           "out of memory for the session's state (%zu bytes)",
                           (p->frames * p->frame_floats + p->tent_floats) * sizeof(float));
        }
    }
    pthread_mutex_lock(&p->mu);
    int rc = p->stop ? err_set(err, -ESHUTDOWN, ENGRAM_NO_OFFSET, "the pool was closed") : 0;
    if (rc == 0)
        p->handles++;
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) {
        serve_session_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Ends the step in progress (commit, abort, close): out of the queue, and
 * nothing is written into its buffer once this returns; waiters elsewhere
 * wake and see that it ended. */
static int end_step(engram_session *s, int closing)
{
    engram_pool *p = s->p;
    pthread_mutex_lock(&p->mu);
    rounds_queue_remove(p, s);
    pthread_mutex_lock(&s->mu);
    s->ended = 1;
    if (s->state == S_STEP)
        s->state = S_IDLE;
    s->closed |= closing;
    if (s->remaining[0] + s->remaining[1] > 0) /* reads of it may be left to drop */
        p->ends++;
    int free_now = closing && s->refs == 0; /* else the last round entry frees it */
    SCHED_WAKE(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&p->mu);
    SCHED_POINT("step ended");
    return free_now;
}

void engram_session_close(engram_session *s)
{
    if (!s)
        return;
    engram_pool *p = s->p;
    /* a prefill in progress is cancelled and let go of: its handle stays
     * valid until its owner ends or cancels it */
    pthread_mutex_lock(&s->mu);
    engram_prefill *pf = s->pf;
    s->pf = NULL;
    pthread_mutex_unlock(&s->mu);
    if (pf) {
        pthread_mutex_lock(&pf->mu);
        pf->s = NULL;
        pf->cancel_req = 1;
        if (pf->rc == 0) {
            pf->rc = -ECANCELED;
            err_set(&pf->err, -ECANCELED, ENGRAM_NO_OFFSET, "the prefill's session was closed");
        }
        SCHED_WAKE(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        pool_kick(p);
    }
    if (end_step(s, 1))
        serve_session_free(s);
    pool_handle_gone(p);
}

void engram_session_history(const engram_session *s, engram_history *h)
{
    if (!s || !h)
        return;
    engram_session *m = (engram_session *)(uintptr_t)s; /* the lock, not the state */
    pthread_mutex_lock(&m->mu);
    *h = s->hist;
    pthread_mutex_unlock(&m->mu);
}

/* Sets the committed history of an idle session (h validated). */
static int set_hist(engram_session *s, const engram_history *h, engram_error *err)
{
    pthread_mutex_lock(&s->mu);
    int rc = s->state != S_IDLE ? err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress") : 0;
    if (rc == 0)
        s->hist = *h;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* A history this pool's member can carry (engram_session_set_history). */
static int check_hist(const engram_pool *p, const engram_history *h, engram_error *err)
{
    if (p->ple) {
        for (int i = 0; i < 2; i++)
            if (h->id[i] < 0 || (uint32_t)h->id[i] >= p->vocab)
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                               "history entry %d (%d) is not a token id < %u", i, h->id[i], p->vocab);
        if (h->id[2] != ENGRAM_DEAD)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "history entry 2 (%d) is not -1 (the PLE member carries 2 ids)", h->id[2]);
        return 0;
    }
    uint32_t cv = engram_hasher_layout(p->hasher)->compressed_vocab;
    for (int i = 0; i < ENGRAM_HISTORY; i++)
        if (h->id[i] != ENGRAM_DEAD && (h->id[i] < 0 || (uint32_t)h->id[i] >= cv))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "history entry %d (%d) is neither -1 nor < %u",
                           i, h->id[i], cv);
    return 0;
}

int engram_session_set_history(engram_session *s, const engram_history *h, engram_error *err)
{
    if (!s || !h)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = check_hist(s->p, h, err);
    return rc < 0 ? rc : set_hist(s, h, err);
}

/* PLE: the history after the last min(n, 2) positions, from a sequence
 * start (the lags are the ids the hash read there). */
static int restore_ple(engram_session *s, const uint32_t *tokens, const uint8_t *mask, size_t n,
                       engram_error *err)
{
    engram_pool *p = s->p;
    size_t from = n > 2 ? n - 2 : 0;
    int rc = serve_check_tokens(p, tokens + from, mask ? mask + from : NULL, n - from, from, err);
    if (rc < 0)
        return rc;
    uint8_t kinds[2];
    uint32_t rows[2 * ENGRAM_PLE_ROWS_PER_TOKEN];
    for (size_t i = from; i < n; i++)
        kinds[i - from] = serve_ple_kind(mask, i);
    engram_ple_history ph;
    engram_ple_history_reset(p->m, &ph);
    engram_ple_hash(p->m, &ph, tokens + from, kinds, n - from, rows, NULL); /* validated */
    engram_history h = serve_hist_of_ple(&ph);
    return set_hist(s, &h, err);
}

int engram_session_restore(engram_session *s, const uint32_t *tokens, const uint8_t *mask,
                           size_t n, engram_error *err)
{
    if (!s || (n > 0 && !tokens))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (s->p->ple)
        return restore_ple(s, tokens, mask, n, err);
    const engram_layout *l = engram_hasher_layout(s->p->hasher);
    engram_history h;
    engram_history_reset(&h);
    size_t from = n > ENGRAM_HISTORY ? n - ENGRAM_HISTORY : 0;
    for (size_t i = from; i < n; i++) /* oldest first, each shifting in */
        if (tokens[i] >= l->vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "token %zu (%u) is not < vocab %u", i,
                           tokens[i], l->vocab);
    for (size_t i = from; i < n; i++) {
        h.id[2] = h.id[1];
        h.id[1] = h.id[0];
        h.id[0] = mask && !mask[i] ? ENGRAM_DEAD : (int32_t)l->token_map[tokens[i]];
    }
    return set_hist(s, &h, err);
}

/* ------------------------------------------------------------ steps */

int serve_check_tokens(const engram_pool *p, const uint32_t *tokens, const uint8_t *mask, size_t n,
                       size_t first, engram_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= p->vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "token %zu (%u) is not < vocab %u", first + i,
                           tokens[i], p->vocab);
        if (p->ple && mask && mask[i] > ENGRAM_MASK_IMAGE)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "mask %zu (%u) is not 0 (padding), 1 (text) or 2 (image)", first + i, mask[i]);
    }
    return 0;
}

/* A sharded pool: token i's request bits for the rows of its block, and
 * zeros in out for the others (before the step is queued: nothing of the
 * step is written after it ends); counts the requests per table into own. */
static void want_block(const engram_pool *p, engram_session *s, unsigned i, size_t rb, unsigned *own)
{
    uint8_t *tok = (uint8_t *)s->out + (size_t)i * p->rpt * rb;
    for (unsigned t = 0; t < p->tables; t++)
        for (unsigned c = 0; c < p->cols; c++) {
            if (!pool_owns(p, t, s->rows[i][t * p->cols + c])) {
                memset(tok + (size_t)(t * p->cols + c) * rb, 0, rb);
                continue;
            }
            unsigned bit = i * ENGRAM_COLUMNS + c;
            s->want[t][bit >> 6] |= 1ull << (bit & 63);
            own[t]++;
        }
}

/* Installs a validated step in an idle session and queues it.  Under p->mu
 * (so that the I/O thread sees the step and the queue change together). */
static void install_step(engram_pool *p, const engram_step_req *q, engram_dtype dtype)
{
    engram_session *s = q->s;
    pthread_mutex_lock(&s->mu);
    s->gen++;
    s->ended = 0;
    s->k = q->k;
    s->dtype = dtype;
    s->out = q->out;
    engram_history h = s->hist;
    engram_ple_history ph = serve_ple_of_hist(&h);
    unsigned live = 0, own[ENGRAM_TABLES] = {0, 0};
    size_t rb = family_row_out_bytes(&p->fam, dtype);
    memset(s->want, 0, sizeof s->want);
    for (unsigned i = 0; i < q->k; i++) {
        int masked;
        if (p->ple) { /* validated: cannot fail */
            uint8_t kind = serve_ple_kind(q->mask, i);
            engram_ple_hash(p->m, &ph, q->tokens + i, &kind, 1, s->rows[i], NULL);
            s->after[i] = serve_hist_of_ple(&ph);
            masked = kind == ENGRAM_PLE_PAD;
        } else {
            masked = q->mask && !q->mask[i];
            engram_hash_token(p->hasher, &h, q->tokens[i], masked, s->rows[i]);
            s->after[i] = h;
        }
        s->masked[i] = (uint8_t)masked;
        live += !masked;
        if (!masked && p->sharded)
            want_block(p, s, i, rb, own);
        else if (!masked) /* request bits: token * 24 + column, whatever the family */
            for (unsigned t = 0; t < p->tables; t++)
                for (unsigned c = 0; c < p->cols; c++) {
                    unsigned bit = i * ENGRAM_COLUMNS + c;
                    s->want[t][bit >> 6] |= 1ull << (bit & 63);
                }
    }
    s->begin_ns = util_now_ns();
    for (unsigned t = 0; t < ENGRAM_TABLES; t++) {
        int has = t < p->tables;
        s->remaining[t] = s->nrows[t] = !has ? 0 : p->sharded ? own[t] : live * p->cols;
        s->rc[t] = 0;
        /* nothing to read (every token masked, or every row foreign): in */
        s->ready_ns[t] = has && !s->remaining[t] ? s->begin_ns : 0;
        s->waited[t] = 0;
    }
    s->applied = 0;
    s->err.code = 0;
    s->state = S_STEP;
    p->steps++;
    if (s->remaining[0] + s->remaining[1] > 0 && !s->queued)
        rounds_queue_add(p, s);
    pthread_mutex_unlock(&s->mu);
}

/* The i-th request of a begin call, however the caller laid them out. */
typedef void (*req_at_fn)(const void *ctx, size_t i, engram_step_req *q);

/* Why request q, the i-th of n, cannot begin, as far as its own arguments
 * tell (0: they are fine); p is the pool of the first request.  A single
 * step's messages name no index. */
static int bad_request(const engram_step_req *q, const engram_pool *p, size_t i, size_t n,
                       engram_error *err)
{
    char at[32] = "";
    if (n > 1)
        snprintf(at, sizeof at, "session %zu: ", i);
    if (!q->s || !q->tokens || !q->out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%sNULL %s", at,
                       !q->s ? "session" : !q->tokens ? "tokens" : "out");
    if (q->s->p != p)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%sthe session is of another pool", at);
    if (q->k == 0 || q->k > ENGRAM_MAX_DRAFT)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%sk = %u (k must be 1..%u)", at, q->k,
                       ENGRAM_MAX_DRAFT);
    return 0;
}

/* Validates every request, then installs and queues all of them at once
 * (one intake takes them together) or none. */
static int begin_steps(req_at_fn at, const void *ctx, size_t n, engram_dtype dtype, engram_error *err)
{
    if (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "dtype %d is not BF16, F32 or RAW", (int)dtype);
    engram_step_req q, o;
    at(ctx, 0, &q);
    engram_pool *p = q.s ? q.s->p : NULL;
    size_t first = 0;
    for (size_t i = 0; i < n; i++) {
        at(ctx, i, &q);
        int rc = bad_request(&q, p, i, n, err);
        if (rc < 0)
            return rc;
        for (size_t j = 0; j < i; j++) {
            at(ctx, j, &o);
            if (o.s == q.s)
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu appears twice (also at %zu)",
                               i, j);
        }
        rc = serve_check_tokens(p, q.tokens, q.mask, q.k, first, err);
        if (rc < 0)
            return rc;
        first += q.k;
    }
    pthread_mutex_lock(&p->mu);
    int rc = pool_refuses(p, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        at(ctx, i, &q);
        pthread_mutex_lock(&q.s->mu);
        if (q.s->state != S_IDLE)
            rc = n == 1 ? err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress")
                        : err_set(err, -EBUSY, ENGRAM_NO_OFFSET,
                                  "session %zu: a step or prefill is in progress", i);
        pthread_mutex_unlock(&q.s->mu);
    }
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            at(ctx, i, &q);
            install_step(p, &q, dtype);
        }
        pool_wake_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    SCHED_POINT("begin");
    return rc;
}

static void req_of_array(const void *ctx, size_t i, engram_step_req *q)
{
    *q = ((const engram_step_req *)ctx)[i];
}

int engram_step_begin_many(const engram_step_req *reqs, size_t n, engram_dtype dtype,
                           engram_error *err)
{
    if (n == 0)
        return 0;
    if (!reqs)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL requests");
    return begin_steps(req_of_array, reqs, n, dtype, err);
}

int engram_step_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, unsigned k,
                      engram_dtype dtype, void *out, engram_error *err)
{
    engram_step_req q = {s, tokens, mask, k, out};
    return begin_steps(req_of_array, &q, 1, dtype, err);
}

struct batch_args {
    engram_session *const *ss;
    const uint32_t *tokens;
    const uint8_t *mask;
    void *const *outs;
};

static void req_of_batch(const void *ctx, size_t i, engram_step_req *q)
{
    const struct batch_args *b = ctx;
    *q = (engram_step_req){b->ss[i], b->tokens + i, b->mask ? b->mask + i : NULL, 1, b->outs[i]};
}

int engram_step_begin_batch(engram_session *const *ss, const uint32_t *tokens, const uint8_t *mask,
                            size_t n, engram_dtype dtype, void *const *outs, engram_error *err)
{
    if (n == 0)
        return 0;
    if (!ss || !tokens || !outs)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s",
                       !ss ? "sessions" : !tokens ? "tokens" : "outs");
    struct batch_args b = {ss, tokens, mask, outs};
    return begin_steps(req_of_batch, &b, n, dtype, err);
}

/* Waits (up to timeout_ns; 0: not at all) until table t's rows of the
 * current step are in, it failed or it ended.  Still to come: -EAGAIN for
 * a poll, else -ETIMEDOUT. */
static int step_table_rc(engram_session *s, int t, uint64_t timeout_ns, int poll, engram_error *err)
{
    if (!s)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL session");
    if (t < 0 || (unsigned)t >= s->p->tables)
        return s->p->tables == 1
                   ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d: the model has one table (0)", t)
                   : err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not 0 or 1", t);
    pthread_mutex_lock(&s->mu);
    if (s->state != S_STEP) {
        pthread_mutex_unlock(&s->mu);
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress");
    }
    unsigned gen = s->gen;
    int forever = timeout_ns == ENGRAM_FOREVER, expired = timeout_ns == 0;
    struct timespec until = {0, 0};
    if (!forever && !expired)
        until = pool_deadline(timeout_ns);
    while (s->gen == gen && !s->ended && s->remaining[t] > 0 && s->rc[t] == 0 && !expired) {
        if (forever)
            SCHED_WAIT(&s->cv, &s->mu);
        else
            expired = SCHED_TIMEDWAIT(&s->cv, &s->mu, &until) == ETIMEDOUT;
    }
    int rc = 0;
    if (s->gen != gen || s->ended) {
        rc = err_set(err, -ECANCELED, ENGRAM_NO_OFFSET,
                     "the step ended (commit, abort or close) during the wait");
    } else if (s->rc[t] != 0) {
        rc = s->rc[t];
        if (err)
            *err = s->err;
    } else if (s->remaining[t] > 0) {
        rc = poll ? -EAGAIN
                  : err_set(err, -ETIMEDOUT, ENGRAM_NO_OFFSET, "table %d: %u of the step's rows still to come",
                            t, s->remaining[t]);
    }
    if (rc == 0)
        s->waited[t] = 1;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int engram_step_wait_timed(engram_session *s, int t, uint64_t timeout_ns, engram_error *err)
{
    return step_table_rc(s, t, timeout_ns, 0, err);
}

int engram_step_wait(engram_session *s, int t, engram_error *err)
{
    return step_table_rc(s, t, ENGRAM_FOREVER, 0, err);
}

int engram_step_poll(engram_session *s, int t, engram_error *err)
{
    return step_table_rc(s, t, 0, 1, err);
}

/* The committed state becomes the state after the step's first j tokens
 * (1 <= j <= k), from the frames engram_step_apply left in tent: the state
 * after a call is the last F frames of the old state followed by the
 * call's frames. */
static void commit_state(const engram_pool *p, engram_session *s, unsigned j)
{
    size_t C = p->frame_floats, F = p->frames, k = s->applied;
    const float *fr = k <= F ? s->conv_tent + (F - k) * C : s->conv_tent + F * C; /* the step's frames */
    if (j >= F) {
        memcpy(s->conv, fr + (j - F) * C, F * C * sizeof *fr);
    } else {
        memmove(s->conv, s->conv + j * C, (F - j) * C * sizeof *fr);
        memcpy(s->conv + (F - j) * C, fr, j * C * sizeof *fr);
    }
}

int engram_step_commit(engram_session *s, unsigned j, engram_error *err)
{
    if (!s)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL session");
    pthread_mutex_lock(&s->mu);
    int rc = s->state != S_STEP ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress")
           : j > s->k ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "commit of %u tokens of a %u-token step", j, s->k)
                      : 0;
    if (rc < 0) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    while (s->rc[0] == 0 && s->rc[1] == 0 && s->remaining[0] + s->remaining[1] > 0)
        SCHED_WAIT(&s->cv, &s->mu);
    rc = s->rc[0] ? s->rc[0] : s->rc[1];
    if (rc < 0 && err)
        *err = s->err;
    if (rc == 0 && j > 0) {
        s->hist = s->after[j - 1];
        if (s->applied && s->p->frames)
            commit_state(s->p, s, j);
    }
    pthread_mutex_unlock(&s->mu);
    SCHED_POINT("commit: history set");
    end_step(s, 0);
    return rc;
}

void engram_step_abort(engram_session *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    int stepping = s->state == S_STEP;
    pthread_mutex_unlock(&s->mu);
    if (stepping)
        end_step(s, 0);
}

void engram_step_get_info(const engram_session *s, engram_step_info *info)
{
    if (!s || !info)
        return;
    engram_session *m = (engram_session *)(uintptr_t)s; /* the lock, not the state */
    pthread_mutex_lock(&m->mu);
    info->k = s->k;
    info->begin_ns = s->begin_ns;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        info->ready_ns[t] = s->ready_ns[t];
        info->rows[t] = s->nrows[t];
    }
    pthread_mutex_unlock(&m->mu);
}

/* ------------------------------------------------------------ apply */

int engram_step_apply(engram_session *s, engram_applier *a, void *residual, engram_dtype resid_dtype,
                      engram_error *err)
{
    if (!s || !a || !residual)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s",
                       !s ? "session" : !a ? "applier" : "residual");
    engram_pool *p = s->p;
    if (p->sharded)
        return pool_refuse_sharded_apply(p, "engram_step_apply", err);
    engram_layer_info li;
    int rc_fit = pool_applier_layer(p, a, &li, err);
    if (rc_fit < 0)
        return rc_fit;
    int t = li.table;
    if (resid_dtype != ENGRAM_F32 && resid_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "residual type %d: F32 or BF16 only",
                       (int)resid_dtype);
    uint8_t mask[ENGRAM_MAX_DRAFT];
    pthread_mutex_lock(&s->mu);
    int dtype = s->dtype;
    /* every refusal comes before the tentative state is touched: an apply
     * refused leaves an earlier one of the step in force */
    int rc = s->state != S_STEP ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress")
             : t < 0 || (unsigned)t >= p->tables || !s->waited[t]
                 ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "table %d's rows of the step were not waited for (a wait that returned 0)", t)
             : !p->ple && dtype == ENGRAM_RAW
                 ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "the step's rows are RAW (undecoded): apply BF16 or F32 steps")
             : p->ple && dtype == ENGRAM_F32
                 ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "the step's rows are F32: the PLE member applies BF16 (or RAW) rows")
                 : 0;
    unsigned k = s->k;
    uint8_t *out = s->out;
    for (unsigned i = 0; i < k; i++)
        mask[i] = !s->masked[i];
    if (rc == 0)
        s->applied = 0; /* the tentative state is rebuilt from the committed one */
    pthread_mutex_unlock(&s->mu);
    if (rc < 0)
        return rc;
    size_t xe = resid_dtype == ENGRAM_F32 ? 4 : 2;
    if (!p->ple) {
        size_t rb = family_row_out_bytes(&p->fam, dtype);
        return engram_apply_strided(a, out + (size_t)t * p->cols * rb, (engram_dtype)dtype, p->rpt * rb,
                                    residual, resid_dtype, (size_t)p->streams * p->width * xe, mask, k, err);
    }
    size_t C = p->frame_floats, F = p->frames;
    if (k <= F || F == 0) {
        if (F)
            memcpy(s->conv_tent, s->conv, F * C * sizeof *s->conv_tent);
        rc = engram_apply_seq(a, out, ENGRAM_BF16, residual, resid_dtype, mask, k,
                              F ? s->conv_tent : NULL, err);
    } else {
        /* more tokens than frames: one at a time, each one's frame kept */
        float *run = s->conv_tent, *frames = s->conv_tent + F * C;
        memcpy(run, s->conv, F * C * sizeof *run);
        size_t tok_rows = (size_t)p->cols * family_row_out_bytes(&p->fam, ENGRAM_BF16);
        size_t tok_res = (size_t)p->streams * p->width * xe;
        for (unsigned i = 0; i < k && rc == 0; i++) {
            rc = engram_apply_seq(a, out + i * tok_rows, ENGRAM_BF16, (uint8_t *)residual + i * tok_res,
                                  resid_dtype, mask + i, 1, run, err);
            memcpy(frames + i * C, run + (F - 1) * C, C * sizeof *run);
            if (rc < 0 && err) { /* each call saw one token, its "token 0": name it */
                char inner[sizeof err->msg];
                snprintf(inner, sizeof inner, "%s", err->msg);
                snprintf(err->msg, sizeof err->msg, "token %u of the step (applied alone; the tokens "
                         "before it were updated): %.160s", i, inner);
            }
        }
    }
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        s->applied = k;
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* Decode of many sessions, one token each: their steps' rows applied in
 * one pass over the weights (engram_apply_seqs), each from its own
 * committed state into its tentative one, as engram_step_apply would. */
#define APPLY_GROUP 64u
int engram_step_apply_batch(engram_session *const *ss, size_t n, engram_applier *a,
                            void *const *residuals, engram_dtype resid_dtype, engram_error *err)
{
    if ((n > 0 && (!ss || !residuals)) || !a)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!ss[i] || !residuals[i])
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "request %zu: NULL %s", i,
                           !ss[i] ? "session" : "residual");
    engram_pool *p = ss[0]->p;
    if (p->sharded)
        return pool_refuse_sharded_apply(p, "engram_step_apply_batch", err);
    if (!p->ple) { /* V4.1: each its own (its rows strided in its step's out) */
        for (size_t i = 0; i < n; i++) {
            int rc = engram_step_apply(ss[i], a, residuals[i], resid_dtype, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (resid_dtype != ENGRAM_F32 && resid_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "residual type %d: F32 or BF16 only",
                       (int)resid_dtype);
    engram_layer_info li;
    int rc_fit = pool_applier_layer(p, a, &li, err);
    if (rc_fit < 0)
        return rc_fit;
    /* every request checked before any state is touched */
    for (size_t i = 0; i < n; i++) {
        engram_session *s = ss[i];
        pthread_mutex_lock(&s->mu);
        int rc = s->p != p ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "request %zu: a session of another pool", i)
                 : s->state != S_STEP ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "request %zu: no step in progress", i)
                 : s->k != 1 ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                                       "request %zu: a step of %u tokens (one each here; engram_step_apply "
                                       "applies drafts)", i, s->k)
                 : !s->waited[0] ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                                           "request %zu: table 0's rows of the step were not waited for", i)
                 : s->dtype == ENGRAM_F32 ? err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                                                    "request %zu: the step's rows are F32: the PLE member "
                                                    "applies BF16 (or RAW) rows", i)
                                          : 0;
        for (size_t j = 0; j < i && rc == 0; j++)
            if (ss[j] == s)
                rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "requests %zu and %zu: the same session", j, i);
        pthread_mutex_unlock(&s->mu);
        if (rc < 0)
            return rc;
    }
    const size_t C = p->frame_floats, F = p->frames;
    const void *rows[APPLY_GROUP];
    float *states[APPLY_GROUP];
    uint8_t mask[APPLY_GROUP];
    /* the inputs of every request (rows, residual, committed state) checked
     * before any is touched: a non-finite one fails the batch as a whole */
    for (size_t g = 0; g < n; g += APPLY_GROUP) {
        size_t m = n - g < APPLY_GROUP ? n - g : APPLY_GROUP, bad = 0;
        for (size_t i = 0; i < m; i++) {
            engram_session *s = ss[g + i];
            pthread_mutex_lock(&s->mu);
            rows[i] = s->out;
            mask[i] = !s->masked[0];
            pthread_mutex_unlock(&s->mu);
            states[i] = s->conv;
        }
        int rc = applier_seqs_check(a, m, rows, residuals + g, resid_dtype, mask, F ? states : NULL, &bad,
                                    err);
        if (rc < 0) {
            if (err) {
                char inner[sizeof err->msg];
                snprintf(inner, sizeof inner, "%s", err->msg);
                snprintf(err->msg, sizeof err->msg, "request %zu (nothing applied): %.200s", g + bad, inner);
            }
            return rc;
        }
    }
    for (size_t g = 0; g < n; g += APPLY_GROUP) {
        size_t m = n - g < APPLY_GROUP ? n - g : APPLY_GROUP, done = 0;
        for (size_t i = 0; i < m; i++) {
            engram_session *s = ss[g + i];
            pthread_mutex_lock(&s->mu);
            s->applied = 0; /* the tentative state is rebuilt from the committed one */
            rows[i] = s->out;
            mask[i] = !s->masked[0];
            pthread_mutex_unlock(&s->mu);
            if (F)
                memcpy(s->conv_tent, s->conv, F * C * sizeof *s->conv_tent);
            states[i] = s->conv_tent;
        }
        int rc = applier_seqs_done(a, m, rows, residuals + g, resid_dtype, mask, F ? states : NULL, &done,
                                   err);
        for (size_t i = 0; i < done; i++) { /* those applied whole commit with their token */
            pthread_mutex_lock(&ss[g + i]->mu);
            ss[g + i]->applied = 1;
            pthread_mutex_unlock(&ss[g + i]->mu);
        }
        if (rc < 0) {
            /* a computed overflow: the requests from the failing one on are
             * not applied (an earlier engram_step_apply of theirs neither) */
            for (size_t i = g + done + 1; i < n; i++) {
                pthread_mutex_lock(&ss[i]->mu);
                ss[i]->applied = 0;
                pthread_mutex_unlock(&ss[i]->mu);
            }
            if (err) {
                char inner[sizeof err->msg];
                snprintf(inner, sizeof inner, "%s", err->msg);
                snprintf(err->msg, sizeof err->msg, "request %zu (the requests before it applied): %.180s",
                         g + done, inner);
            }
            return rc;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ snapshots */

/* The snapshot's header, in the host's byte order; the history follows in
 * it, then the state's floats. */
#define SNAP_MAGIC 0x53474e45u /* "ENGS" */
#define SNAP_VERSION 1u
struct snap_head {
    uint32_t magic, version, member, state_floats, width, reserved;
    int32_t hist[ENGRAM_HISTORY];
    uint32_t pad;
};

static size_t state_floats(const engram_pool *p)
{
    return p->frames * p->frame_floats;
}

size_t engram_session_state_bytes(const engram_session *s)
{
    return s ? sizeof(struct snap_head) + state_floats(s->p) * sizeof(float) : 0;
}

int engram_session_save(const engram_session *s, void *buf, size_t len, engram_error *err)
{
    if (!s || !buf)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s", !s ? "session" : "buffer");
    const engram_pool *p = s->p;
    size_t need = engram_session_state_bytes(s);
    if (len < need)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "a buffer of %zu bytes; the snapshot takes %zu", len,
                       need);
    engram_session *m = (engram_session *)(uintptr_t)s; /* the lock, not the state */
    pthread_mutex_lock(&m->mu);
    int rc = s->state != S_IDLE ? err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress")
                                : 0;
    if (rc == 0) {
        struct snap_head h = {SNAP_MAGIC, SNAP_VERSION, (uint32_t)p->fam.member, (uint32_t)state_floats(p),
                              p->width, 0, {s->hist.id[0], s->hist.id[1], s->hist.id[2]}, 0};
        memcpy(buf, &h, sizeof h);
        if (state_floats(p))
            memcpy((uint8_t *)buf + sizeof h, s->conv, state_floats(p) * sizeof(float));
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int engram_session_load(engram_session *s, const void *buf, size_t len, engram_error *err)
{
    if (!s || !buf)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s", !s ? "session" : "buffer");
    const engram_pool *p = s->p;
    size_t need = engram_session_state_bytes(s), nf = state_floats(p);
    struct snap_head h;
    if (len != need)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "snapshot of %zu bytes; this session's take %zu", len,
                       need);
    memcpy(&h, buf, sizeof h);
    if (h.magic != SNAP_MAGIC)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "snapshot magic 0x%08x is not 0x%08x (not a session snapshot)", h.magic, SNAP_MAGIC);
    if (h.version != SNAP_VERSION)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "snapshot version %u is not %u", h.version,
                       SNAP_VERSION);
    if (h.member != (uint32_t)p->fam.member)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "snapshot of member %u; the pool's model is member %u (%s)", h.member,
                       (uint32_t)p->fam.member, p->fam.name);
    if (h.state_floats != nf)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "snapshot state of %u floats; the model's is %zu",
                       h.state_floats, nf);
    if (h.width != p->width)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "snapshot width %u; the model's is %u", h.width,
                       p->width);
    if (h.reserved != 0 || h.pad != 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "snapshot reserved fields are not 0");
    engram_history hist = {{h.hist[0], h.hist[1], h.hist[2]}};
    int rc = check_hist(p, &hist, err);
    if (rc < 0)
        return rc;
    const uint8_t *fl = (const uint8_t *)buf + sizeof h;
    for (size_t i = 0; i < nf; i++) {
        float v;
        memcpy(&v, fl + i * sizeof v, sizeof v);
        if (!isfinite(v))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "snapshot state float %zu (frame %zu, channel %zu) is not finite", i,
                           i / p->frame_floats, i % p->frame_floats);
    }
    pthread_mutex_lock(&s->mu);
    rc = s->state != S_IDLE ? err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress") : 0;
    if (rc == 0) {
        s->hist = hist;
        if (nf)
            memcpy(s->conv, fl, nf * sizeof(float));
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
