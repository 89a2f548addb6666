/*
 * fault_engine.h - fault injection at the reader's I/O seam (io_engine.h),
 * for test programs only.  The test is linked with
 *   -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new
 * so every engine the reader creates (io_uring, thread pool, buffered
 * fallback) is the real one wrapped in the engine below, which
 *  - counts queue / submit / reap / cancel calls and completions, and fails
 *    the N-th one of a kind as planned (the SQLite way: a test loops N over
 *    every position), with a negative errno, a short result or end of file;
 *  - checks the reader's side of the contract independently of the reader:
 *    a slot is never queued again while its read is in flight, every
 *    completion matches a read in flight, and the engine is never destroyed
 *    with reads in flight (the kernel would write into freed memory).
 * Setup faults: the constructors can be made to fail (ENOMEM, EMFILE, ...).
 */
#ifndef ENGRAM_FAULT_ENGINE_H
#define ENGRAM_FAULT_ENGINE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "../src/io/io_engine.h"

enum fe_op { FE_QUEUE = 0, FE_SUBMIT, FE_REAP, FE_CQE, FE_CANCEL, FE_NOPS };
static const char *const fe_op_name[FE_NOPS] = {"queue", "submit", "reap", "completion", "cancel"};

/* Special results for FE_CQE faults besides a negative errno. */
#define FE_SHORT 1   /* the read comes back with fewer bytes than asked */
#define FE_EOF 2     /* the read comes back with 0 bytes                */
#define FE_CUT 3     /* with at most 200 bytes: short of any row's end (a
                        row's 264 bytes start at or after the read's), so
                        the read is always resubmitted; FE_SHORT's half may
                        still hold the whole row */

struct fe_plan {
    int op;          /* enum fe_op, or -1 for none                              */
    long at;         /* 1-based position among calls of that kind            */
    int err;         /* negative errno, or FE_SHORT / FE_EOF for completions  */
    long count;      /* how many consecutive calls fail (1 = once; <0: all)  */
};

#define FE_MAX_SLOTS 1024

static struct fe_state {
    struct fe_plan plan;
    long calls[FE_NOPS];
    long fired;                      /* faults injected                   */
    int setup_uring, setup_threads;  /* constructor faults (negative errno) */
    int wrap;                        /* wrap engines the reader creates    */
    /* contract checks */
    long requeue_inflight, unknown_cqe, destroy_inflight, destroyed;
    unsigned char inflight[FE_MAX_SLOTS];
    long outstanding;
} fe;

static inline void fe_reset(void)
{
    memset(&fe, 0, sizeof fe);
    fe.plan.op = -1;
    fe.wrap = 1;
}

/* The plan and the counters are shared with a pool's I/O thread (the
 * engine's only caller while a pool is open): arming, firing and reading
 * them take this lock.  The contract counters below are the I/O thread's
 * while it runs and are read after the pool is closed (joined). */
static pthread_mutex_t fe_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void fe_arm(int op, long at, int err, long count)
{
    pthread_mutex_lock(&fe_mu);
    fe.plan = (struct fe_plan){op, at, err, count};
    fe.fired = 0;
    memset(fe.calls, 0, sizeof fe.calls);
    pthread_mutex_unlock(&fe_mu);
}

static inline void fe_disarm(void)
{
    pthread_mutex_lock(&fe_mu);
    fe.plan.op = -1;
    pthread_mutex_unlock(&fe_mu);
}

/* Faults fired since the last arm. */
static inline long fe_fired(void)
{
    pthread_mutex_lock(&fe_mu);
    long n = fe.fired;
    pthread_mutex_unlock(&fe_mu);
    return n;
}

/* 1 if this call of kind op is to fail (and counts it); *err: its error. */
static inline int fe_hit_err(int op, int *err)
{
    pthread_mutex_lock(&fe_mu);
    long n = ++fe.calls[op];
    int hit = fe.plan.op == op && n >= fe.plan.at &&
              !(fe.plan.count >= 0 && n >= fe.plan.at + fe.plan.count);
    if (hit) {
        fe.fired++;
        *err = fe.plan.err;
    }
    pthread_mutex_unlock(&fe_mu);
    return hit;
}

