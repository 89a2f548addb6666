/*
 * reader.c - page-cache-free concurrent row reads on top of an I/O engine.
 *
 * Every row becomes one read of the aligned block(s) covering its 264 bytes
 * into a slot of the reader's arena; the row is validated and decoded
 * straight out of the slot, which is then free again.  Batches are cut into
 * 2048-token chunks whose requests are sorted by row (in place, radix.c) so
 * each distinct row is read once per chunk (the request array is the
 * reader's, sized for one chunk).  With a row cache, rows already read (and
 * validated) are decoded from memory instead.  All memory is allocated at
 * open.
 *
 * Reads in flight are the kernel's until reaped: every path that ends a
 * batch or a step early (a read error, an engine error, cancel, close)
 * first reaps every read it queued, after asking the engine to cancel them
 * where that helps, so no buffer is reused or freed under a read.  Should an
 * engine stop returning completions altogether, the reader is marked broken
 * and its buffers are never freed (see bury()).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "io_engine.h"
#include "model.h"
#include "radix.h"
#include "rowcache.h"
#include "util.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif

#define DEFAULT_DEPTH 64u
#define IO_BUFFER_BUDGET (512u << 10)
#define MAX_THREADS 256u
/* O_DIRECT is used only if at least this many reads fit in the buffer
 * budget (a DIO alignment of at most 32 KiB); larger alignments read so
 * much per row that the buffered fallback is the better path. */
#define MIN_DIRECT_DEPTH 8u
#define CHUNK_REQS (ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS)
#define LANES 64
#define HIST_SUB 16
#define HIST_BUCKETS (64 * HIST_SUB)
/* A read is resubmitted at most this often (short results, -EAGAIN). */
#define MAX_TRIES 8
/* Transient engine refusals retried in a row before giving up (~0.1 s). */
#define TRANSIENT_LIMIT 2000
/* Hard reap failures in a row while draining before the engine is given
 * up for dead. */
#define DRAIN_HARD_LIMIT 8

enum { OWN_NONE = 0, OWN_BATCH, OWN_STEP };

struct slot {
    uint64_t off;          /* aligned file offset of the read       */
    uint32_t len;          /* bytes asked                           */
    uint32_t need;         /* bytes that must arrive (row's end)    */
    uint32_t skip;         /* row start inside the buffer           */
    uint32_t from;         /* where the read in flight starts       */
    uint32_t got;          /* bytes in place from the start         */
    uint32_t row;
    uint8_t table, owner, tries;
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
    char note[192];

    uint8_t *arena;                /* depth x slot_size, aligned          */
    struct slot *slots;
    unsigned *free_slots, n_free;
    unsigned *pending, n_pending;  /* owned slots waiting to be queued    */
    unsigned inflight;             /* queued to the engine, not reaped    */
    struct io_cqe *cqes;
    uint64_t *reqs;                /* one chunk: (row << 32) | destination */
    struct radix_scratch sort;
    struct rowcache *cache;        /* NULL without one                     */

    /* Set when the engine stopped completing reads: the reader refuses all
     * work and close() keeps its buffers (bury()). */
    int broken;
    char broken_msg[160];
    engram_reader *grave_next;

