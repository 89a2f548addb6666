/*
 * session.c - the pool shared by the sessions of a model, its I/O thread,
 * sessions and decode steps (engram.h, "sessions").
 *
 * Sessions queue their steps; the I/O thread takes whatever is queued into
 * a round (up to ENGRAM_ROUND_TOKENS tokens), which is two reader jobs (one
 * per table) whose requests are sorted together, so a row that several
 * sessions want at once is read once.  Reads are issued oldest round first
 * and every round's table 0 before any round's table 1 (table 0 is needed
 * at layer 1, table 1 only at layer 14); prefill chunks get what is left.
 *
 * A step is taken into exactly one round (issued == gen + 1), and every
 * request of it is answered exactly once (a bit per request in want), so a
 * step can only succeed once each of its rows was written.  Rows are
 * written into a session's buffer only under the session's lock and only
 * for the step generation that asked for them and while that step has not
 * ended, so abort, commit and close can promise that nothing is written
 * after they return, without waiting for the device.  A round entry lets
 * go of its session as soon as the session's own requests are answered,
 * whatever the rest of the round does.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "session_int.h"
#include "common/util.h"

struct timespec pool_deadline(uint64_t timeout_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t s = timeout_ns / 1000000000ull, ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000ull;
    if (s > (uint64_t)INT32_MAX * 64) /* "forever" in practice, and no overflow */
        s = (uint64_t)INT32_MAX * 64;
    ts.tv_sec += (time_t)s + (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

void pool_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void pool_wake_locked(engram_pool *p)
{
    if (p->stop)
        return; /* the reader may be gone */
    p->work = 1;
    SCHED_WAKE(&p->cv);
    reader_wake(p->r);
}

void pool_kick(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    pool_wake_locked(p);
    pthread_mutex_unlock(&p->mu);
    SCHED_POINT("kick");
}

static void ring_free(engram_pool *p, struct ring *rg)
{
    if (rg->registered)
        p->host.unreg(p->host.ctx, rg->mem, rg->len);
    free(rg->mem);
    memset(rg, 0, sizeof *rg);
}

/* The pool's memory once it is closed and nothing refers to it. */
static void pool_free_shell(engram_pool *p)
{
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void pool_handle_gone(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int last = --p->handles == 0 && p->closed;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free_shell(p);
}

int pool_ring_take(engram_pool *p, size_t len, struct ring *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    int best = -1;
    for (int i = 0; i < RING_CACHE; i++)
        if (p->rings[i].mem && p->rings[i].len >= len &&
            (best < 0 || p->rings[i].len < p->rings[best].len))
            best = i;
    if (best >= 0) {
        *out = p->rings[best];
        memset(&p->rings[best], 0, sizeof p->rings[best]);
        p->ring_reuses++;
    }
    pthread_mutex_unlock(&p->mu);
    if (out->mem)
        return 0;
    if (posix_memalign((void **)&out->mem, 4096, len) != 0) {
        out->mem = NULL;
        return -ENOMEM;
    }
    out->len = len;
    if (p->host.reg)
        out->registered = p->host.reg(p->host.ctx, out->mem, len) >= 0;
    pthread_mutex_lock(&p->mu);
    p->ring_allocs++;
    p->ring_bytes += len;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void pool_ring_give(engram_pool *p, struct ring *rg)
{
    if (!rg->mem)
        return;
    struct ring victim = *rg;
    memset(rg, 0, sizeof *rg);
    pthread_mutex_lock(&p->mu);
    if (!p->stop) {
        /* kept in a free place, else in place of the smallest kept ring if
         * that is smaller, as long as the kept rings stay within the
         * pool's ring_cache_bytes: the cache holds the largest rings seen */
        uint64_t kept_bytes = 0;
        int at = -1, small = -1;
        for (int i = 0; i < RING_CACHE; i++) {
            kept_bytes += p->rings[i].len;
            if (!p->rings[i].mem && at < 0)
                at = i;
            if (p->rings[i].mem && (small < 0 || p->rings[i].len < p->rings[small].len))
                small = i;
        }
        if (at < 0 && p->rings[small].len < victim.len)
            at = small;
        if (at >= 0 && kept_bytes - p->rings[at].len + victim.len <= p->ring_cache_cap) {
            struct ring kept = victim;
            victim = p->rings[at];
            p->rings[at] = kept;
        }
    }
    if (victim.mem)
        p->ring_bytes -= victim.len;
    pthread_mutex_unlock(&p->mu);
    if (victim.mem)
        ring_free(p, &victim);
}

/* ------------------------------------------------------------ sessions' memory */

static void session_free(engram_session *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* A round entry lets go of its session (under s->mu); 1 when the session
 * is then to be freed (its owner closed it and nothing else refers to it). */
static int entry_release(struct round_entry *en)
{
    engram_session *s = en->s;
    en->left = 0;
    return --s->refs == 0 && s->closed;
}

/* Under s->mu: table t's outstanding requests of the current step fail
 * with e (the first error of the step is kept). */
static void step_fail_table(engram_session *s, int t, const engram_error *e)
{
    if (s->remaining[t] == 0)
        return;
    if (s->rc[t] == 0)
        s->rc[t] = e->code;
    if (s->err.code == 0)
        s->err = *e;
    memset(s->want[t], 0, sizeof s->want[t]);
    s->remaining[t] = 0;
    SCHED_WAKE(&s->cv);
}

/* ------------------------------------------------------------ rounds */

/* Request index within a round: entry << 8 | token << 5 | column. */
#define IDX(e, tok, col) ((uint32_t)(e) << 8 | (uint32_t)(tok) << 5 | (uint32_t)(col))

/* One request of table t answered: its row arrived (raw) or failed (e). */
static void entry_done(struct round *rd, uint32_t idx, int t, const uint8_t *raw,
                       const engram_error *e)
{
    struct round_entry *en = &rd->e[idx >> 8];
    engram_session *s = en->s;
    unsigned tok = (idx >> 5) & 7, col = idx & 31, bit = tok * ENGRAM_COLUMNS + col;
    uint64_t b = 1ull << (bit & 63);
    pthread_mutex_lock(&s->mu);
    if (s->gen == en->gen && !s->ended && (s->want[t][bit >> 6] & b)) {
        s->want[t][bit >> 6] &= ~b;
        if (e) {
            if (s->rc[t] == 0)
                s->rc[t] = e->code;
            if (s->err.code == 0) /* the step's first failure */
                s->err = *e;
        } else if (s->rc[t] == 0) {
            uint8_t *dst = (uint8_t *)en->out +
                           ((size_t)tok * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + col) *
                               row_out_bytes(en->dtype);
            if (en->dtype == ENGRAM_F32)
                engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, (float *)dst, NULL);
            else if (en->dtype == ENGRAM_BF16)
                engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, (uint16_t *)dst, NULL);
            else
                memcpy(dst, raw, ENGRAM_ROW_BYTES);
        }
        if (--s->remaining[t] == 0 && s->rc[t] == 0)
            s->ready_ns[t] = now_ns(); /* every row in: not a failure's time */
        if (e || s->remaining[t] == 0)
            SCHED_WAKE(&s->cv);
    }
    int gone = --en->left == 0 && entry_release(en);
    pthread_mutex_unlock(&s->mu);
    if (gone)
        session_free(s);
    SCHED_POINT("io: row answered");
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

/* The step queue (under p->mu). */
static void queue_add(engram_pool *p, engram_session *s)
{
    s->qnext = NULL;
    s->qprev = p->q_tail;
    if (p->q_tail)
        p->q_tail->qnext = s;
    else
        p->q_head = s;
    p->q_tail = s;
    s->queued = 1;
}

static void queue_remove(engram_pool *p, engram_session *s)
{
    if (!s->queued)
        return;
    if (s->qprev)
        s->qprev->qnext = s->qnext;
    else
        p->q_head = s->qnext;
    if (s->qnext)
        s->qnext->qprev = s->qprev;
    else
        p->q_tail = s->qprev;
    s->qprev = s->qnext = NULL;
    s->queued = 0;
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
            queue_remove(p, s);
            /* queued means "a step not yet in a round"; checked again */
            if (s->state == S_STEP && !s->ended && s->issued != s->gen + 1 &&
                s->remaining[0] + s->remaining[1] > 0) {
                unsigned e = rd->n_entries++;
                rd->e[e] = (struct round_entry){s, s->gen, s->out, s->dtype, 0};
                for (unsigned i = 0; i < s->k; i++) {
                    if (s->masked[i])
                        continue;
                    for (int t = 0; t < ENGRAM_TABLES; t++)
                        for (unsigned c = 0; c < ENGRAM_COLUMNS; c++)
                            rd->reqs[t][n[t]++] =
                                (uint64_t)s->rows[i][t * ENGRAM_COLUMNS + c] << 32 | IDX(e, i, c);
                    rd->e[e].left += ENGRAM_ROWS_PER_TOKEN; /* each answered once */
                }
                rd->n_tokens += s->k;
                s->issued = s->gen + 1;
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
        rd->seq = ++p->round_seq;
        p->n_rounds++;
    }
}

/* Issues up to max of the rounds' reads: every round's table 0 before any
 * round's table 1, each table oldest round first.  The I/O thread's. */
static void issue_rounds(engram_pool *p, unsigned max)
{
    struct round *order[ROUNDS];
    int n = 0;
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active)
            continue;
        int at = n++;
        while (at > 0 && order[at - 1]->seq > rd->seq) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = rd;
    }
    for (int t = 0; t < ENGRAM_TABLES; t++)
        for (int i = 0; i < n && max > 0; i++)
            max -= reader_job_issue(p->r, &order[i]->job[t], max);
}

/* A round all of whose steps have ended (aborted, committed after a
 * failure, closed) stops issuing reads: its jobs fail, what is in flight is
 * collected and its entries are let go of by finish_rounds.  The I/O
 * thread's, after some step ended. */
static void drop_stale_rounds(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active || (rd->job[0].rc != 0 && rd->job[1].rc != 0))
            continue;
        int live = 0;
        for (unsigned k = 0; k < rd->n_entries && !live; k++) {
            struct round_entry *en = &rd->e[k];
            if (en->left == 0)
                continue;
            pthread_mutex_lock(&en->s->mu);
            live = en->s->gen == en->gen && !en->s->ended;
            pthread_mutex_unlock(&en->s->mu);
        }
        if (!live)
            for (int t = 0; t < ENGRAM_TABLES; t++)
                reader_job_fail(&rd->job[t], -ECANCELED, "every step of the round ended");
    }
}

