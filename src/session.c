/*
 * session.c - the pool shared by the sessions of a model, its I/O thread,
 * sessions and decode steps (engram.h, "sessions").
 *
 * Sessions queue their steps; the I/O thread takes whatever is queued into
 * a round (up to ENGRAM_ROUND_TOKENS tokens), which is two reader jobs (one
 * per table, table 0 first) whose requests are sorted together, so a row
 * that several sessions want at once is read once.  Rows are written into
 * a session's buffer only under the session's lock and only for the step
 * generation that asked for them, so abort and commit can promise that
 * nothing is written after they return, without waiting for the device.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "session_int.h"
#include "util.h"

uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t row_bytes(int dtype)
{
    return dtype == ENGRAM_F32 ? ENGRAM_ROW_VALUES * 4
         : dtype == ENGRAM_BF16 ? ENGRAM_ROW_VALUES * 2 : ENGRAM_ROW_BYTES;
}

void pool_kick(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->work = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    reader_wake(p->r);
}

/* ------------------------------------------------------------ rounds */

/* Request index within a round: entry << 8 | token << 5 | column. */
#define IDX(e, tok, col) ((uint32_t)(e) << 8 | (uint32_t)(tok) << 5 | (uint32_t)(col))

/* One request of table t done (row written, or failed with e). */
static void entry_done(struct round *rd, uint32_t idx, int t, const uint8_t *raw,
                       const engram_error *e)
{
    struct round_entry *en = &rd->e[idx >> 8];
    engram_session *s = en->s;
    unsigned tok = (idx >> 5) & 7, col = idx & 31;
    pthread_mutex_lock(&s->mu);
    if (s->gen == en->gen && s->remaining[t] > 0) {
        if (e) {
            if (s->rc[t] == 0)
                s->rc[t] = e->code;
            if (s->err.code == 0) /* the step's first failure */
                s->err = *e;
        } else if (!s->cancelled && s->rc[t] == 0) {
            uint8_t *dst = (uint8_t *)en->out +
                           ((size_t)tok * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + col) *
                               row_bytes(en->dtype);
            if (en->dtype == ENGRAM_F32)
                engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, (float *)dst, NULL);
            else if (en->dtype == ENGRAM_BF16)
                engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, (uint16_t *)dst, NULL);
            else
                memcpy(dst, raw, ENGRAM_ROW_BYTES);
        }
        if (--s->remaining[t] == 0)
            s->ready_ns[t] = pool_now_ns();
        if (e || s->remaining[t] == 0)
            pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static int round_deliver(struct rjob *j, const uint8_t *raw, size_t lo, size_t hi, const char **why)
{
    struct round *rd = j->ctx;
    if (row_check_reason(raw, why) < 0) {
        /* a row that does not decode fails the steps that asked for it */
        engram_error e;
        uint32_t row = (uint32_t)(j->reqs[lo] >> 32);
        err_set_row(&e, -EDOM, row, "row %u of table %d: %s", row, j->table, *why);
        for (size_t i = lo; i < hi; i++)
            entry_done(rd, (uint32_t)j->reqs[i], j->table, NULL, &e);
        return 1; /* handled: the job goes on, the row is not cached */
    }
    for (size_t i = lo; i < hi; i++)
        entry_done(rd, (uint32_t)j->reqs[i], j->table, raw, NULL);
    return 0;
}

static void round_failed(struct rjob *j, size_t lo, size_t hi, const engram_error *e)
{
    for (size_t i = lo; i < hi; i++)
        entry_done(j->ctx, (uint32_t)j->reqs[i], j->table, NULL, e);
}