    /* the one decode step in flight */
    int step_active, step_cancel_sent;
    engram_dtype step_dtype;
    void *step_out;
    uint32_t step_rows[ENGRAM_ROWS_PER_TOKEN];
    uint8_t step_miss[ENGRAM_ROWS_PER_TOKEN]; /* columns not in the cache */
    unsigned n_miss, step_issued, step_done;
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

static void pause_briefly(void)
{
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
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

/* Bytes of one slot: a row spans at most two aligned blocks. */
static uint32_t slot_bytes(uint32_t align)
{
    return (uint32_t)(((uint64_t)align - 1 + ENGRAM_ROW_BYTES + align - 1) / align * align);
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

/*
 * Opens the very file the model validated, with `flags` added: through the
 * model's descriptor (/proc/self/fd/N), so a file renamed over the path in
 * the meantime is not the one read.  Where /proc is not mounted the path is
 * opened and must still name the same file (device and inode), else
 * -ESTALE.  Returns the descriptor or -errno (err filled for -ESTALE only).
 */
static int reopen_model(engram_reader *r, int flags, engram_error *err)
{
    int mfd = model_fd(r->m);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", mfd);
    int fd = open(proc, O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
        fd = open(r->info.path, O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0)
        return -errno;
    struct stat a, b;
    if (fstat(fd, &a) < 0 || fstat(mfd, &b) < 0) {
        int e = -errno;
        close(fd);
        return err_set(err, e, ENGRAM_NO_OFFSET, "cannot stat '%s': %s", r->info.path,
                       strerror(-e));
    }
    if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(fd);
        return err_set(err, -ESTALE, ENGRAM_NO_OFFSET,
                       "'%s' is no longer the file the model opened (replaced since; device/inode "
                       "differ, and /proc is not there to reach the original): reopen the model",
                       r->info.path);
    }
    return fd;
}

/* Tries O_DIRECT: 1 if the reader now reads through it, 0 if not (r->note
 * says why), <0 on an error that must end the open. */
static int try_direct(engram_reader *r, engram_error *err)
{
    int fd = reopen_model(r, O_DIRECT, err);
    if (fd == -ESTALE)
        return fd;
    if (fd < 0) {
        snprintf(r->note, sizeof r->note, "O_DIRECT refused (%s); buffered fallback", strerror(-fd));
        return 0;
    }
    uint32_t a = dio_alignment(fd);
    if (a == 0) {
        snprintf(r->note, sizeof r->note, "no direct I/O on this filesystem; buffered fallback");
    } else if ((uint64_t)slot_bytes(a) * MIN_DIRECT_DEPTH > IO_BUFFER_BUDGET) {
        snprintf(r->note, sizeof r->note,
                 "DIO alignment %u B leaves fewer than %u reads in the %u KiB buffer budget; "
                 "buffered fallback", a, MIN_DIRECT_DEPTH, IO_BUFFER_BUDGET >> 10);
    } else {
        /* Probe one aligned read: some filesystems accept the flag and
         * refuse the read. */
        void *probe = NULL;
        if (posix_memalign(&probe, a < 4096 ? 4096 : a, a) != 0) {
            close(fd);
            return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        }
        ssize_t got = pread(fd, probe, a, (off_t)(r->info.table[0].offset / a * a));
        int e = errno;
        free(probe);
        if (got > 0) {
            r->fd = fd;
            r->align = a;
            r->direct = 1;
            return 1;
        }
        snprintf(r->note, sizeof r->note, "O_DIRECT read refused (%s); buffered fallback",
                 got < 0 ? strerror(e) : "short read");
    }
    close(fd);
    return 0;
}

static int open_descriptor(engram_reader *r, engram_io_engine want, engram_error *err)
{
    if (want != ENGRAM_IO_BUFFERED) {
        int rc = try_direct(r, err);
        if (rc < 0)
            return rc;
        if (rc == 1)
            return 0;
        /* A forced engine is a request for direct reads through it: say
         * so rather than quietly reading through the page cache. */
        if (want != ENGRAM_IO_AUTO)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "the %s engine needs O_DIRECT, which this file does not allow here "
                           "(%s); use the automatic or the buffered engine",
                           want == ENGRAM_IO_URING ? "io_uring" : "thread-pool", r->note);
    }
    int fd = reopen_model(r, 0, err);
    if (fd == -ESTALE)
        return fd;
    if (fd < 0)
        return err_set(err, fd, ENGRAM_NO_OFFSET, "cannot open '%s': %s", r->info.path,
                       strerror(-fd));
    r->fd = fd;
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_RANDOM);
    r->direct = 0;
    r->align = 1;
    r->drop = probe_dontcache(r->fd, r->info.table[0].offset);
    return 0;
}

static void reader_free(engram_reader *r)
{
    if (r->eng)
        r->eng->ops->destroy(r->eng);
    if (r->fd >= 0)
        close(r->fd);
    free(r->arena);
    free(r->slots);
    free(r->free_slots);
    free(r->pending);
    free(r->cqes);
    free(r->reqs);
    rowcache_free(r->cache);
    free(r);
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
    r->fd = -1;
    if (cache_bytes > 0 && rowcache_new(cache_bytes, &r->cache) < 0) {
        reader_free(r);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot allocate a row cache of %llu bytes",
                       (unsigned long long)cache_bytes);
    }
    r->m = m;
    engram_model_get_info(m, &r->info);
    int rc = open_descriptor(r, want, err);
    if (rc < 0) {
        reader_free(r);
        return rc;
    }
    r->slot_size = slot_bytes(r->align);
    unsigned cap = IO_BUFFER_BUDGET / r->slot_size; /* >= MIN_DIRECT_DEPTH (try_direct) */
    r->depth = depth < cap ? depth : cap;
    int try_uring = r->direct && (want == ENGRAM_IO_AUTO || want == ENGRAM_IO_URING);
    if (!try_uring && r->depth > MAX_THREADS)
        r->depth = MAX_THREADS;