/* Rounds whose jobs have ended let go of the sessions whose requests were
 * not all answered: a job that failed as a whole (the engine, or the pool
 * closing) fails what it had not delivered. */
static void finish_rounds(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active || !reader_job_finished(&rd->job[0]) || !reader_job_finished(&rd->job[1]))
            continue;
        for (unsigned k = 0; k < rd->n_entries; k++) {
            struct round_entry *en = &rd->e[k];
            if (en->left == 0)
                continue;
            engram_session *s = en->s;
            pthread_mutex_lock(&s->mu);
            if (s->gen == en->gen && !s->ended)
                for (int t = 0; t < ENGRAM_TABLES; t++) {
                    engram_error e = rd->job[t].err;
                    if (rd->job[t].rc == 0) /* cannot happen: every request is answered */
                        err_set(&e, -EIO, ENGRAM_NO_OFFSET, "table %d: a request was not answered", t);
                    step_fail_table(s, t, &e);
                }
            int gone = entry_release(en);
            pthread_mutex_unlock(&s->mu);
            if (gone)
                session_free(s);
            SCHED_POINT("io: entry released");
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

/* Fails every job of the rounds (not yet failed) with e: their reads in
 * flight are then only collected. */
static void fail_rounds(engram_pool *p, const engram_error *e)
{
    for (int ri = 0; ri < ROUNDS; ri++)
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (p->rounds[ri].active && p->rounds[ri].job[t].rc == 0) {
                p->rounds[ri].job[t].rc = e->code;
                p->rounds[ri].job[t].err = *e;
                p->rounds[ri].job[t].live = 0;
            }
}

/* Fails every queued step with e and empties the queue.  Under p->mu. */
static void fail_queue(engram_pool *p, const engram_error *e)
{
    while (p->q_head) {
        engram_session *s = p->q_head;
        queue_remove(p, s);
        pthread_mutex_lock(&s->mu);
        for (int t = 0; t < ENGRAM_TABLES; t++)
            step_fail_table(s, t, e);
        pthread_mutex_unlock(&s->mu);
    }
}

/* The engine failed as a whole (submit or reap, after retries): every read
 * in flight is collected and every step and prefill chunk that had reads
 * fails with the error.  The pool goes on with later steps unless the
 * reader itself is broken (its engine stopped answering). */
static void fail_everything(engram_pool *p, int rc, const char *what)
{
    engram_error e;
    err_set(&e, rc, ENGRAM_NO_OFFSET, "the pool's I/O engine failed (%s): %s", what,
            engram_strerror(rc));
    fail_rounds(p, &e);
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

/* Every round entry lets go of its session, failing its step with e.  For
 * a broken reader, whose reads will never be collected: their jobs have
 * failed, so nothing would be delivered, and the reader is never reaped
 * again (this thread stops calling it, its close keeps its memory). */
static void release_rounds(engram_pool *p, const engram_error *e)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active)
            continue;
        for (unsigned k = 0; k < rd->n_entries; k++) {
            struct round_entry *en = &rd->e[k];
            if (en->left == 0)
                continue;
            engram_session *s = en->s;
            pthread_mutex_lock(&s->mu);
            if (s->gen == en->gen && !s->ended)
                for (int t = 0; t < ENGRAM_TABLES; t++)
                    step_fail_table(s, t, e);
            int gone = entry_release(en);
            pthread_mutex_unlock(&s->mu);
            if (gone)
                session_free(s);
        }
        pthread_mutex_lock(&p->mu);
        p->step_read += rd->job[0].rows_read + rd->job[1].rows_read;
        pthread_mutex_unlock(&p->mu);
        rd->active = 0;
    }
}

