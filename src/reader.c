/*
 * reader.c - page-cache-free concurrent row reads on top of an I/O engine.
 *
 * Every row becomes one read of the aligned block(s) covering its 264 bytes
 * into a slot of the reader's arena; the row is validated and decoded
 * straight out of the slot, which is then free again.  Batches are cut into
 * 2048-token chunks whose requests are sorted by row so each distinct row is
 * read once per chunk (the request array is the reader's, sized for one
 * chunk).  With a row cache, rows already read (and validated) are decoded
 * from memory instead.  All memory is allocated at open.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "io_engine.h"
#include "rowcache.h"
#include "util.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif

#define DEFAULT_DEPTH 64u
#define IO_BUFFER_BUDGET (512u << 10)
#define MAX_THREADS 256u
#define CHUNK_REQS (ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS)
#define LANES 64
#define HIST_SUB 16
#define HIST_BUCKETS (64 * HIST_SUB)

struct slot {
    uint64_t off;          /* aligned file offset of the read       */
    uint32_t len;          /* bytes asked                           */
    uint32_t need;         /* bytes that must arrive (row's end)    */
    uint32_t skip;         /* row start inside the buffer           */
    uint32_t row;
    uint8_t table;
    uint32_t lo, hi;       /* batch: request range; step: lo = index */
};

struct engram_reader {
    const engram_model *m;
    engram_model_info info;
    int fd;
    int direct;
    enum io_drop drop;
    uint32_t align, slot_size;
    unsigned depth;
    struct io_engine *eng;
    char note[160];

    uint8_t *arena;                /* depth x slot_size, aligned          */
    struct slot *slots;
    unsigned *free_slots, n_free;
    struct io_cqe *cqes;
    uint64_t *reqs;                /* one chunk: (row << 32) | destination */
    struct rowcache *cache;        /* NULL without one                     */

    /* the one decode step in flight */
    int step_active;
    engram_dtype step_dtype;
    void *step_out;
    uint32_t step_rows[ENGRAM_ROWS_PER_TOKEN];
    uint8_t step_miss[ENGRAM_ROWS_PER_TOKEN]; /* columns not in the cache */
    unsigned n_miss, step_issued, step_inflight, step_done;
    uint64_t step_t0;
    int step_rc;
    engram_error step_err;

    /* the batch in progress */
    engram_dtype b_dtype;
    uint8_t *b_out;                /* first token of the current chunk    */
    int b_rc;
    engram_error *b_err;

    engram_io_stats st;
    uint32_t hist[HIST_BUCKETS];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Log-linear histogram: 16 sub-buckets per power of two (~6% resolution). */
static unsigned hist_index(uint64_t v)
{
    if (v < HIST_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)(v >> (e - 4)) & (HIST_SUB - 1);
    unsigned idx = (e - 3) * HIST_SUB + sub;
    return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

static uint64_t hist_value(unsigned idx)
{
    if (idx < HIST_SUB)
        return idx;
    unsigned e = idx / HIST_SUB + 3, sub = idx % HIST_SUB;
    return ((uint64_t)(HIST_SUB + sub)) << (e - 4);
}

static uint64_t hist_quantile(const uint32_t *h, uint64_t total, double q)
{
    if (total == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)total), seen = 0;
    if (want >= total)
        want = total - 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h[i];
        if (seen > want)
            return hist_value(i);
    }
    return hist_value(HIST_BUCKETS - 1);
}

/* ------------------------------------------------------------ opening */

static engram_io_engine env_engine(void)
{
    const char *e = getenv("ENGRAM_IO");
    if (!e)
        return ENGRAM_IO_AUTO;
    if (!strcmp(e, "uring"))
        return ENGRAM_IO_URING;
    if (!strcmp(e, "threads"))
        return ENGRAM_IO_THREADS;
    if (!strcmp(e, "buffered"))
        return ENGRAM_IO_BUFFERED;
    return ENGRAM_IO_AUTO;
}

/* Alignment O_DIRECT needs on this file: statx(STATX_DIOALIGN) where the
 * kernel reports it, else 4096 (a safe multiple of every logical block). */
