/*
 * prefetch.c - prefill with prefetch (engram.h, "prefill"): the pool's I/O
 * thread hashes a prompt chunk by chunk and reads each chunk's rows (one
 * de-duplicated job per table) into a ring of chunk buffers while the
 * consumer works on earlier chunks; each finished chunk is published
 * through an atomic counter.  Each table hashes with its own running
 * history, so table 1 can trail table 0 by any distance (its reads start
 * after a delay or a signal) without keeping the row ids of chunks
 * between: memory does not grow with the prompt.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "session_int.h"
#include "util.h"

static size_t row_bytes(int dtype)
{
    return dtype == ENGRAM_F32 ? ENGRAM_ROW_VALUES * 4
         : dtype == ENGRAM_BF16 ? ENGRAM_ROW_VALUES * 2 : ENGRAM_ROW_BYTES;
}

static size_t chunk_bytes(const engram_prefill *pf)
{
    return (size_t)pf->chunk * ENGRAM_COLUMNS * pf->row_bytes;
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
    for (int t = 0; t < ENGRAM_TABLES; t++)
        free(pf->reqs[t]);
    if (pf->ring_registered)
        pf->p->host.unreg(pf->p->host.ctx, pf->ring_own, pf->ring_len);
    free(pf->ring_own);
    free(pf->rows48);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    free(pf);
}

/* Checked options -> chunk, ring; 0 if begin would refuse them. */
static size_t ring_len(const engram_prefill_opts *o, unsigned *chunk, unsigned *ring)
{
    *chunk = o->chunk_tokens ? o->chunk_tokens : ENGRAM_BATCH_TOKENS;
    *ring = o->ring_chunks ? o->ring_chunks : 2;
    if (*chunk > ENGRAM_BATCH_TOKENS || *ring > 64 ||
        (o->dtype != ENGRAM_BF16 && o->dtype != ENGRAM_F32 && o->dtype != ENGRAM_RAW))
        return 0;
    return (size_t)ENGRAM_TABLES * *ring * *chunk * ENGRAM_COLUMNS * row_bytes(o->dtype);
}

size_t engram_prefill_ring_bytes(const engram_prefill_opts *opts)
{
    engram_prefill_opts o = {0};
    if (opts)
        o = *opts;
    unsigned chunk, ring;
    return ring_len(&o, &chunk, &ring);
}

int engram_prefill_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, size_t n,
                         const engram_prefill_opts *opts, engram_prefill **out, engram_error *err)
{
    if (!s || !out || (n > 0 && !tokens))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_prefill_opts o = {0};
    if (opts)
        o = *opts;
    unsigned chunk, ring;
    size_t len = ring_len(&o, &chunk, &ring);
    if (len == 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "prefill options: chunk 1..%u tokens, ring 1..64 chunks, dtype BF16/F32/RAW",
                       ENGRAM_BATCH_TOKENS);
    if (o.ring_mem && (o.ring_bytes < len || (uintptr_t)o.ring_mem % 64))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "prefill ring memory: %zu bytes at %p; these options need %zu, 64-byte aligned",
                       o.ring_bytes, o.ring_mem, len);
    if (s->state != S_IDLE)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a step or prefill is in progress");
    engram_pool *p = s->p;
    uint32_t vocab = engram_hasher_layout(p->hasher)->vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "token %zu (%u) is not < vocab %u", i,
                           tokens[i], vocab);
    pthread_mutex_lock(&p->mu);
    int broken = p->broken;
    if (broken && err)
        *err = p->broken_err;
    pthread_mutex_unlock(&p->mu);
    if (broken)
        return -EIO;
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
    pf->row_bytes = row_bytes(o.dtype);
    pf->ring_len = len;
    pf->delay_ns = o.table1_delay_ns;
    pf->table1_go = o.table1_delay_ns == 0;
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    int ok = (pf->rows48 = malloc((size_t)chunk * ENGRAM_ROWS_PER_TOKEN * sizeof *pf->rows48)) != NULL;
    uint8_t *mem = o.ring_mem;
    if (ok && !mem) {
        ok = posix_memalign((void **)&pf->ring_own, 4096, len) == 0;
        if (!ok)
            pf->ring_own = NULL;
        mem = pf->ring_own;
    }
    for (int t = 0; t < ENGRAM_TABLES && ok; t++) {
        pf->reqs[t] = malloc((size_t)chunk * ENGRAM_COLUMNS * sizeof *pf->reqs[t]);
        pf->buf[t] = mem + (size_t)t * ring * chunk_bytes(pf);
        ok = pf->reqs[t] != NULL;
        pf->hist[t] = s->hist;
        atomic_init(&pf->ready[t], 0);
    }
    if (!ok) {
        pf_free(pf);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for the prefill's ring (%zu bytes)",
                       o.ring_mem ? (size_t)0 : len);
    }
    if (pf->ring_own && p->host.reg)
        pf->ring_registered = p->host.reg(p->host.ctx, pf->ring_own, len) >= 0;
    pf->t_begin = pool_now_ns();
    s->state = S_PREFILL;
    s->pf = pf;
    pthread_mutex_lock(&p->mu);
    pf->next_pf = p->pf_head;
    p->pf_head = pf;
    pthread_mutex_unlock(&p->mu);
    pool_kick(p);
    *out = pf;
    return 0;
}