/* The reader is broken: its engine stopped answering with reads in flight,
 * and they will never be collected.  Every step queued or in a round and
 * every prefill fails at once with the pool's error; their owners may
 * reuse or free their buffers. */
static void pool_dead(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    engram_error e = p->broken_err;
    fail_queue(p, &e);
    pthread_mutex_unlock(&p->mu);
    release_rounds(p, &e);
    prefetch_detach_all(p, &e);
    SCHED_POINT("io: dead");
}

static int pool_is_broken(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int b = p->broken;
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* The pool closes: every step and prefill still in progress fails with
 * -ESHUTDOWN, every read in flight is collected (unless the reader is
 * broken), and every session and prefill is let go of. */
static void shutdown_io(engram_pool *p)
{
    engram_error e;
    err_set(&e, -ESHUTDOWN, ENGRAM_NO_OFFSET, "the pool was closed");
    pthread_mutex_lock(&p->mu);
    fail_queue(p, &e);
    int broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (!broken) {
        fail_rounds(p, &e);
        prefetch_fail_all(p, e.code, &e);
        reader_drain_all(p->r, 1);
    }
    release_rounds(p, &e);
    prefetch_detach_all(p, &e);
}

static void *io_main(void *arg)
{
    engram_pool *p = arg;
    SCHED_THREAD_BEGIN("io");
    engram_reader *r = p->r;
    uint64_t ends_seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->broken) {
            /* dead: fail whatever arrives until the pool closes */
            if (!p->q_head && !p->pf_head)
                SCHED_WAIT(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            pool_dead(p);
            continue;
        }
        p->work = 0;
        intake(p);
        int ended = p->ends != ends_seen;
        ends_seen = p->ends;
        pthread_mutex_unlock(&p->mu);
        SCHED_POINT("io: intake");
        if (ended)
            drop_stale_rounds(p);

        /* steps first (their rows are on an engine's critical path), but
         * prompts with reads to do keep a few slots, so that a saturated
         * decode load cannot starve them */
        unsigned guard = 0, free_slots = reader_free_slots(r);
        uint64_t delay_end = prefetch_progress(p, &guard);
        issue_rounds(p, free_slots > guard ? free_slots - guard : 0);
        prefetch_issue(p, reader_free_slots(r), guard);
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
            SCHED_POINT("io: reaped");
        } else if (reader_in_flight(r) > 0) {
            struct timespec ts = {0, 50000}; /* reads the engine refused for now */
            nanosleep(&ts, NULL);
        } else {
            pthread_mutex_lock(&p->mu);
            if (!p->work && !p->stop && !p->q_head && !rounds_active(p) && !prefetch_collectable(p)) {
                if (delay_end) { /* until a table 1 may start */
                    uint64_t now = now_ns();
                    struct timespec ts = pool_deadline(delay_end > now ? delay_end - now : 0);
                    SCHED_TIMEDWAIT(&p->cv, &p->mu, &ts);
                } else {
                    SCHED_WAIT(&p->cv, &p->mu);
                }
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
    shutdown_io(p);
    SCHED_THREAD_END();
    return NULL;
}

/* ------------------------------------------------------------ pool */

int engram_pool_open(const engram_model *m, const engram_pool_opts *opts, engram_pool **out,
                     engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->rounds = calloc(ROUNDS, sizeof *p->rounds))) {
        free(p);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    p->m = m;
    p->hasher = engram_model_hasher(m);
    if (opts && opts->reader.host.reg && opts->reader.host.unreg)
        p->host = opts->reader.host;
    p->ring_cache_cap = opts && opts->ring_cache_bytes ? opts->ring_cache_bytes : ENGRAM_RING_CACHE_DEFAULT;
    int rc = reader_open_wakeable(m, opts ? &opts->reader : NULL, &p->r, err);
    if (rc < 0) {
        free(p->rounds);
        free(p);
        return rc;
    }
    engram_reader_get_stats(p->r, &p->io0); /* before the I/O thread owns the reader */
    p->pf_min_slots = opts && opts->prefill_min_slots ? opts->prefill_min_slots : (p->io0.depth + 7) / 8;
    if (p->pf_min_slots > p->io0.depth)
        p->pf_min_slots = p->io0.depth;
    /* at most a quarter of a small depth (8 of 8 would leave prompts only
     * their minimum) */
    p->step_reserve = p->io0.depth / 4 < STEP_RESERVE ? p->io0.depth / 4 : STEP_RESERVE;
    pthread_mutex_init(&p->mu, NULL);
    pool_cond_init(&p->cv);
    rc = thread_start(&p->thread, 256u << 10, io_main, p);
    if (rc < 0) {
        engram_reader_close(p->r);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->rounds);
        free(p);
        return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start the pool's I/O thread: %s",
                       engram_strerror(rc));
    }
    SCHED_SPAWNED();
    *out = p;
    return 0;
}

