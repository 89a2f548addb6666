/*
 * test_reader.c - the uncached reader, every engine forced in turn (io_uring,
 * thread pool, buffered fallback; the thread pool alone under TSan,
 * tsan_skips): batches with duplicates and decode steps must equal the
 * exact single-row path bit for bit; errors name the row; the reader's
 * memory stays within ENGRAM_READER_MAX_BYTES on a 1,000,000-token
 * batch.  Real io_uring on a real file.
 */
#include <math.h>
#include <time.h>

#include "testutil.h"

/* Sanitizers (SANITIZED, testutil.h) add shadow memory to the resident set
 * and slow everything: there the memory bound is not measured and the long
 * batch is shorter. */

static const engram_io_engine engines[] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
static const char *const engine_names[] = {"io_uring", "threads", "buffered"};

/* Under TSan the loops over engines run the thread pool alone
 * (tsan_reader_skips, testutil.h); e counts engines[] round */
static int tsan_skips(int e)
{
    return tsan_reader_skips(engines[e % 3]);
}

/* Distinct rows per 2048-token chunk, counted here by sorting. */
static int cmp32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t expected_reads(const uint32_t *rows, size_t n, int t)
{
    uint64_t total = 0;
    uint32_t *v = malloc(ENGRAM_BATCH_TOKENS * 24 * sizeof *v);
    for (size_t at = 0; at < n; at += ENGRAM_BATCH_TOKENS) {
        size_t k = n - at < ENGRAM_BATCH_TOKENS ? n - at : ENGRAM_BATCH_TOKENS, m = 0;
        for (size_t i = 0; i < k; i++)
            for (int c = 0; c < 24; c++)
                v[m++] = rows[(at + i) * 48 + t * 24 + c];
        qsort(v, m, sizeof *v, cmp32);
        for (size_t i = 0; i < m; i++)
            total += i == 0 || v[i] != v[i - 1];
    }
    free(v);
    return total;
}

/* The bytes of this process's io_uring mappings (rings and submission
 * entries as the kernel made them), from /proc/self/maps. */
static uint64_t uring_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint64_t total = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long a, b;
        if (strstr(line, "io_uring") && sscanf(line, "%llx-%llx", &a, &b) == 2)
            total += b - a;
    }
    if (f)
        fclose(f);
    return total;
}

static size_t host_reg_bytes;
static int count_reg(void *ctx, void *p, size_t len)
{
    (void)ctx, (void)p;
    host_reg_bytes += len;
    return 0;
}
static void count_unreg(void *ctx, void *p, size_t len)
{
    (void)ctx, (void)p;
    host_reg_bytes -= len;
}

/* The deepest io_uring reader's reported memory covers what the kernel
 * mapped for its rings and the I/O buffers it registered (both seen from
 * outside the reader), besides its chunk's request array, and stays within
 * ENGRAM_READER_MAX_BYTES. */
static void reserved_counts(engram_model *m)
{
    uint64_t before = uring_mapped();
    engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = ENGRAM_READER_MAX_DEPTH,
                            .host = {count_reg, count_unreg, NULL}};
    engram_reader *r;
    engram_error err;
    host_reg_bytes = 0;
    CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
    uint64_t rings = uring_mapped() - before;
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    uint64_t reqs = (uint64_t)ENGRAM_BATCH_TOKENS * 24 * 8;
    CHECK(rings > 0);
    CHECK_EQ(st.host_registered, host_reg_bytes);
    CHECK(host_reg_bytes >= (uint64_t)st.depth * 2 * st.align);
    CHECK(st.reserved_bytes >= rings + host_reg_bytes + reqs);
    CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
    printf("depth %u: rings mapped %llu, buffers %zu, requests %llu; reserved %llu of %u\n", st.depth,
           (unsigned long long)rings, host_reg_bytes, (unsigned long long)reqs,
           (unsigned long long)st.reserved_bytes, ENGRAM_READER_MAX_BYTES);
    engram_reader_close(r);
    CHECK_EQ(host_reg_bytes, 0);
    /* a pool's reader (its engine wakeable, no stage) at the same depth */
    before = uring_mapped();
    engram_pool_opts po = {.reader = o};
    engram_pool *p;
    CHECK_EQ(engram_pool_open(m, &po, &p, &err), 0);
    rings = uring_mapped() - before;
    engram_pool_stats ps;
    engram_pool_get_stats(p, &ps);
    CHECK(rings > 0);
    CHECK(ps.io.reserved_bytes >= rings + ps.io.host_registered + reqs);
    CHECK(ps.io.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
    printf("pool's reader, depth %u: rings mapped %llu; reserved %llu\n", ps.io.depth,
           (unsigned long long)rings, (unsigned long long)ps.io.reserved_bytes);
    engram_pool_close(p);
    CHECK_EQ(host_reg_bytes, 0);
}

