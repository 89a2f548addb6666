/*
 * reader.c - page-cache-free concurrent row reads on top of an I/O engine:
 * the slot/job engine, with open and close.
 *
 * Every row becomes one read of the aligned block(s) covering its bytes
 * (264 for V4.1, 320 for the PLE member: either may straddle two blocks)
 * into a slot of the reader's arena; the row is validated and decoded
 * (V4.1) or copied / widened (PLE's BF16 rows) out of the slot, which is
 * then free again; for the batch the row is first copied to a small stage
 * and decoded after the next reads are submitted (reader_defer).  What differs between the members is the
 * row's size and encoding and the rows per token (the model's family).  Work comes as jobs
 * (reader_int.h): sets of row requests sorted by row (in place, radix.c) so
 * each distinct row is read once per job.  The jobs' owners are the batch
 * (reader_batch.c), the decode step (reader_step.c) and the session pool
 * (serve/); the descriptor comes from descriptor.c.  With a row cache, rows
 * already read (and validated) are decoded from memory instead.  All memory
 * is allocated at open, the batch's and the step's too (reader_users).
 *
 * Reads in flight are the kernel's until reaped: every path that ends a
 * batch or a step early (a read error, an engine error, cancel, close)
 * first reaps every read it queued, after asking the engine to cancel them
 * where that helps, so no buffer is reused or freed under a read.  Should an
 * engine stop returning completions altogether, the reader is marked broken
 * and its buffers are never freed (see bury()).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "descriptor.h"
#include "io_engine.h"
#include "latency.h"
#include "format/model.h"
#include "radix.h"
#include "reader_int.h"
#include "rowcache.h"
#include "common/util.h"

#define DEFAULT_DEPTH 64u
_Static_assert(ENGRAM_READER_THREADS(ENGRAM_READER_MAX_DEPTH) <= 256, "the thread pool's bound (engram.h)");
/* A read is resubmitted at most this often (short results, -EAGAIN). */
#define MAX_TRIES 8
/* Transient engine refusals retried in a row before giving up (~0.1 s). */
#define TRANSIENT_LIMIT 2000
/* Hard reap failures in a row while draining before the engine is given
 * up for dead. */
#define DRAIN_HARD_LIMIT 8
/* Rows a deferring owner (the batch) holds between a pump and its next
 * submission: a pump then reaps at most this many completions.  Fewer
 * where the reader's other buffers leave less of ENGRAM_READER_MAX_BYTES
 * (at depth 512 about half of it). */
#define STAGE_MAX 64u

struct slot {
    uint64_t off;          /* aligned file offset of the read       */
    uint32_t len;          /* bytes asked                           */
    uint32_t need;         /* bytes that must arrive (row's end)    */
    uint32_t skip;         /* row start inside the buffer           */
    uint32_t from;         /* where the read in flight starts       */
    uint32_t got;          /* bytes in place from the start         */
    uint32_t row;
    uint8_t table, tries;
    struct rjob *job;      /* whose read it is (NULL: free)         */
    size_t lo, hi;         /* the job's requests for this row       */
};

struct engram_reader {
    const engram_model *m;
    engram_model_info info;
    uint32_t row_bytes;            /* the family's: 264 or 320            */
    int bf16_rows;                 /* PLE: rows are BF16, nothing to check */
    int fd;
    int direct;
    enum io_drop drop;
    uint32_t align, slot_size;
    unsigned depth;
    struct io_engine *eng;
    char note[192];

    uint8_t *arena;                /* depth x slot_size, aligned          */
    size_t arena_bytes;
    engram_host_hooks host;        /* the caller's, if any                 */
    int arena_registered;          /* host.reg accepted the arena          */
    struct slot *slots;
    unsigned *free_slots, n_free;
    unsigned *pending, n_pending;  /* owned slots waiting to be queued    */
    unsigned inflight;             /* queued to the engine, not reaped    */
    struct io_cqe *cqes;
    /* Rows that arrived whole while `defer` is set (the batch): copied out
     * of their slots, which are free again, and delivered by
     * reader_deliver_staged() once the reads that replace them are
     * submitted.  Their jobs' outstanding counts still hold them. */
    int defer;
    struct slot *staged;           /* stage_cap records                    */
    uint8_t *staged_rows;          /* stage_cap x row_bytes                */
    unsigned n_staged, stage_cap;  /* <= min(depth, STAGE_MAX), see there  */
    struct radix_scratch sort;
    struct rowcache *cache;        /* NULL without one                     */

