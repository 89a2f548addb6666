/*
 * pool.c - the pool shared by the sessions of a model (engram.h,
 * "sessions"): open, close, statistics, and its I/O thread, which takes
 * queued steps into rounds (rounds.c) and prompts' chunks (prefetch.c),
 * issues their reads (steps first, prompts keeping a few slots), reaps,
 * and fails what it must when the engine fails or the pool closes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/model.h"
#include "serve_int.h"
#include "common/util.h"

/* The engine failed as a whole (submit or reap, after retries): every read
 * in flight is collected and every step and prefill chunk that had reads
 * fails with the error.  The pool goes on with later steps unless the
 * reader itself is broken (its engine stopped answering). */
static void fail_everything(engram_pool *p, int rc, const char *what)
{
    engram_error e;
    err_set(&e, rc, ENGRAM_NO_OFFSET, "the pool's I/O engine failed (%s): %s", what,
            engram_strerror(rc));
    rounds_fail(p, &e);
    prefetch_fail_all(p, rc, &e);
    reader_drain_all(p->r, 1);
    engram_error be;
    if (reader_broken(p->r, &be) < 0) {
        pthread_mutex_lock(&p->mu);
        if (!p->broken) {
            p->broken = 1;
            p->broken_err = be;
        }
        pthread_mutex_unlock(&p->mu);
    }
}

/* The reader is broken: its engine stopped answering with reads in flight,
 * and they will never be collected.  Every step queued or in a round and
 * every prefill fails at once with the pool's error; their owners may
 * reuse or free their buffers. */
static void pool_dead(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    engram_error e = p->broken_err;
    rounds_queue_fail(p, &e);
    pthread_mutex_unlock(&p->mu);
    rounds_release(p, &e);
    prefetch_detach_all(p, &e);
    SCHED_POINT("io: dead");
}

static int pool_is_broken(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int b = p->broken;
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* The pool closes: every step and prefill still in progress fails with
 * -ESHUTDOWN, every read in flight is collected (unless the reader is
 * broken), and every session and prefill is let go of. */
static void shutdown_io(engram_pool *p)
{
    engram_error e;
    err_set(&e, -ESHUTDOWN, ENGRAM_NO_OFFSET, "the pool was closed");
    pthread_mutex_lock(&p->mu);
    rounds_queue_fail(p, &e);
    int broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (!broken) {
        rounds_fail(p, &e);
        prefetch_fail_all(p, e.code, &e);
        reader_drain_all(p->r, 1);
    }
    rounds_release(p, &e);
    prefetch_detach_all(p, &e);
}

static void *io_main(void *arg)
{
    engram_pool *p = arg;
    SCHED_THREAD_BEGIN("io");
    engram_reader *r = p->r;
    uint64_t ends_seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->broken) {
            /* dead: fail whatever arrives until the pool closes */
            if (!p->q_head && !p->pf_head)
                SCHED_WAIT(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            pool_dead(p);
            continue;
        }
        p->work = 0;
        rounds_intake(p);
        int ended = p->ends != ends_seen;
        ends_seen = p->ends;
        pthread_mutex_unlock(&p->mu);
        SCHED_POINT("io: intake");
        if (ended)
            rounds_drop_stale(p);

        /* steps first (their rows are on an engine's critical path), but
         * prompts with reads to do keep a few slots, so that a saturated
         * decode load cannot starve them */
        unsigned guard = 0, free_slots = reader_free_slots(r);
        uint64_t delay_end = prefetch_progress(p, &guard);
        rounds_issue(p, free_slots > guard ? free_slots - guard : 0);
        prefetch_issue(p, reader_free_slots(r), guard);
        int rc = reader_push_jobs(r);
        if (rc < 0)
            fail_everything(p, rc, "submit");
        if (pool_is_broken(p)) {
            pool_dead(p);
            continue;
        }
        rounds_finish(p);

        if (reader_reaping(r) > 0) {
            pthread_mutex_lock(&p->mu);
            int w = p->work;
            pthread_mutex_unlock(&p->mu);
            int n = reader_pump(r, w ? 0 : 1); /* wake() ends the wait early */
            if (n < 0)
                fail_everything(p, n, "reap");
            if (pool_is_broken(p)) {
                pool_dead(p);
                continue;
            }
            rounds_finish(p);
            SCHED_POINT("io: reaped");
        } else if (reader_in_flight(r) > 0) {
            struct timespec ts = {0, 50000}; /* reads the engine refused for now */
            nanosleep(&ts, NULL);
        } else {
            pthread_mutex_lock(&p->mu);
            if (!p->work && !p->stop && !p->q_head && !rounds_active(p) && !prefetch_collectable(p)) {
                if (delay_end) { /* until a table 1 may start */
                    uint64_t now = util_now_ns();
                    struct timespec ts = pool_deadline(delay_end > now ? delay_end - now : 0);
                    SCHED_TIMEDWAIT(&p->cv, &p->mu, &ts);
                } else {
                    SCHED_WAIT(&p->cv, &p->mu);
                }
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
    shutdown_io(p);
    SCHED_THREAD_END();
    return NULL;
}

int engram_pool_open(const engram_model *m, const engram_pool_opts *opts, engram_pool **out,
                     engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    unsigned rank = opts ? opts->shard_rank : 0, world = opts ? opts->shard_world : 0;
    if (world > ENGRAM_MAX_SHARDS)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "pool option shard_world %u is above %u", world,
                       ENGRAM_MAX_SHARDS);
    if (rank >= (world ? world : 1))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "pool option shard_rank %u is not < shard_world %u%s",
                       rank, world, world ? "" : " (0: unsharded, rank 0)");
    engram_model_info fi;
    engram_model_get_info(m, &fi);
    /* a shard file holds one rank's block only: a pool on it must be that
     * rank's (a world-1 shard holds everything: any unsharded pool) */
    if (fi.shard.world > 1 && (world != fi.shard.world || rank != fi.shard.rank))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "pool options shard_rank %u, shard_world %u do not match the shard file '%s', rank %u of "
                       "%u: a pool on a shard file reads its block, with its rank and world",
                       rank, world, fi.path, fi.shard.rank, fi.shard.world);
    if (fi.shard.world == 1 && world > 1)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "pool option shard_world %u on the shard file '%s', rank 0 of 1", world, fi.path);
    engram_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->rounds = calloc(ROUNDS, sizeof *p->rounds))) {
        free(p);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    p->m = m;
    p->hasher = engram_model_hasher(m);
    engram_model_info mi;
    engram_model_get_info(m, &mi);
    p->fam = mi.family;
    p->ple = mi.family.member == ENGRAM_MEMBER_PLE;
    p->tables = mi.family.tables;
    p->cols = mi.family.rows_per_token;
    p->rpt = p->tables * p->cols;
    p->vocab = mi.family.vocab;
    p->width = mi.width;
    p->streams = mi.streams;
    p->shard_rank = rank;
    p->shard_world = world;
    p->sharded = world > 1;
    for (unsigned t = 0; t < p->tables && p->sharded; t++) {
        /* the reference's ParallelEngramEmbedding blocks: [rank R / N, (rank + 1) R / N) */
        uint64_t R = mi.table[t].rows, lo = rank * R / world, hi = (rank + 1) * R / world;
        p->shard_lo[t] = (uint32_t)lo;
        p->shard_n[t] = (uint32_t)(hi - lo);
    }
    if (p->ple) {
        p->frame_floats = (size_t)mi.streams * mi.width;
        p->frames = p->frame_floats ? mi.family.state_floats / p->frame_floats : 0;
        /* k <= F: one call, its frames are the tentative state's last k;
         * k > F (a model with a short kernel): F frames of running state
         * and the step's frames after them */
        p->tent_floats = p->frames >= ENGRAM_MAX_DRAFT ? (size_t)mi.family.state_floats
                                                       : (p->frames + ENGRAM_MAX_DRAFT) * p->frame_floats;
        if (!p->frames)
            p->tent_floats = 0;
    }
    if (opts && opts->reader.host.reg && opts->reader.host.unreg)
        p->host = opts->reader.host;
    p->ring_cache_cap = opts && opts->ring_cache_bytes ? opts->ring_cache_bytes : ENGRAM_RING_CACHE_DEFAULT;
    int rc = reader_open_wakeable(m, opts ? &opts->reader : NULL, &p->r, err);
    if (rc < 0) {
        free(p->rounds);
        free(p);
        return rc;
    }
    engram_reader_get_stats(p->r, &p->io0); /* before the I/O thread owns the reader */
    p->pf_min_slots = opts && opts->prefill_min_slots ? opts->prefill_min_slots : (p->io0.depth + 7) / 8;
    if (p->pf_min_slots > p->io0.depth)
        p->pf_min_slots = p->io0.depth;
    /* at most a quarter of a small depth (8 of 8 would leave prompts only
     * their minimum) */
    p->step_reserve = p->io0.depth / 4 < STEP_RESERVE ? p->io0.depth / 4 : STEP_RESERVE;
    pthread_mutex_init(&p->mu, NULL);
    pool_cond_init(&p->cv);
    rc = util_thread_start(&p->thread, 256u << 10, io_main, p);
    if (rc < 0) {
        engram_reader_close(p->r);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->rounds);
        free(p);
        return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start the pool's I/O thread: %s",
                       engram_strerror(rc));
    }
    SCHED_SPAWNED();
    *out = p;
    return 0;
}

