/*
 * pool_shared.c - what every part of the pool uses (serve_int.h): waking
 * its I/O thread, its refusal once closed or broken, its lifetime (handles
 * and the shell that outlives engram_pool_close, a session's memory), its
 * cache of prefill rings, and monotonic deadlines.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_int.h"
#include "output/applier.h"
#include "common/util.h"

struct timespec pool_deadline(uint64_t timeout_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t s = timeout_ns / 1000000000ull, ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000ull;
    if (s > (uint64_t)INT32_MAX * 64) /* "forever" in practice, and no overflow */
        s = (uint64_t)INT32_MAX * 64;
    ts.tv_sec += (time_t)s + (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

void pool_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void pool_wake_locked(engram_pool *p)
{
    if (p->stop)
        return; /* the reader may be gone */
    p->work = 1;
    SCHED_WAKE(&p->cv);
    reader_wake(p->r);
}

void pool_kick(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    pool_wake_locked(p);
    pthread_mutex_unlock(&p->mu);
    SCHED_POINT("kick");
}

void pool_ring_free(engram_pool *p, struct ring *rg)
{
    if (rg->registered)
        p->host.unreg(p->host.ctx, rg->mem, rg->len);
    free(rg->mem);
    memset(rg, 0, sizeof *rg);
}

/* The pool's memory once it is closed and nothing refers to it. */
void pool_free_shell(engram_pool *p)
{
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

void pool_handle_gone(engram_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int last = --p->handles == 0 && p->closed;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free_shell(p);
}

int pool_ring_take(engram_pool *p, size_t len, struct ring *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    int best = -1;
    for (int i = 0; i < RING_CACHE; i++)
        if (p->rings[i].mem && p->rings[i].len >= len &&
            (best < 0 || p->rings[i].len < p->rings[best].len))
            best = i;
    if (best >= 0) {
        *out = p->rings[best];
        memset(&p->rings[best], 0, sizeof p->rings[best]);
        p->ring_reuses++;
    }
    pthread_mutex_unlock(&p->mu);
    if (out->mem)
        return 0;
    if (posix_memalign((void **)&out->mem, 4096, len) != 0) {
        out->mem = NULL;
        return -ENOMEM;
    }
    out->len = len;
    if (p->host.reg)
        out->registered = p->host.reg(p->host.ctx, out->mem, len) >= 0;
    pthread_mutex_lock(&p->mu);
    p->ring_allocs++;
    p->ring_bytes += len;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void pool_ring_give(engram_pool *p, struct ring *rg)
{
    if (!rg->mem)
        return;
    struct ring victim = *rg;
    memset(rg, 0, sizeof *rg);
    pthread_mutex_lock(&p->mu);
    if (!p->stop) {
        /* kept in a free place, else in place of the smallest kept ring if
         * that is smaller, as long as the kept rings stay within the
         * pool's ring_cache_bytes: the cache holds the largest rings seen */
        uint64_t kept_bytes = 0;
        int at = -1, small = -1;
        for (int i = 0; i < RING_CACHE; i++) {
            kept_bytes += p->rings[i].len;
            if (!p->rings[i].mem && at < 0)
                at = i;
            if (p->rings[i].mem && (small < 0 || p->rings[i].len < p->rings[small].len))
                small = i;
        }
        if (at < 0 && p->rings[small].len < victim.len)
            at = small;
        if (at >= 0 && kept_bytes - p->rings[at].len + victim.len <= p->ring_cache_cap) {
            struct ring kept = victim;
            victim = p->rings[at];
            p->rings[at] = kept;
        }
    }
    if (victim.mem)
        p->ring_bytes -= victim.len;
    pthread_mutex_unlock(&p->mu);
    if (victim.mem)
        pool_ring_free(p, &victim);
}


void serve_session_free(engram_session *s)
{
    free(s->conv);
    free(s->conv_tent);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int pool_refuses(const engram_pool *p, engram_error *err)
{
    if (p->stop)
        return err_set(err, -ESHUTDOWN, ENGRAM_NO_OFFSET, "the pool was closed");
    if (p->broken) {
        if (err)
            *err = p->broken_err;
        return -EIO;
    }
    return 0;
}

int pool_applier_layer(const engram_pool *p, engram_applier *a, engram_layer_info *li,
                       engram_error *err)
{
    engram_layer_get_info(applier_layer(a), li);
    if (li->member != p->fam.member || li->width != p->width || li->streams != p->streams ||
        li->state_floats != p->frames * p->frame_floats)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "the applier's layer (member %d, %u wide, %u streams, %zu state floats) is not of "
                       "the pool's model (member %d, %u, %u, %zu)",
                       (int)li->member, li->width, li->streams, li->state_floats, (int)p->fam.member,
                       p->width, p->streams, p->frames * p->frame_floats);
    return 0;
}

int pool_refuse_sharded_apply(const engram_pool *p, const char *what, engram_error *err)
{
    /* each rank holds only its block: applying them would add a part of
     * every token's sum, a wrong residual */
    return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                   "%s on a sharded pool (shard_rank %u, shard_world %u): a sharded pool's rows are "
                   "partial: combine them first (libengram-mpi), then apply with engram_apply_strided / "
                   "engram_apply_seq",
                   what, p->shard_rank, p->shard_world);
}