size_t engram_prefill_chunks(const engram_prefill *pf)
{
    return pf->chunks;
}

size_t engram_prefill_ready(const engram_prefill *pf, int table)
{
    if (table < 0 || table >= ENGRAM_TABLES)
        return 0;
    return atomic_load_explicit(&((engram_prefill *)(uintptr_t)pf)->ready[table], memory_order_acquire);
}

int engram_prefill_wait(engram_prefill *pf, int t, size_t c, const void **rows, size_t *first,
                        size_t *n_tokens, engram_error *err)
{
    if (!pf || t < 0 || t >= ENGRAM_TABLES || c >= pf->chunks)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no chunk %zu of table %d", c, t);
    pthread_mutex_lock(&pf->mu);
    while (atomic_load(&pf->ready[t]) <= c && pf->rc == 0 && !pf->cancel_req)
        pthread_cond_wait(&pf->cv, &pf->mu);
    int rc = 0;
    if (atomic_load(&pf->ready[t]) <= c) {
        rc = pf->rc ? pf->rc : -ECANCELED;
        if (err)
            *err = pf->err;
        if (!pf->rc)
            err_set(err, rc, ENGRAM_NO_OFFSET, "the prefill was cancelled");
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

void engram_prefill_release(engram_prefill *pf, int t, size_t c)
{
    if (!pf || t < 0 || t >= ENGRAM_TABLES)
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

/* Asks the I/O thread to stop it and waits until it holds nothing of it. */
static void detach(engram_prefill *pf)
{
    pthread_mutex_lock(&pf->mu);
    pf->cancel_req = 1;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
    pool_kick(pf->p);
    pthread_mutex_lock(&pf->mu);
    while (!pf->detached)
        pthread_cond_wait(&pf->cv, &pf->mu);
    pthread_mutex_unlock(&pf->mu);
}

int engram_prefill_end(engram_prefill *pf, engram_error *err)
{
    if (!pf)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    detach(pf);
    int rc = 0;
    if (pf->rc) {
        rc = pf->rc;
        if (err)
            *err = pf->err;
    } else if (atomic_load(&pf->ready[0]) < pf->chunks || atomic_load(&pf->ready[1]) < pf->chunks) {
        rc = err_set(err, -ECANCELED, ENGRAM_NO_OFFSET,
                     "prefill ended before all its chunks were read; history unchanged");
    }
    engram_session *s = pf->s;
    if (rc == 0)
        s->hist = pf->hist[0];
    s->state = S_IDLE;
    s->pf = NULL;
    pf_free(pf);
    return rc;
}

void engram_prefill_cancel(engram_prefill *pf)
{
    if (!pf)
        return;
    detach(pf);
    pf->s->state = S_IDLE;
    pf->s->pf = NULL;
    pf_free(pf);
}

/* ------------------------------------------------------------ the I/O thread's part */

/* Hashes chunk c for table t and starts its job. */
static void start_chunk(engram_pool *p, engram_prefill *pf, int t)
{
    size_t c = pf->next[t], at = c * pf->chunk;
    size_t k = pf->n - at < pf->chunk ? pf->n - at : pf->chunk;
    /* validated at begin: cannot fail */
    engram_hash_tokens(p->hasher, &pf->hist[t], pf->tokens + at, pf->mask ? pf->mask + at : NULL, k,
                       pf->rows48, NULL);
    size_t nreq = 0;
    for (size_t i = 0; i < k; i++) {
        if (pf->mask && !pf->mask[at + i])
            continue; /* masked tokens read nothing */
        for (unsigned col = 0; col < ENGRAM_COLUMNS; col++)
            pf->reqs[t][nreq++] = (uint64_t)pf->rows48[i * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + col]
                                      << 32 | (uint64_t)(i * ENGRAM_COLUMNS + col);
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

/* Serves one prefill; 1 once it is stopped and holds no read (the caller
 * then detaches it), else 0; *timed set when table 1 waits for its delay. */
static int service_one(engram_pool *p, engram_prefill *pf, unsigned *budget, int *timed)
{
    pthread_mutex_lock(&pf->mu);
    int cancel = pf->cancel_req || pf->rc;
    size_t released[ENGRAM_TABLES] = {pf->released[0], pf->released[1]};
    int go = pf->table1_go;
    pthread_mutex_unlock(&pf->mu);
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
            atomic_store_explicit(&pf->ready[t], pf->next[t], memory_order_release);
        }
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        cancel |= j->rc != 0;
    }
    if (cancel) /* done with it once its reads are collected */
        return !pf->active[0] && !pf->active[1];
    uint64_t now = 0;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        if (!pf->active[t] && pf->next[t] < pf->chunks && pf->next[t] < released[t] + pf->ring) {
            int may = t == 0 || go;
            if (!may && pf->delay_ns != ENGRAM_PREFILL_MANUAL) {
                if (!now)
                    now = pool_now_ns();
                may = now - pf->t_begin >= pf->delay_ns;
                *timed |= !may;
            }
            if (may)
                start_chunk(p, pf, t);
        }
        if (pf->active[t]) {
            unsigned max = *budget > STEP_RESERVE ? *budget - STEP_RESERVE : 0;
            *budget -= reader_job_issue(p->r, &pf->job[t], max);
        }
    }
    return 0;
}

int prefetch_service(engram_pool *p, unsigned *budget)
{
    int timed = 0;
    pthread_mutex_lock(&p->mu);
    engram_prefill *list = p->pf_head;
    pthread_mutex_unlock(&p->mu);
    /* Prefills are only added at the head (under p->mu) and only removed
     * here, by this thread: walking the list taken above is safe. */
    for (engram_prefill *pf = list, *next; pf; pf = next) {
        next = pf->next_pf;
        if (!service_one(p, pf, budget, &timed))
            continue;
        pthread_mutex_lock(&p->mu);
        engram_prefill **pp = &p->pf_head;
        while (*pp != pf)
            pp = &(*pp)->next_pf;
        *pp = pf->next_pf;
        pthread_mutex_unlock(&p->mu);
        /* the last touch: the consumer may free it as soon as it sees this */
        pthread_mutex_lock(&pf->mu);
        pf->detached = 1;
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
    }
    return timed;
}

void prefetch_fail_all(engram_pool *p, int code, const engram_error *e)
{
    pthread_mutex_lock(&p->mu);
    engram_prefill *list = p->pf_head;
    pthread_mutex_unlock(&p->mu);
    for (engram_prefill *pf = list; pf; pf = pf->next_pf)
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (pf->active[t] && pf->job[t].rc == 0) {
                pf->job[t].rc = code;
                pf->job[t].err = *e;
                pf->job[t].live = 0;
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
