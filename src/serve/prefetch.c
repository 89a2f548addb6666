/*
 * prefetch.c - prefill with prefetch (engram.h, "prefill"): the pool's I/O
 * thread hashes a prompt chunk by chunk and reads each chunk's rows (one
 * de-duplicated job per table) into a ring of chunk buffers while the
 * consumer works on earlier chunks; each finished chunk is published
 * through an atomic counter.  Each table hashes with its own running
 * history, so table 1 can trail table 0 by any distance (its reads start
 * after a delay or a signal) without keeping the row ids of chunks
 * between: memory does not grow with the prompt.
 *
 * Prefills are served oldest first, and the slots left after the decode
 * steps (less a reserve for steps arriving meanwhile) are shared between
 * them round-robin, so a prompt's first chunk waits for a share of the
 * device, not for the prompts before it to finish.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"
#include "common/util.h"

static size_t chunk_bytes(const engram_prefill *pf)
{
    return (size_t)pf->chunk * pf->cols * pf->row_bytes;
}

/* Request idx = token in chunk * 24 + column -> its row in the ring. */
static void *pf_dst(struct rjob *j, uint32_t idx)
{
    engram_prefill *pf = j->ctx;
    int t = j->table;
    size_t c = pf->next[t] - 1; /* the chunk this job reads */
    return pf->buf[t] + (c % pf->ring) * chunk_bytes(pf) + (size_t)idx * pf->row_bytes;
}

static void pf_free(engram_prefill *pf)
{
    engram_pool *p = pf->p;
    for (int t = 0; t < ENGRAM_TABLES; t++)
        free(pf->reqs[t]);
    pool_ring_give(p, &pf->own);
    free(pf->rows48);
    free(pf->kinds);
    free(pf->conv);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    free(pf);
    pool_handle_gone(p);
}

/* V4.1's numbers, for the ring sizes asked without a pool (an upper bound
 * for every member: a token's rows of any dtype are fewest bytes for PLE). */
static const engram_family v41_rows = {.tables = ENGRAM_TABLES, .rows_per_token = ENGRAM_COLUMNS,
                                       .row_bytes = ENGRAM_ROW_BYTES, .row_values = ENGRAM_ROW_VALUES};

/* Checked options -> chunk and ring for a prompt of n tokens (SIZE_MAX:
 * any prompt) of a model of family f; the ring's bytes, 0 if begin would
 * refuse the options.  A prompt shorter than a chunk gets a chunk of its
 * length, and a ring never has more chunks than the prompt. */
static size_t ring_len(const engram_family *f, const engram_prefill_opts *o, size_t n, unsigned *chunk,
                       unsigned *ring)
{
    *chunk = o->chunk_tokens ? o->chunk_tokens : ENGRAM_BATCH_TOKENS;
    *ring = o->ring_chunks ? o->ring_chunks : 2;
    if (*chunk > ENGRAM_BATCH_TOKENS || *ring > 64 ||
        (o->dtype != ENGRAM_BF16 && o->dtype != ENGRAM_F32 && o->dtype != ENGRAM_RAW))
        return 0;
    if (n < *chunk)
        *chunk = n ? (unsigned)n : 1;
    size_t chunks = n == SIZE_MAX ? SIZE_MAX : (n + *chunk - 1) / *chunk;
    if (chunks < *ring)
        *ring = chunks ? (unsigned)chunks : 1;
    return (size_t)f->tables * *ring * *chunk * f->rows_per_token * family_row_out_bytes(f, o->dtype);
}

size_t engram_prefill_ring_bytes(const engram_prefill_opts *opts)
{
    return engram_prefill_ring_bytes_for(opts, SIZE_MAX);
}

size_t engram_prefill_ring_bytes_for(const engram_prefill_opts *opts, size_t n_tokens)
{
    engram_prefill_opts o = {0};
    if (opts)
        o = *opts;
    unsigned chunk, ring;
    return ring_len(&v41_rows, &o, n_tokens, &chunk, &ring);
}

