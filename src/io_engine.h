/*
 * io_engine.h - the small interface behind which the reader's I/O engines
 * live: queue reads into caller-owned buffers, submit, reap completions.
 * An engine is driven by one thread at a time (its reader's).
 */
#ifndef ENGRAM_IO_ENGINE_H
#define ENGRAM_IO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

struct io_cqe {
    unsigned slot;     /* what queue() was given                      */
    int32_t res;       /* bytes read, or a negative errno             */
};

enum io_drop { DROP_NONE = 0, DROP_DONTCACHE, DROP_FADVISE };

struct io_engine;
struct io_engine_ops {
    /* Queues a read of len bytes at file offset off into buf; may submit
     * early when the engine's queue is full.  0 or -errno. */
    int (*queue)(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off);
    /* Hands everything queued to the kernel / the workers. */
    int (*submit)(struct io_engine *e);
    /* Submits whatever is queued, then writes up to max completions to out,
     * blocking until at least min are there (one system call for both where
     * the engine can).  Returns how many, or -errno. */
    int (*reap)(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min);
    void (*destroy)(struct io_engine *e);
};

struct io_engine {
    const struct io_engine_ops *ops;
    const char *name;
    size_t bytes;      /* memory the engine holds (rings, queues), not stacks */
};

/* io_uring on fd with `depth` entries; the buffers in [arena, arena+len) are
 * registered as fixed buffers and fd as a fixed file where the kernel allows
 * (note says what it could not do).  -errno if io_uring is refused. */
int io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len,
                        struct io_engine **out, char *note, size_t note_len);

/* `threads` pread workers on fd; drop says how reads leave the page cache on
 * a buffered descriptor. */
int io_threads_engine_new(int fd, unsigned threads, enum io_drop drop, struct io_engine **out);

#endif