    size_t arena = (size_t)r->depth * r->slot_size;
    size_t arena_align = r->align > 4096 ? r->align : 4096;
    if (posix_memalign((void **)&r->arena, arena_align, arena) != 0)
        r->arena = NULL;
    r->slots = calloc(r->depth, sizeof *r->slots);
    r->free_slots = calloc(r->depth, sizeof *r->free_slots);
    r->pending = calloc(r->depth, sizeof *r->pending);
    r->cqes = calloc(r->depth, sizeof *r->cqes);
    r->reqs = malloc(CHUNK_REQS * sizeof *r->reqs);
    if (!r->arena || !r->slots || !r->free_slots || !r->pending || !r->cqes || !r->reqs) {
        reader_free(r);
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
                reader_free(r);
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
            r->eng = NULL;
            reader_free(r);
            return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot start reader threads: %s",
                           strerror(-rc));
        }
    }
    engram_reader_reset_stats(r);
    *out = r;
    return 0;
}

/* Readers whose engine died with reads possibly still in flight: their
 * buffers may yet be written by the kernel, so they are never freed (kept
 * reachable here rather than leaked). */
static pthread_mutex_t grave_mu = PTHREAD_MUTEX_INITIALIZER;
static engram_reader *graves;

static void bury(engram_reader *r)
{
    pthread_mutex_lock(&grave_mu);
    r->grave_next = graves;
    graves = r;
    pthread_mutex_unlock(&grave_mu);
}

static void cancel_and_drain(engram_reader *r);

void engram_reader_close(engram_reader *r)
{
    if (!r)
        return;
    if (r->step_active && !r->broken) {
        if (r->step_rc == 0)
            r->step_rc = -ECANCELED;
        cancel_and_drain(r);
        r->step_active = 0;
    }
    if (r->broken || r->inflight > 0) {
        bury(r);
        return;
    }
    reader_free(r);
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
    st->in_flight = r->inflight;
    st->broken = r->broken;
    st->reserved_bytes = sizeof *r + (uint64_t)r->depth * (r->slot_size + sizeof *r->slots +
                                                           sizeof *r->free_slots +
                                                           sizeof *r->pending + sizeof *r->cqes) +
                         (uint64_t)CHUNK_REQS * sizeof *r->reqs + (r->eng ? r->eng->bytes : 0);
    st->cache_bytes = rowcache_bytes(r->cache);
    st->cache_rows = rowcache_rows(r->cache);
    st->step_p50_ns = hist_quantile(r->hist, r->st.steps, 0.50);
    st->step_p99_ns = hist_quantile(r->hist, r->st.steps, 0.99);
    st->step_p999_ns = hist_quantile(r->hist, r->st.steps, 0.999);
}

/* ------------------------------------------------------------ slots */

static size_t elem_size(engram_dtype d)
{
    return d == ENGRAM_F32 ? sizeof(float) : sizeof(uint16_t);
}

static uint64_t slot_row_offset(const struct slot *sl)
{
    return sl->off + sl->skip;
}

/* Takes a free slot for (table, row) and puts it on the pending list; the
 * caller has checked n_free > 0. */