/* Moves queued steps into free rounds and starts their jobs.  Under p->mu. */
static void intake(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS && p->q_head; ri++) {
        struct round *rd = &p->rounds[ri];
        if (rd->active)
            continue;
        size_t n[ENGRAM_TABLES] = {0, 0};
        rd->n_entries = rd->n_tokens = 0;
        while (p->q_head && rd->n_entries < ENGRAM_ROUND_TOKENS) {
            engram_session *s = p->q_head;
            pthread_mutex_lock(&s->mu);
            if (rd->n_tokens + s->k > ENGRAM_ROUND_TOKENS) {
                pthread_mutex_unlock(&s->mu);
                break;
            }
            p->q_head = s->qnext;
            if (!p->q_head)
                p->q_tail = NULL;
            s->queued = 0;
            if (!s->cancelled && s->remaining[0] + s->remaining[1] > 0) {
                unsigned e = rd->n_entries++;
                rd->e[e] = (struct round_entry){s, s->gen, s->out, s->dtype};
                for (unsigned i = 0; i < s->k; i++) {
                    if (s->masked[i])
                        continue;
                    for (int t = 0; t < ENGRAM_TABLES; t++)
                        for (unsigned c = 0; c < ENGRAM_COLUMNS; c++)
                            rd->reqs[t][n[t]++] =
                                (uint64_t)s->rows[i][t * ENGRAM_COLUMNS + c] << 32 | IDX(e, i, c);
                }
                rd->n_tokens += s->k;
                s->refs++;
            }
            pthread_mutex_unlock(&s->mu);
        }
        if (rd->n_entries == 0)
            continue;
        for (int t = 0; t < ENGRAM_TABLES; t++) {
            struct rjob *j = &rd->job[t];
            memset(j, 0, sizeof *j);
            j->table = t;
            j->dtype = ENGRAM_RAW;
            j->reqs = rd->reqs[t];
            j->nreq = n[t];
            j->deliver = round_deliver;
            j->failed = round_failed;
            j->ctx = rd;
            reader_job_start(p->r, j);
            p->step_requested += n[t];
        }
        rd->active = 1;
        p->n_rounds++;
    }
}

/* Rounds whose reads are all back release their sessions.  A job that
 * failed as a whole (the engine) fails what it had not delivered. */
static void finish_rounds(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active || !reader_job_finished(&rd->job[0]) || !reader_job_finished(&rd->job[1]))
            continue;
        for (unsigned e = 0; e < rd->n_entries; e++) {
            engram_session *s = rd->e[e].s;
            pthread_mutex_lock(&s->mu);
            if (s->gen == rd->e[e].gen)
                for (int t = 0; t < ENGRAM_TABLES; t++)
                    if (rd->job[t].rc != 0 && s->remaining[t] > 0) {
                        if (s->err.code == 0)
                            s->err = rd->job[t].err;
                        if (s->rc[t] == 0)
                            s->rc[t] = rd->job[t].rc;
                        s->remaining[t] = 0;
                    }
            s->refs--;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_lock(&p->mu);
        p->step_read += rd->job[0].rows_read + rd->job[1].rows_read;
        pthread_mutex_unlock(&p->mu);
        rd->active = 0;
    }
}

static int rounds_active(const engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++)
        if (p->rounds[ri].active)
            return 1;
    return 0;
}

/* ------------------------------------------------------------ the I/O thread */

/* The engine failed as a whole (submit or reap, after retries): every read
 * in flight is collected and every step and prefill chunk that had reads
 * fails with the error.  The pool goes on with later steps unless the
 * reader itself is broken (its engine stopped answering). */
static void fail_everything(engram_pool *p, int rc, const char *what)
{
    engram_error e;
    err_set(&e, rc, ENGRAM_NO_OFFSET, "the pool's I/O engine failed (%s): %s", what,
            engram_strerror(rc));
    for (int ri = 0; ri < ROUNDS; ri++)
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (p->rounds[ri].active && p->rounds[ri].job[t].rc == 0) {
                p->rounds[ri].job[t].rc = rc;
                p->rounds[ri].job[t].err = e;
                p->rounds[ri].job[t].live = 0;
            }
    prefetch_fail_all(p, rc, &e);
    reader_drain_all(p->r, 1);
    engram_error be;
    if (reader_broken(p->r, &be) < 0) {
        pthread_mutex_lock(&p->mu);
        if (!p->broken) {
            p->broken = 1;
            p->broken_err = be;
        }
        pthread_mutex_unlock(&p->mu);
    }
}

/* Fails a session's step with the broken pool's error.  Under s->mu. */
static void step_fail_dead(engram_session *s, const engram_error *e)
{
    for (int t = 0; t < ENGRAM_TABLES; t++)
        if (s->remaining[t] > 0) {
            if (s->err.code == 0)
                s->err = *e;
            if (s->rc[t] == 0)
                s->rc[t] = -EIO;
            s->remaining[t] = 0;
        }
    pthread_cond_broadcast(&s->cv);
}

/* The reader is broken: its engine stopped answering with reads in flight,
 * and they will never be collected.  Every step queued or in a round and
 * every prefill fails at once with the pool's error, and their owners may
 * reuse or free their buffers: nothing can be delivered into them any more
 * (their jobs have failed, so a late completion would only be collected,
 * and a broken reader is never reaped again: this thread stops calling it,
 * and its close keeps its memory without reaping).  The jobs' own structs
 * may then go (a prefill's is freed by its owner); the slots that still
 * name them are never looked at again. */
