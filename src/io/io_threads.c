/*
 * io_threads.c - the portable engine: a fixed pool of threads, created once
 * per reader (not per batch), each doing blocking positional reads.  Reads
 * are queued into a ring and completions come back through another; both
 * rings hold `queue` entries (the reader's slots: it never has more in
 * flight).  With more slots than threads (the reader gives a thread per two
 * slots, ENGRAM_READER_THREADS), reads wait queued, and a thread that
 * finishes one takes the next without going to sleep and being woken by the
 * reader's next submission.  With a thread per slot (before 2026-12-07) that
 * hand-off made 3.5-3.6 context switches and ~40 us of CPU a read at depth
 * 32 on the development VM's 2 cores (perf stat; now 1.5-1.6 and 23-26
 * us), and the pool ran at ~0.7x fio's psync engine with as many jobs;
 * queued ahead, 0.92-1.10x, and 1.23-1.84x the reads/s at the same depth
 * (BENCHMARKS.md, 2026-12-07 session y).  A blocked reap is woken when the count it waits
 * for is there, not by every completion.
 *
 * The SCHED_ macros (serve/sched_points.h) are the plain pthread calls, or
 * nothing, except in the library's build for tests/test_interleave.c, which
 * runs this engine's workers and callers one at a time through every
 * ordering of a few scenarios (a pause point after each lock release that
 * ends a change of the shared state, but for wake's, which the pool calls
 * under its own lock; waits that may also end spuriously).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io_engine.h"
#include "common/util.h"
#include "serve/sched_points.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif

struct job {
    unsigned slot;
    void *buf;
    uint32_t len;
    uint64_t off;
};

struct thread_engine {
    struct io_engine base;
    int fd;
    enum io_drop drop;
    unsigned n_threads, cap;     /* threads started; ring entries (queue) */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct job *jobs;            /* ring of queued jobs      */
    unsigned j_head, j_count;
    unsigned staged;             /* queued but not submitted */
    unsigned outstanding;        /* queued, being read, or completed and not reaped: <= cap */
    struct io_cqe *cqes;         /* ring of completions      */
    unsigned c_head, c_count;
    int stop;
    int woken;                   /* wake() since the last reap */
    unsigned want;               /* completions a blocked reap waits for; 0: none waits */
};

/* One read to completion: retries EINTR/EAGAIN, continues partial reads,
 * stops at end of file.  Returns bytes read or -errno. */