static unsigned take_slot(engram_reader *r, int owner, int table, uint32_t row)
{
    unsigned s = r->free_slots[--r->n_free];
    struct slot *sl = &r->slots[s];
    uint64_t off = r->info.table[table].offset + (uint64_t)row * ENGRAM_ROW_BYTES;
    uint64_t start = off / r->align * r->align;
    uint64_t end = (off + ENGRAM_ROW_BYTES + r->align - 1) / r->align * r->align;
    sl->off = start;
    sl->len = (uint32_t)(end - start);
    sl->skip = (uint32_t)(off - start);
    sl->need = sl->skip + ENGRAM_ROW_BYTES;
    sl->from = sl->got = 0;
    sl->row = row;
    sl->table = (uint8_t)table;
    sl->owner = (uint8_t)owner;
    sl->tries = 0;
    r->pending[r->n_pending++] = s;
    r->st.rows_read++;
    return s;
}

static void release(engram_reader *r, unsigned s)
{
    r->slots[s].owner = OWN_NONE;
    r->free_slots[r->n_free++] = s;
}

static int owner_failed(const engram_reader *r, int owner)
{
    return owner == OWN_BATCH ? r->b_rc != 0 : r->step_rc != 0;
}

/* Records the first error of the slot's owner (batch or step), naming the
 * row and its file offset. */
__attribute__((format(printf, 4, 5)))
static void fail(engram_reader *r, unsigned s, int code, const char *fmt, ...)
{
    const struct slot *sl = &r->slots[s];
    engram_error e;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    err_set_at(&e, code, slot_row_offset(sl), sl->row, "row %u of table %d: %s (file offset %llu)",
               sl->row, sl->table, what, (unsigned long long)slot_row_offset(sl));
    if (sl->owner == OWN_BATCH && r->b_rc == 0) {
        r->b_rc = code;
        if (r->b_err)
            *r->b_err = e;
    } else if (sl->owner == OWN_STEP && r->step_rc == 0) {
        r->step_rc = code;
        r->step_err = e;
    }
}

/* Queues the pending slots (what has not arrived of each read).  0 when
 * all are queued, a transient -errno when the engine wants completions
 * reaped first (the rest stay pending), or a hard -errno (the slot whose
 * queueing failed is failed and released). */
static int flush_pending(engram_reader *r)
{
    while (r->n_pending > 0) {
        unsigned s = r->pending[r->n_pending - 1];
        struct slot *sl = &r->slots[s];
        if (owner_failed(r, sl->owner)) {
            r->n_pending--;
            release(r, s);
            continue;
        }
        sl->from = sl->got / r->align * r->align;
        int rc = r->eng->ops->queue(r->eng, s, r->arena + (size_t)s * r->slot_size + sl->from,
                                    sl->len - sl->from, sl->off + sl->from);
        if (rc < 0 && io_transient(rc))
            return rc;
        r->n_pending--;
        if (rc < 0) {
            fail(r, s, rc, "cannot queue the read: %s", strerror(-rc));
            release(r, s);
            return rc;
        }
        r->inflight++;
    }
    return 0;
}

/* Decodes a valid raw row into dst; the decoder validates the row first
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

/* Copies the decoded row at request lo to the other requests [lo+1, hi). */
static void batch_fan_out(engram_reader *r, size_t lo, size_t hi)
{
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->b_dtype);
    const uint8_t *first = r->b_out + (r->reqs[lo] & 0xffffffffu) * row_bytes;
    for (size_t i = lo + 1; i < hi; i++)
        memcpy(r->b_out + (r->reqs[i] & 0xffffffffu) * row_bytes, first, row_bytes);
}

/* The row of slot s has arrived whole: decode it where its owner wants it;
 * a row that decodes goes into the cache. */