size_t engram_pool_prefill_ring_bytes(const engram_pool *p, const engram_prefill_opts *opts,
                                      size_t n_tokens)
{
    if (!p)
        return 0;
    engram_prefill_opts o = {0};
    if (opts)
        o = *opts;
    unsigned chunk, ring;
    return ring_len(&p->fam, &o, n_tokens, &chunk, &ring);
}

/* Which option ring_len refused. */
static int bad_opts(const engram_prefill_opts *o, engram_error *err)
{
    if (o->chunk_tokens > ENGRAM_BATCH_TOKENS)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "prefill option chunk_tokens %u is above %u",
                       o->chunk_tokens, ENGRAM_BATCH_TOKENS);
    if (o->ring_chunks > 64)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "prefill option ring_chunks %u is above 64",
                       o->ring_chunks);
    return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "prefill option dtype %d is not BF16, F32 or RAW",
                   (int)o->dtype);
}

int engram_prefill_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, size_t n,
                         const engram_prefill_opts *opts, engram_prefill **out, engram_error *err)
{
    if (!s || !out || (n > 0 && !tokens))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s",
                       !s ? "session" : !out ? "out" : "tokens");
    engram_pool *p = s->p;
    engram_prefill_opts o = {0};
    if (opts)
        o = *opts;
    unsigned chunk, ring;
    size_t len = ring_len(&p->fam, &o, n, &chunk, &ring);
    if (len == 0)
        return bad_opts(&o, err);
    if (o.ring_mem && (o.ring_bytes < len || (uintptr_t)o.ring_mem % 64))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "prefill ring memory: %zu bytes at %p; these options need %zu, 64-byte aligned",
                       o.ring_bytes, o.ring_mem, len);
    int bad = serve_check_tokens(p, tokens, mask, n, 0, err);
    if (bad < 0)
        return bad;
    pthread_mutex_lock(&s->mu);
    int busy = s->state != S_IDLE;
    engram_history hist = s->hist;
    pthread_mutex_unlock(&s->mu);
    if (busy)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress");
    pthread_mutex_lock(&p->mu); /* before a ring is taken (and registered) */
    int refused = pool_refuses(p, err);
    pthread_mutex_unlock(&p->mu);
    if (refused < 0)
        return refused;
    engram_prefill *pf = calloc(1, sizeof *pf);
    if (!pf)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    pf->s = s;
    pf->p = p;
    pf->tokens = tokens;
    pf->mask = mask;
    pf->n = n;
    pf->chunk = chunk;
    pf->ring = ring;
    pf->chunks = (n + chunk - 1) / chunk;
    pf->dtype = o.dtype;
    pf->row_bytes = family_row_out_bytes(&p->fam, o.dtype);
    pf->tables = p->tables;
    pf->cols = p->cols;
    pf->ring_len = len;
    pf->delay_ns = o.table1_delay_ns;
    pf->table1_go = o.table1_delay_ns == 0;
    pthread_mutex_init(&pf->mu, NULL);
    pool_cond_init(&pf->cv);
    int ok = (pf->rows48 = malloc((size_t)chunk * p->rpt * sizeof *pf->rows48)) != NULL;
    if (ok && p->ple)
        ok = (pf->kinds = malloc(chunk)) != NULL;
    size_t nf = p->frames * p->frame_floats;
    if (ok && nf) { /* the prefill's state starts from the session's committed one */
        /* two copies: an apply works on the second and swaps on success,
         * so a failed one leaves the prefill's state as it was */
        ok = (pf->conv = malloc(2 * nf * sizeof *pf->conv)) != NULL;
        if (ok) {
            pthread_mutex_lock(&s->mu);
            memcpy(pf->conv, s->conv, nf * sizeof *pf->conv);
            pthread_mutex_unlock(&s->mu);
        }
    }
    uint8_t *mem = o.ring_mem;
    if (ok && !mem) {
        ok = pool_ring_take(p, len, &pf->own) == 0;
        mem = pf->own.mem;
    }
    for (unsigned t = 0; t < ENGRAM_TABLES; t++)
        atomic_init(&pf->ready[t], 0);
    for (unsigned t = 0; t < ENGRAM_TABLES && ok; t++) {
        pf->hist[t] = hist;
        if (t >= pf->tables) { /* a table the family lacks: never read */
            pf->next[t] = pf->chunks;
            continue;
        }
        pf->reqs[t] = malloc((size_t)chunk * pf->cols * sizeof *pf->reqs[t]);
        pf->buf[t] = mem + (size_t)t * ring * chunk_bytes(pf);
        ok = pf->reqs[t] != NULL;
    }
    pthread_mutex_lock(&p->mu);
    int rc = ok ? 0 : err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for the prefill's ring (%zu bytes)",
                              o.ring_mem ? (size_t)0 : len);
    if (rc == 0)
        rc = pool_refuses(p, err);
    p->handles++; /* pf_free drops it */
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        s->state = S_PREFILL;
        s->pf = pf;
        pthread_mutex_unlock(&s->mu);
        pf->t_begin = util_now_ns();
        pf->listed = 1;
        if (p->pf_tail)
            p->pf_tail->next_pf = pf;
        else
            p->pf_head = pf;
        p->pf_tail = pf;
        pool_wake_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) {
        pf_free(pf);
        return rc;
    }
    SCHED_POINT("prefill begun");
    *out = pf;
    return 0;
}