/* A thread-pool reader runs ENGRAM_READER_THREADS(depth) threads, one per
 * two slots (engram.h), counted here: its open adds that many to the
 * process, its close takes them away (tu_task_count leaves out the threads
 * already exiting; tu_task_count_settled allows a second); at the deepest
 * depth, and at the smallest ones, odd and even.  Its batches are the exact
 * path's rows at each of these depths (batches() reads at 32 and the
 * deepest). */
static void pool_threads(engram_model *m)
{
    const size_t n = 40;
    uint32_t *rows = tu_hashed(m, n, 5, 41);
    uint16_t *want = tu_expected(m, 0, rows, n, ENGRAM_BF16);
    uint16_t *got = malloc(n * 24 * 256 * 2);
    const unsigned depths[] = {1, 2, 3, 15, ENGRAM_READER_MAX_DEPTH};
    const long before = tu_task_count(); /* earlier readers' joined threads not counted */
    CHECK(before > 0);
    for (int e = 1; e < 3; e++)
        for (size_t k = 0; k < sizeof depths / sizeof *depths && !tsan_skips(e); k++) {
            engram_reader_opts o = {.engine = engines[e], .depth = depths[k]};
            engram_reader *r;
            engram_error err;
            if (engram_reader_open(m, &o, &r, &err) < 0) {
                CHECK(0);
                fprintf(stderr, "%s: %s\n", engine_names[e], err.msg);
                continue;
            }
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            /* the I/O buffers' budget leaves every depth at alignments up to 512 */
            CHECK(st.depth == depths[k] || (st.align > 512 && st.depth < depths[k]));
            long open_count = before + (long)ENGRAM_READER_THREADS(st.depth);
            CHECK_EQ(tu_task_count_settled(open_count), open_count);
            memset(got, 0xee, n * 24 * 256 * 2);
            CHECK_EQ(engram_reader_batch(r, 0, rows, n, ENGRAM_BF16, got, &err), 0);
            CHECK(memcmp(got, want, n * 24 * 256 * 2) == 0);
            engram_reader_close(r);
            CHECK_EQ(tu_task_count_settled(before), before);
        }
    CHECK_EQ(ENGRAM_READER_THREADS(1u), 1u);
    CHECK_EQ(ENGRAM_READER_THREADS(ENGRAM_READER_MAX_DEPTH), 256u);
    free(got);
    free(want);
    free(rows);
}

static void batches(engram_model *m)
{
    const size_t n = 2100; /* two chunks, the last one partial */
    uint32_t *rows = tu_hashed(m, n, 1, 6);
    /* the exact single-row path's values, once for every reader below */
    void *wants[2] = {tu_expected(m, 0, rows, n, ENGRAM_BF16), tu_expected(m, 1, rows, n, ENGRAM_F32)};
    /* the deepest reader too: the rows it stages between a pump and the
     * next submission take what the memory bound leaves (fewer than at 32) */
    for (int e = 0; e < 6; e++) {
        if (tsan_skips(e))
            continue;
        engram_reader_opts o = {.engine = engines[e % 3],
                                .depth = e < 3 ? 32 : ENGRAM_READER_MAX_DEPTH};
        engram_reader *r;
        engram_error err;
        int rc = engram_reader_open(m, &o, &r, &err);
        CHECK_EQ(rc, 0);
        if (rc < 0) {
            fprintf(stderr, "%s: %s\n", engine_names[e % 3], err.msg);
            continue;
        }
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(strcmp(st.engine, engine_names[e % 3]) == 0);
        CHECK_EQ(st.direct, e % 3 != 2);
        CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
        for (int t = 0; t < 2; t++)
            for (int d = t; d <= t; d++) { /* table 0 as bf16, table 1 as f32 */
                engram_dtype dt = d ? ENGRAM_F32 : ENGRAM_BF16;
                size_t bytes = n * 24 * 256 * (d ? 4 : 2);
                uint8_t *got = malloc(bytes + 64);
                memset(got, 0xee, bytes + 64);
                const void *want = wants[t];
                engram_reader_reset_stats(r);
                CHECK_EQ(engram_reader_batch(r, t, rows, n, dt, got, &err), 0);
                CHECK(memcmp(got, want, bytes) == 0);
                for (int k = 0; k < 64; k++)
                    CHECK(got[bytes + k] == 0xee);
                engram_reader_get_stats(r, &st);
                CHECK_EQ(st.rows_requested, n * 24);
                CHECK_EQ(st.rows_read, expected_reads(rows, n, t)); /* each distinct row once */
                CHECK(st.rows_read < st.rows_requested);
                CHECK(st.bytes_read >= st.rows_read * 264);
                free(got);
            }
        printf("batch %-9s direct %d align %u depth %u drop %s note '%s' reserved %llu bytes\n",
               st.engine, st.direct, st.align, st.depth, st.drop, st.note,
               (unsigned long long)st.reserved_bytes);
        engram_reader_close(r);
    }
    free(wants[0]);
    free(wants[1]);
    free(rows);
}

