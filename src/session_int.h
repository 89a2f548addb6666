/*
 * session_int.h - the pool's internals, shared by session.c (the pool, its
 * I/O thread, sessions and decode steps) and prefetch.c (prefill with
 * prefetch, driven by the same thread).
 *
 * Locks: pool->mu guards the step queue, the prefill list and the "work"
 * flag; session->mu guards a session's step delivery state; prefill->mu a
 * prefill's progress.  Order when nested: pool->mu, then session->mu or
 * prefill->mu (never two sessions, never session and prefill).  The reader
 * is touched by the I/O thread only (and by wake from anywhere).
 */
#ifndef ENGRAM_SESSION_INT_H
#define ENGRAM_SESSION_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engram.h"
#include "reader_int.h"

#define ROUNDS 4
#define ROUND_REQS (ENGRAM_ROUND_TOKENS * ENGRAM_COLUMNS)
/* Slots the prefill jobs leave free for decode steps arriving meanwhile. */
#define STEP_RESERVE 8u

enum { S_IDLE = 0, S_STEP, S_PREFILL };

struct engram_session {
    engram_pool *p;
    engram_history hist;          /* committed                            */
    int state;                    /* the owner's view: idle, step, prefill */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the step, written under mu by begin, read by the I/O thread */
    unsigned gen;                 /* bumped by every begin                 */
    unsigned k;
    int dtype;
    void *out;
    uint8_t masked[ENGRAM_MAX_DRAFT];
    uint32_t rows[ENGRAM_MAX_DRAFT][ENGRAM_ROWS_PER_TOKEN];
    engram_history after[ENGRAM_MAX_DRAFT];
    /* delivery state, under mu */
    unsigned remaining[ENGRAM_TABLES];
    int rc[ENGRAM_TABLES];
    engram_error err;             /* of the first failure                  */
    int cancelled;
    unsigned refs;                /* rounds referencing the session        */
    uint64_t begin_ns, ready_ns[ENGRAM_TABLES];
    unsigned nrows[ENGRAM_TABLES];
    /* under pool->mu */
    int queued;
    engram_session *qnext;
    engram_prefill *pf;
};

struct round_entry {
    engram_session *s;
    unsigned gen;
    void *out;
    int dtype;
};

struct round {
    engram_pool *p;
    int active;
    struct rjob job[ENGRAM_TABLES];
    uint64_t reqs[ENGRAM_TABLES][ROUND_REQS];
    struct round_entry e[ENGRAM_ROUND_TOKENS];
    unsigned n_entries, n_tokens;
};

struct engram_pool {
    const engram_model *m;
    const engram_hasher *hasher;
    engram_reader *r;
    engram_host_hooks host;       /* the caller's (opts.reader.host)       */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* the I/O thread's idle wait            */
    int stop, work;
    engram_session *q_head, *q_tail;
    engram_prefill *pf_head;      /* prefills the I/O thread serves        */
    struct round rounds[ROUNDS];
    /* statistics, under mu */
    uint64_t steps, n_rounds, step_requested, step_read, pf_chunks, pf_requested, pf_read;
    int broken;
    engram_error broken_err;
    engram_io_stats io0;          /* the reader's facts at open            */
};

struct engram_prefill {
    engram_session *s;
    engram_pool *p;
    const uint32_t *tokens;
    const uint8_t *mask;
    size_t n, chunks;
    unsigned chunk, ring;
    int dtype;
    size_t row_bytes;
    uint64_t t_begin, delay_ns;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu (the consumer's side) */
    size_t released[ENGRAM_TABLES];
    int cancel_req, table1_go, detached;
    int rc;
    engram_error err;
    _Atomic size_t ready[ENGRAM_TABLES];
    /* the I/O thread's */
    engram_history hist[ENGRAM_TABLES]; /* running history of each table's hashing */
    size_t next[ENGRAM_TABLES];   /* next chunk to read                    */
    int active[ENGRAM_TABLES];
    struct rjob job[ENGRAM_TABLES];
    uint64_t *reqs[ENGRAM_TABLES];   /* chunk x 24                          */
    uint32_t *rows48;                /* chunk x 48, hashing scratch         */
    uint8_t *buf[ENGRAM_TABLES];     /* ring x chunk x 24 rows              */
    uint8_t *ring_own;               /* both rings, if allocated here       */
    size_t ring_len;
    int ring_registered;             /* the pool's host.reg accepted it      */
    engram_prefill *next_pf;
};

uint64_t pool_now_ns(void);
/* Tells the I/O thread there is work (any thread). */
void pool_kick(engram_pool *p);
/* The I/O thread's part of prefills: progress, issue, collect; returns 1
 * if some prefill waits on time only (the delay of table 1). */
int prefetch_service(engram_pool *p, unsigned *budget);
/* 1 if a prefill has a job that ended (read, or failed before its reads
 * were issued) and is still to be collected by prefetch_service.  Called
 * by the I/O thread with p->mu held. */
int prefetch_collectable(engram_pool *p);
/* Fails every prefill's jobs (the engine died): under no lock. */
void prefetch_fail_all(engram_pool *p, int code, const engram_error *e);

#endif
