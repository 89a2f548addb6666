/*
 * test_faults.c - the reader under faults, through the io_engine.h seam
 * (fault_engine.h) and wrapped system calls (open, statx), on a real file
 * with every engine: io_uring, the thread pool and the buffered fallback.
 *
 * Linked with -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new,
 * --wrap=open,--wrap=statx (see the Makefile): test builds only.
 */
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "fault_engine.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static const engram_io_engine engines[] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
static const char *const engine_names[] = {"io_uring", "threads", "buffered"};

/* ------------------------------------------------ wrapped system calls */

static struct {
    int direct_errno;   /* open with O_DIRECT fails with this errno      */
    int proc_errno;     /* open of /proc/self/fd/... fails with this     */
    int open_errno;     /* every open fails with this                    */
    uint32_t dio_align; /* statx reports this DIO alignment (0: real)    */
} sys;

int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & O_CREAT) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int e = sys.open_errno;
    if (!e && sys.direct_errno && (flags & O_DIRECT))
        e = sys.direct_errno;
    if (!e && sys.proc_errno && strncmp(path, "/proc/self/fd/", 14) == 0)
        e = sys.proc_errno;
    if (e) {
        errno = e;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __real_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx);
int __wrap_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx);
int __wrap_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx)
{
    int rc = __real_statx(dirfd, path, flags, mask, sx);
    if (rc == 0 && sys.dio_align) {
        sx->stx_mask |= STATX_DIOALIGN;
        sx->stx_dio_offset_align = sys.dio_align;
        sx->stx_dio_mem_align = sys.dio_align;
    }
    return rc;
}

/* ------------------------------------------------ allocation counter
 * Batches and steps promise to allocate nothing.  glibc lets a program
 * replace malloc (its own internal calls, qsort's among them, go through
 * the replacement), so counting here sees allocations inside libc too.
 * Sanitizers replace malloc themselves: there the count is not taken. */
#if !SANITIZED
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
static volatile long alloc_calls;
static volatile int counting;
/* Default visibility: the build hides symbols, and libc only calls a
 * replacement it can see in the dynamic symbol table. */
#define EXPORT __attribute__((visibility("default")))
#define COUNT() (counting ? (void)__atomic_add_fetch(&alloc_calls, 1, __ATOMIC_RELAXED) : (void)0)
EXPORT void *malloc(size_t n) { COUNT(); return __libc_malloc(n); }
EXPORT void *calloc(size_t a, size_t b) { COUNT(); return __libc_calloc(a, b); }
EXPORT void *realloc(void *p, size_t n) { COUNT(); return __libc_realloc(p, n); }
EXPORT void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n);
EXPORT void *aligned_alloc(size_t a, size_t n) { COUNT(); return __libc_memalign(a, n); }
EXPORT void *memalign(size_t a, size_t n) { COUNT(); return __libc_memalign(a, n); }
EXPORT int posix_memalign(void **p, size_t a, size_t n)
{
    COUNT();
    void *q = __libc_memalign(a, n);
    if (!q)
        return ENOMEM;
    *p = q;
    return 0;
}
#endif

/* ------------------------------------------------ helpers */

static engram_model *open_model(const char *path)
{
    engram_model *m = NULL;
    engram_error err;
    if (engram_model_open(path, &m, &err) < 0)
        fprintf(stderr, "open %s: %s\n", path, err.msg);
    return m;
}

static uint32_t *hashed(engram_model *m, size_t n, uint64_t seed, unsigned alphabet)
{
    uint32_t *tok = malloc(n * sizeof *tok), *rows = malloc(n * 48 * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % alphabet);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &h, tok, NULL, n, rows, NULL), 0);
    free(tok);
    return rows;
}