size_t engram_prefill_chunks(const engram_prefill *pf)
{
    return pf ? pf->chunks : 0;
}

size_t engram_prefill_ready(const engram_prefill *pf, int table)
{
    if (!pf || table < 0 || (unsigned)table >= pf->tables)
        return 0;
    return atomic_load_explicit(&((engram_prefill *)(uintptr_t)pf)->ready[table], memory_order_acquire);
}

void engram_prefill_get_info(const engram_prefill *pf, engram_prefill_info *info)
{
    if (!pf || !info)
        return;
    engram_prefill *m = (engram_prefill *)(uintptr_t)pf; /* the lock, not the state */
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&m->mu);
    info->chunks = pf->chunks;
    info->chunk_tokens = pf->chunk;
    info->ring_chunks = pf->ring;
    info->ring_bytes = pf->ring_len;
    info->begin_ns = pf->t_begin;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        info->chunks_applied[t] = pf->applied[t] == SIZE_MAX ? 0 : pf->applied[t];
        info->ready[t] = atomic_load(&m->ready[t]);
        info->first_ready_ns[t] = pf->first_ns[t];
        info->last_ready_ns[t] = pf->last_ns[t];
    }
    pthread_mutex_unlock(&m->mu);
}

int engram_prefill_wait_timed(engram_prefill *pf, int t, size_t c, uint64_t timeout_ns,
                              const void **rows, size_t *first, size_t *n_tokens, engram_error *err)
{
    if (!pf || t < 0 || (unsigned)t >= pf->tables || c >= pf->chunks)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no chunk %zu of table %d", c, t);
    pthread_mutex_lock(&pf->mu);
    int rc = 0, ready = atomic_load(&pf->ready[t]) > c;
    /* a chunk released (its buffer may hold a later one) is misuse; then
     * why the prefill ended, if it did; then waits that could never return */
    if (c < pf->released[t]) {
        rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                     "chunk %zu of table %d was released (its buffer holds a later chunk)", c, t);
    } else if (!ready && pf->rc) {
        rc = pf->rc;
        if (err)
            *err = pf->err;
    } else if (!ready && pf->cancel_req) {
        rc = err_set(err, -ECANCELED, ENGRAM_NO_OFFSET, "the prefill was cancelled");
    } else if (ready) {
        rc = 0;
    } else if (c >= pf->released[t] + pf->ring)
        rc = err_set(err, -EDEADLK, ENGRAM_NO_OFFSET,
                     "chunk %zu of table %d cannot be read before chunk %zu is released (a ring of %u "
                     "chunks)", c, t, c - pf->ring, pf->ring);
    else if (t == 1 && !pf->table1_go && pf->delay_ns == ENGRAM_PREFILL_MANUAL &&
             atomic_load(&pf->ready[1]) <= c)
        rc = err_set(err, -EDEADLK, ENGRAM_NO_OFFSET,
                     "table 1's reads wait for engram_prefill_start_table1 (table1_delay_ns = "
                     "ENGRAM_PREFILL_MANUAL)");
    int forever = timeout_ns == ENGRAM_FOREVER, expired = timeout_ns == 0;
    struct timespec until = {0, 0};
    if (!forever && !expired)
        until = pool_deadline(timeout_ns);
    while (rc == 0 && atomic_load(&pf->ready[t]) <= c && pf->rc == 0 && !pf->cancel_req && !expired) {
        if (forever)
            SCHED_WAIT(&pf->cv, &pf->mu);
        else
            expired = SCHED_TIMEDWAIT(&pf->cv, &pf->mu, &until) == ETIMEDOUT;
    }
    if (rc == 0 && atomic_load(&pf->ready[t]) <= c) {
        if (pf->rc) {
            rc = pf->rc;
            if (err)
                *err = pf->err;
        } else if (pf->cancel_req) {
            rc = err_set(err, -ECANCELED, ENGRAM_NO_OFFSET, "the prefill was cancelled");
        } else {
            rc = err_set(err, -ETIMEDOUT, ENGRAM_NO_OFFSET, "chunk %zu of table %d is still being read",
                         c, t);
        }
    }
    pthread_mutex_unlock(&pf->mu);
    if (rc < 0)
        return rc;
    if (rows)
        *rows = pf->buf[t] + (c % pf->ring) * chunk_bytes(pf);
    if (first)
        *first = c * pf->chunk;
    if (n_tokens)
        *n_tokens = pf->n - c * pf->chunk < pf->chunk ? pf->n - c * pf->chunk : pf->chunk;
    return 0;
}

