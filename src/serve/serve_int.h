/*
 * serve_int.h - the pool's internals, shared by the files of serve/:
 * pool.c (open, close, the I/O thread), rounds.c (the thread's part of
 * decode steps), session.c (sessions and steps), prefetch.c (prefill with
 * prefetch: its users' calls and the thread's part) and pool_shared.c
 * (what all of them use).  The I/O thread (pool.c) calls into rounds.c and
 * prefetch.c; session.c calls rounds.c (the step queue); all of them call
 * pool_shared.c; nothing calls back up.
 *
 * Locks: pool->mu guards the step queue, the prefill list, the ring cache,
 * the handle count and the pool's flags; session->mu a session's state,
 * history and step; prefill->mu a prefill's consumer-side state.  Order when
 * nested: pool->mu, then session->mu or prefill->mu (never two sessions,
 * never a session and a prefill).  Rounds and the reader are the I/O
 * thread's alone (intake fills rounds under pool->mu).
 *
 * Lifetimes: a session's memory is freed by whichever lets go last, its
 * owner's close or the round entry that still refers to it (refs), so that
 * close never waits for a read.  The pool's memory (its "shell": locks,
 * flags, hooks) outlives engram_pool_close while sessions or prefills of it
 * are still open; the last of them frees it.
 */
#ifndef ENGRAM_SERVE_INT_H
#define ENGRAM_SERVE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engram.h"
#include "io/reader_int.h"
#include "sched_points.h"

#define ROUNDS 4
#define ROUND_REQS (ENGRAM_ROUND_TOKENS * ENGRAM_COLUMNS)
/* Slots the prefill jobs leave free for decode steps arriving meanwhile
 * (at most a quarter of the reader's depth). */
#define STEP_RESERVE 8u
/* Prefill rings the pool keeps for later prompts. */
#define RING_CACHE 4
/* Request bits of one table of a step: token * 24 + column. */
#define STEP_WORDS ((ENGRAM_MAX_DRAFT * ENGRAM_COLUMNS + 63) / 64)

enum { S_IDLE = 0, S_STEP, S_PREFILL };

struct engram_session {
    engram_pool *p;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* CLOCK_MONOTONIC                        */
    /* under mu */
    engram_history hist;          /* committed (PLE: id[0] lag 1, id[1] lag 2) */
    int state;                    /* idle, step, prefill                    */
    int closed;                   /* its owner closed it                    */
    unsigned refs;                /* round entries that refer to it         */
    engram_prefill *pf;           /* the prefill in progress                */
    /* the step, under mu */
    unsigned gen;                 /* bumped by every begin                  */
    unsigned issued;              /* gen + 1 of the step taken into a round */
    int ended;                    /* commit or abort: nothing more written  */
    unsigned k;
    int dtype;
    void *out;
    uint8_t masked[ENGRAM_MAX_DRAFT];
    uint32_t rows[ENGRAM_MAX_DRAFT][ENGRAM_ROWS_PER_TOKEN];
    engram_history after[ENGRAM_MAX_DRAFT];
    uint64_t want[ENGRAM_TABLES][STEP_WORDS]; /* requests not yet answered  */
    unsigned remaining[ENGRAM_TABLES];        /* = bits set in want         */
    int rc[ENGRAM_TABLES];
    engram_error err;             /* of the first failure                   */
    uint64_t begin_ns, ready_ns[ENGRAM_TABLES];
    unsigned nrows[ENGRAM_TABLES];
    int waited[ENGRAM_TABLES];    /* a wait for table t of this step returned 0 */
    /* the family's per-sequence state (PLE), touched only by the calls that
     * begin or end something (the caller serializes them) and by apply */
    float *conv;                  /* committed: F frames, oldest first      */
    float *conv_tent;                  /* step_apply's: the state after its k tokens,
                                     or (F < ENGRAM_MAX_DRAFT) F frames of
                                     running state then the k frames        */
    unsigned applied;             /* tokens of this step step_apply applied (0: none) */
    /* under pool->mu */
    int queued;
    engram_session *qprev, *qnext;
};

struct round_entry {
    engram_session *s;
    unsigned gen;
    void *out;
    int dtype;
    unsigned left;                /* requests not yet answered (0: released) */
    /* the family's numbers, cached for entry_done: a token's bytes in out,
     * a table's first row's offset in a token, a row's delivered bytes */
    uint32_t tok_bytes, table_bytes, row_bytes;
};

struct round {
    int active;
    uint64_t seq;                 /* intake order: older rounds issue first */
    struct rjob job[ENGRAM_TABLES];
    uint64_t reqs[ENGRAM_TABLES][ROUND_REQS];
    struct round_entry e[ENGRAM_ROUND_TOKENS];
    unsigned n_entries, n_tokens;
};

struct ring {
    uint8_t *mem;
    size_t len;
    int registered;               /* the host hooks accepted it            */
};