static void deliver(engram_reader *r, unsigned s)
{
    const struct slot *sl = &r->slots[s];
    const uint8_t *raw = r->arena + (size_t)s * r->slot_size + sl->skip;
    engram_dtype d = sl->owner == OWN_BATCH ? r->b_dtype : r->step_dtype;
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(d);
    uint8_t *dst = sl->owner == OWN_BATCH
                       ? r->b_out + (r->reqs[sl->lo] & 0xffffffffu) * row_bytes
                       : (uint8_t *)r->step_out + (size_t)sl->lo * row_bytes;
    int rc = d == ENGRAM_F32 ? engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 1, (float *)dst, NULL)
                             : engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, (uint16_t *)dst, NULL);
    if (rc < 0) {
        const char *why = "invalid";
        engram_row_check(raw, &why);
        fail(r, s, rc, "%s", why);
        return;
    }
    if (r->cache)
        rowcache_put(r->cache, sl->table, sl->row, raw);
    if (sl->owner == OWN_BATCH)
        batch_fan_out(r, sl->lo, sl->hi);
    else
        r->step_done++;
}

/* One completion.  The slot goes back to the free list unless its read is
 * resubmitted (short result, -EAGAIN/-EINTR); once its owner has failed or
 * was cancelled, completions are only collected. */
static void complete(engram_reader *r, const struct io_cqe *c)
{
    unsigned s = c->slot;
    struct slot *sl = &r->slots[s];
    int res = c->res;
    r->inflight--;
    if (res > 0)
        r->st.bytes_read += (uint64_t)res;
    if (owner_failed(r, sl->owner)) {
        release(r, s);
        return;
    }
    if (res >= 0) {
        sl->got = sl->from + (uint32_t)res;
        if (sl->got >= sl->need) {
            deliver(r, s);
            release(r, s);
            return;
        }
        if (res == 0) {
            fail(r, s, -EIO, "short read (end of file after %u of the row's %u bytes)",
                 sl->got > sl->skip ? sl->got - sl->skip : 0, ENGRAM_ROW_BYTES);
            release(r, s);
            return;
        }
    } else if (res != -EAGAIN && res != -EINTR) {
        fail(r, s, res, "%s", strerror(-res));
        release(r, s);
        return;
    }
    /* A short result or a transient error: read what is missing again. */
    if (++sl->tries > MAX_TRIES) {
        fail(r, s, res < 0 ? res : -EIO, "read still incomplete after %d attempts (%s)", MAX_TRIES,
             res < 0 ? strerror(-res) : "short reads");
        release(r, s);
        return;
    }
    r->st.retries++;
    r->pending[r->n_pending++] = s;
}

/* Reaps at least min completions (min <= reads in flight) and handles
 * them.  Transient engine refusals are retried here (bounded).  Returns the
 * number handled, or a hard -errno (no completion was taken). */
static int pump(engram_reader *r, unsigned min)
{
    for (unsigned spins = 0;; spins++) {
        int n = r->eng->ops->reap(r->eng, r->cqes, r->depth, min);
        if (n >= 0) {
            for (int i = 0; i < n; i++)
                complete(r, &r->cqes[i]);
            return n;
        }
        if (!io_transient(n) || spins >= TRANSIENT_LIMIT)
            return n;
        r->st.retries++;
        if (n != -EINTR && spins > 0)
            pause_briefly();
    }
}

/* Collects every read in flight (their owner has failed or was cancelled,
 * so nothing is delivered) and drops pending ones.  If the engine keeps
 * failing, the reader is marked broken: its buffers are never reused. */
static void drain(engram_reader *r)
{
    while (r->n_pending > 0)
        release(r, r->pending[--r->n_pending]);
    int hard = 0;
    while (r->inflight > 0) {
        int n = pump(r, r->inflight);
        if (n >= 0) {
            hard = 0;
            continue;
        }
        if (++hard >= DRAIN_HARD_LIMIT) {
            r->broken = 1;
            snprintf(r->broken_msg, sizeof r->broken_msg,
                     "reader unusable: its I/O engine failed (%s) with %u reads in flight; "
                     "close it and open another", strerror(-n), r->inflight);
            return;
        }
    }
}

static void cancel_and_drain(engram_reader *r)
{
    if (r->inflight > 0)
        r->eng->ops->cancel(r->eng); /* best effort: the drain reaps either way */
    drain(r);
}

/* Queues what is pending and hands it to the engine; transient refusals
 * are left for the next round (pending reads stay pending; queued ones go
 * with the next reap).  0 or a hard -errno. */