int engram_prefill_wait(engram_prefill *pf, int t, size_t c, const void **rows, size_t *first,
                        size_t *n_tokens, engram_error *err)
{
    return engram_prefill_wait_timed(pf, t, c, ENGRAM_FOREVER, rows, first, n_tokens, err);
}

void engram_prefill_release(engram_prefill *pf, int t, size_t c)
{
    if (!pf || t < 0 || (unsigned)t >= pf->tables || c >= pf->chunks)
        return;
    pthread_mutex_lock(&pf->mu);
    if (c + 1 > pf->released[t])
        pf->released[t] = c + 1;
    pthread_mutex_unlock(&pf->mu);
    pool_kick(pf->p);
}

void engram_prefill_start_table1(engram_prefill *pf)
{
    if (!pf)
        return;
    pthread_mutex_lock(&pf->mu);
    pf->table1_go = 1;
    pthread_mutex_unlock(&pf->mu);
    pool_kick(pf->p);
}

int engram_prefill_apply(engram_prefill *pf, size_t c, engram_applier *a, void *residual,
                         engram_dtype resid_dtype, engram_error *err)
{
    if (!pf || !a || !residual)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL %s",
                       !pf ? "prefill" : !a ? "applier" : "residual");
    engram_pool *p = pf->p;
    if (p->sharded)
        return pool_refuse_sharded_apply(p, "engram_prefill_apply", err);
    engram_layer_info li;
    int rc_fit = pool_applier_layer(p, a, &li, err);
    if (rc_fit < 0)
        return rc_fit;
    int t = li.table;
    if (t < 0 || (unsigned)t >= pf->tables)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "the applier's table %d is not one of the model's", t);
    if ((!p->ple && pf->dtype == ENGRAM_RAW) || (p->ple && pf->dtype == ENGRAM_F32))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "the prefill's rows are %s: apply %s rows",
                       pf->dtype == ENGRAM_RAW ? "RAW" : "F32", p->ple ? "BF16 or RAW" : "BF16 or F32");
    if (resid_dtype != ENGRAM_F32 && resid_dtype != ENGRAM_BF16)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "residual type %d: F32 or BF16 only",
                       (int)resid_dtype);
    pthread_mutex_lock(&pf->mu);
    int rc = 0;
    if (c >= pf->chunks)
        rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no chunk %zu of table %d", c, t);
    else if (c != pf->applied[t])
        rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                     "chunk %zu of table %d: chunks are applied in order from 0 (the next is %zu)", c, t,
                     pf->applied[t]);
    else if (c >= atomic_load(&pf->ready[t]) || c < pf->released[t])
        rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "chunk %zu of table %d is %s", c, t,
                     c < pf->released[t] ? "released" : "not read yet (wait for it first)");
    pthread_mutex_unlock(&pf->mu);
    if (rc < 0)
        return rc;
    const uint8_t *rows = pf->buf[t] + (c % pf->ring) * chunk_bytes(pf);
    size_t first = c * pf->chunk, nt = pf->n - first < pf->chunk ? pf->n - first : pf->chunk;
    const uint8_t *mask = pf->mask ? pf->mask + first : NULL;
    size_t nf = p->frames * p->frame_floats;
    if (p->ple && nf) {
        /* on the spare copy: the state moves only with a chunk applied whole */
        float *next = pf->conv + nf;
        memcpy(next, pf->conv, nf * sizeof *next);
        rc = engram_apply_seq(a, rows, ENGRAM_BF16, residual, resid_dtype, mask, nt, next, err);
        if (rc == 0)
            memcpy(pf->conv, next, nf * sizeof *next);
    } else if (p->ple) {
        rc = engram_apply_seq(a, rows, ENGRAM_BF16, residual, resid_dtype, mask, nt, NULL, err);
    } else {
        rc = engram_apply(a, rows, (engram_dtype)pf->dtype, residual, resid_dtype, mask, nt, err);
    }
    /* a failed apply leaves the state and the next chunk as they were: the
     * chunk may be applied again (with its original residual) */
    pthread_mutex_lock(&pf->mu);
    if (rc == 0)
        pf->applied[t] = c + 1;
    pthread_mutex_unlock(&pf->mu);
    return rc;
}