    /* Set when the engine stopped completing reads: the reader refuses all
     * work and close() keeps its buffers (bury()). */
    int broken;
    char broken_msg[160];
    engram_reader *grave_next;

    /* the batch's and the decode step's memory (their files own it) */
    struct reader_users users;

    engram_io_stats st;
    struct latency_hist hist;      /* decode-step times                    */
};

static void pause_briefly(void)
{
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ opening */

static engram_io_engine env_engine(void)
{
    const char *e = getenv("ENGRAM_IO");
    if (!e)
        return ENGRAM_IO_AUTO;
    if (!strcmp(e, "uring"))
        return ENGRAM_IO_URING;
    if (!strcmp(e, "threads"))
        return ENGRAM_IO_THREADS;
    if (!strcmp(e, "buffered"))
        return ENGRAM_IO_BUFFERED;
    return ENGRAM_IO_AUTO;
}

/* What the reader holds besides its row cache and its stage. */
static uint64_t reserved_base(const engram_reader *r)
{
    return sizeof *r + r->arena_bytes +
           (uint64_t)r->depth * (sizeof *r->slots + sizeof *r->free_slots +
                                       sizeof *r->pending + sizeof *r->cqes) +
           (uint64_t)READER_CHUNK_REQS * sizeof *r->users.batch.reqs + (r->eng ? r->eng->bytes : 0);
}

static void reader_free(engram_reader *r)
{
    if (r->eng)
        r->eng->ops->destroy(r->eng);
    if (r->fd >= 0)
        close(r->fd);
    if (r->arena_registered)
        r->host.unreg(r->host.ctx, r->arena, r->arena_bytes);
    free(r->arena);
    free(r->slots);
    free(r->free_slots);
    free(r->pending);
    free(r->cqes);
    free(r->staged);
    free(r->staged_rows);
    free(r->users.batch.reqs);
    rowcache_free(r->cache);
    free(r);
}

static int reader_open(const engram_model *m, const engram_reader_opts *opts, int wakeable,
                       engram_reader **out, engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_io_engine want = opts ? opts->engine : ENGRAM_IO_AUTO;
    if (want == ENGRAM_IO_AUTO)
        want = env_engine();
    if (want > ENGRAM_IO_BUFFERED)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "unknown I/O engine %d", (int)want);
    unsigned depth = opts && opts->depth ? opts->depth : DEFAULT_DEPTH;
    if (depth > ENGRAM_READER_MAX_DEPTH)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "depth %u exceeds %u", depth,
                       ENGRAM_READER_MAX_DEPTH);

    uint64_t cache_bytes = opts ? opts->cache_bytes : 0;
    if (cache_bytes > 0 && cache_bytes < ENGRAM_READER_MIN_CACHE)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "row cache of %llu bytes is below the %u minimum",
                       (unsigned long long)cache_bytes, ENGRAM_READER_MIN_CACHE);

    engram_reader *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    r->fd = -1;
    engram_model_get_info(m, &r->info);
    r->row_bytes = r->info.family.row_bytes;
    r->bf16_rows = r->info.family.encoding == ENGRAM_ROWS_BF16;
    if (cache_bytes > 0 && rowcache_new_sized(cache_bytes, r->row_bytes, &r->cache) < 0) {
        reader_free(r);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot allocate a row cache of %llu bytes",
                       (unsigned long long)cache_bytes);
    }
    r->m = m;
    struct io_descriptor d;
    int rc = io_descriptor_open(m, want, &d, r->note, sizeof r->note, err);
    if (rc < 0) {
        reader_free(r);
        return rc;
    }
    r->fd = d.fd;
    r->direct = d.direct;
    r->align = d.align;
    r->drop = d.drop;
    r->slot_size = io_slot_bytes(r->align, r->row_bytes);
    unsigned cap = IO_BUFFER_BUDGET / r->slot_size; /* >= MIN_DIRECT_DEPTH (try_direct) */
    r->depth = depth < cap ? depth : cap;
    int try_uring = r->direct && (want == ENGRAM_IO_AUTO || want == ENGRAM_IO_URING);

    size_t arena = (size_t)r->depth * r->slot_size;
    size_t arena_align = r->align > 4096 ? r->align : 4096;
    if (posix_memalign((void **)&r->arena, arena_align, arena) != 0)
        r->arena = NULL;
    r->slots = calloc(r->depth, sizeof *r->slots);
    r->free_slots = calloc(r->depth, sizeof *r->free_slots);
    r->pending = calloc(r->depth, sizeof *r->pending);
    r->cqes = calloc(r->depth, sizeof *r->cqes);
    r->users.batch.reqs = malloc(READER_CHUNK_REQS * sizeof *r->users.batch.reqs);
    if (!r->arena || !r->slots || !r->free_slots || !r->pending || !r->cqes ||
        !r->users.batch.reqs) {
        reader_free(r);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    r->arena_bytes = arena;
    if (opts && opts->host.reg && opts->host.unreg) {
        /* before the engine sees the buffers (io_uring registers them too) */
        r->host = opts->host;
        r->arena_registered = r->host.reg(r->host.ctx, r->arena, arena) >= 0;
    }
    for (unsigned i = 0; i < r->depth; i++)
        r->free_slots[i] = r->depth - 1 - i;
    r->n_free = r->depth;

    if (try_uring) {
        char note[96];
        rc = io_uring_engine_new(r->fd, r->depth, r->arena, arena, wakeable, &r->eng, note,
                                 sizeof note);
        if (rc == 0 && note[0])
            snprintf(r->note, sizeof r->note, "%s", note);
        if (rc < 0) {
            if (want == ENGRAM_IO_URING) {
                reader_free(r);
                return err_set(err, rc, ENGRAM_NO_OFFSET, "io_uring refused: %s", strerror(-rc));
            }
            snprintf(r->note, sizeof r->note, "io_uring refused (%s); thread pool", strerror(-rc));
        }
    }
    if (!r->eng) {
        /* a thread per two slots: the other reads wait queued, taken by the
         * first thread free (io_threads.c) */
        rc = io_threads_engine_new(r->fd, ENGRAM_READER_THREADS(r->depth), r->depth,
                                   r->direct ? DROP_NONE : r->drop, &r->eng);
        if (rc < 0) {
            r->eng = NULL;
            reader_free(r);
            return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start reader threads: %s",
                           strerror(-rc));
        }
    }
    /* the stage (the batch's; a wakeable reader serves a pool, which does
     * not defer) takes what ENGRAM_READER_MAX_BYTES leaves, up to STAGE_MAX */
    uint64_t base = reserved_base(r), per = sizeof *r->staged + r->row_bytes;
    uint64_t room = !wakeable && base < ENGRAM_READER_MAX_BYTES
                        ? (ENGRAM_READER_MAX_BYTES - base) / per : 0;
    r->stage_cap = (unsigned)(room < STAGE_MAX ? room : STAGE_MAX);
    if (r->stage_cap > r->depth)
        r->stage_cap = r->depth;
    if (r->stage_cap > 0) {
        r->staged = calloc(r->stage_cap, sizeof *r->staged);
        r->staged_rows = malloc((size_t)r->stage_cap * r->row_bytes);
        if (!r->staged || !r->staged_rows) {
            reader_free(r);
            return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        }
    }
    engram_reader_reset_stats(r);
    *out = r;
    return 0;
}

