/*
 * bench_prefill.c - section (c) of `engram bench io`: prefill of hashed
 * real text in 2048-token batches, both tables, by the reader (with and
 * without a row cache) and by a baseline that does what the reference
 * engine does on Linux (16 threads created per batch, plain cached pread
 * of 264 bytes, per-batch de-duplication), taking turns over the same
 * segments, with each one's page-cache growth.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

/* ------------------------------------------------------------ page cache */

/* Resident pages of the file's tables, through the caller's descriptor,
 * or -errno. */
static int64_t table_pages(struct bench *b, int fd)
{
    const engram_table_info *last = &b->in.table[b->tables - 1];
    return resident_pages(fd, b->in.table[0].offset, last->offset + last->bytes);
}

/* Drops the file's cached pages (the part of "drop caches" that matters
 * here, without needing /proc/sys/vm). */
static void drop_file_cache(struct bench *b)
{
    int fd = open(b->path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* ------------------------------------------------------------ baseline */

struct base_job {
    int fd;
    uint64_t table_off;
    unsigned row_bytes, row_values;
    int bf16;                 /* PLE: the row is its values, copied       */
    const uint32_t *rows;     /* distinct rows of the batch */
    size_t n;
    size_t next;              /* shared cursor */
    pthread_mutex_t mu;
    uint16_t *out;            /* one decoded row per distinct row */
    int err;
};

static void *base_worker(void *arg)
{
    struct base_job *j = arg;
    uint8_t raw[320];         /* the larger member's row */
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->n)
            break;
        ssize_t got = pread(j->fd, raw, j->row_bytes, (off_t)(j->table_off + (uint64_t)j->rows[i] * j->row_bytes));
        uint16_t *dst = j->out + i * j->row_values;
        if (got != (ssize_t)j->row_bytes)
            j->err = 1;
        else if (j->bf16)
            memcpy(dst, raw, j->row_bytes);
        else if (engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 1, dst, NULL) < 0)
            j->err = 1;
    }
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The reference's Linux path for one table over n tokens; returns distinct
 * reads done. */
static uint64_t baseline_batches(struct bench *b, int fd, int t, const uint32_t *rows, size_t n,
                                 uint16_t *out, int *err)
{
    uint32_t *ids = malloc((size_t)ENGRAM_BATCH_TOKENS * b->cols * sizeof *ids);
    uint64_t reads = 0;
    for (size_t at = 0; at < n && ids; at += ENGRAM_BATCH_TOKENS) {
        size_t k = n - at < ENGRAM_BATCH_TOKENS ? n - at : ENGRAM_BATCH_TOKENS, m = 0;
        for (size_t i = 0; i < k; i++)
            for (unsigned c = 0; c < b->cols; c++)
                ids[m++] = rows[(at + i) * b->stride + (size_t)t * b->cols + c];
        qsort(ids, m, sizeof *ids, cmp_u32);
        size_t d = 0;
        for (size_t i = 0; i < m; i++)
            if (i == 0 || ids[i] != ids[d - 1])
                ids[d++] = ids[i];
        struct base_job j = {fd, b->in.table[t].offset, b->row_bytes, b->row_values, b->ple,
                             ids, d, 0, PTHREAD_MUTEX_INITIALIZER, out, 0};
        pthread_t th[16];
        for (int i = 0; i < 16; i++)
            pthread_create(&th[i], NULL, base_worker, &j);
        for (int i = 0; i < 16; i++)
            pthread_join(th[i], NULL);
        *err |= j.err;
        reads += d;
    }
    free(ids);
    return reads;
}

/* A corpus's tokens, reduced mod vocab: with limit (--max-tokens) at most
 * 2^24, the first limit of them, the rest not read; else all of them
 * (read_numbers: a file of more than 2^24 is refused).  0, or an exit code
 * after saying why not. */
static int read_tokens(const char *path, uint32_t vocab, size_t limit, uint32_t **out, size_t *n)
{
    int st;
    if (!limit || limit > CLI_MAX_ITEMS) {
        st = read_numbers(path, UINT32_MAX, out, n, "corpus");
    } else {
        struct numfile *nf = malloc(sizeof *nf);
        uint32_t *v = malloc(limit * sizeof *v);
        if (!nf || !v) {
            fprintf(stderr, "%s: corpus file '%s': out of memory\n", prog, path);
            st = EXIT_SYSTEM;
        } else if ((st = numfile_open(nf, path, UINT32_MAX, "corpus")) == 0) {
            st = numfile_read(nf, v, limit, n);
            numfile_close(nf);
        }
        free(nf);
        if (st)
            free(v);
        else
            *out = v;
    }
    for (size_t i = 0; !st && i < *n; i++)
        (*out)[i] %= vocab;
    return st;
}