/* Asks the I/O thread to stop the prefill and waits (up to timeout_ns)
 * until it holds nothing of it: 0 or -ETIMEDOUT. */
static int detach(engram_prefill *pf, uint64_t timeout_ns)
{
    pthread_mutex_lock(&pf->mu);
    int was = pf->cancel_req;
    pf->cancel_req = 1;
    SCHED_WAKE(&pf->cv);
    int done = pf->detached;
    pthread_mutex_unlock(&pf->mu);
    SCHED_POINT("prefill: stop asked");
    if (done)
        return 0;
    if (!was)
        pool_kick(pf->p);
    int forever = timeout_ns == ENGRAM_FOREVER, expired = timeout_ns == 0;
    struct timespec until = {0, 0};
    if (!forever && !expired)
        until = pool_deadline(timeout_ns);
    pthread_mutex_lock(&pf->mu);
    while (!pf->detached && !expired) {
        if (forever)
            SCHED_WAIT(&pf->cv, &pf->mu);
        else
            expired = SCHED_TIMEDWAIT(&pf->cv, &pf->mu, &until) == ETIMEDOUT;
    }
    done = pf->detached;
    pthread_mutex_unlock(&pf->mu);
    return done ? 0 : -ETIMEDOUT;
}

/* Every chunk of every table of the family was read. */
static int pf_complete(engram_prefill *pf)
{
    for (unsigned t = 0; t < pf->tables; t++)
        if (atomic_load(&pf->ready[t]) != pf->chunks)
            return 0;
    return 1;
}

/* The prefill's outcome once detached; commits the history when every
 * chunk of both tables was read and its session is still open, and the
 * state (PLE) when besides every chunk was applied. */
static int finish(engram_prefill *pf, int commit, engram_error *err)
{
    int rc = 0;
    pthread_mutex_lock(&pf->mu);
    engram_session *s = pf->s;
    int complete = pf_complete(pf);
    int applied = pf->conv && pf->applied[0] == pf->chunks;
    if (!complete || !s) {
        if (pf->rc) {
            rc = pf->rc;
            if (err)
                *err = pf->err;
        } else {
            rc = err_set(err, -ECANCELED, ENGRAM_NO_OFFSET,
                         "prefill ended before all its chunks were read; history unchanged");
        }
    }
    pthread_mutex_unlock(&pf->mu);
    SCHED_POINT("prefill: outcome read");
    if (s) {
        pthread_mutex_lock(&s->mu);
        if (rc == 0 && commit) {
            s->hist = pf->hist[0];
            if (applied)
                memcpy(s->conv, pf->conv, s->p->frames * s->p->frame_floats * sizeof *s->conv);
        }
        s->state = S_IDLE;
        s->pf = NULL;
        pthread_mutex_unlock(&s->mu);
    }
    pf_free(pf);
    SCHED_POINT("prefill ended");
    return rc;
}