void engram_pool_close(engram_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    pool_wake_locked(p);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    SCHED_JOIN(p->thread);
    engram_reader_close(p->r);
    p->r = NULL;
    free(p->rounds);
    p->rounds = NULL;
    /* the kept rings go first: once closed is published, the last handle's
     * close may free the pool (and its hooks) at any moment; a ring given
     * back meanwhile is freed at once (stop is set) */
    struct ring kept[RING_CACHE];
    pthread_mutex_lock(&p->mu);
    memcpy(kept, p->rings, sizeof kept);
    memset(p->rings, 0, sizeof p->rings);
    for (int i = 0; i < RING_CACHE; i++)
        p->ring_bytes -= kept[i].len;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < RING_CACHE; i++)
        if (kept[i].mem)
            ring_free(p, &kept[i]);
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    int last = p->handles == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free_shell(p);
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
    st->prefill_rings_allocated = p->ring_allocs;
    st->prefill_rings_reused = p->ring_reuses;
    st->prefill_ring_bytes = p->ring_bytes;
    st->closed = p->stop;
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

int pool_refuses(const engram_pool *p, engram_error *err)
{
    if (p->stop)
        return err_set(err, -ESHUTDOWN, ENGRAM_NO_OFFSET, "the pool was closed");
    if (p->broken) {
        if (err)
            *err = p->broken_err;
        return -EIO;
    }
    return 0;
}

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
        session_free(s);
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
    queue_remove(p, s);
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
        session_free(s);
    pool_handle_gone(p);
}