static uint32_t dio_alignment(int fd)
{
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0)
            return 0; /* the filesystem does not do direct I/O on this file */
        uint32_t a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                     : sx.stx_dio_mem_align;
        return a;
    }
#endif
    return 4096;
}

static enum io_drop probe_dontcache(int fd, uint64_t off)
{
    const char *force = getenv("ENGRAM_IO_DROP");
    if (force && !strcmp(force, "fadvise"))
        return DROP_FADVISE;
    char b[16];
    struct iovec iov = {b, sizeof b};
    ssize_t r = preadv2(fd, &iov, 1, (off_t)off, RWF_DONTCACHE);
    return r >= 0 ? DROP_DONTCACHE : DROP_FADVISE;
}

static int open_descriptor(engram_reader *r, engram_io_engine want, engram_error *err)
{
    const char *path = r->info.path;
    if (want != ENGRAM_IO_BUFFERED) {
        r->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (r->fd >= 0) {
            r->align = dio_alignment(r->fd);
            /* Probe one aligned read: some filesystems accept the flag and
             * refuse the read. */
            void *probe = NULL;
            uint32_t a = r->align ? r->align : 4096;
            if (r->align && posix_memalign(&probe, a < 4096 ? 4096 : a, a) == 0) {
                ssize_t got = pread(r->fd, probe, a, (off_t)(r->info.table[0].offset / a * a));
                free(probe);
                if (got > 0) {
                    r->direct = 1;
                    return 0;
                }
                snprintf(r->note, sizeof r->note, "O_DIRECT read refused (%s); buffered fallback",
                         got < 0 ? strerror(errno) : "short read");
            } else {
                free(probe);
                snprintf(r->note, sizeof r->note, "no direct I/O on this filesystem; buffered fallback");
            }
            close(r->fd);
        } else {
            snprintf(r->note, sizeof r->note, "O_DIRECT refused (%s); buffered fallback",
                     strerror(errno));
        }
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot open '%s': %s", path,
                       strerror(errno));
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_RANDOM);
    r->direct = 0;
    r->align = 1;
    r->drop = probe_dontcache(r->fd, r->info.table[0].offset);
    return 0;
}

int engram_reader_open(const engram_model *m, const engram_reader_opts *opts,
                       engram_reader **out, engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_io_engine want = opts ? opts->engine : ENGRAM_IO_AUTO;
    if (want == ENGRAM_IO_AUTO)
        want = env_engine();
    if (want > ENGRAM_IO_BUFFERED)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "unknown I/O engine %d", (int)want);
    unsigned depth = opts && opts->depth ? opts->depth : DEFAULT_DEPTH;
    if (depth > ENGRAM_READER_MAX_DEPTH)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "depth %u exceeds %u", depth,
                       ENGRAM_READER_MAX_DEPTH);

    uint64_t cache_bytes = opts ? opts->cache_bytes : 0;
    if (cache_bytes > 0 && cache_bytes < ENGRAM_READER_MIN_CACHE)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "row cache of %llu bytes is below the %u minimum",
                       (unsigned long long)cache_bytes, ENGRAM_READER_MIN_CACHE);

    engram_reader *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    if (cache_bytes > 0 && rowcache_new(cache_bytes, &r->cache) < 0) {
        free(r);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot allocate a row cache of %llu bytes",
                       (unsigned long long)cache_bytes);
    }
    r->m = m;
    engram_model_get_info(m, &r->info);
    r->fd = -1;
    int rc = open_descriptor(r, want, err);
    if (rc < 0) {
        rowcache_free(r->cache);
        free(r);
        return rc;
    }
    /* A row spans at most two aligned blocks. */
    uint32_t a = r->align;
    r->slot_size = (uint32_t)(((uint64_t)a - 1 + ENGRAM_ROW_BYTES + a - 1) / a * a);
    unsigned cap = IO_BUFFER_BUDGET / r->slot_size;
    r->depth = depth < cap ? depth : cap;
    int try_uring = r->direct && (want == ENGRAM_IO_AUTO || want == ENGRAM_IO_URING);
    if (!try_uring && r->depth > MAX_THREADS)
        r->depth = MAX_THREADS;

    size_t arena = (size_t)r->depth * r->slot_size;
    if (posix_memalign((void **)&r->arena, 4096, arena) != 0)
        r->arena = NULL;
    r->slots = calloc(r->depth, sizeof *r->slots);
    r->free_slots = calloc(r->depth, sizeof *r->free_slots);
    r->cqes = calloc(r->depth, sizeof *r->cqes);
    r->reqs = malloc(CHUNK_REQS * sizeof *r->reqs);
    if (!r->arena || !r->slots || !r->free_slots || !r->cqes || !r->reqs) {
        engram_reader_close(r);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    for (unsigned i = 0; i < r->depth; i++)
        r->free_slots[i] = r->depth - 1 - i;
    r->n_free = r->depth;

    if (try_uring) {
        char note[96];
        rc = io_uring_engine_new(r->fd, r->depth, r->arena, arena, &r->eng, note, sizeof note);
        if (rc == 0 && note[0])
            snprintf(r->note, sizeof r->note, "%s", note);
        if (rc < 0) {
            if (want == ENGRAM_IO_URING) {
                engram_reader_close(r);
                return err_set(err, rc, ENGRAM_NO_OFFSET, "io_uring refused: %s", strerror(-rc));
            }
            snprintf(r->note, sizeof r->note, "io_uring refused (%s); thread pool", strerror(-rc));
            if (r->depth > MAX_THREADS) { /* fewer slots in use than allocated */
                r->depth = MAX_THREADS;
                for (unsigned i = 0; i < r->depth; i++)
                    r->free_slots[i] = r->depth - 1 - i;
                r->n_free = r->depth;
            }
        }
    }
    if (!r->eng) {
        rc = io_threads_engine_new(r->fd, r->depth, r->direct ? DROP_NONE : r->drop, &r->eng);
        if (rc < 0) {
            engram_reader_close(r);
            return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start reader threads: %s",
                           strerror(-rc));
        }
    }
    engram_reader_reset_stats(r);
    *out = r;
    return 0;
}

