/*
 * io_engine.h - the small interface behind which the reader's I/O engines
 * live: queue reads into caller-owned buffers, submit, reap completions,
 * cancel.  An engine is driven by one thread at a time (its reader's).
 *
 * The contract the reader keeps (and tests/fault_engine.h checks): every
 * queued read is reaped exactly once, cancelled or not, before its buffer
 * is queued again or freed, and destroy() is only called with nothing in
 * flight; reap() is never asked to wait for more completions than there are
 * reads in flight.
 *
 * Errors: queue/submit/reap/cancel return 0 (or a count) or a negative
 * errno.  -EINTR, -EAGAIN and -EBUSY are transient: nothing was lost, the
 * caller reaps what it can and tries again.  Any other error is hard.
 */
#ifndef ENGRAM_IO_ENGINE_H
#define ENGRAM_IO_ENGINE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

struct io_cqe {
    unsigned slot;     /* what queue() was given                      */
    int32_t res;       /* bytes read, or a negative errno             */
};

enum io_drop { DROP_NONE = 0, DROP_DONTCACHE, DROP_FADVISE };

static inline int io_transient(int rc)
{
    return rc == -EINTR || rc == -EAGAIN || rc == -EBUSY;
}

struct io_engine;
struct io_engine_ops {
    /* Queues a read of len bytes at file offset off into buf; may submit
     * early when the engine's queue is full.  0 or -errno (nothing queued). */
    int (*queue)(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off);
    /* Hands everything queued to the kernel / the workers.  On an error the
     * reads stay queued: the next submit or reap hands them over. */
    int (*submit)(struct io_engine *e);
    /* Submits whatever is queued, then writes up to max completions to out,
     * blocking until at least min are there (one system call for both where
     * the engine can).  Returns how many, or -errno (then none was taken). */
    int (*reap)(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min);
    /* Asks for every read queued or in flight to be cancelled.  Each still
     * completes through reap, with -ECANCELED or its real result (reads
     * already at the device finish).  0 or -errno. */
    int (*cancel)(struct io_engine *e);
    /* Makes a reap() that is blocked (or the next one) return, with the
     * completions there are, possibly none.  The only op that may be called
     * from any thread, concurrently with the others.  Engines created
     * without `wakeable` ignore it. */
    void (*wake)(struct io_engine *e);
    void (*destroy)(struct io_engine *e);
};

struct io_engine {
    const struct io_engine_ops *ops;
    const char *name;
    size_t bytes;      /* memory the engine holds (rings, queues), not stacks */
};

/* io_uring on fd with `depth` entries; the buffers in [arena, arena+len) are
 * registered as fixed buffers and fd as a fixed file where the kernel allows
 * (note says what it could not do).  wakeable: keep a read of an eventfd in
 * the ring so that wake() can interrupt a reap (one descriptor more).
 * -errno if io_uring is refused. */
int io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                        struct io_engine **out, char *note, size_t note_len);

/* `threads` pread workers on fd taking reads from a queue of `queue`
 * (>= threads, else -EINVAL) entries: the reads the caller may have in
 * flight, those past `threads` waiting queued for the next free worker
 * (queue() returns -EBUSY while `queue` reads are queued, being read, or
 * completed and not reaped); drop says how reads leave the page cache on a
 * buffered descriptor. */
int io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                          struct io_engine **out);

#endif