int engram_prefill_end_timed(engram_prefill *pf, uint64_t timeout_ns, engram_error *err)
{
    if (!pf)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (detach(pf, timeout_ns) < 0)
        return err_set(err, -ETIMEDOUT, ENGRAM_NO_OFFSET,
                       "the prefill still has reads in flight; it is stopping: call end or cancel again");
    return finish(pf, 1, err);
}

int engram_prefill_end(engram_prefill *pf, engram_error *err)
{
    return engram_prefill_end_timed(pf, ENGRAM_FOREVER, err);
}

void engram_prefill_cancel(engram_prefill *pf)
{
    if (!pf)
        return;
    detach(pf, ENGRAM_FOREVER);
    finish(pf, 0, NULL);
}

/* ------------------------------------------------------------ the I/O thread's part */

/* Hashes chunk c for table t and starts its job. */
static void start_chunk(engram_pool *p, engram_prefill *pf, int t)
{
    size_t c = pf->next[t], at = c * pf->chunk;
    size_t k = pf->n - at < pf->chunk ? pf->n - at : pf->chunk;
    /* validated at begin: cannot fail */
    if (p->ple) {
        for (size_t i = 0; i < k; i++)
            pf->kinds[i] = serve_ple_kind(pf->mask, at + i);
        engram_ple_history ph = serve_ple_of_hist(&pf->hist[t]);
        engram_ple_hash(p->m, &ph, pf->tokens + at, pf->kinds, k, pf->rows48, NULL);
        pf->hist[t] = serve_hist_of_ple(&ph);
    } else {
        engram_hash_tokens(p->hasher, &pf->hist[t], pf->tokens + at, pf->mask ? pf->mask + at : NULL, k,
                           pf->rows48, NULL);
    }
    size_t nreq = 0, cols = p->cols, rpt = p->rpt;
    /* a sharded pool reads its block's rows and zeroes the others in the
     * chunk's buffer: free (c < released + ring), and only this thread
     * writes it until the chunk is published */
    uint8_t *zero = p->sharded ? pf->buf[t] + (c % pf->ring) * chunk_bytes(pf) : NULL;
    for (size_t i = 0; i < k; i++) {
        if (pf->mask && !pf->mask[at + i])
            continue; /* masked tokens (PLE: padding) read nothing */
        if (zero) {
            for (size_t col = 0; col < cols; col++) {
                uint32_t row = pf->rows48[i * rpt + (size_t)t * cols + col];
                if (pool_owns(p, (unsigned)t, row))
                    pf->reqs[t][nreq++] = (uint64_t)row << 32 | (uint64_t)(i * cols + col);
                else
                    memset(zero + (i * cols + col) * pf->row_bytes, 0, pf->row_bytes);
            }
            continue;
        }
        for (size_t col = 0; col < cols; col++)
            pf->reqs[t][nreq++] = (uint64_t)pf->rows48[i * rpt + (size_t)t * cols + col] << 32 |
                                  (uint64_t)(i * cols + col);
    }
    struct rjob *j = &pf->job[t];
    memset(j, 0, sizeof *j);
    j->table = t;
    j->dtype = pf->dtype;
    j->reqs = pf->reqs[t];
    j->nreq = nreq;
    j->dst = pf_dst;
    j->ctx = pf;
    reader_job_start(p->r, j);
    pf->next[t] = c + 1;
    pf->active[t] = 1;
    pthread_mutex_lock(&p->mu);
    p->pf_requested += nreq;
    pthread_mutex_unlock(&p->mu);
}

