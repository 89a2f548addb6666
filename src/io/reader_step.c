/*
 * reader_step.c - engram_reader_step_*: the one decode step a reader has in
 * flight (a token's rows: V4.1's 48, one job per table, or the PLE
 * member's 16 of its one table; request idx = the column), submitted
 * without waiting, then waited for, polled or cancelled; a step that fails
 * collects its reads before it returns.  Owns reader_users(r)->step;
 * allocates nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "reader_int.h"
#include "format/model.h"
#include "common/util.h"

/* The step's jobs, one per table of the model (V4.1 two, PLE one):
 * request idx = the column (0..23, or 0..15). */
static void *step_dst(struct rjob *j, uint32_t idx)
{
    const struct reader_step *st = j->ctx;
    return (uint8_t *)st->out + ((size_t)j->table * st->cols + idx) * j->out_bytes;
}

static struct reader_step *step_of(engram_reader *r)
{
    return &reader_users(r)->step;
}

static struct rjob *step_jobs(engram_reader *r, int t)
{
    return &step_of(r)->job[t];
}

static int step_error(engram_reader *r, engram_error *err)
{
    /* the job that failed first, not one abandoned because of it */
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < step_of(r)->tables; t++)
            if (step_jobs(r, t)->rc != 0 && (pass == 1 || !step_jobs(r, t)->abandoned)) {
                if (err)
                    *err = step_jobs(r, t)->err;
                return step_jobs(r, t)->rc;
            }
    return 0;
}

static int step_finish(engram_reader *r, engram_error *err)
{
    step_of(r)->active = 0;
    int rc = step_error(r, err);
    if (rc == 0)
        reader_note_step(r, util_now_ns() - step_of(r)->t0);
    return rc;
}

/* An engine error fails the step (through its table-0 job). */
static void step_fail(engram_reader *r, int code, const char *what)
{
    struct rjob *j = step_jobs(r, 0);
    j->rc = err_set(&j->err, code, ENGRAM_NO_OFFSET, "%s: %s", what, strerror(-code));
    j->live = 0;
}

/* Issues what can be issued; a hard engine error fails the step. */
static void step_push(engram_reader *r)
{
    for (int t = 0; t < step_of(r)->tables; t++)
        reader_job_issue(r, step_jobs(r, t), UINT32_MAX);
    if (step_error(r, NULL) != 0)
        return;
    int rc = reader_push(r);
    if (rc < 0 && step_error(r, NULL) == 0) /* not a queue failure, which names its row */
        step_fail(r, rc, "I/O engine refused to submit");
}

static int step_finished(engram_reader *r)
{
    for (int t = 0; t < step_of(r)->tables; t++)
        if (!reader_job_finished(step_jobs(r, t)))
            return 0;
    return 1;
}

int engram_reader_step_submit(engram_reader *r, const uint32_t *rows,
                              engram_dtype dtype, void *out, engram_error *err)
{
    if (!r || !rows || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "dtype %d: a step decodes to BF16 or F32",
                       (int)dtype);
    int rc = reader_broken(r, err);
    if (rc < 0)
        return rc;
    if (reader_users(r)->batch.active)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a batch is in progress");
    struct reader_step *st = step_of(r);
    if (st->active)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a decode step is already in flight");
    const engram_family *fam = &reader_model_info(r)->family;
    const int cols = (int)fam->rows_per_token, tables = (int)fam->tables;
    for (int k = 0; k < tables * cols; k++) {
        int t = k / cols;
        engram_error e;
        if (model_row_check(reader_model_info(r), t, rows[k], &e) < 0)
            return err_set_row(err, -EINVAL, rows[k], "column %d: %s", k % cols, e.msg);
    }
    st->active = 1;
    st->tables = tables;
    st->cols = cols;
    st->cancel_sent = 0;
    st->out = out;
    st->t0 = util_now_ns();
    for (int t = 0; t < tables; t++) {
        struct rjob *j = step_jobs(r, t);
        memset(j, 0, sizeof *j);
        j->table = t;
        j->dtype = dtype;
        j->reqs = st->reqs + t * cols;
        for (int c = 0; c < cols; c++)
            j->reqs[c] = (uint64_t)rows[t * cols + c] << 32 | (uint64_t)c;
        j->nreq = (size_t)cols;
        j->dst = step_dst;
        j->ctx = st;
        reader_job_start(r, j);
    }
    step_push(r);
    if (step_error(r, NULL) != 0) { /* nothing of a failed step stays in flight */
        reader_drain_all(r, 1);
        return step_finish(r, err);
    }
    return 0;
}

int engram_reader_step_wait(engram_reader *r, engram_error *err)
{
    if (!r || !step_of(r)->active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    unsigned spins = 0;
    while (step_error(r, NULL) == 0 && !step_finished(r)) {
        step_push(r);
        if (step_error(r, NULL) != 0 || step_finished(r))
            break;
        if (reader_reaping(r) == 0) {
            if (reader_stall(r, &spins) < 0)
                reader_job_fail(step_jobs(r, 0), -EAGAIN, "I/O engine kept refusing reads");
            continue;
        }
        /* Wait for everything in flight in one wake-up: waking per row costs
         * a context switch each, which on a VM is a good part of a step. */
        int n = reader_pump(r, reader_reaping(r));
        if (n < 0 && step_error(r, NULL) == 0) {
            step_fail(r, n, "I/O engine failed");
        } else if (n > 0) {
            spins = 0;
        }
    }
    if (step_error(r, NULL) != 0)
        reader_drain_all(r, 1);
    return step_finish(r, err);
}

int engram_reader_step_poll(engram_reader *r, engram_error *err)
{
    if (!r || !step_of(r)->active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    if (step_error(r, NULL) == 0 && !step_finished(r)) {
        step_push(r);
        if (step_error(r, NULL) == 0 && reader_reaping(r) > 0) {
            int n = reader_pump(r, 0);
            if (n < 0 && step_error(r, NULL) == 0)
                step_fail(r, n, "I/O engine failed");
            step_push(r);
        }
    }
    if (step_error(r, NULL) != 0) {
        /* Failed: collect the rest without blocking, after asking for it
         * to be cancelled once (the other table's job is abandoned first, so
         * its cancelled reads are not taken for its own failure). */
        for (int t = 0; t < step_of(r)->tables; t++) {
            struct rjob *j = step_jobs(r, t);
            if (j->rc == 0) {
                reader_job_fail(j, -ECANCELED, "abandoned after another read failed");
                j->abandoned = 1;
            }
        }
        reader_drop_pending(r);
        struct reader_step *st = step_of(r);
        if (reader_reaping(r) > 0 && !st->cancel_sent) {
            st->cancel_sent = 1;
            reader_cancel(r);
        }
        if (reader_reaping(r) > 0 && reader_pump(r, 0) < 0)
            reader_drain_all(r, 0); /* the engine failed while collecting: block once */
        if (reader_reaping(r) > 0)
            return -EAGAIN;
        return step_finish(r, err);
    }
    if (!step_finished(r))
        return -EAGAIN;
    return step_finish(r, err);
}

int engram_reader_step_cancel(engram_reader *r)
{
    if (!r || !step_of(r)->active)
        return -EINVAL;
    reader_job_fail(step_jobs(r, 0), -ECANCELED, "step cancelled");
    reader_drain_all(r, 1);
    step_of(r)->active = 0;
    reader_stats(r)->steps_cancelled++;
    return 0;
}
