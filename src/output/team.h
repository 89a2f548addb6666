/*
 * team.h - a fixed fork-join team of worker threads, created once: run(fn)
 * calls fn(arg, w) for w = 0 .. workers-1, worker 0 on the calling thread,
 * and returns when all are done.  Used by the applier when the caller gives
 * no fork-join hook of its own.  One run at a time per team.
 */
#ifndef ENGRAM_TEAM_H
#define ENGRAM_TEAM_H

#include "engram.h"

struct team;

/* A team of `workers` (>= 1): workers - 1 threads are started, with
 * 256 KiB stacks.  0, -EAGAIN (thread creation) or -ENOMEM. */
int team_new(unsigned workers, struct team **out);
void team_free(struct team *p);
/* The engram_fork_join signature, with ctx = the team. */
void team_run(void *team, unsigned workers, engram_worker_fn fn, void *arg);

#endif