/* Collects a prefill's ended jobs (publishing their chunks) and starts the
 * next chunks its ring and table 1's signal allow; 1 once it is stopped
 * (cancelled, failed or every chunk read) and holds no read, so that the
 * caller detaches it.  *until: the earliest time (CLOCK_MONOTONIC ns) a
 * table 1 waiting for its delay may start, if earlier than *until or it
 * is 0. */
static int service_one(engram_pool *p, engram_prefill *pf, uint64_t *until)
{
    pthread_mutex_lock(&pf->mu);
    int cancel = pf->cancel_req || pf->rc;
    size_t released[ENGRAM_TABLES] = {pf->released[0], pf->released[1]};
    int go = pf->table1_go;
    pthread_mutex_unlock(&pf->mu);
    SCHED_POINT("io: prefill state read");
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        struct rjob *j = &pf->job[t];
        if (!pf->active[t])
            continue;
        if (cancel)
            reader_job_fail(j, -ECANCELED, "prefill cancelled");
        if (!reader_job_finished(j))
            continue;
        pf->active[t] = 0;
        pthread_mutex_lock(&p->mu);
        p->pf_read += j->rows_read;
        p->pf_chunks += j->rc == 0;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&pf->mu);
        if (j->rc != 0 && !cancel && pf->rc == 0) {
            pf->rc = j->rc;
            pf->err = j->err;
        } else if (j->rc == 0) {
            uint64_t now = util_now_ns();
            if (!pf->first_ns[t])
                pf->first_ns[t] = now;
            pf->last_ns[t] = now;
            atomic_store_explicit(&pf->ready[t], pf->next[t], memory_order_release);
        }
        SCHED_WAKE(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        SCHED_POINT("io: chunk published");
        cancel |= j->rc != 0;
    }
    if (cancel) /* done with it once its reads are collected */
        return !pf->active[0] && !pf->active[1];
    if (pf->next[0] == pf->chunks && pf->next[1] == pf->chunks && !pf->active[0] && !pf->active[1])
        return 1; /* every chunk read */
    uint64_t now = 0;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        if (pf->active[t] || pf->next[t] >= pf->chunks || pf->next[t] >= released[t] + pf->ring)
            continue;
        int may = t == 0 || go;
        if (!may && pf->delay_ns != ENGRAM_PREFILL_MANUAL) {
            if (!now)
                now = util_now_ns();
            may = now - pf->t_begin >= pf->delay_ns;
            uint64_t at = pf->t_begin + pf->delay_ns;
            if (!may && (*until == 0 || at < *until))
                *until = at;
        }
        if (may)
            start_chunk(p, pf, t);
    }
    return 0;
}

/* Takes pf off the pool's list and tells its consumer: the last touch, the
 * consumer may free it as soon as it sees detached. */
static void detach_now(engram_pool *p, engram_prefill *pf)
{
    pthread_mutex_lock(&p->mu);
    engram_prefill **pp = &p->pf_head, *prev = NULL;
    while (*pp != pf) {
        prev = *pp;
        pp = &(*pp)->next_pf;
    }
    *pp = pf->next_pf;
    if (p->pf_tail == pf)
        p->pf_tail = prev;
    pf->listed = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&pf->mu);
    pf->detached = 1;
    SCHED_WAKE(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
    SCHED_POINT("io: prefill detached");
}

/* The list's next prefill after pf (NULL: the first); prefills are added at
 * the tail under p->mu and removed only by this thread. */
