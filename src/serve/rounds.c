/*
 * rounds.c - the I/O thread's part of decode steps: the step queue, and
 * rounds of queued steps of many sessions read as two jobs (one per
 * table) whose requests are sorted together, so a row that several
 * sessions want at once is read once.  Reads are issued oldest round
 * first and every round's table 0 before any round's table 1.
 *
 * A step is taken into exactly one round (issued == gen + 1), and every
 * request of it is answered exactly once (a bit per request in want), so a
 * step can only succeed once each of its rows was written.  Rows are
 * written into a session's buffer only under the session's lock, only for
 * the step generation that asked for them and only while that step has
 * not ended.  A round entry lets go of its session as soon as the
 * session's own requests are answered, whatever the rest of the round does.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"
#include "common/util.h"
#include "hash/ple.h"

/* A round entry lets go of its session (under s->mu); 1 when the session
 * is then to be freed (its owner closed it and nothing else refers to it). */
int rounds_entry_release(struct round_entry *en)
{
    engram_session *s = en->s;
    en->left = 0;
    return --s->refs == 0 && s->closed;
}

/* Under s->mu: table t's outstanding requests of the current step fail
 * with e (the first error of the step is kept). */
void rounds_step_fail(engram_session *s, int t, const engram_error *e)
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

/* Request index within a round: entry << 8 | token << 5 | column. */
#define IDX(e, tok, col) ((uint32_t)(e) << 8 | (uint32_t)(tok) << 5 | (uint32_t)(col))

/* One request of table t answered: its row arrived (raw) or failed (e). */
static void entry_done(struct round *rd, uint32_t idx, int t, int bf16_rows, const uint8_t *raw,
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
            uint8_t *dst = (uint8_t *)en->out + (size_t)tok * en->tok_bytes + (size_t)t * en->table_bytes +
                           (size_t)col * en->row_bytes;
            if (bf16_rows && en->dtype == ENGRAM_F32) /* PLE: BF16 as stored, widened or copied */
                rows_bf16_widen(raw, PLE_ROW_VALUES, (float *)dst);
            else if (bf16_rows)
                memcpy(dst, raw, PLE_ROW_BYTES);
            else if (en->dtype == ENGRAM_F32)
                engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, (float *)dst, NULL);
            else if (en->dtype == ENGRAM_BF16)
                engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, (uint16_t *)dst, NULL);
            else
                memcpy(dst, raw, ENGRAM_ROW_BYTES);
        }
        if (--s->remaining[t] == 0 && s->rc[t] == 0)
            s->ready_ns[t] = util_now_ns(); /* every row in: not a failure's time */
        if (e || s->remaining[t] == 0)
            SCHED_WAKE(&s->cv);
    }
    int gone = --en->left == 0 && rounds_entry_release(en);
    pthread_mutex_unlock(&s->mu);
    if (gone)
        serve_session_free(s);
    SCHED_POINT("io: row answered");
}

static int round_deliver(struct rjob *j, const uint8_t *raw, size_t lo, size_t hi, const char **why)
{
    struct round *rd = j->ctx;
    if (!j->bf16_rows && row_check_reason(raw, why) < 0) {
        /* a row that does not decode fails the steps that asked for it */
        engram_error e;
        uint32_t row = (uint32_t)(j->reqs[lo] >> 32);
        err_set_row(&e, -EDOM, row, "row %u of table %d: %s", row, j->table, *why);
        for (size_t i = lo; i < hi; i++)
            entry_done(rd, (uint32_t)j->reqs[i], j->table, 0, NULL, &e);
        return 1; /* handled: the job goes on, the row is not cached */
    }
    for (size_t i = lo; i < hi; i++)
        entry_done(rd, (uint32_t)j->reqs[i], j->table, j->bf16_rows, raw, NULL);
    return 0;
}

static void round_failed(struct rjob *j, size_t lo, size_t hi, const engram_error *e)
{
    for (size_t i = lo; i < hi; i++)
        entry_done(j->ctx, (uint32_t)j->reqs[i], j->table, 0, NULL, e);
}

/* The step queue (under p->mu). */
void rounds_queue_add(engram_pool *p, engram_session *s)
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

void rounds_queue_remove(engram_pool *p, engram_session *s)
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

/* A sharded pool: token i's requests for the rows of the pool's block
 * (install_step zeroed the others in out), appended to the round's; how
 * many. */
static unsigned block_reqs(const engram_pool *p, struct round *rd, const engram_session *s, unsigned e,
                           unsigned i, size_t *n)
{
    unsigned own = 0;
    for (unsigned t = 0; t < p->tables; t++)
        for (unsigned c = 0; c < p->cols; c++) {
            uint32_t row = s->rows[i][t * p->cols + c];
            if (pool_owns(p, t, row)) {
                rd->reqs[t][n[t]++] = (uint64_t)row << 32 | IDX(e, i, c);
                own++;
            }
        }
    return own;
}