void engram_reader_close(engram_reader *r)
{
    if (!r)
        return;
    if (r->eng)
        r->eng->ops->destroy(r->eng);
    if (r->fd >= 0)
        close(r->fd);
    free(r->arena);
    free(r->slots);
    free(r->free_slots);
    free(r->cqes);
    free(r->reqs);
    rowcache_free(r->cache);
    free(r);
}

void engram_reader_reset_stats(engram_reader *r)
{
    memset(&r->st, 0, sizeof r->st);
    memset(r->hist, 0, sizeof r->hist);
}

void engram_reader_stats(const engram_reader *r, engram_io_stats *st)
{
    *st = r->st;
    st->engine = r->eng ? r->eng->name : "none";
    st->note = r->note;
    st->direct = r->direct;
    st->drop = r->direct ? "" : r->drop == DROP_DONTCACHE ? "RWF_DONTCACHE" : "fadvise";
    st->align = r->align;
    st->depth = r->depth;
    st->reserved_bytes = sizeof *r + (uint64_t)r->depth * (r->slot_size + sizeof *r->slots +
                                                           sizeof *r->free_slots + sizeof *r->cqes) +
                         (uint64_t)CHUNK_REQS * sizeof *r->reqs + (r->eng ? r->eng->bytes : 0);
    st->cache_bytes = rowcache_bytes(r->cache);
    st->cache_rows = rowcache_rows(r->cache);
    st->step_p50_ns = hist_quantile(r->hist, r->st.steps, 0.50);
    st->step_p99_ns = hist_quantile(r->hist, r->st.steps, 0.99);
    st->step_p999_ns = hist_quantile(r->hist, r->st.steps, 0.999);
}

/* ------------------------------------------------------------ slots */

static int issue(engram_reader *r, unsigned s, int table, uint32_t row)
{
    struct slot *sl = &r->slots[s];
    uint64_t off = r->info.table[table].offset + (uint64_t)row * ENGRAM_ROW_BYTES;
    uint64_t start = off / r->align * r->align;
    uint64_t end = (off + ENGRAM_ROW_BYTES + r->align - 1) / r->align * r->align;
    sl->off = start;
    sl->len = (uint32_t)(end - start);
    sl->skip = (uint32_t)(off - start);
    sl->need = sl->skip + ENGRAM_ROW_BYTES;
    sl->row = row;
    sl->table = (uint8_t)table;
    return r->eng->ops->queue(r->eng, s, r->arena + (size_t)s * r->slot_size, sl->len, start);
}