/* One reader's run over segments of a corpus: time, and page-cache growth
 * counted per segment from 0 up (pages another reader cached may be evicted
 * meanwhile). */
struct runner {
    double secs;
    int64_t growth_pages;
    int count_err;            /* -errno: the growth could not be counted  */
    uint64_t reads;           /* baseline: preads issued                  */
};

/* Adds a segment's growth, or keeps the first reason it was not counted. */
static void count_growth(struct runner *ru, int64_t before, int64_t after)
{
    if (before < 0 || after < 0) {
        if (!ru->count_err)
            ru->count_err = (int)(before < 0 ? before : after);
    } else if (after > before) {
        ru->growth_pages += after - before;
    }
}

static void engram_segment(struct bench *b, int fd, engram_reader *r, const uint32_t *rows, size_t s0,
                           size_t s1, uint16_t *out, struct runner *ru)
{
    engram_error err;
    int64_t before = table_pages(b, fd);
    double t0 = now_s();
    for (size_t at = s0; at < s1; at += ENGRAM_BATCH_TOKENS) {
        size_t k = s1 - at < ENGRAM_BATCH_TOKENS ? s1 - at : ENGRAM_BATCH_TOKENS;
        for (int t = 0; t < (int)b->tables; t++)
            if (engram_reader_batch(r, t, rows + at * b->stride, k, ENGRAM_BF16, out, &err) < 0)
                fprintf(stderr, "%s: %s\n", prog, err.msg);
    }
    ru->secs += now_s() - t0;
    count_growth(ru, before, table_pages(b, fd));
}

static void baseline_segment(struct bench *b, int fd, const uint32_t *rows, size_t s0, size_t s1,
                             uint16_t *out, struct runner *ru, int *berr)
{
    int64_t before = table_pages(b, fd);
    double t0 = now_s();
    for (size_t at = s0; at < s1; at += ENGRAM_BATCH_TOKENS) {
        size_t k = s1 - at < ENGRAM_BATCH_TOKENS ? s1 - at : ENGRAM_BATCH_TOKENS;
        for (int t = 0; t < (int)b->tables; t++)
            ru->reads += baseline_batches(b, fd, t, rows + at * b->stride, k, out, berr);
    }
    ru->secs += now_s() - t0;
    count_growth(ru, before, table_pages(b, fd));
}

/* A runner's growth in MB for the table (one decimal), or "n/a" where it was
 * not counted. */
static const char *growth_mb(const struct runner *ru, double mb, char buf[16])
{
    if (ru->count_err)
        return "n/a";
    snprintf(buf, 16, "%.1f", (double)ru->growth_pages * mb);
    return buf;
}

/* Half a second of uncached random reads of every table, so that the first
 * reader timed after dropping the cache does not also pay for waking the
 * device up (it touches no corpus row on purpose: random rows of a large
 * table, read with O_DIRECT, leave nothing in the page cache). */
static void warm_up(struct bench *b)
{
    engram_reader *r;
    engram_error err;
    if (engram_reader_open(b->m, NULL, &r, &err) < 0)
        return;
    uint32_t *rows = malloc((size_t)256 * b->stride * sizeof *rows);
    uint16_t *out = malloc((size_t)256 * b->cols * b->row_values * 2);
    uint64_t seed = b->seed ^ 0x5eed;
    double t0 = now_s();
    while (rows && out && now_s() - t0 < 0.5) {
        for (size_t i = 0; i < (size_t)256 * b->stride; i++)
            rows[i] = (uint32_t)(bench_rnd(&seed) % b->in.table[i % b->stride / b->cols].rows);
        for (int t = 0; t < (int)b->tables; t++)
            engram_reader_batch(r, t, rows, 256, ENGRAM_BF16, out, NULL);
    }
    free(rows);
    free(out);
    engram_reader_close(r);
}

/* A corpus's tokens (at most --max-tokens) hashed from an empty history:
 * 48 rows per token, PLE 16 (the caller frees them), or NULL after saying
 * why. */