int engram_reader_open(const engram_model *m, const engram_reader_opts *opts,
                       engram_reader **out, engram_error *err)
{
    return reader_open(m, opts, 0, out, err);
}

int reader_open_wakeable(const engram_model *m, const engram_reader_opts *opts,
                         engram_reader **out, engram_error *err)
{
    return reader_open(m, opts, 1, out, err);
}

/* Readers whose engine died with reads possibly still in flight: their
 * buffers may yet be written by the kernel, so they are never freed (kept
 * reachable here rather than leaked). */
static pthread_mutex_t grave_mu = PTHREAD_MUTEX_INITIALIZER;
static engram_reader *graves;

static void bury(engram_reader *r)
{
    pthread_mutex_lock(&grave_mu);
    r->grave_next = graves;
    graves = r;
    pthread_mutex_unlock(&grave_mu);
}

void engram_reader_close(engram_reader *r)
{
    if (!r)
        return;
    if (!r->broken && (r->inflight > 0 || r->n_pending > 0)) {
        /* a step in flight (or a pool's jobs): abandon them */
        reader_drain_all(r, 1);
    }
    if (r->broken || r->inflight > 0) {
        bury(r);
        return;
    }
    reader_free(r);
}

void engram_reader_reset_stats(engram_reader *r)
{
    if (!r)
        return;
    memset(&r->st, 0, sizeof r->st);
    memset(&r->hist, 0, sizeof r->hist);
}