struct engram_pool {
    const engram_model *m;
    const engram_hasher *hasher;  /* V4.1's; NULL for PLE                  */
    /* the family's numbers (engram_family), cached at open */
    engram_family fam;
    int ple;                      /* fam.member == ENGRAM_MEMBER_PLE       */
    unsigned tables, cols, rpt;   /* tables, rows per table and token, rows per token */
    uint32_t vocab, width, streams;
    /* row-block shards (opts.shard_world > 1): table t's rows [shard_lo[t],
     * shard_lo[t] + shard_n[t]) are this pool's; the others are delivered
     * as zeros.  0: the whole tables (and the arrays unused). */
    int sharded;
    unsigned shard_rank, shard_world;
    uint32_t shard_lo[ENGRAM_TABLES], shard_n[ENGRAM_TABLES];
    size_t frame_floats;          /* PLE: one frame of the state, streams x W */
    size_t frames;                /* PLE: frames of the state, 3 (T - 1)   */
    size_t tent_floats;           /* a session's tentative buffer          */
    engram_reader *r;
    engram_host_hooks host;       /* the caller's (opts.reader.host)       */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* the I/O thread's idle wait (MONOTONIC) */
    int stop, work;
    int closed;                   /* engram_pool_close has returned        */
    unsigned handles;             /* sessions and prefills still open      */
    engram_session *q_head, *q_tail;
    engram_prefill *pf_head, *pf_tail; /* prefills served, oldest first    */
    unsigned pf_turn;             /* round-robin start of the prefill share */
    unsigned pf_min_slots;        /* reads in flight prompts keep          */
    unsigned step_reserve;        /* slots prompts leave for steps to come  */
    struct round *rounds;         /* [ROUNDS], the I/O thread's            */
    uint64_t round_seq;
    uint64_t ends;                /* steps ended with rows still to come   */
    struct ring rings[RING_CACHE];/* free rings of ended prefills          */
    uint64_t ring_cache_cap;      /* bytes they may hold together          */
    /* statistics, under mu */
    uint64_t steps, n_rounds, step_requested, step_read, pf_chunks, pf_requested, pf_read;
    uint64_t ring_allocs, ring_reuses, ring_bytes;
    int broken;
    engram_error broken_err;
    engram_io_stats io0;          /* the reader's facts at open            */
};

struct engram_prefill {
    engram_session *s;            /* NULL once its session closed (under pf->mu) */
    engram_pool *p;
    const uint32_t *tokens;
    const uint8_t *mask;
    size_t n, chunks;
    unsigned chunk, ring;
    int dtype;
    size_t row_bytes;
    unsigned tables, cols;        /* the pool's family                     */
    uint64_t t_begin, delay_ns;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* CLOCK_MONOTONIC                       */
    /* under mu (the consumer's side) */
    size_t released[ENGRAM_TABLES];
    int cancel_req, table1_go, detached;
    int rc;
    engram_error err;
    uint64_t first_ns[ENGRAM_TABLES], last_ns[ENGRAM_TABLES];
    size_t applied[ENGRAM_TABLES]; /* chunks engram_prefill_apply applied, in order */
    float *conv;                  /* PLE: the state after the applied chunks */
    _Atomic size_t ready[ENGRAM_TABLES];
    /* the I/O thread's */
    engram_history hist[ENGRAM_TABLES]; /* running history of each table's hashing */
    size_t next[ENGRAM_TABLES];   /* next chunk to read                    */
    int active[ENGRAM_TABLES];
    struct rjob job[ENGRAM_TABLES];
    uint64_t *reqs[ENGRAM_TABLES];   /* chunk x 24                          */
    uint32_t *rows48;                /* chunk x rows per token, hashing scratch */
    uint8_t *kinds;                  /* PLE: chunk kinds, hashing scratch   */
    uint8_t *buf[ENGRAM_TABLES];     /* ring x chunk x 24 rows              */
    struct ring own;                 /* both rings, if the pool provided them */
    size_t ring_len;
    /* under pool->mu */
    int listed;
    engram_prefill *next_pf;
};

/* ------------------------------------------------- pool_shared.c */

/* Under p->mu: the I/O thread runs another iteration (unless stopping). */
void pool_wake_locked(engram_pool *p);
/* Under p->mu: 0, or why the pool takes no new work (-ESHUTDOWN, -EIO
 * with the broken reader's error). */
int pool_refuses(const engram_pool *p, engram_error *err);
/* The applier's layer info into *li, if it is a layer of the pool's model
 * (member, width, streams, state): 0, else -EINVAL naming both. */
int pool_applier_layer(const engram_pool *p, engram_applier *a, engram_layer_info *li,
                       engram_error *err);
/* A sharded pool's: whether row `row` of table t is in this pool's block
 * (one unsigned compare: rows below the block wrap above it). */
static inline int pool_owns(const engram_pool *p, unsigned t, uint32_t row)
{
    return row - p->shard_lo[t] < p->shard_n[t];
}
/* The refusal of an apply on a sharded pool (-EINVAL), whose rows are
 * only this rank's block. */
int pool_refuse_sharded_apply(const engram_pool *p, const char *what, engram_error *err);
/* Tells the I/O thread there is work (any thread, no lock held). */
void pool_kick(engram_pool *p);
/* Drops a handle (a session or a prefill) of a closed pool; frees the
 * pool's shell when it was the last.  Under no lock. */