/* With a row cache: outputs unchanged; each distinct row of a chunk is
 * either read or served from the cache (never both, never neither); a
 * repeated batch or step reads nothing when the cache holds it all; a cache
 * far smaller than the data still gives exact outputs; the cache's memory is
 * what was asked for. */
static void cached(engram_model *m)
{
    const size_t n = 2100;
    uint32_t *rows = tu_hashed(m, n, 3, 40);
    void *want = tu_expected(m, 1, rows, n, ENGRAM_BF16);
    size_t bytes = n * 24 * 256 * 2;
    uint16_t *got = malloc(bytes);
    uint64_t distinct = expected_reads(rows, n, 1);
    for (int e = 0; e < 3; e++)
        for (int big = 0; big < 2 && !tsan_skips(e); big++) {
            uint64_t ask = big ? 64u << 20 : ENGRAM_READER_MIN_CACHE; /* all rows / ~230 rows */
            engram_reader_opts o = {.engine = engines[e], .depth = 16, .cache_bytes = ask};
            engram_reader *r;
            engram_error err;
            CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
            engram_io_stats st;
            for (int pass = 0; pass < 2; pass++) {
                memset(got, 0, bytes);
                engram_reader_reset_stats(r);
                CHECK_EQ(engram_reader_batch(r, 1, rows, n, ENGRAM_BF16, got, &err), 0);
                CHECK(memcmp(got, want, bytes) == 0);
                engram_reader_get_stats(r, &st);
                CHECK_EQ(st.rows_read + st.cache_hits, distinct);
                if (big && pass == 1)
                    CHECK_EQ(st.rows_read, 0);
                if (!big)
                    CHECK(st.rows_read > distinct / 2);
            }
            CHECK(st.cache_bytes <= ask && st.cache_bytes > ask / 2);
            CHECK(st.cache_rows > 0 && st.cache_rows * 264 < st.cache_bytes);
            CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
            /* Decode steps: a second pass over the same tokens is all hits
             * with the big cache; outputs exact either way. */
            const size_t ns = 40;
            void *w0 = tu_expected(m, 0, rows, ns, ENGRAM_F32), *w1 = tu_expected(m, 1, rows, ns, ENGRAM_F32);
            static float out[48 * 256];
            for (int pass = 0; pass < 2; pass++) {
                engram_reader_reset_stats(r);
                for (size_t i = 0; i < ns; i++) {
                    memset(out, 0, sizeof out);
                    CHECK_EQ(engram_reader_step_submit(r, rows + i * 48, ENGRAM_F32, out, &err), 0);
                    CHECK_EQ(engram_reader_step_wait(r, &err), 0);
                    CHECK(memcmp(out, (float *)w0 + i * 24 * 256, 24 * 256 * 4) == 0);
                    CHECK(memcmp(out + 24 * 256, (float *)w1 + i * 24 * 256, 24 * 256 * 4) == 0);
                }
                engram_reader_get_stats(r, &st);
                CHECK_EQ(st.steps, ns);
                CHECK_EQ(st.rows_read + st.cache_hits, ns * 48);
                if (big && pass == 1)
                    CHECK_EQ(st.rows_read, 0);
            }
            if (big)
                printf("cache %-9s %llu bytes, %llu rows\n", st.engine,
                       (unsigned long long)st.cache_bytes, (unsigned long long)st.cache_rows);
            free(w0);
            free(w1);
            engram_reader_close(r);
        }
    engram_reader_opts o = {.engine = ENGRAM_IO_AUTO, .depth = 16, .cache_bytes = 1000};
    engram_reader *r;
    engram_error err;
    CHECK_EQ(engram_reader_open(m, &o, &r, &err), -EINVAL);
    free(got);
    free(want);
    free(rows);
}