void engram_reader_get_stats(const engram_reader *r, engram_io_stats *st)
{
    if (!r || !st)
        return;
    *st = r->st;
    st->engine = r->eng ? r->eng->name : "none";
    st->note = r->note;
    st->direct = r->direct;
    st->drop = r->direct ? "" : r->drop == DROP_DONTCACHE ? "RWF_DONTCACHE" : "fadvise";
    st->align = r->align;
    st->depth = r->depth;
    st->in_flight = r->inflight;
    st->broken = r->broken;
    st->reserved_bytes = reserved_base(r) + (uint64_t)r->stage_cap * (sizeof *r->staged + r->row_bytes);
    st->host_registered = r->arena_registered ? r->arena_bytes : 0;
    st->cache_bytes = rowcache_bytes(r->cache);
    st->cache_rows = rowcache_rows(r->cache);
    st->step_p50_ns = latency_quantile(&r->hist, r->st.steps, 0.50);
    st->step_p99_ns = latency_quantile(&r->hist, r->st.steps, 0.99);
    st->step_p999_ns = latency_quantile(&r->hist, r->st.steps, 0.999);
}

/* ------------------------------------------------------------ slots */

static uint64_t slot_row_offset(const struct slot *sl)
{
    return sl->off + sl->skip;
}

unsigned reader_free_slots(const engram_reader *r)
{
    return r->n_free;
}

unsigned reader_in_flight(const engram_reader *r)
{
    return r->inflight + r->n_pending;
}

unsigned reader_reaping(const engram_reader *r)
{
    return r->inflight;
}

/* Takes a free slot for (table, row) of job j, requests [lo, hi), and puts
 * it on the pending list; the caller has checked n_free > 0. */
static unsigned take_slot(engram_reader *r, struct rjob *j, int table, uint32_t row, size_t lo,
                          size_t hi)
{
    unsigned s = r->free_slots[--r->n_free];
    struct slot *sl = &r->slots[s];
    /* a shard file holds rows [first_row, ...): its local row is row - first_row */
    uint64_t off = r->info.table[table].offset + (row - r->info.shard.first_row[table]) * r->row_bytes;
    uint64_t start = off / r->align * r->align;
    uint64_t end = (off + r->row_bytes + r->align - 1) / r->align * r->align;
    sl->off = start;
    sl->len = (uint32_t)(end - start);
    sl->skip = (uint32_t)(off - start);
    sl->need = sl->skip + r->row_bytes;
    sl->from = sl->got = 0;
    sl->row = row;
    sl->table = (uint8_t)table;
    sl->tries = 0;
    sl->job = j;
    sl->lo = lo;
    sl->hi = hi;
    j->outstanding++;
    j->rows_read++;
    r->pending[r->n_pending++] = s;
    r->st.rows_read++;
    return s;
}

/* Slot s back on the free list (its job's count is the caller's). */
static void free_slot(engram_reader *r, unsigned s)
{
    r->slots[s].job = NULL;
    r->free_slots[r->n_free++] = s;
}

static void release(engram_reader *r, unsigned s)
{
    if (r->slots[s].job)
        r->slots[s].job->outstanding--;
    free_slot(r, s);
}