static size_t elem_size(engram_dtype d)
{
    return d == ENGRAM_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Checks a completion.  1: the row's bytes are in the slot (decoding
 * validates them); 0: requeued (transient); <0: error (err filled). */
static int check_cqe(engram_reader *r, const struct io_cqe *c, engram_error *err)
{
    struct slot *sl = &r->slots[c->slot];
    if (c->res == -EAGAIN || c->res == -EINTR) {
        r->st.retries++;
        int rc = issue(r, c->slot, sl->table, sl->row);
        return rc < 0 ? err_set_row(err, rc, sl->row, "row %u of table %d: requeue failed: %s",
                                    sl->row, sl->table, strerror(-rc))
                      : 0;
    }
    if (c->res < 0)
        return err_set_row(err, c->res, sl->row, "row %u of table %d (file offset %llu): %s",
                           sl->row, sl->table,
                           (unsigned long long)(sl->off + sl->skip), strerror(-c->res));
    r->st.bytes_read += (uint64_t)c->res;
    if ((uint32_t)c->res < sl->need)
        return err_set_row(err, -EIO, sl->row,
                           "row %u of table %d (file offset %llu): short read (%d of %u bytes)",
                           sl->row, sl->table, (unsigned long long)(sl->off + sl->skip), c->res,
                           sl->need);
    return 1;
}

/* Decodes the row in slot s into dst; the decoder validates the row first
 * and writes nothing if it is invalid (-EDOM, err naming the row). */
static int decode_raw(const uint8_t *raw, int table, uint32_t row, engram_dtype d, void *dst,
                      engram_error *err)
{
    int rc = d == ENGRAM_F32 ? engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, dst, NULL)
                             : engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, dst, NULL);
    if (rc == -EDOM) {
        const char *why = "invalid";
        engram_row_check(raw, &why);
        return err_set_row(err, -EDOM, row, "row %u of table %d: %s", row, table, why);
    }
    return rc;
}

/* Decodes the row in slot s; a row that decodes goes into the cache. */
static int decode_slot(engram_reader *r, unsigned s, engram_dtype d, void *dst,
                       engram_error *err)
{
    const struct slot *sl = &r->slots[s];
    const uint8_t *raw = r->arena + (size_t)s * r->slot_size + sl->skip;
    int rc = decode_raw(raw, sl->table, sl->row, d, dst, err);
    if (rc == 0 && r->cache)
        rowcache_put(r->cache, sl->table, sl->row, raw);
    return rc;
}

/* Decodes (table, row) from the cache into dst: 1 if it was there, 0 if
 * not, <0 on error (err filled). */
static int decode_cached(engram_reader *r, int table, uint32_t row, engram_dtype d, void *dst,
                         engram_error *err)
{
    const uint8_t *raw = r->cache ? rowcache_get(r->cache, table, row) : NULL;
    if (!raw)
        return 0;
    r->st.cache_hits++;
    int rc = decode_raw(raw, table, row, d, dst, err);
    return rc < 0 ? rc : 1;
}

static void release(engram_reader *r, unsigned s)
{
    r->free_slots[r->n_free++] = s;
}

/* ------------------------------------------------------------ batch */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Keys are row << 32 | destination: sorting groups each row's requests. */
static void sort_reqs(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
}

/* Copies the decoded row at request lo to the other requests [lo+1, hi). */
static void batch_fan_out(engram_reader *r, size_t lo, size_t hi)
{
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->b_dtype);
    const uint8_t *first = r->b_out + (r->reqs[lo] & 0xffffffffu) * row_bytes;
    for (size_t i = lo + 1; i < hi; i++)
        memcpy(r->b_out + (r->reqs[i] & 0xffffffffu) * row_bytes, first, row_bytes);
}