static int push(engram_reader *r)
{
    int rc = flush_pending(r);
    if (rc < 0 && !io_transient(rc))
        return rc;
    rc = r->eng->ops->submit(r->eng);
    return rc < 0 && !io_transient(rc) ? rc : 0;
}

/* Waits for progress when nothing could be queued: pending reads wait for
 * the engine to accept them (bounded). */
static int stalled(engram_reader *r, unsigned *spins)
{
    if (++*spins > TRANSIENT_LIMIT)
        return -EAGAIN;
    r->st.retries++;
    pause_briefly();
    return 0;
}

/* ------------------------------------------------------------ batch */

/* Start of the group (requests for one row) at or after position b. */
static size_t group_start(const uint64_t *reqs, size_t n, size_t b)
{
    while (b > 0 && b < n && (reqs[b] >> 32) == (reqs[b - 1] >> 32))
        b++;
    return b;
}

static int batch_chunk(engram_reader *r, int t, size_t nreq)
{
    radix_sort_rows(r->reqs, nreq, &r->sort);
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
    unsigned spins = 0;
    size_t row_bytes = ENGRAM_ROW_VALUES * elem_size(r->b_dtype);
    while (r->b_rc == 0) {
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
            unsigned s = take_slot(r, OWN_BATCH, t, row);
            r->slots[s].lo = (uint32_t)i;
            r->slots[s].hi = (uint32_t)j;
        }
        if (r->b_rc != 0)
            break;
        int rc = push(r);
        if (rc < 0) {
            if (r->b_rc == 0) /* a submit failure (a queue failure names its row) */
                r->b_rc = err_set(r->b_err, rc, ENGRAM_NO_OFFSET, "I/O engine refused to submit: %s",
                                  strerror(-rc));
            break;
        }
        if (r->inflight == 0) {
            if (r->n_pending == 0 && live == 0)
                break; /* chunk done */
            if (r->n_pending > 0 && stalled(r, &spins) < 0) {
                r->b_rc = err_set(r->b_err, -EAGAIN, ENGRAM_NO_OFFSET,
                                  "I/O engine kept refusing reads");
                break;
            }
            continue;
        }
        /* Submit what was queued and wait, in one call; waiting for an eighth
         * of the queue rather than one read saves wake-ups and barely lowers
         * the depth the device sees. */
        unsigned want = r->inflight / 8 ? r->inflight / 8 : 1;
        int done = pump(r, want);
        if (done < 0) {
            if (r->b_rc == 0)
                r->b_rc = err_set(r->b_err, done, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                  strerror(-done));
            break;
        }
        if (done > 0)
            spins = 0;
    }
    if (r->b_rc != 0)
        drain(r); /* reads of a failed chunk finish quickly: no cancel */
    return r->b_rc;
}

static int reader_usable(const engram_reader *r, engram_error *err)
{
    if (r->broken)
        return err_set(err, -EIO, ENGRAM_NO_OFFSET, "%s", r->broken_msg);
    return 0;
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
    int rc = reader_usable(r, err);
    if (rc < 0)
        return rc;
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
            rc = sink(ctx, at, k, out);
            if (rc != 0)
                r->b_rc = err_set(err, rc, ENGRAM_NO_OFFSET, "stopped by the sink (%d)", rc);
        }
    }
    r->b_err = NULL;
    rc = r->b_rc;
    r->b_rc = 0;
    return rc;
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

/* Takes slots for the step's rows not yet issued, as far as slots allow. */
static void step_take_slots(engram_reader *r)
{
    while (r->step_issued < r->n_miss && r->n_free > 0) {
        unsigned k = r->step_miss[r->step_issued++];
        unsigned s = take_slot(r, OWN_STEP, (int)(k / ENGRAM_COLUMNS), r->step_rows[k]);
        r->slots[s].lo = k;
    }
}