/* Moves queued steps into free rounds and starts their jobs.  Under p->mu. */
void rounds_intake(engram_pool *p)
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
            rounds_queue_remove(p, s);
            /* queued means "a step not yet in a round"; checked again */
            if (s->state == S_STEP && !s->ended && s->issued != s->gen + 1 &&
                s->remaining[0] + s->remaining[1] > 0) {
                unsigned e = rd->n_entries++;
                uint32_t rb = (uint32_t)family_row_out_bytes(&p->fam, s->dtype);
                rd->e[e] = (struct round_entry){s, s->gen, s->out, s->dtype, 0,
                                                p->rpt * rb, p->cols * rb, rb};
                for (unsigned i = 0; i < s->k; i++) {
                    if (s->masked[i])
                        continue;
                    if (p->sharded) {
                        rd->e[e].left += block_reqs(p, rd, s, e, i, n);
                        continue;
                    }
                    for (unsigned t = 0; t < p->tables; t++)
                        for (unsigned c = 0; c < p->cols; c++)
                            rd->reqs[t][n[t]++] =
                                (uint64_t)s->rows[i][t * p->cols + c] << 32 | IDX(e, i, c);
                    rd->e[e].left += p->rpt; /* each answered once */
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
            memset(j, 0, sizeof *j); /* a table the family lacks: a job finished from the start */
            if ((unsigned)t >= p->tables)
                continue;
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
void rounds_issue(engram_pool *p, unsigned max)
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
    for (unsigned t = 0; t < p->tables; t++)
        for (int i = 0; i < n && max > 0; i++)
            max -= reader_job_issue(p->r, &order[i]->job[t], max);
}

/* A round all of whose steps have ended (aborted, committed after a
 * failure, closed) stops issuing reads: its jobs fail, what is in flight is
 * collected and its entries are let go of by rounds_finish.  The I/O
 * thread's, after some step ended. */
void rounds_drop_stale(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (!rd->active || (rd->job[0].rc != 0 && (p->tables < 2 || rd->job[1].rc != 0)))
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
            for (unsigned t = 0; t < p->tables; t++)
                reader_job_fail(&rd->job[t], -ECANCELED, "every step of the round ended");
    }
}

/* A round ends: each entry still holding requests lets go of its session,
 * failing the live step's outstanding requests with e, or (e NULL) with
 * the error of the table's job (a job that failed as a whole: the engine,
 * or the pool closing); the round's reads are counted and it is free. */
static void retire(engram_pool *p, struct round *rd, const engram_error *e)
{
    for (unsigned k = 0; k < rd->n_entries; k++) {
        struct round_entry *en = &rd->e[k];
        if (en->left == 0)
            continue;
        engram_session *s = en->s;
        pthread_mutex_lock(&s->mu);
        if (s->gen == en->gen && !s->ended)
            for (unsigned t = 0; t < p->tables; t++) {
                engram_error je = rd->job[t].err;
                if (!e && rd->job[t].rc == 0) /* cannot happen: every request is answered */
                    err_set(&je, -EIO, ENGRAM_NO_OFFSET, "table %u: a request was not answered", t);
                rounds_step_fail(s, (int)t, e ? e : &je);
            }
        int gone = rounds_entry_release(en);
        pthread_mutex_unlock(&s->mu);
        if (gone)
            serve_session_free(s);
        if (!e)
            SCHED_POINT("io: entry released");
    }
    pthread_mutex_lock(&p->mu);
    p->step_read += rd->job[0].rows_read + rd->job[1].rows_read;
    pthread_mutex_unlock(&p->mu);
    rd->active = 0;
}

/* Rounds whose jobs have ended let go of the sessions whose requests were
 * not all answered. */
void rounds_finish(engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++) {
        struct round *rd = &p->rounds[ri];
        if (rd->active && reader_job_finished(&rd->job[0]) && reader_job_finished(&rd->job[1]))
            retire(p, rd, NULL);
    }
}

int rounds_active(const engram_pool *p)
{
    for (int ri = 0; ri < ROUNDS; ri++)
        if (p->rounds[ri].active)
            return 1;
    return 0;
}

/* Fails every job of the rounds (not yet failed) with e: their reads in
 * flight are then only collected. */
void rounds_fail(engram_pool *p, const engram_error *e)
{
    for (int ri = 0; ri < ROUNDS; ri++)
        for (unsigned t = 0; t < p->tables; t++)
            if (p->rounds[ri].active && p->rounds[ri].job[t].rc == 0) {
                p->rounds[ri].job[t].rc = e->code;
                p->rounds[ri].job[t].err = *e;
                p->rounds[ri].job[t].live = 0;
            }
}

/* Fails every queued step with e and empties the queue.  Under p->mu. */
void rounds_queue_fail(engram_pool *p, const engram_error *e)
{
    while (p->q_head) {
        engram_session *s = p->q_head;
        rounds_queue_remove(p, s);
        pthread_mutex_lock(&s->mu);
        for (int t = 0; t < ENGRAM_TABLES; t++)
            rounds_step_fail(s, t, e);
        pthread_mutex_unlock(&s->mu);
    }
}

/* Every round entry lets go of its session, failing its step with e.  For
 * a broken reader, whose reads will never be collected: their jobs have
 * failed, so nothing would be delivered, and the reader is never reaped
 * again (this thread stops calling it, its close keeps its memory). */
void rounds_release(engram_pool *p, const engram_error *e)
{
    for (int ri = 0; ri < ROUNDS; ri++)
        if (p->rounds[ri].active)
            retire(p, &p->rounds[ri], e);
}
