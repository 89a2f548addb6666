/*
 * test_ple_reader.c - the uncached reader on the family's second member
 * (issue #22, item 4): a scaled qwen4exp demo (real multipliers, sizes from
 * the generator at a small base, BF16 rows drawn like a trained table)
 * read through every engine, batch, stream and step, with and without a
 * row cache, gives the rows engram_model_read_* give (plain preads: the
 * exact single-row path); each distinct row costs one read of exactly the
 * aligned span covering its 320 bytes (one sector, or two where it
 * straddles, counted here independently from the offsets); reading does
 * not grow the page cache, while plain cached preads of the same rows do.
 */
#include <errno.h>
#include <string.h>

#include "testutil.h"

#define BASE 4001u
#define WIDTH 64u
#define N 3000u
#define RPT ENGRAM_PLE_ROWS_PER_TOKEN
#define VALUES 160u
#define ROWB 320u

static engram_model *demo(char *path, size_t n)
{
    tu_path(path, n, "ple.gguf");
    engram_ple_build_opts o = {.base = BASE, .width = WIDTH, .fill = ENGRAM_FILL_NORMAL, .seed = 11};
    engram_error err;
    int rc = engram_build_ple_model(path, &o, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "build: %s\n", err.msg);
        exit(1);
    }
    return tu_open_model(path);
}

/* N tokens of a random text hashed as one sequence: [N][16] global ids. */
static uint32_t *hashed(engram_model *m, uint64_t seed)
{
    uint32_t *tok = malloc(N * sizeof *tok), *rows = malloc((size_t)N * RPT * sizeof *rows);
    engram_model_info in;
    engram_model_get_info(m, &in);
    for (unsigned i = 0; i < N; i++) /* a small alphabet: rows repeat, as in text */
        tok[i] = (uint32_t)(tu_rand(&seed) % (i % 7 ? 300 : in.family.vocab));
    engram_ple_history h;
    engram_ple_history_reset(m, &h);
    engram_error err;
    CHECK_EQ(engram_ple_hash(m, &h, tok, NULL, N, rows, &err), 0);
    free(tok);
    return rows;
}

struct sink_ctx {
    const uint16_t *want;
    size_t next, calls;
    int same;
};

static int sink(void *ctx, size_t first, size_t n, const void *window)
{
    struct sink_ctx *c = ctx;
    c->same &= first == c->next;
    c->same &= memcmp(window, c->want + first * RPT * VALUES, n * RPT * VALUES * 2) == 0;
    c->next = first + n;
    c->calls++;
    return 0;
}

