/*
 * reader_int.h - the reader's job interface, for the owners of jobs.
 *
 * A job is one owner's set of row requests (a batch chunk, a decode step, a
 * round of decode steps of many sessions, a prefill chunk): requests sorted
 * by (table, row) so that each distinct row is read once and fanned out to
 * every request for it.  Any number of jobs may be in progress on a reader
 * at once; their reads share the reader's slots.  Everything here is
 * driven by one thread at a time (the reader's user), except
 * reader_wake().  The owners: the batch (reader_batch.c), the decode step
 * (reader_step.c), the session pool (serve/); the engine is reader.c.
 */
#ifndef ENGRAM_READER_INT_H
#define ENGRAM_READER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "codec/rowcodec.h" /* row_check_reason: the reasons a delivery fails with */

#define JOB_LANES 64

struct rjob;
typedef void *(*rjob_dst_fn)(struct rjob *j, uint32_t idx);
typedef void (*rjob_done_fn)(struct rjob *j, uint32_t idx);
/* Custom delivery of the row for requests [lo, hi) (raw: its row_bytes,
 * valid during the call, not yet validated).  0; -EDOM with *why to fail
 * the job; 1 when the row did not decode and the owner dealt with it.  The
 * reader puts rows delivered with 0 into its row cache. */
typedef int (*rjob_deliver_fn)(struct rjob *j, const uint8_t *raw, size_t lo, size_t hi,
                               const char **why);
/* A read that failed for requests [lo, hi): with this set the job goes on
 * (the owner decides what the failure means); without it the job fails. */
typedef void (*rjob_failed_fn)(struct rjob *j, size_t lo, size_t hi, const engram_error *e);

struct rjob {
    int rc;                  /* first error; then completions are only collected */
    int abandoned;           /* rc came from another job's failure (drain)     */
    engram_error err;
    int table;               /* every request of a job is for one table        */
    int dtype;               /* ENGRAM_BF16, ENGRAM_F32 or ENGRAM_RAW          */
    /* set by reader_job_start from the reader's family */
    uint32_t row_bytes;      /* a row as stored: 264 (V4.1), 320 (PLE)         */
    uint32_t out_bytes;      /* a row as delivered in dtype                    */
    int bf16_rows;           /* PLE: BF16 rows, copied or widened              */
    uint64_t *reqs;          /* (row << 32) | idx, sorted by reader_job_start  */
    size_t nreq;
    size_t cur[JOB_LANES], end[JOB_LANES];
    int lane, live;          /* issue cursor: lanes still holding requests     */
    unsigned outstanding;    /* slots taken for this job, not yet released,
                                and its staged rows not yet delivered          */
    uint64_t rows_read;      /* distinct rows this job read from the device    */
    rjob_dst_fn dst;         /* where request idx's row goes                   */
    rjob_done_fn done;       /* after request idx's row is written (or NULL)   */
    rjob_deliver_fn deliver; /* instead of dst/done (or NULL)                  */
    rjob_failed_fn failed;   /* per-read failures (or NULL: the job fails)     */
    void *ctx;
};

/* Sorts the job's requests and sets up its issue cursor (rc = 0).  No heap
 * memory. */
void reader_job_start(engram_reader *r, struct rjob *j);
/* Issues up to `max` more distinct rows of j (row cache hits are served at
 * once and count as none); returns how many reads were taken.  Errors land
 * in j->rc. */
unsigned reader_job_issue(engram_reader *r, struct rjob *j, unsigned max);
/* 1 when every request of j has been issued and no read of it is left. */
static inline int reader_job_finished(const struct rjob *j)
{
    return j->live == 0 && j->outstanding == 0;
}
/* Fails the job (if it has not failed): no more of its rows are issued or
 * delivered; reads in flight are collected by later pumps. */