static void pool_dead(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    engram_error e = p->broken_err;
    for (engram_session *s = p->q_head; s; s = s->qnext) {
        pthread_mutex_lock(&s->mu);
        s->queued = 0;
        step_fail_dead(s, &e);
        pthread_mutex_unlock(&s->mu);
    }
    p->q_head = p->q_tail = NULL;
    engram_prefill *list = p->pf_head;
    p->pf_head = NULL;
    pthread_mutex_unlock(&p->mu);
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active)
            continue;
        for (unsigned k = 0; k < rd->n_entries; k++) {
            engram_session *s = rd->e[k].s;
            pthread_mutex_lock(&s->mu);
            if (s->gen == rd->e[k].gen)
                step_fail_dead(s, &e);
            s->refs--;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
        }
        rd->active = 0;
    }
    for (engram_prefill *pf = list, *next; pf; pf = next) {
        next = pf->next_pf;
        pf->active[0] = pf->active[1] = 0;
        /* the last touch: the consumer may free it as soon as it sees this */
        pthread_mutex_lock(&pf->mu);
        if (pf->rc == 0) {
            pf->rc = -EIO;
            pf->err = e;
        }
        pf->detached = 1;
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
    }
}

static int pool_is_broken(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int b = p->broken;
    pthread_mutex_unlock(&p->mu);
    return b;
}

static void *io_main(void *arg)
{
    engram_pool *p = arg;
    engram_reader *r = p->r;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->broken) {
            /* Dead: fail whatever arrives (a step or prefill may have passed
             * its check just before the reader broke) until the pool closes. */
            if (!p->q_head && !p->pf_head)
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            pool_dead(p);
            continue;
        }
        p->work = 0;
        intake(p);
        pthread_mutex_unlock(&p->mu);

        /* steps first: their rows are on an engine's critical path */
        for (int ri = 0; ri < ROUNDS; ri++)
            for (int t = 0; t < ENGRAM_TABLES; t++)
                if (p->rounds[ri].active)
                    reader_job_issue(r, &p->rounds[ri].job[t], UINT32_MAX);
        unsigned budget = reader_free_slots(r);
        int timed = prefetch_service(p, &budget);
        int rc = reader_push_jobs(r);
        if (rc < 0)
            fail_everything(p, rc, "submit");
        if (pool_is_broken(p)) {
            pool_dead(p);
            continue;
        }
        finish_rounds(p);

        if (reader_reaping(r) > 0) {
            pthread_mutex_lock(&p->mu);
            int w = p->work;
            pthread_mutex_unlock(&p->mu);
            int n = reader_pump(r, w ? 0 : 1); /* wake() ends the wait early */
            if (n < 0)
                fail_everything(p, n, "reap");
            if (pool_is_broken(p)) {
                pool_dead(p);
                continue;
            }
            finish_rounds(p);
        } else if (reader_in_flight(r) > 0) {
            struct timespec ts = {0, 50000}; /* reads the engine refused for now */
            nanosleep(&ts, NULL);
        } else {
            pthread_mutex_lock(&p->mu);
            if (!p->work && !p->stop && !p->q_head && !rounds_active(p) && !prefetch_collectable(p)) {
                if (timed) {
                    struct timespec ts;
                    clock_gettime(CLOCK_REALTIME, &ts);
                    ts.tv_nsec += 200000;
                    if (ts.tv_nsec >= 1000000000) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000;
                    }
                    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
                } else {
                    pthread_cond_wait(&p->cv, &p->mu);
                }
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
    /* closing: nothing may stay in flight (a broken reader's reads will
     * never come back: its close keeps its memory instead) */
    if (!pool_is_broken(p)) {
        reader_drain_all(r, 1);
        finish_rounds(p);
    }
    return NULL;
}

/* ------------------------------------------------------------ pool */

int engram_pool_open(const engram_model *m, const engram_pool_opts *opts, engram_pool **out,
                     engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_pool *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    p->m = m;
    p->hasher = engram_model_hasher(m);
    if (opts && opts->reader.host.reg && opts->reader.host.unreg)
        p->host = opts->reader.host;
    int rc = reader_open_wakeable(m, opts ? &opts->reader : NULL, &p->r, err);
    if (rc < 0) {
        free(p);
        return rc;
    }
    for (int ri = 0; ri < ROUNDS; ri++)
        p->rounds[ri].p = p;
    engram_reader_get_stats(p->r, &p->io0); /* before the I/O thread owns the reader */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    rc = thread_start(&p->thread, 256u << 10, io_main, p);
    if (rc < 0) {
        engram_reader_close(p->r);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start the pool's I/O thread: %s",
                       engram_strerror(rc));
    }
    p->started = 1;
    *out = p;
    return 0;
}