/* [n][24][256] bf16 of table t through the exact single-row path. */
static uint16_t *expected(engram_model *m, int t, const uint32_t *rows, size_t n)
{
    uint16_t *out = malloc(n * 24 * 256 * 2);
    uint32_t *ids = malloc(n * 24 * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        memcpy(ids + i * 24, rows + i * 48 + t * 24, 24 * sizeof *ids);
    CHECK_EQ(engram_model_read_bf16(m, t, ids, n * 24, out, NULL), 0);
    free(ids);
    return out;
}

static engram_reader *open_reader(engram_model *m, int e, unsigned depth)
{
    engram_reader_opts o = {.engine = engines[e], .depth = depth};
    engram_reader *r = NULL;
    engram_error err;
    int rc = engram_reader_open(m, &o, &r, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", engine_names[e], err.msg);
    return r;
}

/* One batch of table t compared with want; returns the call's result. */
static int batch_eq(engram_reader *r, int t, const uint32_t *rows, size_t n, const uint16_t *want,
                    engram_error *err)
{
    size_t bytes = n * 24 * 256 * 2;
    uint16_t *got = malloc(bytes);
    memset(got, 0xee, bytes);
    int rc = engram_reader_batch(r, t, rows, n, ENGRAM_BF16, got, err);
    if (rc == 0)
        CHECK(memcmp(got, want, bytes) == 0);
    free(got);
    return rc;
}

/* One decode step compared with want0/want1 (token i). */
static int step_eq(engram_reader *r, const uint32_t *rows48, const uint16_t *w0, const uint16_t *w1,
                   engram_error *err)
{
    static uint16_t out[48 * 256];
    memset(out, 0xee, sizeof out);
    int rc = engram_reader_step_submit(r, rows48, ENGRAM_BF16, out, err);
    if (rc < 0)
        return rc;
    rc = engram_reader_step_wait(r, err);
    if (rc == 0) {
        CHECK(memcmp(out, w0, 24 * 256 * 2) == 0);
        CHECK(memcmp(out + 24 * 256, w1, 24 * 256 * 2) == 0);
    }
    return rc;
}

static void contract_clean(const char *what)
{
    if (fe.requeue_inflight || fe.unknown_cqe || fe.destroy_inflight)
        fprintf(stderr, "%s: contract: requeued in flight %ld, unknown completions %ld, "
                        "destroyed with %ld in flight\n",
                what, fe.requeue_inflight, fe.unknown_cqe, fe.destroy_inflight);
    CHECK_EQ(fe.requeue_inflight, 0);
    CHECK_EQ(fe.unknown_cqe, 0);
    CHECK_EQ(fe.destroy_inflight, 0);
}

/* ------------------------------------------------ the five scenarios */

/* 1. Closing a reader with a step in flight: the engine must not be torn
 * down (nor the buffers freed) while reads are in flight. */
static void close_in_flight(engram_model *m, const uint32_t *rows)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        for (int i = 0; i < 20; i++) {
            engram_reader *r = open_reader(m, e, 64);
            if (!r)
                continue;
            static uint16_t out[48 * 256];
            CHECK_EQ(engram_reader_step_submit(r, rows + (size_t)i * 48, ENGRAM_BF16, out, NULL), 0);
            engram_reader_close(r);
        }
        char what[64];
        snprintf(what, sizeof what, "close in flight, %s", engine_names[e]);
        contract_clean(what);
    }
    /* What the contract protects, seen directly: memory allocated right after
     * close must not change under the test's feet (the kernel writing rows
     * into freed buffers).  ASan's quarantine keeps freed memory from being
     * reused, so this half only means something in plain builds. */
    if (SANITIZED)
        return;
    fe_reset();
    fe.wrap = 0;
    int changed = 0;
    for (int i = 0; i < 200; i++) {
        engram_reader *r = open_reader(m, 0, 64);
        if (!r)
            continue;
        static uint16_t out[48 * 256];
        engram_reader_step_submit(r, rows + (size_t)(i % 40) * 48, ENGRAM_BF16, out, NULL);
        engram_reader_close(r);
        unsigned char *p = malloc(128 << 10);
        memset(p, 0x5a, 128 << 10);
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
        for (size_t k = 0; k < (128u << 10); k++)
            if (p[k] != 0x5a) {
                changed++;
                break;
            }
        free(p);
    }
    printf("close with a step in flight: %d of 200 fresh buffers changed after close\n", changed);
    CHECK_EQ(changed, 0);
}

/* 2. One transient engine error (reap -> -EAGAIN) must not break the
 * reader: the call itself retries, and later batches and steps are exact;
 * after a hard error, the next step must be exact too. */