void engram_session_history(const engram_session *s, engram_history *h)
{
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
    s->begin_ns = now_ns();
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        s->remaining[t] = s->nrows[t] = live * ENGRAM_COLUMNS;
        s->rc[t] = 0;
        s->ready_ns[t] = live ? 0 : s->begin_ns;
    }
    s->err.code = 0;
    s->state = S_STEP;
    p->steps++;
    if (live && !s->queued)
        queue_add(p, s);
    pthread_mutex_unlock(&s->mu);
}

/* The i-th request of a begin call, however the caller laid them out. */
typedef void (*req_at_fn)(const void *ctx, size_t i, engram_step_req *q);

/* Validates every request, then installs and queues all of them at once
 * (one intake takes them together) or none. */
static int begin_steps(req_at_fn at, const void *ctx, size_t n, engram_dtype dtype, engram_error *err)
{
    if (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad dtype %d", (int)dtype);
    engram_step_req q, o;
    at(ctx, 0, &q);
    engram_pool *p = q.s ? q.s->p : NULL;
    size_t first = 0;
    for (size_t i = 0; i < n; i++) {
        at(ctx, i, &q);
        if (!q.s || q.s->p != p || !q.out || !q.tokens)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu: NULL or of another pool", i);
        if (q.k == 0 || q.k > ENGRAM_MAX_DRAFT)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu: k = %u (k must be 1..%u)", i,
                           q.k, ENGRAM_MAX_DRAFT);
        for (size_t j = 0; j < i; j++) {
            at(ctx, j, &o);
            if (o.s == q.s)
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "session %zu appears twice (also at %zu)",
                               i, j);
        }
        int rc = check_tokens(p, q.tokens, q.k, first, err);
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
    if (!s || !tokens || !out || k == 0 || k > ENGRAM_MAX_DRAFT)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument (k must be 1..%u)",
                       ENGRAM_MAX_DRAFT);
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
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    struct batch_args b = {ss, tokens, mask, outs};
    return begin_steps(req_of_batch, &b, n, dtype, err);
}

/* Waits (up to timeout_ns; 0: not at all) until table t's rows of the
 * current step are in, it failed or it ended.  Still to come: -EAGAIN for
 * a poll, else -ETIMEDOUT. */
static int step_table_rc(engram_session *s, int t, uint64_t timeout_ns, int poll, engram_error *err)
{
    if (!s || t < 0 || t >= ENGRAM_TABLES)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL session or bad table %d", t);
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
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no step in progress");
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