static void steps(engram_model *m)
{
    const size_t n = 24;
    uint32_t *rows = tu_hashed(m, n, 2, 1000);
    void *want0 = tu_expected(m, 0, rows, n, ENGRAM_F32), *want1 = tu_expected(m, 1, rows, n, ENGRAM_F32);
    for (int e = 0; e < 3; e++) {
        if (tsan_skips(e))
            continue;
        for (unsigned depth = 8; depth <= 64; depth *= 8) { /* fewer slots than rows, and more */
            engram_reader_opts o = {.engine = engines[e], .depth = depth};
            engram_reader *r;
            engram_error err;
            CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
            float out[48 * 256];
            int polled = 0;
            for (size_t i = 0; i < n; i++) {
                memset(out, 0, sizeof out);
                CHECK_EQ(engram_reader_step_submit(r, rows + i * 48, ENGRAM_F32, out, &err), 0);
                CHECK_EQ(engram_reader_step_submit(r, rows + i * 48, ENGRAM_F32, out, &err), -EBUSY);
                uint16_t tmp[24 * 256];
                CHECK_EQ(engram_reader_batch(r, 0, rows, 1, ENGRAM_BF16, tmp, &err), -EBUSY);
                int rc;
                if (i % 2) {
                    while ((rc = engram_reader_step_poll(r, &err)) == -EAGAIN)
                        polled++;
                } else {
                    rc = engram_reader_step_wait(r, &err);
                }
                CHECK_EQ(rc, 0);
                CHECK(memcmp(out, (float *)want0 + i * 24 * 256, 24 * 256 * 4) == 0);
                CHECK(memcmp(out + 24 * 256, (float *)want1 + i * 24 * 256, 24 * 256 * 4) == 0);
            }
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            CHECK_EQ(st.steps, n);
            CHECK(st.step_p50_ns > 0 && st.step_p50_ns <= st.step_p99_ns &&
                  st.step_p99_ns <= st.step_p999_ns);
            CHECK(st.step_max_ns >= st.step_p50_ns / 2);
            CHECK_EQ(engram_reader_step_wait(r, &err), -EINVAL);
            if (depth == 64)
                printf("steps %-9s p50 %.1f us  p99 %.1f us  (%d polls pending)\n", st.engine,
                       (double)st.step_p50_ns / 1e3, (double)st.step_p99_ns / 1e3, polled);
            engram_reader_close(r);
        }
    }
    free(rows);
    free(want0);
    free(want1);
}

/* Bad rows: out of range (nothing read), NaN (named), and a file that shrinks
 * under the reader (short read, named). */
/* Refused arguments at every entry point: -EINVAL with the reason, and no
 * step left in flight. */
static int no_sink_called(void *ctx, size_t first, size_t n, const void *window)
{
    (void)ctx, (void)first, (void)n, (void)window;
    return 0;
}