/* Where slot s's row starts in the arena. */
static const uint8_t *slot_row(const engram_reader *r, unsigned s)
{
    return r->arena + (size_t)s * r->slot_size + r->slots[s].skip;
}

void reader_job_fail(struct rjob *j, int code, const char *what)
{
    if (j->rc != 0)
        return;
    j->rc = code;
    err_set(&j->err, code, ENGRAM_NO_OFFSET, "%s", what);
    j->live = 0;
}

/* Records the first error of the read's job (sl: a slot, or a staged
 * copy of one), naming the row and its file offset. */
__attribute__((format(printf, 3, 4)))
static void fail_read(const struct slot *sl, int code, const char *fmt, ...)
{
    struct rjob *j = sl->job;
    if (!j || j->rc != 0)
        return;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    engram_error e;
    err_set_at(&e, code, slot_row_offset(sl), sl->row, "row %u of table %d: %s (file offset %llu)",
               sl->row, sl->table, what, (unsigned long long)slot_row_offset(sl));
    if (j->failed) { /* the owner takes it; the job goes on */
        j->failed(j, sl->lo, sl->hi, &e);
        return;
    }
    j->rc = code;
    j->err = e;
    j->live = 0;
}

/* Queues the pending slots (what has not arrived of each read) in the
 * order they were taken, so that reads issued first (the pool's oldest
 * steps, table 0 before table 1) reach the device first.  0 when all are
 * queued, a transient -errno when the engine wants completions reaped
 * first (the rest stay pending, in order), or a hard -errno (the slot whose
 * queueing failed is failed and released).
 *
 * The first read is handed to the engine at once and the following ones in
 * groups that double (1, 2, 4, 8, ...; the caller submits the rest), for
 * ~log2(n) system calls instead of one.  Reads submitted together tend to
 * come back together (a virtio disk takes a kick's reads as one batch and
 * signals their completions at once), so a reader that refills everything
 * it reaped in one submission runs the device in waves: the whole queue
 * completes, the device idles while the reader turns around, the whole
 * queue goes out again.  Starting the device on the first read while the
 * rest is prepared breaks the waves (issue #25, development VM: +5-14%
 * reads/s at depths 4-64 and ~8% off a decode step's p50; fio made to
 * submit and reap whole waves of 16 loses as much).  An early submission
 * that fails hard stops them and lands in *submit_err (its reads stay
 * queued, in flight for the drain, as when the caller's own submit fails);
 * a transient refusal leaves its reads for the next submission. */
static int flush_pending(engram_reader *r, int *submit_err)
{
    unsigned i = 0, queued = 0, next_submit = 1;
    int err = 0;
    for (; i < r->n_pending; i++) {
        unsigned s = r->pending[i];
        struct slot *sl = &r->slots[s];
        if (sl->job->rc != 0) {
            release(r, s);
            continue;
        }
        sl->from = sl->got / r->align * r->align;
        err = r->eng->ops->queue(r->eng, s, r->arena + (size_t)s * r->slot_size + sl->from,
                                 sl->len - sl->from, sl->off + sl->from);
        if (err < 0 && io_transient(err))
            break;
        if (err < 0) {
            fail_read(&r->slots[s], err, "cannot queue the read: %s", strerror(-err));
            release(r, s);
            i++;
            break;
        }
        r->inflight++;
        if (++queued == next_submit && i + 1 < r->n_pending && *submit_err == 0) {
            int rc = r->eng->ops->submit(r->eng);
            if (rc < 0 && !io_transient(rc))
                *submit_err = rc;
            next_submit = 2 * next_submit + 1;
        }
    }
    memmove(r->pending, r->pending + i, (r->n_pending - i) * sizeof *r->pending);
    r->n_pending -= i;
    return err;
}

/* Writes a valid-or-not raw row where the job wants it: decoded (the
 * decoder checks the row first and writes nothing for an invalid one) or,
 * for raw delivery, checked and copied.  0 or -EDOM with *why set.  A
 * BF16 row (PLE) has no invalid values: copied, or widened to F32. */