static engram_prefill *next_of(engram_pool *p, engram_prefill *pf)
{
    pthread_mutex_lock(&p->mu);
    engram_prefill *n = pf ? pf->next_pf : p->pf_head;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Reads a prefill's jobs may still issue (0 when none wants a slot). */
static int wants_slots(const engram_prefill *pf)
{
    return (pf->active[0] && pf->job[0].live > 0 && pf->job[0].rc == 0) ||
           (pf->active[1] && pf->job[1].live > 0 && pf->job[1].rc == 0);
}

/* Issues up to max reads of pf, the older chunk's first (the engine needs
 * chunk c's table-1 rows at layer 14 before chunk c+1's table-0 rows at
 * layer 1), table 0 first for the same chunk; returns how many. */
static unsigned issue_one(engram_pool *p, engram_prefill *pf, unsigned max)
{
    int first = pf->active[1] && (!pf->active[0] || pf->next[1] < pf->next[0]);
    unsigned used = 0;
    for (int i = 0; i < ENGRAM_TABLES && used < max; i++) {
        int t = i ^ first;
        if (pf->active[t])
            used += reader_job_issue(p->r, &pf->job[t], max - used);
    }
    return used;
}

/* Gives pf up to `share` of the avail - *used slots left. */
static void give(engram_pool *p, engram_prefill *pf, unsigned share, unsigned avail, unsigned *used)
{
    if (*used < avail && wants_slots(pf))
        *used += issue_one(p, pf, share < avail - *used ? share : avail - *used);
}

uint64_t prefetch_progress(engram_pool *p, unsigned *guard)
{
    uint64_t until = 0;
    unsigned wanting = 0, in_flight = 0;
    for (engram_prefill *pf = next_of(p, NULL), *next; pf; pf = next) {
        next = next_of(p, pf);
        if (service_one(p, pf, &until)) {
            detach_now(p, pf);
            continue;
        }
        wanting += wants_slots(pf);
        for (int t = 0; t < ENGRAM_TABLES; t++)
            in_flight += pf->active[t] ? pf->job[t].outstanding : 0;
    }
    /* the slots the prompts keep whatever the steps want */
    *guard = wanting && in_flight < p->pf_min_slots ? p->pf_min_slots - in_flight : 0;
    return until;
}

void prefetch_issue(engram_pool *p, unsigned budget, unsigned guard)
{
    unsigned wanting = 0, listed = 0;
    for (engram_prefill *pf = next_of(p, NULL); pf; pf = next_of(p, pf)) {
        wanting += wants_slots(pf);
        listed++;
    }
    /* The slots the steps left, less a reserve for steps arriving before
     * the next pass (but never less than the prompts' guard), in equal
     * shares from a rotating first prefill, then what is left, oldest
     * first.  (Only this thread removes prefills from the list; one added
     * meanwhile has no job yet.) */
    unsigned avail = budget > p->step_reserve ? budget - p->step_reserve : 0, used = 0;
    if (avail < guard)
        avail = guard < budget ? guard : budget;
    if (wanting == 0 || avail == 0)
        return;
    unsigned share = (avail + wanting - 1) / wanting, start = p->pf_turn++ % listed;
    engram_prefill *first = next_of(p, NULL);
    for (unsigned i = 0; i < start && first; i++)
        first = next_of(p, first);
    for (engram_prefill *pf = first; pf; pf = next_of(p, pf))
        give(p, pf, share, avail, &used);
    for (engram_prefill *pf = next_of(p, NULL); pf && pf != first; pf = next_of(p, pf))
        give(p, pf, share, avail, &used);
    for (engram_prefill *pf = next_of(p, NULL); pf && used < avail; pf = next_of(p, pf))
        give(p, pf, avail, avail, &used);
}

void prefetch_fail_all(engram_pool *p, int code, const engram_error *e)
{
    for (engram_prefill *pf = next_of(p, NULL); pf; pf = next_of(p, pf))
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (pf->active[t] && pf->job[t].rc == 0) {
                pf->job[t].rc = code;
                pf->job[t].err = *e;
                pf->job[t].live = 0;
            }
}

void prefetch_detach_all(engram_pool *p, const engram_error *e)
{
    for (engram_prefill *pf; (pf = next_of(p, NULL)) != NULL;) {
        pf->active[0] = pf->active[1] = 0;
        pthread_mutex_lock(&pf->mu);
        int complete = pf_complete(pf);
        if (pf->rc == 0 && !complete) {
            pf->rc = e->code;
            pf->err = *e;
        }
        pthread_mutex_unlock(&pf->mu);
        detach_now(p, pf);
    }
}

int prefetch_collectable(engram_pool *p)
{
    for (engram_prefill *pf = p->pf_head; pf; pf = pf->next_pf)
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (pf->active[t] && reader_job_finished(&pf->job[t]))
                return 1;
    return 0;
}