static int batch_complete(engram_reader *r, unsigned s, engram_error *err)
{
    struct slot *sl = &r->slots[s];
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->b_dtype);
    int rc = decode_slot(r, s, r->b_dtype, r->b_out + (r->reqs[sl->lo] & 0xffffffffu) * row_bytes,
                         err);
    if (rc < 0)
        return rc;
    batch_fan_out(r, sl->lo, sl->hi);
    return 0;
}

/* Reaps at least `min` completions and handles them; returns how many slots
 * were released, or -errno on an engine failure. */
static int batch_reap(engram_reader *r, unsigned min)
{
    int n = r->eng->ops->reap(r->eng, r->cqes, r->depth, min);
    if (n < 0)
        return n;
    int released = 0;
    for (int i = 0; i < n; i++) {
        engram_error e;
        int rc = check_cqe(r, &r->cqes[i], &e);
        if (rc == 0)
            continue;
        if (rc > 0)
            rc = batch_complete(r, r->cqes[i].slot, &e);
        if (rc < 0 && r->b_rc == 0) {
            r->b_rc = rc;
            if (r->b_err)
                *r->b_err = e;
        }
        release(r, r->cqes[i].slot);
        released++;
    }
    return released;
}

/* Start of the group (requests for one row) at or after position b. */
static size_t group_start(const uint64_t *reqs, size_t n, size_t b)
{
    while (b > 0 && b < n && (reqs[b] >> 32) == (reqs[b - 1] >> 32))
        b++;
    return b;
}

static int batch_chunk(engram_reader *r, int t, size_t nreq)
{
    sort_reqs(r->reqs, nreq);
    /* Sorting groups duplicates, but issuing in row order would keep every
     * read in flight inside a narrow stretch of the file, which network and
     * striped block devices serve with little parallelism.  The sorted
     * requests are cut into LANES stretches issued round-robin, so reads in
     * flight spread over the whole table while each row is still read once. */
    size_t cur[LANES], end[LANES];
    for (int l = 0; l < LANES; l++)
        cur[l] = group_start(r->reqs, nreq, nreq * (size_t)l / LANES);
    for (int l = 0; l < LANES; l++)
        end[l] = l + 1 < LANES ? cur[l + 1] : nreq;
    int lane = 0, live = 0;
    for (int l = 0; l < LANES; l++)
        live += cur[l] < end[l];
    unsigned inflight = 0;
    while ((live > 0 && r->b_rc == 0) || inflight > 0) {
        while (live > 0 && r->n_free > 0 && r->b_rc == 0) {
            while (cur[lane] >= end[lane])
                lane = (lane + 1) % LANES;
            size_t i = cur[lane];
            uint32_t row = (uint32_t)(r->reqs[i] >> 32);
            size_t j = i + 1;
            while (j < end[lane] && (uint32_t)(r->reqs[j] >> 32) == row)
                j++;
            cur[lane] = j;
            live -= j >= end[lane];
            lane = (lane + 1) % LANES;
            if (r->cache) {
                size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->b_dtype);
                int hit = decode_cached(r, t, row, r->b_dtype,
                                        r->b_out + (r->reqs[i] & 0xffffffffu) * row_bytes, r->b_err);
                if (hit < 0) {
                    r->b_rc = hit;
                    break;
                }
                if (hit) {
                    batch_fan_out(r, i, j);
                    continue;
                }
            }
            unsigned s = r->free_slots[--r->n_free];
            r->slots[s].lo = (uint32_t)i;
            r->slots[s].hi = (uint32_t)j;
            int rc = issue(r, s, t, row);
            if (rc < 0) {
                release(r, s);
                r->b_rc = err_set_row(r->b_err, rc, row, "row %u of table %d: cannot queue: %s",
                                      row, t, strerror(-rc));
                break;
            }
            r->st.rows_read++;
            inflight++;
        }
        if (inflight == 0)
            break;
        /* Submit what was queued and wait, in one call; waiting for an eighth
         * of the queue rather than one read saves wake-ups and barely lowers
         * the depth the device sees. */
        unsigned want = inflight / 8 ? inflight / 8 : 1;
        int done = batch_reap(r, want);
        if (done < 0) {
            /* The engine itself failed: nothing more will complete. */
            if (r->b_rc == 0)
                r->b_rc = err_set(r->b_err, done, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                  strerror(-done));
            return r->b_rc;
        }
        inflight -= (unsigned)done;
    }
    return r->b_rc;
}