static void arguments(engram_model *m)
{
    engram_error err;
    engram_reader *r = (engram_reader *)0x1;
    int rc = engram_reader_open(NULL, NULL, &r, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_reader_open(m, NULL, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    engram_reader_opts bad_engine = {.engine = (engram_io_engine)99};
    rc = engram_reader_open(m, &bad_engine, &r, &err);
    CHECK_ERR(rc, err, -EINVAL, "unknown I/O engine 99");
    CHECK(r == (engram_reader *)0x1);
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), 0);
    uint32_t rows[48] = {0};
    static uint16_t out[48 * 256], window[2 * 24 * 256];
    rc = engram_reader_batch(r, 0, rows, 1, ENGRAM_BF16, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_reader_batch(r, 0, rows, 1, (engram_dtype)77, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "dtype 77 is not");
    rc = engram_reader_batch(r, 2, rows, 1, ENGRAM_BF16, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "table 2 is not one of the model's 2");
    rc = engram_reader_batch_stream(r, 0, rows, 1, ENGRAM_BF16, window, 2, NULL, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "no sink");
    rc = engram_reader_batch_stream(r, 0, rows, 1, ENGRAM_BF16, window, 0, no_sink_called, NULL,
                                    &err);
    CHECK_ERR(rc, err, -EINVAL, "window of 0 tokens");
    rc = engram_reader_step_submit(r, rows, ENGRAM_BF16, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_reader_step_submit(r, NULL, ENGRAM_BF16, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_reader_step_submit(r, rows, ENGRAM_RAW, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "dtype 2: a step decodes to BF16 or F32");
    rc = engram_reader_step_poll(r, &err);
    CHECK_ERR(rc, err, -EINVAL, "no decode step in flight");
    rc = engram_reader_step_wait(r, &err);
    CHECK_EQ(rc, -EINVAL);
    CHECK_EQ(engram_reader_step_cancel(r), -EINVAL);
    CHECK_EQ(engram_reader_step_cancel(NULL), -EINVAL);
    /* the reader still works */
    CHECK_EQ(engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err), 0);
    CHECK_EQ(engram_reader_step_wait(r, &err), 0);
    engram_reader_close(r);
    printf("arguments: every entry point refuses NULL, unknown and out-of-range arguments\n");
}

static void errors(const char *path, const engram_layout *l)
{
    char bad[600];
    snprintf(bad, sizeof bad, "%s.bad", path);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, bad);
    CHECK_EQ(system(cmd), 0);
    engram_model *m = tu_open_model(bad);
    engram_model_info in;
    engram_model_get_info(m, &in);
    /* Poison row 1000 of table 1 (NaN scale). */
    int fd = open(bad, O_WRONLY | O_CLOEXEC);
    uint8_t ff = 0xff;
    CHECK_EQ(pwrite(fd, &ff, 1, (off_t)(in.table[1].offset + 1000ull * 264 + 258)), 1);
    close(fd);
    uint32_t rows[3 * 48];
    for (int i = 0; i < 3 * 48; i++)
        rows[i] = (uint32_t)(i * 7 % 500);
    for (int e = 0; e < 4; e++) { /* the 4th: io_uring with a row cache */
        if (tsan_skips(e))
            continue;
        engram_reader_opts o = {.engine = engines[e % 3], .depth = 16,
                                .cache_bytes = e == 3 ? 1u << 20 : 0};
        engram_reader *r;
        engram_error err;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        static uint16_t out[3 * 24 * 256];
        rows[48 + 24 + 5] = l->rows[1];
        int rc = engram_reader_batch(r, 1, rows, 3, ENGRAM_BF16, out, &err);
        CHECK_ERR(rc, err, -EINVAL, "token 1 column 5");
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK_EQ(st.rows_read, 0);
        rows[48 + 24 + 5] = 1000;
        rc = engram_reader_batch(r, 1, rows, 3, ENGRAM_BF16, out, &err);
        CHECK_ERR(rc, err, -EDOM, "row 1000 of table 1: NaN scale");
        CHECK_EQ(err.row, 1000);
        /* The same through a decode step. */
        uint32_t step[48];
        memcpy(step, rows + 48, sizeof step);
        CHECK_EQ(engram_reader_step_submit(r, step, ENGRAM_BF16, out, &err), 0);
        rc = engram_reader_step_wait(r, &err);
        CHECK_ERR(rc, err, -EDOM, "row 1000 of table 1");
        step[30] = l->rows[1] + 5;
        rc = engram_reader_step_submit(r, step, ENGRAM_BF16, out, &err);
        CHECK_ERR(rc, err, -EINVAL, "out of range");
        rows[48 + 24 + 5] = 1;
        engram_reader_close(r);
    }
    /* Shrink the file: the last rows of table 1 are gone. */
    CHECK_EQ(truncate(bad, (off_t)(in.table[1].offset + 2000ull * 264 + 100)), 0);
    for (int e = 0; e < 3; e++) {
        if (tsan_skips(e))
            continue;
        engram_reader_opts o = {.engine = engines[e], .depth = 16};
        engram_reader *r;
        engram_error err;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        uint32_t two[2 * 48] = {0};
        two[48 + 24 + 3] = 2000; /* partly past the end: short */
        two[48 + 24 + 4] = 1999; /* intact */
        static uint16_t out[2 * 24 * 256];
        int rc = engram_reader_batch(r, 1, two, 2, ENGRAM_BF16, out, &err);
        CHECK_ERR(rc, err, -EIO, "row 2000 of table 1");
        CHECK_EQ(err.row, 2000);
        two[48 + 24 + 3] = 5000; /* wholly past the end */
        rc = engram_reader_batch(r, 1, two, 2, ENGRAM_BF16, out, &err);
        CHECK_ERR(rc, err, -EIO, "row 5000 of table 1");
        engram_reader_close(r);
    }
    engram_model_close(m);
    unlink(bad);
}

/* 1,000,000 tokens through a 2048-token window: the reader's memory does not
 * move, and every chunk is right. */
struct sink_ctx {
    const uint16_t *want;     /* [4][24][256]: the 4 positions of the cycle */
    size_t tokens, bad;
    long rss_max_kb;          /* largest resident set seen during the batch */
};

/* Current resident set (not the peak, which earlier tests already set). */
static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int sink(void *vctx, size_t first, size_t n, const void *window)
{
    struct sink_ctx *c = vctx;
    const uint16_t *w = window;
    for (size_t i = 0; i < n; i++) {
        size_t pos = first + i;
        size_t phase = pos < 4 ? 4 + pos : pos % 4; /* first 3 tokens see dead history */
        if (phase >= 4)
            continue;
        if (memcmp(w + i * 24 * 256, c->want + phase * 24 * 256, 24 * 256 * 2) != 0)
            c->bad++;
    }
    c->tokens += n;
    long rss = rss_kb();
    if (rss > c->rss_max_kb)
        c->rss_max_kb = rss;
    return 0;
}

static void million(engram_model *m)
{
    const size_t n = SANITIZED ? 100000 : 1000000;
    uint32_t *tok = malloc(n * sizeof *tok), *rows = malloc(n * 48 * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(10 + i % 4);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &h, tok, NULL, n, rows, NULL), 0);
    /* Positions 4..7 cover the four steady phases 0..3 (pos % 4). */
    uint16_t *want = malloc(4 * 24 * 256 * 2);
    for (int p = 0; p < 4; p++) {
        void *w = tu_expected(m, 0, rows + (size_t)(4 + p) * 48, 1, ENGRAM_BF16);
        memcpy(want + p * 24 * 256, w, 24 * 256 * 2);
        free(w);
    }
    size_t window_tokens = ENGRAM_BATCH_TOKENS;
    uint16_t *window = malloc(window_tokens * 24 * 256 * 2);
    memset(window, 0x5a, window_tokens * 24 * 256 * 2); /* resident before measuring (not 0:
                                                           malloc+memset(0) may become calloc) */
    for (int e = 0; e < 3; e++) {
        if (tsan_skips(e))
            continue;
        /* The full million on io_uring; 200,000 tokens on the others. */
        size_t nt = e == 0 ? n : n / 5;
        engram_reader_opts o = {.engine = engines[e], .depth = 64};
        engram_reader *r;
        engram_error err;
        long at_open = rss_kb();
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        long before = rss_kb();
        struct sink_ctx c = {want, 0, 0, before};
        CHECK_EQ(engram_reader_batch_stream(r, 0, rows, nt, ENGRAM_BF16, window, window_tokens,
                                            sink, &c, &err), 0);
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK_EQ(c.tokens, nt);
        CHECK_EQ(c.bad, 0);
        CHECK_EQ(st.rows_requested, nt * 24);
        CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
        /* Opening takes the reader's memory (plus worker stacks for the
         * thread pool); the batch itself takes nothing more. */
        long open_kb = before - at_open, grew_kb = c.rss_max_kb - before;
        if (!SANITIZED)
            CHECK(c.rss_max_kb - at_open <= (long)(ENGRAM_READER_MAX_BYTES / 1024) + (e == 0 ? 0 : 64 * 64));
        printf("%zu tokens %-9s: %llu requests, %llu reads, reserved %llu bytes; RSS +%ld KiB at open, +%ld KiB during the batch\n",
               nt, st.engine, (unsigned long long)st.rows_requested, (unsigned long long)st.rows_read,
               (unsigned long long)st.reserved_bytes, open_kb, grew_kb);
        /* A sink can stop the batch. */
        engram_reader_close(r);
    }
    free(window);
    free(want);
    free(tok);
    free(rows);
}

