/*
 * pool.h - a fixed fork-join team of worker threads, created once: run(fn)
 * calls fn(arg, w) for w = 0 .. workers-1, worker 0 on the calling thread,
 * and returns when all are done.  Used by the applier when the caller gives
 * no fork-join hook of its own.  One run at a time per pool.
 */
#ifndef ENGRAM_POOL_H
#define ENGRAM_POOL_H

#include "engram.h"

struct pool;

/* A team of `workers` (>= 1): workers - 1 threads are started, with
 * 256 KiB stacks.  0, -EAGAIN (thread creation) or -ENOMEM. */
int pool_new(unsigned workers, struct pool **out);
void pool_free(struct pool *p);
/* The engram_fork_join signature, with ctx = the pool. */
void pool_run(void *pool, unsigned workers, engram_worker_fn fn, void *arg);

#endif