static int write_row(const struct rjob *j, const uint8_t *raw, void *dst, const char **why)
{
    int rc, dtype = j->dtype;
    if (j->bf16_rows) {
        if (dtype == ENGRAM_F32)
            rows_bf16_widen(raw, j->row_bytes / 2, dst);
        else
            memcpy(dst, raw, j->row_bytes);
        return 0;
    }
    if (dtype == ENGRAM_F32)
        rc = engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, (float *)dst, NULL);
    else if (dtype == ENGRAM_BF16)
        rc = engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, (uint16_t *)dst, NULL);
    else if ((rc = row_check_reason(raw, why)) == 0)
        memcpy(dst, raw, ENGRAM_ROW_BYTES);
    if (rc == -EDOM && dtype != ENGRAM_RAW)
        row_check_reason(raw, why);
    return rc;
}

/* The row for the job's requests [lo, hi) is in raw: write it for the
 * first request, copy it to the others, tell the job.  0 or -EDOM (nothing
 * written; *why says why). */
static int deliver_rows(struct rjob *j, const uint8_t *raw, size_t lo, size_t hi, const char **why)
{
    if (j->deliver)
        return j->deliver(j, raw, lo, hi, why);
    void *first = j->dst(j, (uint32_t)j->reqs[lo]);
    int rc = write_row(j, raw, first, why);
    if (rc < 0)
        return rc;
    size_t bytes = j->out_bytes;
    for (size_t i = lo + 1; i < hi; i++)
        memcpy(j->dst(j, (uint32_t)j->reqs[i]), first, bytes);
    if (j->done)
        for (size_t i = lo; i < hi; i++)
            j->done(j, (uint32_t)j->reqs[i]);
    return 0;
}

/* The row of read sl (a slot, or a staged copy of one) is in raw, whole:
 * deliver it; a row that decodes goes into the cache. */
static void deliver_read(engram_reader *r, const struct slot *sl, const uint8_t *raw)
{
    const char *why = "invalid";
    int rc = deliver_rows(sl->job, raw, sl->lo, sl->hi, &why);
    if (rc < 0) {
        fail_read(sl, -EDOM, "%s", why);
        return;
    }
    if (rc == 0 && r->cache) /* > 0: the owner took an invalid row itself */
        rowcache_put(r->cache, sl->table, sl->row, raw);
}

/* Slot s's row has arrived whole and the reader defers deliveries: the row
 * and the slot's record are copied out and the slot is free again; its
 * job's outstanding count keeps it until reader_deliver_staged(). */
static void stage(engram_reader *r, unsigned s)
{
    struct slot *sl = &r->slots[s];
    unsigned k = r->n_staged++;
    r->staged[k] = *sl;
    memcpy(r->staged_rows + (size_t)k * r->row_bytes, slot_row(r, s), r->row_bytes);
    free_slot(r, s);
}

void reader_deliver_staged(engram_reader *r)
{
    for (unsigned k = 0; k < r->n_staged; k++) {
        const struct slot *sl = &r->staged[k];
        if (sl->job->rc == 0)
            deliver_read(r, sl, r->staged_rows + (size_t)k * r->row_bytes);
        sl->job->outstanding--;
    }
    r->n_staged = 0;
}

void reader_defer(engram_reader *r, int on)
{
    if (!on)
        reader_deliver_staged(r);
    r->defer = on && r->stage_cap > 0;
}

/* One completion.  The slot goes back to the free list unless its read is
 * resubmitted (short result, -EAGAIN/-EINTR); once its job has failed or
 * was cancelled, completions are only collected. */
static void complete(engram_reader *r, const struct io_cqe *c)
{
    unsigned s = c->slot;
    struct slot *sl = &r->slots[s];
    int res = c->res;
    r->inflight--;
    if (res > 0)
        r->st.bytes_read += (uint64_t)res;
    if (sl->job->rc != 0) {
        release(r, s);
        return;
    }
    if (res >= 0) {
        sl->got = sl->from + (uint32_t)res;
        if (sl->got >= sl->need) {
            if (r->defer) { /* the pump reaped no more than the stage holds */
                stage(r, s);
                return;
            }
            deliver_read(r, sl, slot_row(r, s));
            release(r, s);
            return;
        }
        if (res == 0) {
            fail_read(&r->slots[s], -EIO, "short read (end of file after %u of the row's %u bytes)",
                      sl->got > sl->skip ? sl->got - sl->skip : 0, r->row_bytes);
            release(r, s);
            return;
        }
    } else if (res != -EAGAIN && res != -EINTR) {
        fail_read(&r->slots[s], res, "%s", strerror(-res));
        release(r, s);
        return;
    }
    /* A short result or a transient error: read what is missing again. */
    if (++sl->tries > MAX_TRIES) {
        fail_read(&r->slots[s], res < 0 ? res : -EIO, "read still incomplete after %d attempts (%s)",
                  MAX_TRIES, res < 0 ? strerror(-res) : "short reads");
        release(r, s);
        return;
    }
    r->st.retries++;
    r->pending[r->n_pending++] = s;
}