static void engines(engram_model *m, const uint32_t *rows)
{
    engram_error err;
    size_t nv = (size_t)N * RPT * VALUES;
    uint16_t *want16 = malloc(nv * 2), *got16 = malloc(nv * 2);
    float *want32 = malloc(nv * 4), *got32 = malloc(nv * 4);
    uint8_t *wantraw = malloc((size_t)N * RPT * ROWB), *gotraw = malloc((size_t)N * RPT * ROWB);
    CHECK_EQ(engram_model_read_bf16(m, 0, rows, (size_t)N * RPT, want16, &err), 0);
    CHECK_EQ(engram_model_read_f32(m, 0, rows, (size_t)N * RPT, want32, &err), 0);
    CHECK_EQ(engram_model_read_raw(m, 0, rows, (size_t)N * RPT, wantraw, &err), 0);
    /* the rows are not all zero (a read of the wrong place would show) */
    size_t nonzero = 0;
    for (size_t i = 0; i < nv; i++)
        nonzero += want16[i] != 0;
    CHECK(nonzero > nv / 2);

    engram_io_engine eng[3] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
    for (int e = 0; e < 3; e++)
        for (int cached = 0; cached < 2 && !tsan_reader_skips(eng[e]); cached++) {
            engram_reader_opts o = {.engine = eng[e], .depth = 32,
                                    .cache_bytes = cached ? 1u << 20 : 0};
            engram_reader *r;
            int rc = engram_reader_open(m, &o, &r, &err);
            CHECK_EQ(rc, 0);
            if (rc < 0) {
                fprintf(stderr, "engine %d: %s\n", e, err.msg);
                continue;
            }
            memset(got16, 0xee, nv * 2);
            CHECK_EQ(engram_reader_batch(r, 0, rows, N, ENGRAM_BF16, got16, &err), 0);
            CHECK(memcmp(got16, want16, nv * 2) == 0);
            memset(got32, 0xee, nv * 4);
            CHECK_EQ(engram_reader_batch(r, 0, rows, N, ENGRAM_F32, got32, &err), 0);
            CHECK(memcmp(got32, want32, nv * 4) == 0);
            memset(gotraw, 0xee, (size_t)N * RPT * ROWB);
            CHECK_EQ(engram_reader_batch(r, 0, rows, N, ENGRAM_RAW, gotraw, &err), 0);
            CHECK(memcmp(gotraw, wantraw, (size_t)N * RPT * ROWB) == 0);
            /* a stream through a window of 97 tokens */
            struct sink_ctx c = {want16, 0, 0, 1};
            uint16_t *window = malloc((size_t)97 * RPT * VALUES * 2);
            CHECK_EQ(engram_reader_batch_stream(r, 0, rows, N, ENGRAM_BF16, window, 97, sink, &c, &err), 0);
            CHECK(c.same && c.next == N && c.calls == (N + 96) / 97);
            free(window);
            /* decode steps: one token's 16 rows */
            for (unsigned t = 0; t < 200; t++) {
                uint16_t step[RPT * VALUES];
                memset(step, 0xee, sizeof step);
                CHECK_EQ(engram_reader_step_submit(r, rows + (size_t)t * 13 * RPT, ENGRAM_BF16, step, &err), 0);
                CHECK_EQ(engram_reader_step_wait(r, &err), 0);
                CHECK(memcmp(step, want16 + (size_t)t * 13 * RPT * VALUES, sizeof step) == 0);
            }
            /* polled steps in F32 */
            for (unsigned t = 0; t < 50; t++) {
                float step[RPT * VALUES];
                CHECK_EQ(engram_reader_step_submit(r, rows + (size_t)t * 7 * RPT, ENGRAM_F32, step, &err), 0);
                while ((rc = engram_reader_step_poll(r, &err)) == -EAGAIN)
                    ;
                CHECK_EQ(rc, 0);
                CHECK(memcmp(step, want32 + (size_t)t * 7 * RPT * VALUES, sizeof step) == 0);
            }
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            CHECK(!cached || st.cache_hits > 0);
            engram_reader_close(r);
        }
    free(want16), free(got16), free(want32), free(got32), free(wantraw), free(gotraw);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* One read per distinct row of exactly the aligned span covering it. */
static void read_sizes(engram_model *m, const uint32_t *rows)
{
    engram_model_info in;
    engram_model_get_info(m, &in);
    engram_error err;
    engram_reader_opts o = {.engine = ENGRAM_IO_THREADS, .depth = 16};
    engram_reader *r;
    CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    uint64_t a = st.align;
    CHECK(st.direct && a >= 512);
    /* one chunk (<= 2048 tokens: each distinct row read once) */
    size_t nt = 2000, nr = nt * RPT;
    uint32_t *d = malloc(nr * sizeof *d);
    memcpy(d, rows, nr * sizeof *d);
    qsort(d, nr, sizeof *d, cmp_u32);
    uint64_t distinct = 0, bytes = 0, straddle = 0;
    for (size_t i = 0; i < nr; i++) {
        if (i > 0 && d[i] == d[i - 1])
            continue;
        uint64_t off = in.table[0].offset + (uint64_t)d[i] * ROWB;
        uint64_t lo = off / a * a, hi = (off + ROWB + a - 1) / a * a;
        distinct++;
        bytes += hi - lo;
        straddle += hi - lo > a;
    }
    uint16_t *out = malloc(nr * VALUES * 2);
    engram_reader_reset_stats(r);
    CHECK_EQ(engram_reader_batch(r, 0, rows, nt, ENGRAM_BF16, out, &err), 0);
    engram_reader_get_stats(r, &st);
    CHECK_EQ(st.rows_read, distinct);
    CHECK_EQ(st.bytes_read, bytes);
    CHECK_EQ(st.rows_requested, nr);
    printf("  %llu distinct rows of %zu requests, alignment %llu: %llu straddle two blocks "
           "(%.1f%%), %.0f bytes read per row\n",
           (unsigned long long)distinct, nr, (unsigned long long)a, (unsigned long long)straddle,
           100.0 * (double)straddle / (double)distinct, (double)bytes / (double)distinct);
    if (a == 512) /* 320-byte rows from offsets k * 320: half of them straddle */
        CHECK(straddle * 10 > distinct * 4 && straddle * 10 < distinct * 6);
    engram_reader_close(r);
    free(d);
    free(out);
}

static void page_cache(engram_model *m, const char *path, const uint32_t *rows)
{
    engram_model_info in;
    engram_model_get_info(m, &in);
    uint64_t lo = in.table[0].offset, hi = lo + in.table[0].bytes;
    engram_error err;
    uint16_t *out = malloc((size_t)N * RPT * VALUES * 2);
    engram_io_engine eng[3] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
    for (int e = 0; e < 3; e++) {
        if (tsan_reader_skips(eng[e]))
            continue;
        tu_evict(path);
        uint64_t before = tu_resident(path, lo, hi);
        CHECK(before != UINT64_MAX);
        engram_reader_opts o = {.engine = eng[e], .depth = 64};
        engram_reader *r;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        CHECK_EQ(engram_reader_batch(r, 0, rows, N, ENGRAM_BF16, out, &err), 0);
        for (unsigned t = 0; t < 50; t++) {
            CHECK_EQ(engram_reader_step_submit(r, rows + (size_t)t * RPT, ENGRAM_BF16, out, &err), 0);
            CHECK_EQ(engram_reader_step_wait(r, &err), 0);
        }
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        engram_reader_close(r);
        uint64_t after = tu_resident(path, lo, hi);
        printf("  engine %-8s rows read %6llu, resident table pages %llu -> %llu (of %llu)\n",
               st.engine, (unsigned long long)st.rows_read, (unsigned long long)before,
               (unsigned long long)after, (unsigned long long)((hi - lo) / 4096));
        CHECK(st.rows_read > 10000);
        CHECK(after <= before + 2);
    }
    /* the control: plain cached preads of the same rows do grow it */
    tu_evict(path);
    uint64_t before = tu_resident(path, lo, hi);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t buf[ROWB];
    for (size_t i = 0; i < (size_t)N * RPT; i++)
        CHECK_EQ(pread(fd, buf, ROWB, (off_t)(lo + (uint64_t)rows[i] * ROWB)), (ssize_t)ROWB);
    close(fd);
    uint64_t after = tu_resident(path, lo, hi);
    printf("  plain cached pread (control): resident table pages %llu -> %llu\n",
           (unsigned long long)before, (unsigned long long)after);
    CHECK(after > before + (hi - lo) / 4096 / 4);
    free(out);
}

static void errors(engram_model *m, const uint32_t *rows)
{
    engram_model_info in;
    engram_model_get_info(m, &in);
    engram_error err;
    engram_reader *r;
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), 0);
    uint32_t bad[RPT];
    memcpy(bad, rows, sizeof bad);
    bad[9] = (uint32_t)in.table[0].rows;
    uint16_t out[RPT * VALUES];
    CHECK_ERR(engram_reader_batch(r, 1, rows, 1, ENGRAM_BF16, out, &err), err, -EINVAL, "table 1");
    CHECK_ERR(engram_reader_batch(r, 0, bad, 1, ENGRAM_BF16, out, &err), err, -EINVAL, "column 9");
    CHECK_ERR(engram_reader_step_submit(r, bad, ENGRAM_BF16, out, &err), err, -EINVAL, "column 9");
    /* the reader is as usable as before */
    CHECK_EQ(engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err), 0);
    CHECK_EQ(engram_reader_step_cancel(r), 0);
    CHECK_EQ(engram_reader_batch(r, 0, rows, 1, ENGRAM_BF16, out, &err), 0);
    engram_reader_close(r);
}

int main(void)
{
    char path[512];
    engram_model *m = demo(path, sizeof path);
    engram_model_info in;
    engram_model_get_info(m, &in);
    CHECK_EQ(in.family.member, ENGRAM_MEMBER_PLE);
    CHECK_EQ(in.family.row_bytes, ROWB);
    uint32_t *rows = hashed(m, 5);
    engines(m, rows);
    read_sizes(m, rows);
    page_cache(m, path, rows);
    errors(m, rows);
    free(rows);
    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_ple_reader");
}