void engram_pool_close(engram_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    reader_wake(p->r);
    pthread_join(p->thread, NULL);
    engram_reader_close(p->r);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void engram_pool_get_stats(engram_pool *p, engram_pool_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&p->mu);
    st->steps = p->steps;
    st->rounds = p->n_rounds;
    st->step_rows_requested = p->step_requested;
    st->step_rows_read = p->step_read;
    st->prefill_chunks = p->pf_chunks;
    st->prefill_rows_requested = p->pf_requested;
    st->prefill_rows_read = p->pf_read;
    int broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    /* the reader's counters belong to the I/O thread: only its fixed facts,
     * taken at open, are reported, and whether it is broken */
    st->io = p->io0;
    st->io.broken = broken;
    st->io.rows_requested = st->step_rows_requested + st->prefill_rows_requested;
    st->io.rows_read = st->step_rows_read + st->prefill_rows_read;
}

/* ------------------------------------------------------------ sessions */

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
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return 0;
}

void engram_session_close(engram_session *s)
{
    if (!s)
        return;
    if (s->state == S_PREFILL && s->pf)
        engram_prefill_cancel(s->pf);
    engram_step_abort(s);
    engram_pool *p = s->p;
    pthread_mutex_lock(&p->mu); /* out of the queue */
    if (s->queued) {
        engram_session **pp = &p->q_head, *prev = NULL;
        while (*pp && *pp != s) {
            prev = *pp;
            pp = &(*pp)->qnext;
        }
        if (*pp) {
            *pp = s->qnext;
            if (p->q_tail == s)
                p->q_tail = prev;
        }
        s->queued = 0;
    }
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&s->mu); /* no round may refer to it */
    while (s->refs > 0)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

void engram_session_history(const engram_session *s, engram_history *h)
{
    *h = s->hist;
}

int engram_session_set_history(engram_session *s, const engram_history *h, engram_error *err)
{
    if (!s || !h)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (s->state != S_IDLE)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress");
    uint32_t cv = engram_hasher_layout(s->p->hasher)->compressed_vocab;
    for (int i = 0; i < ENGRAM_HISTORY; i++)
        if (h->id[i] != ENGRAM_DEAD && (h->id[i] < 0 || (uint32_t)h->id[i] >= cv))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "history entry %d (%d) is neither -1 nor < %u",
                           i, h->id[i], cv);
    s->hist = *h;
    return 0;
}

int engram_session_restore(engram_session *s, const uint32_t *tokens, const uint8_t *mask,
                           size_t n, engram_error *err)
{
    if (!s || (n > 0 && !tokens))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (s->state != S_IDLE)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress");
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
    s->hist = h;
    return 0;
}

/* Hashes a step into the session (under s->mu: the I/O thread may be
 * reading an aborted step's queued data).  Tokens validated by the caller. */
static void set_step(engram_session *s, const uint32_t *tokens, const uint8_t *mask, unsigned k,
                     engram_dtype dtype, void *out)
{
    pthread_mutex_lock(&s->mu);
    s->gen++;
    s->k = k;
    s->dtype = dtype;
    s->out = out;
    engram_history h = s->hist;
    unsigned live = 0;
    for (unsigned i = 0; i < k; i++) {
        int masked = mask && !mask[i];
        engram_hash_token(s->p->hasher, &h, tokens[i], masked, s->rows[i]);
        s->after[i] = h;
        s->masked[i] = (uint8_t)masked;
        live += !masked;
    }
    s->begin_ns = pool_now_ns();
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        s->remaining[t] = s->nrows[t] = live * ENGRAM_COLUMNS;
        s->rc[t] = 0;
        s->ready_ns[t] = live ? 0 : s->begin_ns;
    }
    s->cancelled = 0;
    s->err.code = 0;
    pthread_mutex_unlock(&s->mu);
    s->state = S_STEP;
}

/* Queues a session whose step has rows to read.  Under p->mu. */
static void enqueue(engram_pool *p, engram_session *s)
{
    p->steps++;
    if (s->remaining[0] + s->remaining[1] == 0 || s->queued)
        return;
    s->qnext = NULL;
    if (p->q_tail)
        p->q_tail->qnext = s;
    else
        p->q_head = s;
    p->q_tail = s;
    s->queued = 1;
}

