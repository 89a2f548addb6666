/*
 * session.c - sessions and their decode steps (engram.h, "sessions"):
 * open, close (which never waits), history, restore; a step begins by
 * hashing its tokens and queueing the session for the I/O thread
 * (rounds.c), is waited for per table (timed too), and ends by commit or
 * abort.  Nothing is written into a step's buffer after commit, abort or
 * close return (rounds.c writes only for the live step generation).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_int.h"
#include "common/util.h"

int engram_session_open(engram_pool *p, engram_session **out, engram_error *err)
{
    if (!p || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_session *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    s->p = p;
    engram_history_reset(&s->hist);
    pthread_mutex_init(&s->mu, NULL);
    pool_cond_init(&s->cv);
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

int engram_session_set_history(engram_session *s, const engram_history *h, engram_error *err)
{
    if (!s || !h)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    uint32_t cv = engram_hasher_layout(s->p->hasher)->compressed_vocab;
    for (int i = 0; i < ENGRAM_HISTORY; i++)
        if (h->id[i] != ENGRAM_DEAD && (h->id[i] < 0 || (uint32_t)h->id[i] >= cv))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "history entry %d (%d) is neither -1 nor < %u",
                           i, h->id[i], cv);
    return set_hist(s, h, err);
}

int engram_session_restore(engram_session *s, const uint32_t *tokens, const uint8_t *mask,
                           size_t n, engram_error *err)
{
    if (!s || (n > 0 && !tokens))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
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

static int check_tokens(const engram_pool *p, const uint32_t *tokens, size_t n, size_t first,
                        engram_error *err)
{
    uint32_t vocab = engram_hasher_layout(p->hasher)->vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "token %zu (%u) is not < vocab %u", first + i,
                           tokens[i], vocab);
    return 0;
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
    unsigned live = 0;
    memset(s->want, 0, sizeof s->want);
    for (unsigned i = 0; i < q->k; i++) {
        int masked = q->mask && !q->mask[i];
        engram_hash_token(p->hasher, &h, q->tokens[i], masked, s->rows[i]);
        s->after[i] = h;
        s->masked[i] = (uint8_t)masked;
        live += !masked;
        if (!masked)
            for (int t = 0; t < ENGRAM_TABLES; t++)
                for (unsigned c = 0; c < ENGRAM_COLUMNS; c++) {
                    unsigned bit = i * ENGRAM_COLUMNS + c;
                    s->want[t][bit >> 6] |= 1ull << (bit & 63);
                }
    }
    s->begin_ns = util_now_ns();
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        s->remaining[t] = s->nrows[t] = live * ENGRAM_COLUMNS;
        s->rc[t] = 0;
        s->ready_ns[t] = live ? 0 : s->begin_ns;
    }
    s->err.code = 0;
    s->state = S_STEP;
    p->steps++;
    if (live && !s->queued)
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
        rc = check_tokens(p, q.tokens, q.k, first, err);
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
    if (t < 0 || t >= ENGRAM_TABLES)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not 0 or 1", t);
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
    if (rc == 0 && j > 0)
        s->hist = s->after[j - 1];
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