static uint32_t *hashed_corpus(struct bench *b, const char *corpus, size_t *count)
{
    uint32_t *tok = NULL, *rows;
    size_t n = 0;
    if (read_tokens(corpus, b->in.family.vocab, b->max_tokens, &tok, &n) != 0)
        return NULL;
    if (n == 0) {
        fprintf(stderr, "%s: cannot read tokens from %s: none in it\n", prog, corpus);
        free(tok);
        return NULL;
    }
    rows = malloc(n * b->stride * sizeof *rows);
    if (!rows) {
        fprintf(stderr, "%s: %s: %s\n", prog, corpus, strerror(ENOMEM));
        free(tok);
        return NULL;
    }
    if (b->ple) { /* one sequence: 16 rows per token, global ids of the one table */
        engram_ple_history ph;
        engram_ple_history_reset(b->m, &ph);
        engram_ple_hash(b->m, &ph, tok, NULL, n, rows, NULL);
    } else {
        engram_history h;
        engram_history_reset(&h);
        engram_hash_tokens(engram_model_hasher(b->m), &h, tok, NULL, n, rows, NULL);
    }
    free(tok);
    *count = n;
    return rows;
}

/* What the three readers did over one corpus: ru[0] engram, ru[1] engram
 * with the row cache, ru[2] the baseline. */
struct prefill_run {
    size_t n;                 /* tokens                                    */
    struct runner ru[3];
    engram_io_stats st, stc;  /* the two engram readers'                   */
    int berr;                 /* the baseline hit read or decode errors    */
};

/* The readers over the corpus's rows, taking turns segment by segment
 * after the page cache was dropped and the device woken up.  0, or -1
 * when a reader could not be opened (said on stderr). */
static int race_readers(struct bench *b, int fd, const uint32_t *rows, uint16_t *out, struct prefill_run *p)
{
    int with_cache = b->cache_bytes > 0;
    /* The readers run over the same segments in turn, so drift of a
     * shared disk hits them alike; the page cache is dropped once, at
     * the start, and the baseline keeps whatever it caches from then on. */
    drop_file_cache(b);
    warm_up(b);
    engram_reader_opts o = {.engine = ENGRAM_IO_AUTO, .depth = 128};
    engram_reader_opts oc = {.engine = ENGRAM_IO_AUTO, .depth = 128, .cache_bytes = b->cache_bytes};
    engram_reader *r = NULL, *rcache = NULL;
    engram_error err;
    if (engram_reader_open(b->m, &o, &r, &err) < 0 ||
        (with_cache && engram_reader_open(b->m, &oc, &rcache, &err) < 0)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        engram_reader_close(r);
        return -1;
    }
    memset(p->ru, 0, sizeof p->ru);
    p->berr = 0;
    const size_t seg = 2 * ENGRAM_BATCH_TOKENS, n = p->n;
    unsigned turn = 0;
    for (size_t s0 = 0; s0 < n; s0 += seg, turn++) {
        size_t s1 = n - s0 < seg ? n : s0 + seg;
        for (unsigned k = 0; k < 3; k++) {
            unsigned who = (turn + k) % 3;
            if (who == 0)
                engram_segment(b, fd, r, rows, s0, s1, out, &p->ru[0]);
            else if (who == 1 && with_cache)
                engram_segment(b, fd, rcache, rows, s0, s1, out, &p->ru[1]);
            else if (who == 2 && b->use_baseline)
                baseline_segment(b, fd, rows, s0, s1, out, &p->ru[2], &p->berr);
        }
    }
    engram_reader_get_stats(r, &p->st);
    memset(&p->stc, 0, sizeof p->stc);
    if (rcache)
        engram_reader_get_stats(rcache, &p->stc);
    engram_reader_close(r);
    engram_reader_close(rcache);
    drop_file_cache(b);
    return 0;
}