static int stop_sink(void *ctx, size_t first, size_t n, const void *w)
{
    (void)ctx; (void)n; (void)w;
    return first > 0 ? -ECANCELED : 0;
}

/* A stream's sink that calls the reader again: a step or another batch is
 * refused (-EBUSY), the stream goes on. */
struct nested {
    engram_reader *r;
    const uint32_t *rows;
    int calls, step_busy, batch_busy;
};

static int nested_sink(void *vctx, size_t first, size_t n, const void *w)
{
    (void)first; (void)n; (void)w;
    struct nested *c = vctx;
    static uint16_t out[ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];
    c->calls++;
    c->step_busy += engram_reader_step_submit(c->r, c->rows, ENGRAM_BF16, out, NULL) == -EBUSY;
    c->batch_busy += engram_reader_batch(c->r, 0, c->rows, 1, ENGRAM_BF16, out, NULL) == -EBUSY;
    return 0;
}

static void env_and_options(engram_model *m)
{
    engram_reader *r;
    engram_error err;
    setenv("ENGRAM_IO", "threads", 1);
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), 0);
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    CHECK(strcmp(st.engine, "threads") == 0);
    /* The 0.1.0 name still works for one release (a deprecation warning). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    engram_io_stats old;
    engram_reader_stats(r, &old);
#pragma GCC diagnostic pop
    CHECK(strcmp(old.engine, st.engine) == 0 && old.depth == st.depth &&
          old.reserved_bytes == st.reserved_bytes);
    uint32_t *rows = tu_hashed(m, 5000, 9, 30);
    uint16_t *w = malloc(100 * 24 * 256 * 2);
    int rc = engram_reader_batch_stream(r, 0, rows, 5000, ENGRAM_BF16, w, 100, stop_sink, NULL, &err);
    CHECK_ERR(rc, err, -ECANCELED, "sink");
    struct nested nc = {r, rows, 0, 0, 0};
    CHECK_EQ(engram_reader_batch_stream(r, 0, rows, 300, ENGRAM_BF16, w, 100, nested_sink, &nc, &err), 0);
    CHECK_EQ(nc.calls, 3);
    CHECK_EQ(nc.step_busy, 3);
    CHECK_EQ(nc.batch_busy, 3);
    static uint16_t one[ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];
    CHECK_EQ(engram_reader_step_submit(r, rows, ENGRAM_BF16, one, NULL), 0); /* after it: free */
    CHECK_EQ(engram_reader_step_wait(r, NULL), 0);
    free(w);
    free(rows);
    engram_reader_close(r);
    setenv("ENGRAM_IO", "buffered", 1);
    setenv("ENGRAM_IO_DROP", "fadvise", 1);
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), 0);
    engram_reader_get_stats(r, &st);
    CHECK(strcmp(st.engine, "buffered") == 0 && strcmp(st.drop, "fadvise") == 0);
    engram_reader_close(r);
    unsetenv("ENGRAM_IO");
    unsetenv("ENGRAM_IO_DROP");
    engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = ENGRAM_READER_MAX_DEPTH + 1};
    CHECK_EQ(engram_reader_open(m, &o, &r, &err), -EINVAL);
    engram_reader_close(NULL);
}