static int32_t do_read(struct thread_engine *t, const struct job *j)
{
    uint32_t got = 0;
    while (got < j->len) {
        ssize_t r;
        if (t->drop == DROP_DONTCACHE) {
            struct iovec iov = {(char *)j->buf + got, j->len - got};
            r = preadv2(t->fd, &iov, 1, (off_t)(j->off + got), RWF_DONTCACHE);
        } else {
            r = pread(t->fd, (char *)j->buf + got, j->len - got, (off_t)(j->off + got));
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        got += (uint32_t)r;
    }
    if (t->drop == DROP_FADVISE) {
        uint64_t lo = j->off & ~(uint64_t)4095, hi = (j->off + j->len + 4095) & ~(uint64_t)4095;
        posix_fadvise(t->fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
    }
    return (int32_t)got;
}

static void *worker(void *arg)
{
    struct thread_engine *t = arg;
    SCHED_THREAD_BEGIN("io worker");
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && t->j_count - t->staged == 0)
            SCHED_WAIT_SPURIOUS(&t->work, &t->mu);
        if (t->stop)
            break;
        struct job j = t->jobs[t->j_head];
        t->j_head = (t->j_head + 1) % t->cap;
        t->j_count--;
        pthread_mutex_unlock(&t->mu);
        SCHED_POINT("threads: read taken");
        int32_t res = do_read(t, &j);
        pthread_mutex_lock(&t->mu);
        t->cqes[(t->c_head + t->c_count) % t->cap] = (struct io_cqe){j.slot, res};
        t->c_count++;
        if (t->want && t->c_count >= t->want)
            SCHED_SIGNAL(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    SCHED_THREAD_END();
    return NULL;
}

static int t_queue(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off)
{
    struct thread_engine *t = (struct thread_engine *)e;
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    if (t->outstanding == t->cap) { /* the completion ring must hold every read taken */
        rc = -EBUSY;
    } else {
        t->jobs[(t->j_head + t->j_count) % t->cap] = (struct job){slot, buf, len, off};
        t->j_count++;
        t->staged++;
        t->outstanding++;
    }
    pthread_mutex_unlock(&t->mu);
    SCHED_POINT("threads: queued");
    return rc;
}

static int t_submit(struct io_engine *e)
{
    struct thread_engine *t = (struct thread_engine *)e;
    pthread_mutex_lock(&t->mu);
    unsigned n = t->staged;
    t->staged = 0;
    if (n == 1)
        SCHED_SIGNAL(&t->work);
    else if (n > 1)
        SCHED_WAKE(&t->work);
    pthread_mutex_unlock(&t->mu);
    SCHED_POINT("threads: submitted");
    return 0;
}

static int t_reap(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min)
{
    struct thread_engine *t = (struct thread_engine *)e;
    t_submit(e);
    pthread_mutex_lock(&t->mu);
    while (t->c_count < min && !t->woken) {
        t->want = min;
        SCHED_WAIT_SPURIOUS(&t->done, &t->mu);
    }
    t->want = 0;
    t->woken = 0;
    unsigned n = t->c_count < max ? t->c_count : max;
    for (unsigned i = 0; i < n; i++)
        out[i] = t->cqes[(t->c_head + i) % t->cap];
    t->c_head = (t->c_head + n) % t->cap;
    t->c_count -= n;
    t->outstanding -= n;
    pthread_mutex_unlock(&t->mu);
    SCHED_POINT("threads: reaped");
    return (int)n;
}

/* Jobs no worker has taken yet complete at once with -ECANCELED; reads a
 * worker is doing finish normally. */
static int t_cancel(struct io_engine *e)
{
    struct thread_engine *t = (struct thread_engine *)e;
    pthread_mutex_lock(&t->mu);
    while (t->j_count > 0) {
        struct job j = t->jobs[t->j_head];
        t->j_head = (t->j_head + 1) % t->cap;
        t->j_count--;
        t->cqes[(t->c_head + t->c_count) % t->cap] = (struct io_cqe){j.slot, -ECANCELED};
        t->c_count++;
    }
    t->staged = 0;
    SCHED_WAKE(&t->done);
    pthread_mutex_unlock(&t->mu);
    SCHED_POINT("threads: cancelled");
    return 0;
}

static void t_wake(struct io_engine *e)
{
    struct thread_engine *t = (struct thread_engine *)e;
    pthread_mutex_lock(&t->mu);
    t->woken = 1;
    SCHED_WAKE(&t->done);
    pthread_mutex_unlock(&t->mu);
    /* no pause point: the pool calls this holding its own lock */
}

static void t_destroy(struct io_engine *e)
{
    struct thread_engine *t = (struct thread_engine *)e;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    SCHED_WAKE(&t->work);
    pthread_mutex_unlock(&t->mu);
    SCHED_POINT("threads: stop");
    for (unsigned i = 0; i < t->n_threads; i++)
        SCHED_JOIN(t->threads[i]);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->work);
    pthread_cond_destroy(&t->done);
    free(t->threads);
    free(t->jobs);
    free(t->cqes);
    free(t);
}

static const struct io_engine_ops thread_ops = {t_queue, t_submit, t_reap, t_cancel, t_wake, t_destroy};

int io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                          struct io_engine **out)
{
    if (threads == 0 || queue < threads)
        return -EINVAL;
    struct thread_engine *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->fd = fd;
    t->drop = drop;
    t->cap = queue;
    t->threads = calloc(threads, sizeof *t->threads);
    t->jobs = calloc(queue, sizeof *t->jobs);
    t->cqes = calloc(queue, sizeof *t->cqes);
    if (!t->threads || !t->jobs || !t->cqes) {
        free(t->threads);
        free(t->jobs);
        free(t->cqes);
        free(t);
        return -ENOMEM;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work, NULL);
    pthread_cond_init(&t->done, NULL);
    t->base.ops = &thread_ops;
    t->base.name = drop == DROP_NONE ? "threads" : "buffered";
    t->base.bytes = sizeof *t + (size_t)threads * sizeof *t->threads +
                    (size_t)queue * (sizeof *t->jobs + sizeof *t->cqes);
    for (unsigned i = 0; i < threads; i++) {
        int rc = util_thread_start(&t->threads[i], 64 * 1024, worker, t); /* workers only read */
        if (rc < 0) {
            t->n_threads = i;
            t_destroy(&t->base);
            return rc;
        }
        SCHED_SPAWNED();
        t->n_threads = i + 1;
    }
    *out = &t->base;
    return 0;
}