/* A corpus's line of the table and its CSV rows. */
static void report_corpus(struct bench *b, const char *corpus, const struct prefill_run *p)
{
    int with_cache = b->cache_bytes > 0;
    const struct runner *ru = p->ru;
    double req = (double)p->st.rows_requested;
    double ours = req / ru[0].secs;
    double cached = with_cache ? req / ru[1].secs : 0;
    double base = ru[2].secs > 0 ? req / ru[2].secs : 0;
    double base_rps = ru[2].secs > 0 ? (double)ru[2].reads / ru[2].secs : 0;
    double saved = 1.0 - (double)p->st.rows_read / req;
    double saved_c = with_cache ? 1.0 - (double)p->stc.rows_read / req : 0;
    if (p->berr)
        fprintf(stderr, "%s: the baseline reader hit read or decode errors\n", prog);
    const char *name = strrchr(corpus, '/') ? strrchr(corpus, '/') + 1 : corpus;
    double mb = (double)sysconf(_SC_PAGESIZE) / 1e6;
    char g[3][16];
    printf("    %-16.16s %7zu | %10.0f %5.1f%% %8s | %10.0f %5.1f%% %8s | %10.0f %8.0f %8s | %6.2f %6.2f\n",
           name, p->n, ours, 100 * saved, growth_mb(&ru[0], mb, g[0]), cached, 100 * saved_c,
           growth_mb(&ru[1], mb, g[1]), base, base_rps, growth_mb(&ru[2], mb, g[2]),
           base > 0 ? ours / base : 0, base > 0 ? cached / base : 0);
    for (int k = 0; k < 3; k++)
        if (ru[k].count_err) {
            fprintf(stderr, "%s: page-cache growth not counted (mapping %s: %s)\n", prog, b->path,
                    strerror(-ru[k].count_err));
            break;
        }
    bench_csv_row(b, name, "engram_rows_per_s", 0, ours, "rows/s");
    if (!ru[0].count_err)
        bench_csv_row(b, name, "engram_cache_growth_MB", 0, (double)ru[0].growth_pages * mb, "MB");
    bench_csv_row(b, name, "dedup_saved", 0, saved, "fraction");
    if (with_cache) {
        bench_csv_row(b, name, "engram_rowcache_rows_per_s", 0, cached, "rows/s");
        bench_csv_row(b, name, "engram_rowcache_saved", 0, saved_c, "fraction");
        bench_csv_row(b, name, "engram_rowcache_MiB", 0, (double)p->stc.cache_bytes / 1048576.0, "MiB");
    }
    if (b->use_baseline) {
        bench_csv_row(b, name, "baseline_rows_per_s", 0, base, "rows/s");
        if (!ru[2].count_err)
            bench_csv_row(b, name, "baseline_cache_growth_MB", 0, (double)ru[2].growth_pages * mb, "MB");
    }
    fflush(stdout);
}

int bench_section_prefill(struct bench *b)
{
    printf("\n(c) prefill: hashed real text, 2048-token batches, %s; page cache dropped\n"
           "    before each corpus; the readers take turns (rotating order) on 4096-token segments.\n"
           "    engram: no row cache; +cache: engram with a %.0f MiB row cache (empty at the start);\n"
           "    base: the reference on Linux (16 threads per batch, cached pread).  'saved': requests\n"
           "    that needed no device read (de-duplication, and for +cache its hits too).\n",
           b->tables > 1 ? "both tables" : "the one table, 16 rows a token", (double)b->cache_bytes / 1048576.0);
    printf("    %-16s %7s | %10s %6s %8s | %10s %6s %8s | %10s %8s %8s | %6s %6s\n", "corpus", "tokens",
           "engram r/s", "saved", "cache+MB", "+cache r/s", "saved", "cache+MB", "base r/s", "reads/s",
           "cache+MB", "ratio", "+cache");
    int fd = open(b->path, O_RDONLY | O_CLOEXEC);
    uint16_t *out = malloc((size_t)ENGRAM_BATCH_TOKENS * b->cols * b->row_values * 2);
    if (fd < 0 || !out) {
        if (fd < 0)
            fprintf(stderr, "%s: prefill: %s: %s\n", prog, b->path, strerror(errno));
        else
            fprintf(stderr, "%s: prefill: %s\n", prog, strerror(ENOMEM));
        if (fd >= 0)
            close(fd);
        free(out);
        return EXIT_SYSTEM;
    }
    for (int c = 0; c < b->n_corpora; c++) {
        struct prefill_run p;
        uint32_t *rows = hashed_corpus(b, b->corpora[c], &p.n);
        if (!rows)
            continue;
        if (race_readers(b, fd, rows, out, &p) == 0)
            report_corpus(b, b->corpora[c], &p);
        free(rows);
    }
    close(fd);
    free(out);
    return 0;
}