void reader_job_fail(struct rjob *j, int code, const char *what);
/* While deferring (on), a row that arrives whole is copied out of its slot
 * and the slot freed at once, and the row is delivered by the next
 * reader_deliver_staged() (or dropped with its job by reader_drain_all):
 * an owner that submits the reads replacing a pump's rows before
 * delivering them keeps the device busy while it decodes.  Turning it off
 * delivers what is staged.  The batch defers; the other owners do not. */
void reader_defer(engram_reader *r, int on);
void reader_deliver_staged(engram_reader *r);

/* The memory of the owners behind the reader's public calls, kept by the
 * reader (allocated at open, freed at close) and used by their files only:
 * the batch in progress (reader_batch.c) and the one decode step in flight
 * (reader_step.c; a batch refuses to run while it is active). */
#define READER_CHUNK_REQS (ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS)
struct reader_batch {
    int active;              /* a batch is running (a step submitted from a
                                stream's sink is refused with -EBUSY)      */
    struct rjob job;
    uint64_t *reqs;          /* one chunk: (row << 32) | destination, READER_CHUNK_REQS */
    uint8_t *out;            /* first token of the current chunk               */
};
struct reader_step {
    int active, cancel_sent;
    int tables, cols;        /* the family's: 2 x 24 (V4.1), 1 x 16 (PLE)      */
    struct rjob job[ENGRAM_TABLES];
    uint64_t reqs[ENGRAM_ROWS_PER_TOKEN];
    void *out;
    uint64_t t0;
};
struct reader_users {
    struct reader_batch batch;
    struct reader_step step;
};
struct reader_users *reader_users(engram_reader *r);
const engram_model_info *reader_model_info(const engram_reader *r);
/* The reader's statistics, for the owners' counts; a finished decode step
 * of `ns` nanoseconds (count, latency histogram, maximum). */
engram_io_stats *reader_stats(engram_reader *r);
void reader_note_step(engram_reader *r, uint64_t ns);
/* Waits a little when nothing could be queued (the engine wants reaping
 * first): 0, or -EAGAIN after ~0.1 s of refusals in a row (*spins counts
 * them; the caller zeroes it on progress). */
int reader_stall(engram_reader *r, unsigned *spins);
/* Reads taken but not yet queued: how many; give them all back (their
 * jobs have failed). */
unsigned reader_pending(const engram_reader *r);
void reader_drop_pending(engram_reader *r);
/* Asks the engine to cancel what is in flight (best effort; reaping
 * collects the reads either way). */
void reader_cancel(engram_reader *r);

unsigned reader_free_slots(const engram_reader *r);
/* Reads taken (in flight or waiting to be queued), and those in flight. */
unsigned reader_in_flight(const engram_reader *r);
unsigned reader_reaping(const engram_reader *r);
/* Queues and submits what is pending: 0 or a hard -errno. */
int reader_push(engram_reader *r);
/* The same for several owners (the pool): a read that cannot be queued
 * fails its own job and the rest are queued; -errno only when submitting
 * fails. */
int reader_push_jobs(engram_reader *r);
/* Reaps at least min completions (min <= in flight; a wake-up may end the
 * wait early) and delivers them to their jobs, or stages them while the
 * reader defers (then at most the stage's room: min is cut to it).
 * Returns how many, or a hard -errno (transients retried). */
int reader_pump(engram_reader *r, unsigned min);
/* Collects every read in flight (asking the engine to cancel them first
 * when cancel), delivering none, and drops the staged rows (their jobs
 * fail as abandoned); marks the reader broken if the engine stops
 * answering. */
void reader_drain_all(engram_reader *r, int cancel);
/* From any thread: makes a blocked reader_pump return. */
void reader_wake(engram_reader *r);
/* Opens a reader whose engine can be woken (for the pool's I/O thread). */
int reader_open_wakeable(const engram_model *m, const engram_reader_opts *opts,
                         engram_reader **out, engram_error *err);
int reader_broken(const engram_reader *r, engram_error *err);

#endif