int reader_pump(engram_reader *r, unsigned min)
{
    /* deferring: no more completions than the stage has room for (the rest
     * wait in the engine for the next pump; the owner delivers in between) */
    unsigned max = r->defer ? r->stage_cap - r->n_staged : r->depth;
    if (min > max)
        min = max;
    for (unsigned spins = 0;; spins++) {
        int n = r->eng->ops->reap(r->eng, r->cqes, max, min);
        if (n >= 0) {
            for (int i = 0; i < n; i++)
                complete(r, &r->cqes[i]);
            return n;
        }
        if (!io_transient(n) || spins >= TRANSIENT_LIMIT)
            return n;
        r->st.retries++;
        if (n != -EINTR && spins > 0)
            pause_briefly();
    }
}

void reader_drain_all(engram_reader *r, int cancel)
{
    /* every job with reads here is done for: fail the ones that are not,
     * so completions are collected rather than delivered; rows staged for
     * delivery are dropped with their jobs */
    for (unsigned k = 0; k < r->n_staged; k++) {
        struct rjob *j = r->staged[k].job;
        if (j->rc == 0) {
            reader_job_fail(j, -ECANCELED, "abandoned after another read failed");
            j->abandoned = 1;
        }
        j->outstanding--;
    }
    r->n_staged = 0;
    for (unsigned s = 0; s < r->depth; s++) {
        struct rjob *j = r->slots[s].job;
        if (j && j->rc == 0) {
            reader_job_fail(j, -ECANCELED, "abandoned after another read failed");
            j->abandoned = 1;
        }
    }
    while (r->n_pending > 0)
        release(r, r->pending[--r->n_pending]);
    if (cancel && r->inflight > 0)
        r->eng->ops->cancel(r->eng); /* best effort: the drain reaps either way */
    int hard = 0;
    while (r->inflight > 0) {
        int n = reader_pump(r, r->inflight);
        if (n >= 0) {
            hard = 0;
            continue;
        }
        if (++hard >= DRAIN_HARD_LIMIT) {
            r->broken = 1;
            snprintf(r->broken_msg, sizeof r->broken_msg,
                     "reader unusable: its I/O engine failed (%s) with %u reads in flight; "
                     "close it and open another", strerror(-n), r->inflight);
            return;
        }
    }
}

void reader_wake(engram_reader *r)
{
    r->eng->ops->wake(r->eng);
}

int reader_broken(const engram_reader *r, engram_error *err)
{
    if (r->broken)
        return err_set(err, -EIO, ENGRAM_NO_OFFSET, "%s", r->broken_msg);
    return 0;
}

int reader_push_jobs(engram_reader *r)
{
    int rc, submit_err = 0;
    /* a read the engine will not queue has failed its own job (naming the
     * row); the other jobs' reads go on */
    while ((rc = flush_pending(r, &submit_err)) < 0 && !io_transient(rc))
        ;
    if (submit_err < 0)
        return submit_err;
    rc = r->eng->ops->submit(r->eng);
    return rc < 0 && !io_transient(rc) ? rc : 0;
}

int reader_push(engram_reader *r)
{
    int submit_err = 0;
    int rc = flush_pending(r, &submit_err);
    if (rc < 0 && !io_transient(rc))
        return rc;
    if (submit_err < 0)
        return submit_err;
    rc = r->eng->ops->submit(r->eng);
    return rc < 0 && !io_transient(rc) ? rc : 0;
}