static inline int fe_hit(int op)
{
    int e;
    return fe_hit_err(op, &e);
}

struct fe_engine {
    struct io_engine base;
    struct io_engine *inner;
};

static int fe_queue(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off)
{
    struct fe_engine *f = (struct fe_engine *)e;
    int ferr;
    if (fe_hit_err(FE_QUEUE, &ferr))
        return ferr;
    if (slot < FE_MAX_SLOTS) {
        if (fe.inflight[slot])
            fe.requeue_inflight++;
        fe.inflight[slot] = 1;
    }
    int rc = f->inner->ops->queue(f->inner, slot, buf, len, off);
    if (rc == 0)
        fe.outstanding++;
    else if (slot < FE_MAX_SLOTS)
        fe.inflight[slot] = 0;
    return rc;
}

static int fe_submit(struct io_engine *e)
{
    struct fe_engine *f = (struct fe_engine *)e;
    int ferr;
    if (fe_hit_err(FE_SUBMIT, &ferr))
        return ferr;
    return f->inner->ops->submit(f->inner);
}

static int fe_reap(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min)
{
    struct fe_engine *f = (struct fe_engine *)e;
    int ferr;
    if (fe_hit_err(FE_REAP, &ferr))
        return ferr; /* nothing taken from the inner engine: nothing lost */
    int n = f->inner->ops->reap(f->inner, out, max, min);
    for (int i = 0; i < n; i++) {
        unsigned s = out[i].slot;
        if (s >= FE_MAX_SLOTS || !fe.inflight[s])
            fe.unknown_cqe++;
        else
            fe.inflight[s] = 0;
        fe.outstanding--;
        if (out[i].res > 0 && fe_hit_err(FE_CQE, &ferr)) {
            if (ferr == FE_SHORT)
                out[i].res = out[i].res > 1 ? out[i].res / 2 : 0;
            else if (ferr == FE_CUT)
                out[i].res = out[i].res / 2 < 200 ? out[i].res / 2 : 200;
            else if (ferr == FE_EOF)
                out[i].res = 0;
            else
                out[i].res = ferr;
        }
    }
    return n;
}

static int fe_cancel(struct io_engine *e)
{
    struct fe_engine *f = (struct fe_engine *)e;
    int ferr;
    if (fe_hit_err(FE_CANCEL, &ferr))
        return ferr;
    return f->inner->ops->cancel(f->inner);
}

static void fe_wake(struct io_engine *e)
{
    struct fe_engine *f = (struct fe_engine *)e;
    f->inner->ops->wake(f->inner);
}

static void fe_destroy(struct io_engine *e)
{
    struct fe_engine *f = (struct fe_engine *)e;
    if (fe.outstanding > 0)
        fe.destroy_inflight += fe.outstanding;
    fe.destroyed++;
    f->inner->ops->destroy(f->inner);
    free(f);
}

static const struct io_engine_ops fe_ops = {fe_queue, fe_submit, fe_reap, fe_cancel, fe_wake, fe_destroy};

static inline struct io_engine *fe_wrap_engine(struct io_engine *inner)
{
    struct fe_engine *f = calloc(1, sizeof *f);
    if (!f)
        return inner;
    f->base = *inner;
    f->base.ops = &fe_ops;
    f->inner = inner;
    memset(fe.inflight, 0, sizeof fe.inflight);
    fe.outstanding = 0;
    return &f->base;
}


