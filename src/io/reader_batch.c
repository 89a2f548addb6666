/*
 * reader_batch.c - engram_reader_batch and _batch_stream: a batch of
 * tokens' rows of one table (the family's rows per token: 24 of a V4.1
 * table, the PLE member's 16), cut into chunks of up to 2048 tokens, each
 * chunk one job (each distinct row read once) run to its end on the
 * calling thread; the stream hands each chunk to a sink.  Owns
 * reader_users(r)->batch; allocates nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "reader_int.h"
#include "format/model.h"
#include "common/util.h"

/* Runs jobs on this thread until all are finished or one fails; a failure
 * drains everything (the reader is single-user here).  0 or the first
 * job's error (in *err). */
static int run_jobs(engram_reader *r, struct rjob **jobs, int n, engram_error *err)
{
    unsigned spins = 0;
    int failed = -1;
    /* a job of one token's rows or fewer is waited for whole, as a step */
    const engram_family *fam = &reader_model_info(r)->family;
    const size_t one_token = (size_t)fam->tables * fam->rows_per_token;
    /* The rows a pump brings are delivered (decoded, copied out) after the
     * reads replacing them are submitted: the device has the next reads
     * while this thread decodes (issue #25: +1-3% reads/s on the
     * development VM's virtio disk at depths 16 and 48). */
    reader_defer(r, 1);
    for (;;) {
        for (int i = 0; i < n && failed < 0; i++) {
            reader_job_issue(r, jobs[i], UINT32_MAX);
            if (jobs[i]->rc != 0)
                failed = i;
        }
        if (failed >= 0)
            break;
        /* Nothing new to submit: whatever the engine holds goes with the
         * pump's wait.  (A push happens only with reads pending, so its
         * error is never lost to a job that the deliveries below finish.) */
        int rc = reader_pending(r) > 0 ? reader_push(r) : 0;
        reader_deliver_staged(r);
        int finished = 1;
        for (int i = 0; i < n; i++) {
            if (jobs[i]->rc != 0 && failed < 0)
                failed = i;
            finished &= reader_job_finished(jobs[i]);
        }
        if (failed >= 0 || finished)
            break;
        if (rc < 0) {
            /* a queue failure has failed its own job, naming the row */
            for (int i = 0; i < n && failed < 0; i++)
                if (jobs[i]->rc != 0)
                    failed = i;
            if (failed < 0) {
                failed = 0;
                jobs[0]->rc = err_set(&jobs[0]->err, rc, ENGRAM_NO_OFFSET,
                                      "I/O engine refused to submit: %s", strerror(-rc));
                jobs[0]->live = 0;
            }
            break;
        }
        if (reader_reaping(r) == 0) {
            if (reader_pending(r) > 0 && reader_stall(r, &spins) < 0) {
                reader_job_fail(jobs[0], -EAGAIN, "I/O engine kept refusing reads");
                failed = 0;
                break;
            }
            continue;
        }
        /* Wait (submitting anything the engine still holds in the same
         * call); waiting for an eighth of the queue rather than one read
         * saves wake-ups and barely lowers the depth the device sees (a job
         * of one token's rows waits for all, or for as many as the stage
         * takes). */
        unsigned inflight = reader_reaping(r);
        unsigned want = n > 1 || jobs[0]->nreq <= one_token ? inflight
                        : inflight / 8 ? inflight / 8 : 1;
        int done = reader_pump(r, want);
        if (done < 0) {
            for (int i = 0; i < n && failed < 0; i++)
                if (jobs[i]->rc != 0)
                    failed = i;
            if (failed < 0) {
                failed = 0;
                jobs[0]->rc = err_set(&jobs[0]->err, done, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                      strerror(-done));
                jobs[0]->live = 0;
            }
            break;
        }
        if (done > 0)
            spins = 0;
        for (int i = 0; i < n && failed < 0; i++)
            if (jobs[i]->rc != 0)
                failed = i;
        if (failed >= 0)
            break;
    }
    if (failed < 0) {
        reader_defer(r, 0);
        return 0;
    }
    reader_drain_all(r, n > 1 || jobs[0]->nreq <= one_token);
    reader_defer(r, 0);
    if (err)
        *err = jobs[failed]->err;
    return jobs[failed]->rc;
}