int reader_stall(engram_reader *r, unsigned *spins)
{
    if (++*spins > TRANSIENT_LIMIT)
        return -EAGAIN;
    r->st.retries++;
    pause_briefly();
    return 0;
}

/* ------------------------------------------------------------ for the owners */

struct reader_users *reader_users(engram_reader *r)
{
    return &r->users;
}

const engram_model_info *reader_model_info(const engram_reader *r)
{
    return &r->info;
}

engram_io_stats *reader_stats(engram_reader *r)
{
    return &r->st;
}

void reader_note_step(engram_reader *r, uint64_t ns)
{
    r->st.steps++;
    latency_add(&r->hist, ns);
    if (ns > r->st.step_max_ns)
        r->st.step_max_ns = ns;
}

unsigned reader_pending(const engram_reader *r)
{
    return r->n_pending;
}

void reader_drop_pending(engram_reader *r)
{
    while (r->n_pending > 0)
        release(r, r->pending[--r->n_pending]);
}

void reader_cancel(engram_reader *r)
{
    r->eng->ops->cancel(r->eng);
}

/* ------------------------------------------------------------ jobs */

/* Start of the group (requests for one row) at or after position b. */
static size_t group_start(const uint64_t *reqs, size_t n, size_t b)
{
    while (b > 0 && b < n && (reqs[b] >> 32) == (reqs[b - 1] >> 32))
        b++;
    return b;
}

void reader_job_start(engram_reader *r, struct rjob *j)
{
    radix_sort_rows(j->reqs, j->nreq, &r->sort);
    /* Sorting groups duplicates, but issuing in row order would keep every
     * read in flight inside a narrow stretch of the file, which network and
     * striped block devices serve with little parallelism.  The sorted
     * requests are cut into lanes issued round-robin, so reads in flight
     * spread over the whole table while each row is still read once. */
    for (int l = 0; l < JOB_LANES; l++)
        j->cur[l] = group_start(j->reqs, j->nreq, j->nreq * (size_t)l / JOB_LANES);
    for (int l = 0; l < JOB_LANES; l++)
        j->end[l] = l + 1 < JOB_LANES ? j->cur[l + 1] : j->nreq;
    j->live = 0;
    for (int l = 0; l < JOB_LANES; l++)
        j->live += j->cur[l] < j->end[l];
    j->lane = 0;
    j->outstanding = 0;
    j->rows_read = 0;
    j->rc = 0;
    j->abandoned = 0;
    j->row_bytes = r->row_bytes;
    j->bf16_rows = r->bf16_rows;
    j->out_bytes = (uint32_t)family_row_out_bytes(&r->info.family, j->dtype);
    r->st.rows_requested += j->nreq;
}

unsigned reader_job_issue(engram_reader *r, struct rjob *j, unsigned max)
{
    unsigned taken = 0;
    while (j->live > 0 && j->rc == 0 && taken < max && r->n_free > 0) {
        while (j->cur[j->lane] >= j->end[j->lane])
            j->lane = (j->lane + 1) % JOB_LANES;
        int l = j->lane;
        size_t i = j->cur[l];
        uint32_t row = (uint32_t)(j->reqs[i] >> 32);
        size_t k = i + 1;
        while (k < j->end[l] && (uint32_t)(j->reqs[k] >> 32) == row)
            k++;
        j->cur[l] = k;
        j->live -= k >= j->end[l];
        j->lane = (l + 1) % JOB_LANES;
        const uint8_t *raw = r->cache ? rowcache_get(r->cache, j->table, row) : NULL;
        if (raw) {
            /* cached rows were validated when they were read */
            r->st.cache_hits++;
            const char *why = "invalid";
            if (deliver_rows(j, raw, i, k, &why) < 0) {
                engram_error e;
                err_set_row(&e, -EDOM, row, "row %u of table %d: %s", row, j->table, why);
                if (j->failed) {
                    j->failed(j, i, k, &e);
                } else {
                    j->rc = -EDOM;
                    j->err = e;
                    j->live = 0;
                }
            }
            continue;
        }
        take_slot(r, j, j->table, row, i, k);
        taken++;
    }
    return taken;
}