/* ------------------------------------------------ the gate
 *
 * With fg_arm(1), engines created from then on are gates: no read reaches
 * the device until the test releases it.  A gate keeps the reads queued
 * to it in order (and logs every one: offset, length), and its reap
 * completes only released reads, by a real pread of the model file into the
 * reader's buffer; with none released it blocks until a release or a
 * wake.  So a test decides when each read finishes: a read it never
 * releases is a read stuck in the device, and the reads the pool issues
 * between two releases (a "wave") are its decisions for that state.
 * fg_settle() waits until the pool's thread is blocked in the gate again
 * with nothing to do (every effect of the last release or begin seen). */

#define FG_LOG 65536

struct fg_read {
    unsigned slot;
    void *buf;
    uint32_t len;
    uint64_t off;
    int released, stuck, cancelled;
};

static struct {
    int armed;
    int fd;
    struct fg_read q[FE_MAX_SLOTS]; /* in flight, in queue order */
    unsigned n;
    uint64_t log_off[FG_LOG];
    uint32_t log_len[FG_LOG];
    unsigned nlog;
    int waiting, woken;
    unsigned long blocks;            /* times the reaper blocked         */
    pthread_cond_t cv;
} fg = {.cv = PTHREAD_COND_INITIALIZER};

struct fg_engine {
    struct io_engine base;
    struct io_engine *inner;
};

static int fg_queue(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off)
{
    (void)e;
    pthread_mutex_lock(&fe_mu);
    int rc = -EBUSY;
    if (fg.n < FE_MAX_SLOTS) {
        fg.q[fg.n++] = (struct fg_read){slot, buf, len, off, 0, 0, 0};
        if (fg.nlog < FG_LOG) {
            fg.log_off[fg.nlog] = off;
            fg.log_len[fg.nlog++] = len;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&fe_mu);
    return rc;
}

static int fg_submit(struct io_engine *e)
{
    (void)e;
    return 0;
}

static int fg_reap(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min)
{
    (void)e;
    pthread_mutex_lock(&fe_mu);
    unsigned k = 0;
    for (;;) {
        for (unsigned i = 0; i < fg.n && k < max;) {
            struct fg_read *r = &fg.q[i];
            if (!r->released && !r->cancelled) {
                i++;
                continue;
            }
            ssize_t got = r->cancelled ? -ECANCELED : pread(fg.fd, r->buf, r->len, (off_t)r->off);
            out[k++] = (struct io_cqe){r->slot, got < 0 ? (r->cancelled ? -ECANCELED : -errno) : (int32_t)got};
            memmove(r, r + 1, (fg.n - i - 1) * sizeof *r);
            fg.n--;
        }
        /* a wake may end the wait early (io_engine.h) */
        if ((k > 0 && k >= min) || min == 0 || fg.woken)
            break;
        fg.waiting = 1;
        fg.blocks++;
        pthread_cond_broadcast(&fg.cv);
        pthread_cond_wait(&fg.cv, &fe_mu);
        fg.waiting = 0;
    }
    fg.woken = 0;
    pthread_mutex_unlock(&fe_mu);
    return (int)k;
}

static int fg_cancel(struct io_engine *e)
{
    (void)e;
    pthread_mutex_lock(&fe_mu);
    for (unsigned i = 0; i < fg.n; i++)
        if (!fg.q[i].released)
            fg.q[i].cancelled = 1;
    pthread_cond_broadcast(&fg.cv);
    pthread_mutex_unlock(&fe_mu);
    return 0;
}

static void fg_wake(struct io_engine *e)
{
    (void)e;
    pthread_mutex_lock(&fe_mu);
    fg.woken = 1;
    pthread_cond_broadcast(&fg.cv);
    pthread_mutex_unlock(&fe_mu);
}

static void fg_destroy(struct io_engine *e)
{
    struct fg_engine *g = (struct fg_engine *)e;
    pthread_mutex_lock(&fe_mu);
    if (fg.n > 0)
        fe.destroy_inflight += fg.n;
    pthread_mutex_unlock(&fe_mu);
    g->inner->ops->destroy(g->inner);
    free(g);
}

static const struct io_engine_ops fg_ops = {fg_queue, fg_submit, fg_reap, fg_cancel, fg_wake, fg_destroy};

static inline struct io_engine *fg_wrap_engine(int fd, struct io_engine *inner)
{
    struct fg_engine *g = calloc(1, sizeof *g);
    if (!g)
        return inner;
    g->base = *inner;
    g->base.ops = &fg_ops;
    g->inner = inner;
    pthread_mutex_lock(&fe_mu);
    fg.fd = fd;
    fg.n = 0;
    fg.nlog = 0;
    fg.waiting = fg.woken = 0;
    pthread_mutex_unlock(&fe_mu);
    return &g->base;
}

static inline void fg_arm(int on)
{
    pthread_mutex_lock(&fe_mu);
    fg.armed = on;
    pthread_mutex_unlock(&fe_mu);
}

/* The reaper's blocks so far: pass to fg_settle after an action. */
static inline unsigned long fg_blocks(void)
{
    pthread_mutex_lock(&fe_mu);
    unsigned long b = fg.blocks;
    pthread_mutex_unlock(&fe_mu);
    return b;
}

/* Waits (up to 20 s: 0 then) until the reaper blocked again after
 * `since` and is blocked now with no wake pending. */
static inline int fg_settle(unsigned long since)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&fe_mu);
    int rc = 0;
    while (!(fg.blocks > since && fg.waiting && !fg.woken) && rc == 0)
        rc = pthread_cond_timedwait(&fg.cv, &fe_mu, &until);
    int ok = fg.blocks > since && fg.waiting && !fg.woken;
    pthread_mutex_unlock(&fe_mu);
    return ok;
}