/* Issues what can be issued; a hard engine error fails the step. */
static void step_push(engram_reader *r)
{
    if (r->step_rc != 0)
        return;
    step_take_slots(r);
    int rc = push(r);
    if (rc < 0 && r->step_rc == 0)
        r->step_rc = err_set(&r->step_err, rc, ENGRAM_NO_OFFSET, "I/O engine refused to submit: %s",
                             strerror(-rc));
}

static int step_finish(engram_reader *r, engram_error *err)
{
    r->step_active = 0;
    if (r->step_rc == 0) {
        uint64_t dt = now_ns() - r->step_t0;
        r->st.steps++;
        r->hist[hist_index(dt)]++;
        if (dt > r->st.step_max_ns)
            r->st.step_max_ns = dt;
        return 0;
    }
    if (err)
        *err = r->step_err;
    return r->step_rc;
}

int engram_reader_step_submit(engram_reader *r, const uint32_t rows[ENGRAM_ROWS_PER_TOKEN],
                              engram_dtype dtype, void *out, engram_error *err)
{
    if (!r || !rows || !out || (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    int rc = reader_usable(r, err);
    if (rc < 0)
        return rc;
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
    r->step_cancel_sent = 0;
    r->step_dtype = dtype;
    r->step_out = out;
    r->step_issued = r->step_done = r->n_miss = 0;
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
    step_push(r);
    if (r->step_rc != 0) { /* nothing of a failed step stays in flight */
        cancel_and_drain(r);
        return step_finish(r, err);
    }
    return 0;
}

int engram_reader_step_wait(engram_reader *r, engram_error *err)
{
    if (!r || !r->step_active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    unsigned spins = 0;
    while (r->step_rc == 0 && r->step_done < ENGRAM_ROWS_PER_TOKEN) {
        step_push(r);
        if (r->step_rc != 0)
            break;
        if (r->inflight == 0) {
            if (stalled(r, &spins) < 0)
                r->step_rc = err_set(&r->step_err, -EAGAIN, ENGRAM_NO_OFFSET,
                                     "I/O engine kept refusing reads");
            continue;
        }
        /* Wait for everything in flight in one wake-up: waking per row costs
         * a context switch each, which on a VM is a good part of a step. */
        int n = pump(r, r->inflight);
        if (n < 0 && r->step_rc == 0)
            r->step_rc = err_set(&r->step_err, n, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                 strerror(-n));
        else if (n > 0)
            spins = 0;
    }
    if (r->step_rc != 0)
        cancel_and_drain(r);
    return step_finish(r, err);
}

int engram_reader_step_poll(engram_reader *r, engram_error *err)
{
    if (!r || !r->step_active)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "no decode step in flight");
    if (r->step_rc == 0 && r->step_done < ENGRAM_ROWS_PER_TOKEN) {
        step_push(r);
        if (r->step_rc == 0 && r->inflight > 0) {
            int n = pump(r, 0);
            if (n < 0 && r->step_rc == 0)
                r->step_rc = err_set(&r->step_err, n, ENGRAM_NO_OFFSET, "I/O engine failed: %s",
                                     strerror(-n));
            step_push(r);
        }
    }
    if (r->step_rc != 0) {
        /* Failed: collect the rest without blocking, after asking for it
         * to be cancelled once. */
        while (r->n_pending > 0)
            release(r, r->pending[--r->n_pending]);
        if (r->inflight > 0 && !r->step_cancel_sent) {
            r->step_cancel_sent = 1;
            r->eng->ops->cancel(r->eng);
        }
        if (r->inflight > 0 && pump(r, 0) < 0) {
            drain(r); /* the engine failed while collecting: block once */
        }
        if (r->inflight > 0)
            return -EAGAIN;
        return step_finish(r, err);
    }
    if (r->step_done < ENGRAM_ROWS_PER_TOKEN)
        return -EAGAIN;
    return step_finish(r, err);
}

int engram_reader_step_cancel(engram_reader *r)
{
    if (!r || !r->step_active)
        return -EINVAL;
    if (r->step_rc == 0)
        r->step_rc = err_set(&r->step_err, -ECANCELED, ENGRAM_NO_OFFSET, "step cancelled");
    cancel_and_drain(r);
    r->step_active = 0;
    r->st.steps_cancelled++;
    return 0;
}
