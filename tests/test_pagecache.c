/*
 * test_pagecache.c - reading a table does not grow the page cache.
 *
 * The file's resident pages are counted with mincore() on a mapping of it
 * (mapping alone reads nothing).  The file is first evicted; then each
 * engine reads thousands of random rows and the count must not move.  The
 * same rows read with plain cached pread() must make it grow: that shows the
 * measurement can fail.
 */
#include "testutil.h"

int main(void)
{
    static uint32_t map[2000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 2000, 1500, 5300), 0);
    char path[512];
    CHECK_EQ(tu_build("cache.gguf", &l, ENGRAM_FILL_RANDOM, 0, path, sizeof path), 0);
    engram_model *m;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    engram_model_info in;
    engram_model_get_info(m, &in);
    uint64_t lo = in.table[0].offset, hi = in.table[1].offset + in.table[1].bytes;
    uint64_t table_pages = (hi - lo) / 4096;

    /* 1500 tokens of random rows (72,000 requests over both tables). */
    enum { N = 1500 };
    uint32_t *rows = malloc(N * 48 * sizeof *rows);
    uint64_t seed = 3;
    for (int i = 0; i < N * 48; i++)
        rows[i] = (uint32_t)(tu_rand(&seed) % l.rows[(i % 48) / 24]);
    uint16_t *out = malloc((size_t)N * 24 * 256 * 2);

    struct { const char *name; engram_io_engine e; const char *drop; } modes[] = {
        {"io_uring", ENGRAM_IO_URING, NULL},
        {"threads", ENGRAM_IO_THREADS, NULL},
        {"buffered (RWF_DONTCACHE where the kernel has it)", ENGRAM_IO_BUFFERED, NULL},
        {"buffered (posix_fadvise)", ENGRAM_IO_BUFFERED, "fadvise"},
    };
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        if (tsan_dup_engine(modes[k].e))
            continue; /* under TSan: the thread pool's run covers it (testutil.h) */
        if (modes[k].drop)
            setenv("ENGRAM_IO_DROP", modes[k].drop, 1);
        else
            unsetenv("ENGRAM_IO_DROP");
        tu_evict(path);
        uint64_t before = tu_resident(path, lo, hi);
        CHECK(before != UINT64_MAX);
        engram_reader_opts o = {.engine = modes[k].e, .depth = 64};
        engram_reader *r;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        CHECK_EQ(engram_reader_batch(r, 0, rows, N, ENGRAM_BF16, out, &err), 0);
        CHECK_EQ(engram_reader_batch(r, 1, rows, N, ENGRAM_BF16, out, &err), 0);
        for (int s = 0; s < 50; s++) {
            CHECK_EQ(engram_reader_step_submit(r, rows + s * 48, ENGRAM_BF16, out, &err), 0);
            CHECK_EQ(engram_reader_step_wait(r, &err), 0);
        }
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        engram_reader_close(r);
        uint64_t after = tu_resident(path, lo, hi);
        printf("%-48s rows read %6llu  resident table pages %llu -> %llu (of %llu)\n",
               modes[k].name, (unsigned long long)st.rows_read, (unsigned long long)before,
               (unsigned long long)after, (unsigned long long)table_pages);
        CHECK(st.rows_read > 60000);
        CHECK(after <= before + 2);
    }
    unsetenv("ENGRAM_IO_DROP");

    /* The control: the reference engine's plain cached pread. */
    tu_evict(path);
    uint64_t before = tu_resident(path, lo, hi);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t buf[264];
    for (int i = 0; i < N * 48; i++) {
        int t = (i % 48) / 24;
        CHECK_EQ(pread(fd, buf, 264, (off_t)(in.table[t].offset + (uint64_t)rows[i] * 264)), 264);
    }
    close(fd);
    uint64_t after = tu_resident(path, lo, hi);
    printf("%-48s resident table pages %llu -> %llu (of %llu)\n", "plain cached pread (control)",
           (unsigned long long)before, (unsigned long long)after, (unsigned long long)table_pages);
    CHECK(after > before + table_pages / 4);

    free(rows);
    free(out);
    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_pagecache");
}