/* Releases every read in flight that is not stuck; returns how many. */
static inline unsigned fg_release_all(void)
{
    pthread_mutex_lock(&fe_mu);
    unsigned k = 0;
    for (unsigned i = 0; i < fg.n; i++)
        if (!fg.q[i].stuck && !fg.q[i].released) {
            fg.q[i].released = 1;
            k++;
        }
    pthread_cond_broadcast(&fg.cv);
    pthread_mutex_unlock(&fe_mu);
    return k;
}

/* Marks the reads in flight covering file bytes [lo, hi) stuck (or not). */
static inline unsigned fg_stick(uint64_t lo, uint64_t hi, int stuck)
{
    pthread_mutex_lock(&fe_mu);
    unsigned k = 0;
    for (unsigned i = 0; i < fg.n; i++)
        if (fg.q[i].off <= lo && fg.q[i].off + fg.q[i].len >= hi) {
            fg.q[i].stuck = stuck;
            k++;
        }
    pthread_mutex_unlock(&fe_mu);
    return k;
}

static inline unsigned fg_in_flight(void)
{
    pthread_mutex_lock(&fe_mu);
    unsigned n = fg.n;
    pthread_mutex_unlock(&fe_mu);
    return n;
}

int __real_io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                               struct io_engine **out, char *note, size_t note_len);
int __wrap_io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                               struct io_engine **out, char *note, size_t note_len);
int __wrap_io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                               struct io_engine **out, char *note, size_t note_len)
{
    if (fe.setup_uring)
        return fe.setup_uring;
    int rc = __real_io_uring_engine_new(fd, depth, arena, arena_len, wakeable, out, note, note_len);
    if (rc == 0 && fg.armed)
        *out = fg_wrap_engine(fd, *out);
    else if (rc == 0 && fe.wrap)
        *out = fe_wrap_engine(*out);
    return rc;
}

int __real_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out);
int __wrap_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out);
int __wrap_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out)
{
    if (fe.setup_threads)
        return fe.setup_threads;
    int rc = __real_io_threads_engine_new(fd, threads, queue, drop, out);
    if (rc == 0 && fg.armed)
        *out = fg_wrap_engine(fd, *out);
    else if (rc == 0 && fe.wrap)
        *out = fe_wrap_engine(*out);
    return rc;
}

#endif