static int batch_run(engram_reader *r, int t, const uint32_t *rows, size_t n, engram_dtype dtype,
                     void *out, size_t window_tokens, engram_batch_sink sink, void *ctx,
                     engram_error *err)
{
    if (!r || (n > 0 && (!rows || !out)) || (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32) ||
        window_tokens == 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    if (t < 0 || t >= ENGRAM_TABLES)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not 0 or 1", t);
    if (r->step_active)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a decode step is in flight");
    const uint32_t limit = (uint32_t)r->info.table[t].rows;
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < ENGRAM_COLUMNS; c++) {
            uint32_t row = rows[i * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + (size_t)c];
            if (row >= limit)
                return err_set_row(err, -EINVAL, row,
                                   "token %zu column %d: row %u of table %d is out of range (%u rows)",
                                   i, c, row, t, limit);
        }
    r->b_dtype = dtype;
    r->b_rc = 0;
    r->b_err = err;
    r->st.batches++;
    size_t token_bytes = (size_t)ENGRAM_COLUMNS * ENGRAM_ROW_VALUES * elem_size(dtype);
    size_t chunk = window_tokens < ENGRAM_BATCH_TOKENS ? window_tokens : ENGRAM_BATCH_TOKENS;
    for (size_t at = 0; at < n && r->b_rc == 0; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        size_t nreq = 0;
        for (size_t i = 0; i < k; i++)
            for (int c = 0; c < ENGRAM_COLUMNS; c++) {
                uint64_t row = rows[(at + i) * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + (size_t)c];
                r->reqs[nreq++] = row << 32 | (uint64_t)(i * ENGRAM_COLUMNS + (size_t)c);
            }
        r->st.rows_requested += nreq;
        r->b_out = (uint8_t *)out + (sink ? 0 : at * token_bytes);
        if (batch_chunk(r, t, nreq) == 0 && sink) {
            int rc = sink(ctx, at, k, out);
            if (rc != 0)
                r->b_rc = err_set(err, rc, ENGRAM_NO_OFFSET, "stopped by the sink (%d)", rc);
        }
    }
    r->b_err = NULL;
    return r->b_rc;
}

int engram_reader_batch(engram_reader *r, int t, const uint32_t *rows, size_t n,
                        engram_dtype dtype, void *out, engram_error *err)
{
    return batch_run(r, t, rows, n, dtype, out, n ? n : 1, NULL, NULL, err);
}

int engram_reader_batch_stream(engram_reader *r, int t, const uint32_t *rows, size_t n,
                               engram_dtype dtype, void *window, size_t window_tokens,
                               engram_batch_sink sink, void *ctx, engram_error *err)
{
    if (!sink)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no sink");
    return batch_run(r, t, rows, n, dtype, window, window_tokens, sink, ctx, err);
}

/* ------------------------------------------------------------ decode step */

/* After an error, rows never issued count as done so that wait() ends once
 * the reads in flight are back. */
static void step_abandon_rest(engram_reader *r)
{
    r->step_done += r->n_miss - r->step_issued;
    r->step_issued = r->n_miss;
}

static void step_issue_more(engram_reader *r)
{
    if (r->step_rc != 0) {
        step_abandon_rest(r);
        return;
    }
    unsigned queued = 0;
    while (r->step_issued < r->n_miss && r->n_free > 0) {
        unsigned k = r->step_miss[r->step_issued];
        unsigned s = r->free_slots[--r->n_free];
        r->slots[s].lo = k;
        int rc = issue(r, s, (int)(k / ENGRAM_COLUMNS), r->step_rows[k]);
        if (rc < 0) {
            release(r, s);
            r->step_rc = err_set_row(&r->step_err, rc, r->step_rows[k],
                                     "row %u: cannot queue: %s", r->step_rows[k], strerror(-rc));
            step_abandon_rest(r);
            break;
        }
        r->step_issued++;
        r->step_inflight++;
        r->st.rows_read++;
        queued++;
    }
    if (queued)
        r->eng->ops->submit(r->eng);
}