static int check_tokens(const engram_pool *p, const uint32_t *tokens, size_t n, engram_error *err)
{
    uint32_t vocab = engram_hasher_layout(p->hasher)->vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "token %zu (%u) is not < vocab %u", i,
                           tokens[i], vocab);
    return 0;
}

static int pool_usable(engram_pool *p, engram_error *err)
{
    pthread_mutex_lock(&p->mu);
    int broken = p->broken;
    if (broken && err)
        *err = p->broken_err;
    pthread_mutex_unlock(&p->mu);
    return broken ? -EIO : 0;
}

int engram_step_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, unsigned k,
                      engram_dtype dtype, void *out, engram_error *err)
{
    if (!s || !tokens || !out || k == 0 || k > ENGRAM_MAX_DRAFT ||
        (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument (k must be 1..%u)",
                       ENGRAM_MAX_DRAFT);
    if (s->state != S_IDLE)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress");
    int rc = check_tokens(s->p, tokens, k, err);
    if (rc == 0)
        rc = pool_usable(s->p, err);
    if (rc < 0)
        return rc;
    set_step(s, tokens, mask, k, dtype, out);
    pthread_mutex_lock(&s->p->mu);
    enqueue(s->p, s);
    s->p->work = 1;
    pthread_cond_signal(&s->p->cv);
    pthread_mutex_unlock(&s->p->mu);
    reader_wake(s->p->r);
    return 0;
}

int engram_step_begin_batch(engram_session *const *ss, const uint32_t *tokens, const uint8_t *mask,
                            size_t n, engram_dtype dtype, void *const *outs, engram_error *err)
{
    if (n == 0)
        return 0;
    if (!ss || !tokens || !outs || (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    engram_pool *p = ss[0] ? ss[0]->p : NULL;
    for (size_t i = 0; i < n; i++) {
        if (!ss[i] || ss[i]->p != p || !outs[i])
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu: NULL or of another pool", i);
        for (size_t j = 0; j < i; j++)
            if (ss[j] == ss[i])
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu appears twice (also at %zu)",
                               i, j);
        if (ss[i]->state != S_IDLE)
            return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "session %zu: a step or prefill is in progress", i);
    }
    int rc = check_tokens(p, tokens, n, err);
    if (rc == 0)
        rc = pool_usable(p, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        set_step(ss[i], tokens + i, mask ? mask + i : NULL, 1, dtype, outs[i]);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++)
        enqueue(p, ss[i]);
    p->work = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    reader_wake(p->r);
    return 0;
}

static int step_table_rc(engram_session *s, int t, int block, engram_error *err)
{
    pthread_mutex_lock(&s->mu);
    while (block && s->remaining[t] > 0 && s->rc[t] == 0)
        pthread_cond_wait(&s->cv, &s->mu);
    int rc = s->rc[t] ? s->rc[t] : s->remaining[t] > 0 ? -EAGAIN : 0;
    if (rc < 0 && rc != -EAGAIN && err)
        *err = s->err;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int engram_step_wait(engram_session *s, int t, engram_error *err)
{
    if (!s || t < 0 || t >= ENGRAM_TABLES || s->state != S_STEP)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress (or a bad table)");
    return step_table_rc(s, t, 1, err);
}

int engram_step_poll(engram_session *s, int t, engram_error *err)
{
    if (!s || t < 0 || t >= ENGRAM_TABLES || s->state != S_STEP)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress (or a bad table)");
    return step_table_rc(s, t, 0, err);
}

/* Ends the step: nothing is written into its buffer afterwards. */
static void end_step(engram_session *s)
{
    pthread_mutex_lock(&s->mu);
    s->cancelled = 1;
    pthread_mutex_unlock(&s->mu);
    s->state = S_IDLE;
}

int engram_step_commit(engram_session *s, unsigned j, engram_error *err)
{
    if (!s || s->state != S_STEP)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress");
    if (j > s->k)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "commit of %u tokens of a %u-token step", j,
                       s->k);
    int rc = 0;
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++)
        rc = step_table_rc(s, t, 1, err);
    if (rc == 0 && j > 0)
        s->hist = s->after[j - 1];
    end_step(s);
    return rc;
}

void engram_step_abort(engram_session *s)
{
    if (s && s->state == S_STEP)
        end_step(s);
}

void engram_step_get_info(const engram_session *s, engram_step_info *info)
{
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