void engram_pool_close(engram_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    pool_wake_locked(p);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    SCHED_JOIN(p->thread);
    engram_reader_close(p->r);
    p->r = NULL;
    free(p->rounds);
    p->rounds = NULL;
    /* the kept rings go first: once closed is published, the last handle's
     * close may free the pool (and its hooks) at any moment; a ring given
     * back meanwhile is freed at once (stop is set) */
    struct ring kept[RING_CACHE];
    pthread_mutex_lock(&p->mu);
    memcpy(kept, p->rings, sizeof kept);
    memset(p->rings, 0, sizeof p->rings);
    for (int i = 0; i < RING_CACHE; i++)
        p->ring_bytes -= kept[i].len;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < RING_CACHE; i++)
        if (kept[i].mem)
            pool_ring_free(p, &kept[i]);
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    int last = p->handles == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free_shell(p);
}

void engram_pool_get_stats(engram_pool *p, engram_pool_stats *st)
{
    if (!p || !st)
        return;
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&p->mu);
    st->steps = p->steps;
    st->rounds = p->n_rounds;
    st->step_rows_requested = p->step_requested;
    st->step_rows_read = p->step_read;
    st->prefill_chunks = p->pf_chunks;
    st->prefill_rows_requested = p->pf_requested;
    st->prefill_rows_read = p->pf_read;
    st->prefill_rings_allocated = p->ring_allocs;
    st->prefill_rings_reused = p->ring_reuses;
    st->prefill_ring_bytes = p->ring_bytes;
    st->closed = p->stop;
    int broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    /* the reader's counters belong to the I/O thread: only its fixed facts,
     * taken at open, are reported, and whether it is broken */
    st->io = p->io0;
    st->io.broken = broken;
    st->io.rows_requested = st->step_rows_requested + st->prefill_rows_requested;
    st->io.rows_read = st->step_rows_read + st->prefill_rows_read;
}