int engram_reader_step_submit(engram_reader *r, const uint32_t rows[ENGRAM_ROWS_PER_TOKEN],
                              engram_dtype dtype, void *out, engram_error *err)
{
    if (!r || !rows || !out || (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    if (r->step_active)
        return err_set(err, -EBUSY, ENGRAM_NO_OFFSET, "a decode step is already in flight");
    for (int k = 0; k < ENGRAM_ROWS_PER_TOKEN; k++) {
        int t = k / ENGRAM_COLUMNS;
        if (rows[k] >= r->info.table[t].rows)
            return err_set_row(err, -EINVAL, rows[k], "column %d: row %u of table %d is out of range",
                               k % ENGRAM_COLUMNS, rows[k], t);
    }
    memcpy(r->step_rows, rows, sizeof r->step_rows);
    r->step_active = 1;
    r->step_dtype = dtype;
    r->step_out = out;
    r->step_issued = r->step_inflight = r->step_done = r->n_miss = 0;
    r->step_rc = 0;
    r->st.rows_requested += ENGRAM_ROWS_PER_TOKEN;
    r->step_t0 = now_ns();
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(dtype);
    for (unsigned k = 0; k < ENGRAM_ROWS_PER_TOKEN; k++) {
        engram_error e;
        int hit = decode_cached(r, (int)(k / ENGRAM_COLUMNS), rows[k], dtype,
                                (uint8_t *)out + k * row_bytes, &e);
        if (hit == 0) {
            r->step_miss[r->n_miss++] = (uint8_t)k;
            continue;
        }
        if (hit < 0 && r->step_rc == 0) {
            r->step_rc = hit;
            r->step_err = e;
        }
        r->step_done++;
    }
    step_issue_more(r);
    return 0;
}

/* Handles what the engine returns; min = completions to wait for. */
static int step_progress(engram_reader *r, unsigned min)
{
    int n = r->eng->ops->reap(r->eng, r->cqes, r->depth, min);
    if (n < 0) {
        if (r->step_rc == 0)
            r->step_rc = err_set(&r->step_err, n, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                 strerror(-n));
        r->step_done = ENGRAM_ROWS_PER_TOKEN; /* nothing more will arrive */
        return n;
    }
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->step_dtype);
    for (int i = 0; i < n; i++) {
        unsigned s = r->cqes[i].slot;
        engram_error e;
        int rc = check_cqe(r, &r->cqes[i], &e);
        if (rc == 0)
            continue;
        if (rc > 0)
            rc = decode_slot(r, s, r->step_dtype, (uint8_t *)r->step_out + r->slots[s].lo * row_bytes,
                             &e);
        if (rc < 0 && r->step_rc == 0) {
            r->step_rc = rc;
            r->step_err = e;
        }
        release(r, s);
        r->step_inflight--;
        r->step_done++;
    }
    step_issue_more(r);
    return 0;
}

static int step_finish(engram_reader *r, engram_error *err)
{
    uint64_t dt = now_ns() - r->step_t0;
    r->st.steps++;
    r->hist[hist_index(dt)]++;
    if (dt > r->st.step_max_ns)
        r->st.step_max_ns = dt;
    r->step_active = 0;
    if (r->step_rc < 0 && err)
        *err = r->step_err;
    return r->step_rc;
}

int engram_reader_step_wait(engram_reader *r, engram_error *err)
{
    if (!r || !r->step_active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    /* Wait for everything in flight in one wake-up: waking per row costs a
     * context switch each, which on a VM is a good part of a step. */
    while (r->step_done < ENGRAM_ROWS_PER_TOKEN) {
        unsigned inflight = r->step_inflight;
        if (step_progress(r, inflight ? inflight : 1) < 0)
            break;
    }
    return step_finish(r, err);
}

int engram_reader_step_poll(engram_reader *r, engram_error *err)
{
    if (!r || !r->step_active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    if (r->step_done < ENGRAM_ROWS_PER_TOKEN)
        step_progress(r, 0);
    if (r->step_done < ENGRAM_ROWS_PER_TOKEN)
        return -EAGAIN;
    return step_finish(r, err);
}