static void *batch_dst(struct rjob *j, uint32_t idx)
{
    const struct reader_batch *b = j->ctx;
    return b->out + (size_t)idx * j->out_bytes;
}

static int batch_run(engram_reader *r, int t, const uint32_t *rows, size_t n, engram_dtype dtype,
                     void *out, size_t window_tokens, engram_batch_sink sink, void *ctx,
                     engram_error *err)
{
    if (!r || (n > 0 && (!rows || !out)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "dtype %d is not BF16, F32 or RAW", (int)dtype);
    if (window_tokens == 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "a window of 0 tokens");
    const engram_family *fam = &reader_model_info(r)->family;
    const size_t cols = fam->rows_per_token, stride = (size_t)fam->tables * cols;
    if (t < 0 || (unsigned)t >= fam->tables)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not one of the model's %u", t,
                       fam->tables);
    int rc = reader_broken(r, err);
    if (rc < 0)
        return rc;
    struct reader_batch *bt = &reader_users(r)->batch;
    if (reader_users(r)->step.active)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a decode step is in flight");
    if (bt->active) /* called from a stream's sink */
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a batch is in progress");
    const engram_model_info *in = reader_model_info(r);
    /* the file's rows: the whole table, or a shard file's block */
    const uint64_t first = in->shard.first_row[t], held = in->shard.rows[t];
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < cols; c++) {
            uint32_t row = rows[i * stride + (size_t)t * cols + c];
            if (row - first >= held) {
                engram_error e;
                model_row_check(in, t, row, &e);
                return err_set_row(err, -EINVAL, row, "token %zu column %zu: %s", i, c, e.msg);
            }
        }
    reader_stats(r)->batches++;
    struct rjob *j = &bt->job;
    memset(j, 0, sizeof *j);
    j->table = t;
    j->dtype = dtype;
    j->reqs = bt->reqs;
    j->dst = batch_dst;
    j->ctx = bt;
    size_t token_bytes = cols * family_row_out_bytes(fam, dtype);
    size_t chunk = window_tokens < ENGRAM_BATCH_TOKENS ? window_tokens : ENGRAM_BATCH_TOKENS;
    rc = 0;
    bt->active = 1;
    for (size_t at = 0; at < n && rc == 0; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        size_t nreq = 0;
        for (size_t i = 0; i < k; i++)
            for (size_t c = 0; c < cols; c++) {
                uint64_t row = rows[(at + i) * stride + (size_t)t * cols + c];
                bt->reqs[nreq++] = row << 32 | (uint64_t)(i * cols + c);
            }
        j->nreq = nreq;
        bt->out = (uint8_t *)out + (sink ? 0 : at * token_bytes);
        reader_job_start(r, j);
        rc = run_jobs(r, &j, 1, err);
        if (rc == 0 && sink) {
            int s = sink(ctx, at, k, out);
            if (s != 0)
                rc = err_set(err, s, ENGRAM_NO_OFFSET, "stopped by the sink (%d)", s);
        }
    }
    bt->active = 0;
    return rc;
}

int engram_reader_batch(engram_reader *r, int t, const uint32_t *rows, size_t n,
                        engram_dtype dtype, void *out, engram_error *err)
{
    return batch_run(r, t, rows, n, dtype, out, n ? n : 1, NULL, NULL, err);
}

int engram_reader_batch_stream(engram_reader *r, int t, const uint32_t *rows, size_t n,
                               engram_dtype dtype, void *window, size_t window_tokens,
                               engram_batch_sink sink, void *ctx, engram_error *err)
{
    if (!sink)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no sink");
    return batch_run(r, t, rows, n, dtype, window, window_tokens, sink, ctx, err);
}