/* Writes a random row (quantized from random values of varied scale, so
 * every row decodes) at each of the n table-t ids in rows; 0 or -errno. */
static int write_rows(const char *path, uint64_t table_offset, const uint32_t *rows, size_t n,
                      uint64_t seed)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        float v[256];
        uint8_t row[264];
        int shift = (int)(tu_rand(&seed) % 24) - 12;
        for (int j = 0; j < 256; j++)
            v[j] = ldexpf((float)((int64_t)(tu_rand(&seed) % 2001) - 1000) / 1000.0f, shift);
        rc = engram_rows_quantize_f32(v, 1, row, NULL, NULL);
        if (rc == 0 && pwrite(fd, row, sizeof row, (off_t)(table_offset + (uint64_t)rows[i] * 264)) !=
                           (ssize_t)sizeof row)
            rc = -EIO;
    }
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    close(fd);
    return rc;
}

/* The full-size V4.1 geometry (a file of holes, 2 x ~101 GB apparent):
 * every engine reads rows at both ends of both tables, past 4 GiB and past
 * 100 GB (table 1's last rows), equal to the exact single-row path.  Only
 * the rows read are written (random), the rest are holes: the file takes
 * a few blocks, not the sparse fill's one block in every 4096 rows (187k
 * blocks, 4 s to write and 21 s to unlink on this VM's ext4). */