static void transient_reap(engram_model *m, const uint32_t *rows, const uint16_t *w0,
                           const uint16_t *w1, size_t n)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        fe_arm(FE_REAP, 1, -EAGAIN, 1);
        int rc = batch_eq(r, 0, rows, n, w0, &err);
        CHECK_EQ(fe.fired, 1);
        CHECK_EQ(rc, 0);
        fe_disarm();
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        engram_io_stats st;
        engram_reader_reset_stats(r);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        engram_reader_stats(r, &st);
        CHECK(st.rows_read > 0);
        /* A hard engine error fails the batch; the reader stays exact. */
        fe_arm(FE_REAP, 2, -EIO, 1);
        rc = batch_eq(r, 0, rows, n, w0, &err);
        CHECK_EQ(rc, -EIO);
        fe_disarm();
        for (size_t i = 0; i < 4; i++)
            CHECK_EQ(step_eq(r, rows + i * 48, w0 + i * 24 * 256, w1 + i * 24 * 256, &err), 0);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        /* The same during a step. */
        fe_arm(FE_REAP, 1, -EAGAIN, 1);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        fe_disarm();
        CHECK_EQ(step_eq(r, rows + 48, w0 + 24 * 256, w1 + 24 * 256, &err), 0);
        engram_reader_close(r);
        char what[64];
        snprintf(what, sizeof what, "transient reap, %s", engine_names[e]);
        contract_clean(what);
    }
}

/* 3. The model file renamed over between model open and reader open (as
 * `engram build` does): the reader must read the file the model validated. */
static void renamed_over(const engram_layout *l)
{
    char a[512], b[512];
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    o.layout = *l;
    o.fill = ENGRAM_FILL_RANDOM;
    o.seed = 7;
    tu_path(a, sizeof a, "renamed.gguf");
    tu_path(b, sizeof b, "other.gguf");
    CHECK_EQ(engram_build_model(a, &o, NULL), 0);
    o.seed = 8;
    CHECK_EQ(engram_build_model(b, &o, NULL), 0);
    engram_model *m = open_model(a);
    if (!m)
        return;
    uint32_t *rows = hashed(m, 64, 5, 500);
    uint16_t *want = expected(m, 1, rows, 64);
    CHECK_EQ(rename(b, a), 0);
    fe_reset();
    for (int e = 0; e < 3; e++) {
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(batch_eq(r, 1, rows, 64, want, &err), 0);
        engram_reader_close(r);
    }
    free(rows);
    free(want);
    engram_model_close(m);
}

/* 4. Batches and steps allocate nothing. */
static void no_allocation(engram_model *m, const uint32_t *rows, size_t n)
{
#if SANITIZED
    (void)m; (void)rows; (void)n;
    printf("allocation count: not taken under sanitizers\n");
#else
    fe_reset();
    fe.wrap = 0;
    uint16_t *out = malloc(n * 24 * 256 * 2);
    for (int e = 0; e < 3; e++) {
        engram_reader *r = open_reader(m, e, 64);
        if (!r)
            continue;
        alloc_calls = 0;
        counting = 1;
        int rc = engram_reader_batch(r, 0, rows, n, ENGRAM_BF16, out, NULL);
        for (size_t i = 0; i < 8 && rc == 0; i++) {
            rc = engram_reader_step_submit(r, rows + i * 48, ENGRAM_BF16, out, NULL);
            if (rc == 0)
                rc = engram_reader_step_wait(r, NULL);
        }
        counting = 0;
        CHECK_EQ(rc, 0);
        printf("allocations during a %zu-token batch and 8 steps, %s: %ld\n", n, engine_names[e],
               alloc_calls);
        CHECK_EQ(alloc_calls, 0);
        engram_reader_close(r);
    }
    free(out);
#endif
}