void pool_handle_gone(engram_pool *p);
/* A condition variable whose timed waits take CLOCK_MONOTONIC times. */
void pool_cond_init(pthread_cond_t *cv);
/* An absolute CLOCK_MONOTONIC time timeout_ns from now. */
struct timespec pool_deadline(uint64_t timeout_ns);
/* A ring of at least len bytes from the pool's cache or new (registered
 * with the host hooks), or NULL; gives it back (kept or freed). */
int pool_ring_take(engram_pool *p, size_t len, struct ring *out);
void pool_ring_give(engram_pool *p, struct ring *rg);
/* Frees a ring now (unregistering it). */
void pool_ring_free(engram_pool *p, struct ring *rg);
/* The pool's memory once it is closed and nothing refers to it. */
void pool_free_shell(engram_pool *p);
/* A session's memory, once neither its owner nor a round refers to it. */
void serve_session_free(engram_session *s);
/* PLE: a session mask entry (0 pad, 1 text, 2 image; NULL mask: text) as
 * an engram_ple_hash kind; 0xff for a value that is none of them. */
static inline uint8_t serve_ple_kind(const uint8_t *mask, size_t i)
{
    static const uint8_t kind[3] = {ENGRAM_PLE_PAD, ENGRAM_PLE_TEXT, ENGRAM_PLE_IMAGE};
    return !mask ? ENGRAM_PLE_TEXT : mask[i] < 3 ? kind[mask[i]] : 0xff;
}
/* Checks n tokens (< vocab) and, for PLE, their mask values; first: the
 * position of tokens[0] in the caller's numbering. */
int serve_check_tokens(const engram_pool *p, const uint32_t *tokens, const uint8_t *mask, size_t n,
                       size_t first, engram_error *err);
/* PLE histories: engram_ple_history <-> engram_history (id[0] lag 1,
 * id[1] lag 2, id[2] = ENGRAM_DEAD). */
static inline engram_history serve_hist_of_ple(const engram_ple_history *h)
{
    engram_history e = {{(int32_t)h->lag[0], (int32_t)h->lag[1], ENGRAM_DEAD}};
    return e;
}
static inline engram_ple_history serve_ple_of_hist(const engram_history *e)
{
    engram_ple_history h = {{(uint32_t)e->id[0], (uint32_t)e->id[1]}};
    return h;
}

/* ------------------------------------------------- rounds.c */

/* Under s->mu: a round entry lets go of its session; 1 when the session
 * is then to be freed (closed, and nothing else refers to it). */
int rounds_entry_release(struct round_entry *en);
/* Under s->mu: table t's outstanding requests of the current step fail
 * with e (the step's first error is kept). */
void rounds_step_fail(engram_session *s, int t, const engram_error *e);
/* The step queue, under p->mu: a session with a step not yet in a round;
 * removing one that is not queued does nothing; rounds_queue_fail fails every
 * queued step with e and empties the queue. */
void rounds_queue_add(engram_pool *p, engram_session *s);
void rounds_queue_remove(engram_pool *p, engram_session *s);
void rounds_queue_fail(engram_pool *p, const engram_error *e);
/* The I/O thread's: queued steps into free rounds (under p->mu); up to max
 * of the rounds' reads issued; rounds whose steps all ended stop reading;
 * finished rounds let go of their sessions; whether any round is active;
 * every round's jobs failed with e; every entry let go, failing its step
 * with e (a broken reader's rounds). */
void rounds_intake(engram_pool *p);
void rounds_issue(engram_pool *p, unsigned max);
void rounds_drop_stale(engram_pool *p);
void rounds_finish(engram_pool *p);
int rounds_active(const engram_pool *p);
void rounds_fail(engram_pool *p, const engram_error *e);
void rounds_release(engram_pool *p, const engram_error *e);

/* ------------------------------------------------- prefetch.c */

/* The I/O thread's part of prefills, first: collect ended jobs, detach
 * what is done, start the next chunks; *guard = the slots the prompts are
 * to keep now (their minimum less what they have in flight, when they have
 * reads to issue).  Returns when the next table 1 waiting for its delay
 * may start (CLOCK_MONOTONIC ns), or 0. */
uint64_t prefetch_progress(engram_pool *p, unsigned *guard);
/* Then, after the steps: issues prefill reads with the budget left (less a
 * reserve for steps, but at least guard), shared between prefills. */
void prefetch_issue(engram_pool *p, unsigned budget, unsigned guard);
/* 1 if a prefill has a job that ended and is still to be collected by
 * prefetch_progress.  Called by the I/O thread with p->mu held. */
int prefetch_collectable(engram_pool *p);
/* Fails every prefill's jobs (the engine died, or the pool closes): under
 * no lock. */
void prefetch_fail_all(engram_pool *p, int code, const engram_error *e);
/* Ends every prefill for good (after a drain, or when the reader is
 * broken): fails them with e and detaches them.  Under no lock. */
void prefetch_detach_all(engram_pool *p, const engram_error *e);

#endif