static void beyond_4g(void)
{
    static uint32_t map[129280];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 129280, 99092, 16000000), 0);
    char path[512];
    if (tu_build("full.gguf", &l, ENGRAM_FILL_ZERO, 0, path, sizeof path) < 0) {
        CHECK(0);
        return;
    }
    /* Two tokens' worth of rows per table: rows near both ends (multiples
     * of 4096 and their neighbours), duplicates, and the very last row. */
    const size_t n = 2;
    uint32_t rows[2 * 48];
    for (int t = 0; t < 2; t++) {
        uint32_t last = l.rows[t] - 1, top = last / 4096 * 4096;
        for (int c = 0; c < 24; c++) {
            uint32_t pick[8] = {0, 4096, 8192, top, top - 4096, top + 1, last, last - 1};
            rows[0 * 48 + t * 24 + c] = pick[c % 8]; /* each three times: duplicates too */
            rows[1 * 48 + t * 24 + c] = c < 8 ? top - 4096u * (uint32_t)c : last - (uint32_t)c;
        }
    }
    engram_model *m = tu_open_model(path);
    if (!m) {
        CHECK(0);
        return;
    }
    engram_model_info in;
    engram_model_get_info(m, &in);
    CHECK(in.table[1].offset > 100000000000ull);
    for (int t = 0; t < 2; t++)
        for (size_t k = 0; k < n; k++)
            CHECK_EQ(write_rows(path, in.table[t].offset, rows + k * 48 + t * 24, 24, 77 + 2 * k + (uint64_t)t), 0);
    for (int e = 0; e < 3; e++) {
        if (tsan_skips(e))
            continue;
        engram_reader_opts o = {.engine = engines[e], .depth = 16};
        engram_reader *r;
        engram_error err;
        if (engram_reader_open(m, &o, &r, &err) < 0) {
            fprintf(stderr, "%s: %s\n", engine_names[e], err.msg);
            CHECK(0);
            continue;
        }
        for (int t = 0; t < 2; t++) {
            uint16_t *want = tu_expected(m, t, rows, n, ENGRAM_BF16);
            static uint16_t got[2 * 24 * 256];
            memset(got, 0xee, sizeof got);
            CHECK_EQ(engram_reader_batch(r, t, rows, n, ENGRAM_BF16, got, &err), 0);
            CHECK(memcmp(got, want, sizeof got) == 0);
            /* not all zeros: the random rows are there */
            int nonzero = 0;
            for (size_t i = 0; i < 24 * 256; i++)
                nonzero |= got[i] != 0;
            CHECK(nonzero);
            free(want);
        }
        static float step[48 * 256];
        float *w0 = tu_expected(m, 0, rows + 48, 1, ENGRAM_F32);
        float *w1 = tu_expected(m, 1, rows + 48, 1, ENGRAM_F32);
        CHECK_EQ(engram_reader_step_submit(r, rows + 48, ENGRAM_F32, step, &err), 0);
        CHECK_EQ(engram_reader_step_wait(r, &err), 0);
        CHECK(memcmp(step, w0, 24 * 256 * 4) == 0);
        CHECK(memcmp(step + 24 * 256, w1, 24 * 256 * 4) == 0);
        free(w0);
        free(w1);
        engram_reader_close(r);
    }
    printf("full size: rows up to %u of table 1 (file offset %llu) read by %s\n",
           l.rows[1] - 1, (unsigned long long)(in.table[1].offset + (uint64_t)(l.rows[1] - 1) * 264),
           TSANITIZED ? "the thread pool (TSan)" : "every engine");
    engram_model_close(m);
}

int main(void)
{
    /* a hang (a wait for reads that never complete) fails the test instead of
     * stalling the suite: SIGALRM kills it (its slowest run, under TSan, was
     * 169 s in the suite on a slow 2-core VM, before TSan's run left io_uring out) */
    alarm(300);
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 30000), 0);
    char path[512];
    CHECK_EQ(tu_build("reader.gguf", &l, ENGRAM_FILL_RANDOM, 0, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    CHECK(m != NULL);
    if (!m)
        return tu_finish("test_reader");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
#define LAP(call)                                                                        \
    do {                                                                                 \
        call;                                                                            \
        clock_gettime(CLOCK_MONOTONIC, &t1);                                             \
        printf("  (%s: %.2f s)\n", #call,                                                \
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9); \
        t0 = t1;                                                                         \
    } while (0)
    LAP(reserved_counts(m));
    LAP(batches(m));
    LAP(pool_threads(m));
    LAP(arguments(m));
    LAP(steps(m));
    LAP(cached(m));
    LAP(env_and_options(m));
    LAP(million(m));
    engram_model_close(m);
    LAP(errors(path, &l));
    LAP(beyond_4g());
    tu_cleanup();
    return tu_finish("test_reader");
}