/* 5. The smaller defects. */
static void smaller(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1,
                    size_t n)
{
    engram_error err;
    engram_model_info info;
    engram_model_get_info(m, &info);
    /* (a) A DIO alignment of 512 KiB and more must not leave the reader
     * without slots. */
    for (uint32_t align = 256u << 10; align <= (1u << 20); align *= 2) {
        fe_reset();
        sys.dio_align = align;
        engram_reader *r = open_reader(m, 0, 64);
        sys.dio_align = 0;
        if (!r)
            continue;
        engram_io_stats st;
        engram_reader_stats(r, &st);
        CHECK(st.depth > 0);
        CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        if (st.depth > 0)
            CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        engram_reader_close(r);
    }
    /* (b) Short reads are resubmitted for the remainder. */
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        fe_arm(FE_CQE, 3, FE_SHORT, 5);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        CHECK_EQ(fe.fired, 5);
        engram_io_stats st;
        engram_reader_stats(r, &st);
        CHECK(st.retries >= 5);
        fe_arm(FE_CQE, 2, FE_SHORT, 3);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        fe_disarm();
        engram_reader_close(r);
        contract_clean("short reads");
    }
    /* (c) A read error names the row and its file offset. */
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        fe_arm(FE_CQE, 1, -EIO, 1);
        memset(&err, 0, sizeof err);
        int rc = batch_eq(r, 0, rows, n, w0, &err);
        fe_disarm();
        CHECK_EQ(rc, -EIO);
        CHECK(err.row != ENGRAM_NO_ROW);
        CHECK_EQ(err.offset, info.table[0].offset + err.row * 264);
        engram_reader_close(r);
        contract_clean("read error");
    }
    /* (e) io_uring forced on a file that refuses O_DIRECT: refused with a
     * reason, not silently replaced by the buffered thread pool. */
    fe_reset();
    sys.direct_errno = EINVAL;
    engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = 16};
    engram_reader *r = NULL;
    int rc = engram_reader_open(m, &o, &r, &err);
    sys.direct_errno = 0;
    CHECK(rc < 0);
    if (rc < 0)
        CHECK(strstr(err.msg, "O_DIRECT") != NULL);
    engram_reader_close(r);
    /* (f) The token map is held once per model. */
    const engram_layout *ml = engram_model_layout(m);
    const engram_layout *hl = engram_hasher_layout(engram_model_hasher(m));
    CHECK(ml->token_map == hl->token_map);
}

/* Each scenario runs in a child process with a time limit, so that a hang
 * (a wait for reads that will never complete) is a failure, not a stuck
 * suite. */
#define SCENARIO(name, call)                                                             \
    do {                                                                                 \
        fflush(stdout);                                                                  \
        pid_t pid_ = fork();                                                             \
        if (pid_ == 0) {                                                                 \
            tu_failures = 0;                                                             \
            alarm(120);                                                                  \
            call;                                                                        \
            fflush(stdout);                                                              \
            _exit(tu_failures ? 1 : 0);                                                  \
        }                                                                                \
        int st_ = 0;                                                                     \
        waitpid(pid_, &st_, 0);                                                          \
        int ok_ = WIFEXITED(st_) && WEXITSTATUS(st_) == 0;                               \
        printf("%-28s %s\n", name, ok_ ? "ok" : WIFSIGNALED(st_) ? "FAILED (killed: hang or crash)" \
                                                              : "FAILED");               \
        CHECK(ok_);                                                                      \
    } while (0)

int main(void)
{
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 30000), 0);
    char path[512];
    CHECK_EQ(tu_build("faults.gguf", &l, ENGRAM_FILL_RANDOM, 0, path, sizeof path), 0);
    engram_model *m = open_model(path);
    if (!m)
        return tu_finish("test_faults");
    const size_t n = 40;
    uint32_t *rows = hashed(m, n, 11, 300);
    uint16_t *w0 = expected(m, 0, rows, n), *w1 = expected(m, 1, rows, n);
    uint32_t *big = hashed(m, ENGRAM_BATCH_TOKENS, 12, 3000);

    SCENARIO("1 close in flight", close_in_flight(m, rows));
    SCENARIO("2 transient reap error", transient_reap(m, rows, w0, w1, n));
    SCENARIO("3 renamed over", renamed_over(&l));
    SCENARIO("4 no allocation", no_allocation(m, big, ENGRAM_BATCH_TOKENS));
    SCENARIO("5 smaller defects", smaller(m, rows, w0, w1, n));

    free(big);
    free(rows);
    free(w0);
    free(w1);
    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_faults");
}
