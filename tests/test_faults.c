/*
 * test_faults.c - the reader under faults, through the io_engine.h seam
 * (fault_engine.h) and wrapped system calls (open, statx), on a real file
 * with every engine: io_uring, the thread pool and the buffered fallback.
 *
 * Linked with -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new,
 * --wrap=open,--wrap=statx (see the Makefile): test builds only.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "../src/format/gguf.h"
#include "../src/output/team.h"
#include "../src/io/rowcache.h"
#include "../src/common/util.h"
#include "fault_engine.h"
#include "testutil.h"

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

/* Allocation failures for library code: calls from the library's objects
 * to malloc/calloc/realloc/strdup/posix_memalign and anonymous mmap are routed here (--wrap); the N-th one
 * fails while armed.  Works under sanitizers too. */
struct lib_alloc_plan {
    long calls, fail_at;  /* fail_at 0: never */
    int armed;
};
static struct lib_alloc_plan lib_alloc;

static int lib_alloc_fails(void)
{
    if (!lib_alloc.armed)
        return 0;
    return ++lib_alloc.calls == lib_alloc.fail_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n) { return lib_alloc_fails() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { return lib_alloc_fails() ? NULL : __real_calloc(a, b); }
int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    return lib_alloc_fails() ? ENOMEM : __real_posix_memalign(p, a, n);
}
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
void *__wrap_realloc(void *p, size_t n) { return lib_alloc_fails() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return lib_alloc_fails() ? NULL : __real_strdup(s); }

/* pread (the GGUF reader's and the model's row reads; the reader's
 * buffered engine): the N-th call while armed fails with EIO. */
static struct lib_alloc_plan preads;
static int pread_errno = EIO; /* the failing call's error (EINTR: to be retried) */
ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (preads.armed && ++preads.calls == preads.fail_at) {
        errno = pread_errno;
        return -1;
    }
    return __real_pread(fd, buf, n, off);
}

/* preadv2 (the thread engine's reads with RWF_DONTCACHE): likewise. */
static struct lib_alloc_plan preadv2s;
ssize_t __real_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __wrap_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __wrap_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
    if (preadv2s.armed && ++preadv2s.calls == preadv2s.fail_at) {
        errno = pread_errno;
        return -1;
    }
    return __real_preadv2(fd, iov, n, off, flags);
}

/* pwrite (the model builder's table and weight fillers, the GGUF
 * writer): the N-th call while armed fails with EIO. */
static struct lib_alloc_plan pwrites;
static int pwrite_zero; /* the failing call writes nothing instead (returns 0) */
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (pwrites.armed && ++pwrites.calls == pwrites.fail_at) {
        if (pwrite_zero)
            return 0;
        errno = EIO;
        return -1;
    }
    return __real_pwrite(fd, buf, n, off);
}

/* Anonymous mappings (the layer's weights) count as allocations too. */
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if ((flags & MAP_ANONYMOUS) && lib_alloc_fails()) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

/* liburing set-up calls and thread creation, failed on demand. */
static struct {
    int queue_init, register_files, register_buffers; /* negative errno to return */
    long thread_fail_at, thread_calls;                /* N-th pthread_create fails */
    int attr_fail;                                    /* pthread_attr_init fails */
} setup;

struct io_uring;
struct io_uring_params;
int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
    return setup.queue_init ? setup.queue_init : __real_io_uring_queue_init_params(entries, ring, p);
}
int __real_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n);
int __wrap_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n);
int __wrap_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n)
{
    return setup.register_files ? setup.register_files : __real_io_uring_register_files(ring, files, n);
}
struct iovec;
int __real_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n)
{
    return setup.register_buffers ? setup.register_buffers
                                  : __real_io_uring_register_buffers(ring, iov, n);
}
/* io_uring_submit: 0 the real one, 1 fails with -EAGAIN (the kernel wants
 * completions reaped first), 2 takes nothing (returns 0, the entries stay). */
static int uring_submit_mode;
int __real_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring)
{
    if (uring_submit_mode == 1)
        return -EAGAIN;
    if (uring_submit_mode == 2)
        return 0;
    return __real_io_uring_submit(ring);
}
int __real_pthread_attr_init(pthread_attr_t *a);
int __wrap_pthread_attr_init(pthread_attr_t *a);
int __wrap_pthread_attr_init(pthread_attr_t *a)
{
    return setup.attr_fail ? ENOMEM : __real_pthread_attr_init(a);
}
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    if (setup.thread_fail_at && ++setup.thread_calls == setup.thread_fail_at)
        return EAGAIN;
    return __real_pthread_create(t, a, fn, arg);
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
            /* really closed (engine destroyed, memory freed), not kept aside */
            CHECK_EQ(fe.destroyed, i + 1);
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
        engram_reader_get_stats(r, &st);
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
    engram_model *m = tu_open_model(a);
    if (!m)
        return;
    uint32_t *rows = tu_hashed(m, 64, 5, 500);
    uint16_t *want = tu_expected(m, 1, rows, 64, ENGRAM_BF16);
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
    for (uint32_t align = 4096; align <= (1u << 20); align *= 2) {
        fe_reset();
        sys.dio_align = align;
        engram_reader_opts ao = {.engine = ENGRAM_IO_AUTO, .depth = 64};
        engram_reader *r = NULL;
        CHECK_EQ(engram_reader_open(m, &ao, &r, &err), 0);
        /* A forced engine needs O_DIRECT: refused, naming the alignment. */
        engram_reader *forced = NULL;
        ao.engine = ENGRAM_IO_URING;
        int frc = engram_reader_open(m, &ao, &forced, &err);
        sys.dio_align = 0;
        if (align > (32u << 10))
            CHECK(frc == -EINVAL && strstr(err.msg, "alignment") != NULL);
        else
            CHECK_EQ(frc, 0);
        engram_reader_close(forced);
        if (!r)
            continue;
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(st.depth > 0);
        CHECK_EQ(st.direct, align <= (32u << 10));
        CHECK_EQ(st.align, align <= (32u << 10) ? align : 1);
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
        /* cut short of the row: each of the 5 is resubmitted (a half could
         * still hold the row, and whether it does depends on which reads
         * complete 3rd to 7th) */
        fe_arm(FE_CQE, 3, FE_CUT, 5);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        CHECK_EQ(fe.fired, 5);
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
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

/* ------------------------------------------------ every fault at every position */

struct fault {
    int op, err;
    int want;            /* the call's documented result: 0 (retried, exact) or the error */
};

static const struct fault faults[] = {
    {FE_QUEUE, -EAGAIN, 0}, {FE_QUEUE, -EBUSY, 0}, {FE_QUEUE, -EIO, -EIO}, {FE_QUEUE, -ENOMEM, -ENOMEM},
    {FE_SUBMIT, -EINTR, 0}, {FE_SUBMIT, -EAGAIN, 0}, {FE_SUBMIT, -EBUSY, 0}, {FE_SUBMIT, -EIO, -EIO},
    {FE_REAP, -EINTR, 0},   {FE_REAP, -EAGAIN, 0},   {FE_REAP, -EBUSY, 0},   {FE_REAP, -EIO, -EIO},
    {FE_CQE, -EAGAIN, 0},   {FE_CQE, -EINTR, 0},     {FE_CQE, FE_SHORT, 0},  {FE_CQE, -EIO, -EIO},
    {FE_CQE, -ENODATA, -ENODATA}, {FE_CQE, FE_EOF, -EIO},
};
#define N_FAULTS (sizeof faults / sizeof faults[0])

static const char *fault_name(const struct fault *f)
{
    static char b[64];
    const char *e = f->err == FE_SHORT ? "short" : f->err == FE_EOF ? "eof" : strerror(-f->err);
    snprintf(b, sizeof b, "%s %s", fe_op_name[f->op], e);
    return b;
}

/* Under ThreadSanitizer every position costs ~10x: there every 5th. */
#if defined(__SANITIZE_THREAD__)
#define STRIDE 5
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRIDE 5
#endif
#endif
#ifndef STRIDE
#define STRIDE 1
#endif

struct sweep_totals {
    long injected, survived;
} totals;

/* Checks one faulted call's outcome against the documented one. */
static int outcome_ok(const struct fault *f, int rc, const engram_error *err, engram_reader *r,
                      uint64_t table_off)
{
    int ok = 1;
    int want = fe.fired ? f->want : 0;
    if (rc != want) {
        fprintf(stderr, "  %s at %ld: rc %d, want %d (%s)\n", fault_name(f), fe.plan.at, rc, want,
                err->msg);
        ok = 0;
    }
    if (rc < 0 && (f->op == FE_CQE || f->op == FE_QUEUE)) {
        /* a read's error names its row and the row's file offset */
        if (err->row == ENGRAM_NO_ROW || err->offset != table_off + err->row * 264) {
            fprintf(stderr, "  %s at %ld: error does not name row and offset: %s\n",
                    fault_name(f), fe.plan.at, err->msg);
            ok = 0;
        }
    }
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    if (st.in_flight != 0 || st.broken) {
        fprintf(stderr, "  %s at %ld: %u reads in flight after the call, broken %d\n",
                fault_name(f), fe.plan.at, st.in_flight, st.broken);
        ok = 0;
    }
    return ok;
}

/* Batches: every fault of the table at every position of a 4-token batch
 * (96 reads, depth 16), then the same batch without faults must be exact. */
static void sweep_batches(engram_model *m, const uint32_t *rows, const uint16_t *w0)
{
    engram_model_info info;
    engram_model_get_info(m, &info);
    const size_t n = 4;
    for (int e = 0; e < 3; e++) {
        long bad = 0, runs = 0;
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0); /* a clean run counts the positions */
        long positions[FE_NOPS];
        memcpy(positions, fe.calls, sizeof positions);
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            for (long at = 1; at <= positions[f->op] + 1; at += STRIDE) {
                fe_arm(f->op, at, f->err, 1);
                memset(&err, 0, sizeof err);
                int rc = batch_eq(r, 0, rows, n, w0, &err);
                fe_disarm();
                int ok = outcome_ok(f, rc, &err, r, info.table[0].offset);
                totals.injected += fe.fired;
                /* the next request is exact */
                ok &= batch_eq(r, 0, rows, n, w0, &err) == 0;
                totals.survived += ok && fe.fired;
                bad += !ok;
                runs++;
            }
        }
        engram_reader_close(r);
        contract_clean(engine_names[e]);
        printf("batch faults, %-8s: %ld faulted batches (positions: %ld queue, %ld submit, %ld reap, "
               "%ld completions), %ld wrong\n",
               engine_names[e], runs, positions[FE_QUEUE], positions[FE_SUBMIT], positions[FE_REAP],
               positions[FE_CQE], bad);
        CHECK_EQ(bad, 0);
    }
}

/* Decode steps: the same, waited for and polled, with depth 16 (three
 * rounds of reads per step). */
static void sweep_steps(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    engram_model_info info;
    engram_model_get_info(m, &info);
    for (int e = 0; e < 3; e++) {
        long bad = 0, runs = 0;
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        long positions[FE_NOPS];
        memcpy(positions, fe.calls, sizeof positions);
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            for (long at = 1; at <= positions[f->op] + 1; at += STRIDE) {
                for (int poll = 0; poll < 2; poll++) {
                    static uint16_t out[48 * 256];
                    memset(out, 0xee, sizeof out);
                    fe_arm(f->op, at, f->err, 1);
                    memset(&err, 0, sizeof err);
                    int rc = engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err);
                    if (rc == 0) {
                        if (poll)
                            while ((rc = engram_reader_step_poll(r, &err)) == -EAGAIN)
                                ;
                        else
                            rc = engram_reader_step_wait(r, &err);
                    }
                    fe_disarm();
                    uint64_t off = err.row != ENGRAM_NO_ROW && err.offset >= info.table[1].offset
                                       ? info.table[1].offset : info.table[0].offset;
                    int ok = outcome_ok(f, rc, &err, r, off);
                    if (rc == 0)
                        ok &= memcmp(out, w0, 24 * 256 * 2) == 0 &&
                              memcmp(out + 24 * 256, w1, 24 * 256 * 2) == 0;
                    totals.injected += fe.fired;
                    ok &= step_eq(r, rows + 48, w0 + 24 * 256, w1 + 24 * 256, &err) == 0;
                    totals.survived += ok && fe.fired;
                    bad += !ok;
                    runs++;
                }
            }
        }
        engram_reader_close(r);
        contract_clean(engine_names[e]);
        printf("step faults,  %-8s: %ld faulted steps (positions: %ld queue, %ld submit, %ld reap, "
               "%ld completions), %ld wrong\n",
               engine_names[e], runs, positions[FE_QUEUE], positions[FE_SUBMIT], positions[FE_REAP],
               positions[FE_CQE], bad);
        CHECK_EQ(bad, 0);
    }
    printf("faults injected %ld, survived with the documented outcome and an exact next request %ld\n",
           totals.injected, totals.survived);
    CHECK_EQ(totals.injected, totals.survived);
}

/* Cancelling a step at every point it can be in, and a cancel the engine
 * refuses: nothing stays in flight, the next step is exact. */
static void cancels(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        static uint16_t out[48 * 256];
        for (int polls = 0; polls < 12; polls++) {
            for (int refuse = 0; refuse < 2; refuse++) {
                CHECK_EQ(engram_reader_step_submit(r, rows + 2 * 48, ENGRAM_BF16, out, &err), 0);
                for (int p = 0; p < polls; p++)
                    if (engram_reader_step_poll(r, &err) != -EAGAIN)
                        break; /* finished before the cancel: then nothing to cancel */
                engram_io_stats st;
                engram_reader_get_stats(r, &st);
                if (refuse)
                    fe_arm(FE_CANCEL, 1, -EIO, 1);
                int rc = engram_reader_step_cancel(r);
                fe_disarm();
                engram_reader_get_stats(r, &st);
                CHECK(rc == 0 || rc == -EINVAL);
                CHECK_EQ(st.in_flight, 0);
                CHECK_EQ(engram_reader_step_wait(r, &err), -EINVAL); /* the step is over */
                CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
            }
        }
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(st.steps_cancelled > 0);
        engram_reader_close(r);
        contract_clean("cancel");
    }
}

/* An engine that stops completing for good: the reader says it is broken,
 * refuses further work, and close() does not free what the kernel may
 * still write to. */
static void engine_dies(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        for (int in_step = 0; in_step < 2; in_step++) {
            fe_reset();
            engram_reader *r = open_reader(m, e, 16);
            if (!r)
                continue;
            engram_error err;
            fe_arm(FE_REAP, 1, -EIO, -1);
            int rc = in_step ? step_eq(r, rows, w0, w1, &err) : batch_eq(r, 0, rows, 4, w0, &err);
            CHECK_EQ(rc, -EIO);
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            CHECK_EQ(st.broken, 1);
            CHECK(st.in_flight > 0);
            rc = batch_eq(r, 0, rows, 4, w0, &err);
            CHECK_ERR(rc, err, -EIO, "unusable");
            rc = step_eq(r, rows, w0, w1, &err);
            CHECK_ERR(rc, err, -EIO, "unusable");
            engram_reader_close(r);
            CHECK_EQ(fe.destroyed, 0); /* buffers and engine kept */
            fe_disarm();
        }
    }
}

/* An engine that refuses reads transiently for ever (a queue that never
 * drains), from the first read and after some are in flight: the reader
 * gives up after its bound with -EAGAIN ("kept refusing"), nothing left in
 * flight or pending, not broken; the next requests are exact.  Polling
 * such a step says "not yet" and the wait that follows gives up the same
 * way.  Then a queue refusing for good (-EIO on every read from the 5th):
 * the error names the row, nothing stays in flight. */
static void engine_refuses(engram_model *m, const uint32_t *rows, const uint16_t *w0,
                           const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        for (int how = 0; how < 8; how++) {
            int in_step = how & 1, late = how & 2, hard = how & 4;
            fe_reset();
            engram_reader *r = open_reader(m, e, 16);
            if (!r)
                continue;
            engram_error err;
            memset(&err, 0, sizeof err);
            fe_arm(FE_QUEUE, late ? 5 : 1, hard ? -EIO : -EAGAIN, -1);
            int rc;
            if (in_step && !hard) {
                static uint16_t out[48 * 256];
                CHECK_EQ(engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err), 0);
                for (int p = 0; p < 3; p++)
                    CHECK_EQ(engram_reader_step_poll(r, &err), -EAGAIN);
                rc = engram_reader_step_wait(r, &err);
            } else {
                rc = in_step ? step_eq(r, rows, w0, w1, &err) : batch_eq(r, 0, rows, 4, w0, &err);
            }
            fe_disarm();
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            if (hard) {
                CHECK_ERR(rc, err, -EIO, "cannot queue");
                CHECK(err.row != ENGRAM_NO_ROW);
            } else {
                CHECK_ERR(rc, err, -EAGAIN, "kept refusing");
                CHECK(st.retries >= 2000);
            }
            CHECK_EQ(st.in_flight, 0);
            CHECK_EQ(st.broken, 0);
            CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
            CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
            engram_reader_close(r);
            contract_clean(engine_names[e]);
        }
        printf("engine refuses, %-8s: for ever (-EAGAIN, from the 1st and the 5th read; batch, "
               "step, polled step): -EAGAIN after the bound; for good (-EIO): the row named; "
               "nothing in flight, next requests exact\n", engine_names[e]);
    }
}

/* Set-up failures: allocation, descriptors, io_uring, threads.  Forced
 * engines fail with the error; the automatic choice falls back where a
 * fallback exists; nothing is left allocated or open. */
static int open_fds(void)
{
    int n = 0;
    char p[64];
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        n += access(p, F_OK) == 0;
    }
    return n;
}

/* An operation swept by fails_in_turn: run makes something (0 or -errno;
 * on an error it also checks that nothing was made); done releases what a
 * successful run made, checking it where a fault was injected (faulted). */
struct op {
    int (*run)(void *ctx, engram_error *err);
    void (*done)(void *ctx, int faulted);
    void *ctx;
};

/* Runs op once with *plan counting its calls, then once per call with
 * that call failed: each run fails with want (msg in its message) or, where
 * a fallback exists, succeeds and done() checks it.  Returns the number of
 * calls; *refused: how many runs failed. */
static long fails_in_turn(const struct op *op, struct lib_alloc_plan *plan, int want,
                          const char *msg, long *refused)
{
    engram_error err;
    *plan = (struct lib_alloc_plan){0, 0, 1};
    CHECK_EQ(op->run(op->ctx, &err), 0);
    plan->armed = 0;
    op->done(op->ctx, 0);
    long total = plan->calls, failed = 0;
    for (long k = 1; k <= total; k++) {
        *plan = (struct lib_alloc_plan){0, k, 1};
        int rc = op->run(op->ctx, &err);
        plan->armed = 0;
        if (rc == 0) {
            op->done(op->ctx, 1);
            continue;
        }
        if (rc != want)
            fprintf(stderr, "call %ld of %ld failed: rc %d (%s)\n", k, total, rc, err.msg);
        CHECK_ERR(rc, err, want, msg);
        failed++;
    }
    if (refused)
        *refused = failed;
    return total;
}

/* A model open, or a GGUF open, that must fail whenever a call fails. */
struct open_ctx {
    const char *path;
    engram_model *m;
    gguf_file *g;
    int gguf;
    uint64_t fail_offset; /* counts failures whose error names this offset */
    long at_offset;
};

static int open_run(void *vc, engram_error *err)
{
    struct open_ctx *c = vc;
    c->m = NULL;
    c->g = NULL;
    int rc = c->gguf ? gguf_open(c->path, &c->g, err) : engram_model_open(c->path, &c->m, err);
    if (rc < 0) {
        CHECK(c->m == NULL && c->g == NULL);
        c->at_offset += err->offset == c->fail_offset;
    }
    return rc;
}

static void open_done(void *vc, int faulted)
{
    struct open_ctx *c = vc;
    CHECK(!faulted); /* no fallback: a failed call must fail the open */
    engram_model_close(c->m);
    gguf_close(c->g);
}

/* A model open (the GGUF reader's header, keys, strings and tensor infos,
 * the layout, the token map, the checks) with every allocation, then every
 * pread, failed in turn: -ENOMEM / -EIO, nothing returned, no descriptor
 * left open; then the decoding reads' one buffer. */
static void model_open_faults(const char *path)
{
    int fds0 = open_fds();
    struct open_ctx c = {.path = path};
    struct op op = {open_run, open_done, &c};
    long allocs = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
    long reads = fails_in_turn(&op, &preads, -EIO, "", NULL);
    CHECK(allocs > 5 && reads > 2);
    CHECK_EQ(open_fds(), fds0);
    printf("model open: each of %ld allocations failed in turn: -ENOMEM; each of %ld reads: -EIO\n",
           allocs, reads);
    engram_error err;
    engram_model *m = NULL;
    /* the decoding reads' one temporary buffer: -ENOMEM, output untouched */
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    uint32_t rows[2] = {0, 1};
    uint16_t out[2 * 256];
    memset(out, 0x5a, sizeof out);
    lib_alloc = (struct lib_alloc_plan){0, 1, 1};
    int rc = engram_model_read_bf16(m, 0, rows, 2, out, &err);
    lib_alloc.armed = 0;
    CHECK_ERR(rc, err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(((uint8_t *)out)[i] == 0x5a);
    CHECK_EQ(engram_model_read_bf16(m, 0, rows, 2, out, &err), 0);
    engram_model_close(m);
}

/* A GGUF string that crosses the reader's 1 MiB read window: a file of one
 * 1.5 MiB string value, opened with each of its reads failed in turn; the
 * read inside the string fails the open with -EIO naming its offset. */
static void long_string_faults(void)
{
    char path[512];
    tu_path(path, sizeof path, "longstr.gguf");
    const uint64_t n = 3u << 19;
    unsigned char head[4 + 4 + 8 + 8 + 8 + 3 + 4 + 8];
    unsigned char *p = head;
    uint32_t version = 3, type = 8; /* a string value */
    uint64_t tensors = 0, kvs = 1, klen = 3;
    memcpy(p, "GGUF", 4), p += 4;
    memcpy(p, &version, 4), p += 4;
    memcpy(p, &tensors, 8), p += 8;
    memcpy(p, &kvs, 8), p += 8;
    memcpy(p, &klen, 8), p += 8;
    memcpy(p, "big", 3), p += 3;
    memcpy(p, &type, 4), p += 4;
    memcpy(p, &n, 8);
    char *str = malloc(n);
    memset(str, 'a', n);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(head, 1, sizeof head, f) == sizeof head && fwrite(str, 1, n, f) == n);
    if (f)
        fclose(f);
    free(str);
    struct open_ctx c = {.path = path, .gguf = 1, .fail_offset = 1u << 20};
    struct op op = {open_run, open_done, &c};
    long reads = fails_in_turn(&op, &preads, -EIO, "read failed", NULL);
    CHECK(reads >= 2);          /* the window, then the rest of the string */
    CHECK_EQ(c.at_offset, 1);   /* one failed read began inside the string */
    unlink(path);
    printf("long string: each of %ld reads failed in turn: -EIO\n", reads);
}

/* Files in the test directory whose names start with prefix. */
static int files_named(const char *prefix)
{
    char probe[512];
    tu_path(probe, sizeof probe, "x");
    probe[strlen(probe) - 1] = '\0'; /* the directory, with its '/' */
    DIR *d = opendir(probe);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* A model build that must leave neither the file nor a temporary one when
 * it fails (all or nothing). */
struct build_ctx {
    const char *path;
    engram_build_opts o;
};

static int build_run(void *vc, engram_error *err)
{
    struct build_ctx *c = vc;
    int rc = engram_build_model(c->path, &c->o, err);
    if (rc < 0)
        CHECK_EQ(files_named("bfault"), 0);
    return rc;
}

static void build_done(void *vc, int faulted)
{
    struct build_ctx *c = vc;
    CHECK(!faulted);
    CHECK_EQ(unlink(c->path), 0);
}

/* engram_build_model with every allocation, then every pwrite, failed in
 * turn, for each way of filling the tables: -ENOMEM / -EIO, no file left. */
static void build_faults(void)
{
    /* small tables (24 x ~300 rows each): a build is ~4 MB of writes */
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 300), 0);
    static const engram_fill fills[] = {ENGRAM_FILL_RANDOM, ENGRAM_FILL_POOL, ENGRAM_FILL_SPARSE,
                                        ENGRAM_FILL_NORMAL};
    static const char *const names[] = {"random", "pool", "sparse", "normal"};
    char path[512];
    tu_path(path, sizeof path, "bfault.gguf");
    for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
        struct build_ctx c = {.path = path, .o = {.layout = l, .fill = fills[i], .width = 16, .seed = 3}};
        struct op op = {build_run, build_done, &c};
        long allocs = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
        long writes = fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL);
        pwrite_zero = 1; /* a write that writes nothing: -EIO, not a loop */
        CHECK_EQ(fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL), writes);
        pwrite_zero = 0;
        CHECK(allocs > 3 && writes > 3);
        printf("model build (%s tables): each of %ld allocations failed in turn: -ENOMEM; "
               "each of %ld writes failed, or wrote nothing: -EIO; no file left\n", names[i], allocs, writes);
    }
}

/* A hasher, a row cache: no fallback, every failed allocation -ENOMEM. */
struct small_ctx {
    const engram_layout *l;
    engram_hasher *h;
    struct rowcache *c;
    int cache;
};

static int small_run(void *vc, engram_error *err)
{
    struct small_ctx *c = vc;
    c->h = NULL;
    c->c = NULL;
    if (!c->cache)
        return engram_hasher_new(c->l, &c->h, err);
    int rc = rowcache_new(1u << 20, &c->c);
    if (rc < 0)
        err_set(err, rc, ENGRAM_NO_OFFSET, "out of memory");
    return rc;
}

static void small_done(void *vc, int faulted)
{
    struct small_ctx *c = vc;
    CHECK(!faulted);
    engram_hasher_free(c->h);
    rowcache_free(c->c);
}

/* The GGUF writer: metadata, tensors and the file, with every allocation
 * failed in turn.  The call whose allocation failed returns -ENOMEM (the
 * others 0: the writer records the failure), and the write then refuses:
 * -ENOMEM, the file empty. */
static void writer_adds(gguf_writer *w, long fail_at, int *wrong)
{
    static const char *const strs[3] = {"x", "yy", "zzz"};
    static uint32_t arr[3000];
    uint64_t dims[2] = {64, 4};
    for (int i = 0; i < 8; i++) {
        char key[32];
        snprintf(key, sizeof key, "key.%d", i);
        long before = lib_alloc.calls;
        int rc;
        switch (i % 4) {
        case 0: rc = gguf_w_str(w, key, "a value"); break;
        case 1: rc = gguf_w_array(w, key, GGUF_U32, arr, 3000); break;
        case 2: rc = gguf_w_array_str(w, key, strs, 3); break;
        default: rc = gguf_w_tensor(w, key, GGML_F32, 2, dims, 0, NULL, NULL); break;
        }
        int here = before < fail_at && lib_alloc.calls >= fail_at;
        *wrong += rc != (here ? -ENOMEM : 0);
    }
}

static void writer_faults(void)
{
    char path[512];
    tu_path(path, sizeof path, "wfault.gguf");
    long total = 0, refused = 0;
    for (long k = 0; k == 0 || k <= total; k++) {
        int wrong = 0;
        lib_alloc = (struct lib_alloc_plan){0, k, 1}; /* k = 0: counts only */
        gguf_writer *w = gguf_writer_new(3, 32);
        if (w)
            writer_adds(w, k, &wrong);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        engram_error err;
        int rc = w ? gguf_w_write_fd(w, fd, &err) : -ENOMEM;
        lib_alloc.armed = 0;
        struct stat st;
        CHECK_EQ(fstat(fd, &st), 0);
        close(fd);
        gguf_writer_free(w);
        CHECK_EQ(wrong, 0);
        if (k == 0) {
            total = lib_alloc.calls;
            CHECK_EQ(rc, 0);
            CHECK(st.st_size > 0);
            continue;
        }
        if (w)
            CHECK_ERR(rc, err, -ENOMEM, "out of memory");
        CHECK_EQ(rc, -ENOMEM);
        CHECK_EQ(st.st_size, 0);
        refused++;
    }
    unlink(path);
    CHECK(total > 5);
    printf("GGUF writer: each of %ld allocations failed in turn: -ENOMEM, nothing written\n", refused);
}

static void small_faults(const engram_layout *l)
{
    for (int cache = 0; cache < 2; cache++) {
        struct small_ctx c = {.l = l, .cache = cache};
        struct op op = {small_run, small_done, &c};
        long n = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
        CHECK(n >= 2);
        printf("%s: each of %ld allocations failed in turn: -ENOMEM\n",
               cache ? "row cache" : "hasher", n);
    }
    writer_faults();
    /* a pool of no workers */
    struct team *pl = NULL;
    CHECK_EQ(team_new(0, &pl), -EINVAL);
    CHECK(pl == NULL);
    /* threads that cannot even get their attributes: -ENOMEM, nothing left */
    setup.attr_fail = 1;
    CHECK_EQ(team_new(4, &pl), -ENOMEM);
    CHECK(pl == NULL);
    setup.attr_fail = 0;
}

/* Reaps want completions from an engine driven directly (each reap waits
 * for at least one); returns how many arrived before an error. */
static int reap_all(struct io_engine *e, struct io_cqe *cq, int want)
{
    int n = 0;
    while (n < want) {
        int k = e->ops->reap(e, cq + n, (unsigned)(want - n), 1);
        CHECK(k > 0);
        if (k <= 0)
            break;
        n += k;
    }
    return n;
}

/* The engines at their limits, driven directly (not through a reader). */
static void engine_limits(void)
{
    /* the thread engine holds as many reads as it has workers: one more is
     * refused with -EBUSY (transient), and those it took arrive */
    char path[512];
    tu_path(path, sizeof path, "eng.bin");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    static unsigned char data[3 * 4096], got[3][4096];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7 + 1);
    CHECK(fd >= 0 && write(fd, data, sizeof data) == (ssize_t)sizeof data);
    struct io_engine *e = NULL;
    CHECK_EQ(__real_io_threads_engine_new(fd, 2, DROP_NONE, &e), 0);
    if (e) {
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 0), 0);
        CHECK_EQ(e->ops->queue(e, 1, got[1], 4096, 4096), 0);
        CHECK_EQ(e->ops->queue(e, 2, got[2], 4096, 8192), -EBUSY);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[2];
        int n = reap_all(e, cq, 2);
        for (int i = 0; i < n; i++)
            CHECK(cq[i].slot < 2 && cq[i].res == 4096);
        CHECK(memcmp(got[0], data, 4096) == 0 && memcmp(got[1], data + 4096, 4096) == 0);
        e->ops->destroy(e);
    }
    /* the thread engine's read system call failing: EIO completes the read
     * with -EIO (pread, and preadv2 with RWF_DONTCACHE); EINTR is retried
     * and the read completes exact (pread) */
    const struct { int dontcache, eno; } calls[3] = {{0, EIO}, {1, EIO}, {0, EINTR}};
    for (int k = 0; k < 3; k++) {
        struct lib_alloc_plan *pl = calls[k].dontcache ? &preadv2s : &preads;
        e = NULL;
        CHECK_EQ(__real_io_threads_engine_new(fd, 2, calls[k].dontcache ? DROP_DONTCACHE : DROP_NONE, &e), 0);
        if (!e)
            continue;
        memset(got, 0, sizeof got);
        pread_errno = calls[k].eno;
        *pl = (struct lib_alloc_plan){.fail_at = 1, .armed = 1};
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 4096), 0);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[1];
        int n = reap_all(e, cq, 1);
        pl->armed = 0;
        pread_errno = EIO;
        CHECK(pl->calls >= 1); /* the failure was injected */
        if (n == 1 && calls[k].eno == EIO)
            CHECK_EQ(cq[0].res, -EIO);
        else if (n == 1)
            CHECK(cq[0].res == 4096 && memcmp(got[0], data + 4096, 4096) == 0);
        e->ops->destroy(e);
    }
    /* io_uring with its submission ring full (4 entries, none submitted):
     * a 5th read or a cancel submits early; if the kernel refuses that
     * (-EAGAIN) or takes nothing, the call fails transiently (-EAGAIN /
     * -EBUSY) with nothing queued; then the 5th read goes, all five arrive */
    char note[128];
    static unsigned char ubuf[5][4096] __attribute__((aligned(4096)));
    e = NULL;
    CHECK_EQ(__real_io_uring_engine_new(fd, 4, ubuf, sizeof ubuf, 0, &e, note, sizeof note), 0);
    if (e) {
        memset(ubuf, 0, sizeof ubuf);
        for (unsigned i = 0; i < 4; i++)
            CHECK_EQ(e->ops->queue(e, i, ubuf[i], 4096, (i % 3) * 4096), 0);
        uring_submit_mode = 1;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), -EAGAIN);
        CHECK_EQ(e->ops->cancel(e), -EAGAIN);
        uring_submit_mode = 2;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), -EBUSY);
        CHECK_EQ(e->ops->cancel(e), -EBUSY);
        uring_submit_mode = 0;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), 0);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[5];
        int n = reap_all(e, cq, 5);
        unsigned seen = 0;
        for (int i = 0; i < n; i++) {
            CHECK(cq[i].slot < 5 && cq[i].res == 4096);
            seen |= 1u << cq[i].slot;
        }
        CHECK_EQ(seen, 31);
        for (unsigned i = 0; i < 5; i++)
            CHECK(memcmp(ubuf[i], data + (i < 4 ? (i % 3) : 1) * 4096, 4096) == 0);
        e->ops->destroy(e);
    }
    printf("thread engine: a read past its 2 workers -EBUSY, the 2 taken delivered; its pread and "
           "preadv2 failing with EIO: -EIO, with EINTR: retried, exact; io_uring, "
           "its 4-entry ring full: a refused (-EAGAIN) or empty submit fails the 5th read and a "
           "cancel transiently, then all 5 delivered\n");
    close(fd);
    unlink(path);
}

/* A reader open: where an allocation fails, either -ENOMEM or (io_uring's
 * own allocation under the automatic choice) the thread pool, exact. */
struct reader_ctx {
    engram_model *m;
    engram_reader_opts o;
    engram_reader *r;
    const uint32_t *rows;
    const uint16_t *w0;
};

static int reader_run(void *vc, engram_error *err)
{
    struct reader_ctx *c = vc;
    c->r = NULL;
    int rc = engram_reader_open(c->m, &c->o, &c->r, err);
    if (rc < 0)
        CHECK(c->r == NULL);
    return rc;
}

static void reader_done(void *vc, int faulted)
{
    struct reader_ctx *c = vc;
    if (faulted) {
        engram_io_stats st;
        engram_error err;
        engram_reader_get_stats(c->r, &st);
        CHECK(c->o.engine == ENGRAM_IO_AUTO && strcmp(st.engine, "threads") == 0);
        CHECK_EQ(batch_eq(c->r, 0, c->rows, 4, c->w0, &err), 0);
    }
    engram_reader_close(c->r);
}

static void setup_faults(engram_model *m, const uint32_t *rows, const uint16_t *w0)
{
    engram_error err;
    int fds0 = open_fds();
    /* Every allocation of an open, failed in turn, for every engine with and
     * without a row cache. */
    for (int e = 0; e < 4; e++) {
        struct reader_ctx c = {m, {.engine = e < 3 ? engines[e] : ENGRAM_IO_AUTO, .depth = 16,
                                   .cache_bytes = e == 3 ? 1u << 20 : 0}, NULL, rows, w0};
        struct op op = {reader_run, reader_done, &c};
        long failed_ok;
        long total = fails_in_turn(&op, &lib_alloc, -ENOMEM, "", &failed_ok);
        CHECK(failed_ok > 0);
        printf("set-up: %ld allocations of a %s%s open failed in turn (%ld refused with ENOMEM)\n",
               total, e < 3 ? engine_names[e] : "automatic", e == 3 ? " + cache" : "", failed_ok);
    }
    /* Descriptors. */
    sys.open_errno = EMFILE;
    engram_reader *r = NULL;
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), -EMFILE);
    sys.open_errno = 0;
    /* io_uring refused at set-up: forced fails, automatic takes threads. */
    int codes[2] = {-ENOMEM, -EPERM};
    for (int c = 0; c < 2; c++) {
        setup.queue_init = codes[c];
        engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = 16};
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), codes[c]);
        o.engine = ENGRAM_IO_AUTO;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(strcmp(st.engine, "threads") == 0 && strstr(st.note, "io_uring refused") != NULL);
        CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
        engram_reader_close(r);
        setup.queue_init = 0;
    }
    /* No fixed file / no fixed buffers: io_uring still reads, and says so. */
    setup.register_files = -EMFILE;
    setup.register_buffers = -ENOMEM;
    engram_reader_opts ou = {.engine = ENGRAM_IO_URING, .depth = 16};
    CHECK_EQ(engram_reader_open(m, &ou, &r, &err), 0);
    setup.register_files = setup.register_buffers = 0;
    if (r) {
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(strstr(st.note, "no fixed file") && strstr(st.note, "no fixed buffers"));
        CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
        engram_reader_close(r);
    }
    /* A thread that cannot be started, at every position of the pool. */
    for (int e = 1; e < 3; e++) {
        for (long k = 1; k <= 16; k++) {
            setup.thread_fail_at = k;
            setup.thread_calls = 0;
            engram_reader_opts o = {.engine = engines[e], .depth = 16};
            int rc = engram_reader_open(m, &o, &r, &err);
            setup.thread_fail_at = 0;
            CHECK_ERR(rc, err, -EAGAIN, "threads");
        }
    }
    CHECK_EQ(open_fds(), fds0);
}

/* ------------------------------------------------ sessions, prefetch, apply */

/* Decode steps through a pool under every fault at every position of a
 * one-token step (48 reads): the step's result is the documented one (0
 * with exact rows where the fault is retried, else the error with the
 * history unchanged), and the session and pool stay usable: the next step
 * is exact.  fresh = steps of a model whose rows nothing has read yet. */
static engram_pool *fault_pool(engram_model *m, int e)
{
    engram_pool_opts o = {.reader = {.engine = engines[e], .depth = 16}};
    engram_pool *p = NULL;
    engram_error err;
    CHECK_EQ(engram_pool_open(m, &o, &p, &err), 0);
    return p;
}

static int session_step(engram_session *s, uint32_t tok, uint16_t *out, engram_error *err)
{
    memset(out, 0xee, 48 * 256 * 2);
    int rc = engram_step_begin(s, &tok, NULL, 1, ENGRAM_BF16, out, err);
    if (rc < 0)
        return rc;
    int r0 = engram_step_wait(s, 0, err);
    int r1 = r0 == 0 ? engram_step_wait(s, 1, err) : 0;
    int rc2 = engram_step_commit(s, 1, err);
    return r0 < 0 ? r0 : r1 < 0 ? r1 : rc2;
}

static void session_faults(engram_model *m)
{
    const size_t n = 64;
    uint32_t tok[64];
    uint64_t seed = 77;
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 3000);
    static uint16_t out[48 * 256];
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0) {
            CHECK(0);
            continue;
        }
        long injected = 0, survived = 0, bad = 0;
        size_t i = 0; /* next token of the stream */
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            long maxpos = f->op == FE_QUEUE || f->op == FE_CQE ? 48 : 4;
            for (long at = 1; at <= maxpos; at += STRIDE) {
                engram_history h0, h1;
                engram_session_history(s, &h0);
                uint32_t ids[48];
                engram_history hx = h0;
                engram_hash_token(engram_model_hasher(m), &hx, tok[i % n], 0, ids);
                uint16_t *w0 = tu_expected(m, 0, ids, 1, ENGRAM_BF16);
                uint16_t *w1 = tu_expected(m, 1, ids, 1, ENGRAM_BF16);
                fe_arm(f->op, at, f->err, 1);
                int rc = session_step(s, tok[i % n], out, &err);
                fe_disarm();
                long fired = fe_fired();
                injected += fired;
                engram_session_history(s, &h1);
                int ok = 1;
                if (rc == 0) {
                    /* retried, or the fault hit a call after this step's reads
                     * were all in (the pool's I/O thread runs on its own):
                     * either way the rows must be exact */
                    ok = memcmp(out, w0, 24 * 512) == 0 && memcmp(out + 24 * 256, w1, 24 * 512) == 0 &&
                         memcmp(&h1, &hx, sizeof h1) == 0;
                    i++;
                } else {
                    ok = fired > 0 && rc == f->want && memcmp(&h1, &h0, sizeof h1) == 0;
                }
                /* usable afterwards: the same token again, exact */
                if (rc < 0) {
                    int rc2 = session_step(s, tok[i % n], out, &err);
                    engram_session_history(s, &h1);
                    ok = ok && rc2 == 0 && memcmp(out, w0, 24 * 512) == 0 &&
                         memcmp(out + 24 * 256, w1, 24 * 512) == 0 && memcmp(&h1, &hx, sizeof h1) == 0;
                    i++;
                }
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  session %s, %s at %ld: rc %d (%s)\n", engine_names[e],
                            fault_name(f), at, rc, err.msg);
                survived += ok && fired;
                free(w0);
                free(w1);
            }
        }
        engram_pool_stats st;
        engram_pool_get_stats(p, &st);
        CHECK_EQ(st.io.in_flight, 0);
        CHECK_EQ(st.io.broken, 0);
        engram_session_close(s);
        engram_pool_close(p);
        contract_clean("session faults");
        CHECK_EQ(bad, 0);
        printf("session steps, %-8s: %ld faults injected, %ld survived with the documented outcome "
               "and an exact next step\n", engine_names[e], injected, survived);
        totals.injected += injected;
        totals.survived += survived;
    }
}

/* A pool whose engine dies for good (every reap fails): the step that hit
 * it and a prefill in progress fail with -EIO and their histories stay; the pool reports itself broken
 * and refuses every later step, batch and prefill with -EIO, histories
 * unchanged; closing the sessions and the pool neither hangs nor frees what
 * the kernel may still write to. */
static void pool_dies(engram_model *m)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s = NULL, *t = NULL;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0 || engram_session_open(p, &t, &err) < 0) {
            CHECK(0);
            engram_session_close(s);
            engram_pool_close(p);
            continue;
        }
        static uint16_t out[2][48 * 256];
        uint32_t tok[2] = {5, 6};
        CHECK_EQ(session_step(s, tok[0], out[0], &err), 0);
        engram_history hs, ht, h;
        engram_session_history(s, &hs);
        engram_session_history(t, &ht);
        /* t: a prefill of 3 chunks through a ring of 1, so chunks 1 and 2
         * cannot have been read when the engine dies */
        static uint32_t ptok[120];
        for (unsigned i = 0; i < 120; i++)
            ptok[i] = (i * 37 + 11) % 3000;
        engram_prefill_opts po = {.chunk_tokens = 40, .ring_chunks = 1, .dtype = ENGRAM_BF16};
        engram_prefill *tpf = NULL;
        CHECK_EQ(engram_prefill_begin(t, ptok, NULL, 120, &po, &tpf, &err), 0);
        fe_arm(FE_REAP, 1, -EIO, -1);
        CHECK_EQ(session_step(s, tok[1], out[0], &err), -EIO);
        if (tpf) {
            const void *rows;
            int rc0 = engram_prefill_wait(tpf, 0, 0, &rows, NULL, NULL, &err);
            CHECK(rc0 == 0 || rc0 == -EIO);
            if (rc0 == 0) {
                engram_prefill_release(tpf, 0, 0);
                CHECK_EQ(engram_prefill_wait(tpf, 0, 1, &rows, NULL, NULL, &err), -EIO);
            }
            CHECK_EQ(engram_prefill_end(tpf, &err), -EIO);
        }
        engram_pool_stats st;
        engram_pool_get_stats(p, &st);
        CHECK_EQ(st.io.broken, 1);
        int rc = engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out[0], &err);
        CHECK_ERR(rc, err, -EIO, "");
        engram_session *ss[2] = {s, t};
        void *outs[2] = {out[0], out[1]};
        CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EIO);
        engram_prefill *pf = NULL;
        CHECK_EQ(engram_prefill_begin(t, tok, NULL, 2, NULL, &pf, &err), -EIO);
        CHECK(pf == NULL);
        engram_session_history(s, &h);
        CHECK(memcmp(&h, &hs, sizeof h) == 0);
        engram_session_history(t, &h);
        CHECK(memcmp(&h, &ht, sizeof h) == 0);
        engram_session_close(s);
        engram_session_close(t);
        engram_pool_close(p);
        CHECK_EQ(fe.destroyed, 0); /* the dead engine's buffers are kept */
        fe_disarm();
        printf("pool dies, %-8s: the step and the prefill in flight -EIO, then step, batch and prefill refused "
               "with -EIO, histories unchanged\n", engine_names[e]);
    }
}

/* Prefills under faults at positions spread over their reads: either every
 * chunk is exact and the history moves on, or a wait and the end report
 * the error and the history stays; the next prefill is exact. */
static int prefill_run(engram_session *s, const uint32_t *tok, size_t n, const uint16_t *w0,
                       const uint16_t *w1, engram_error *err, int *exact)
{
    engram_prefill_opts o = {.chunk_tokens = 40, .ring_chunks = 2, .dtype = ENGRAM_BF16};
    engram_prefill *pf;
    int rc = engram_prefill_begin(s, tok, NULL, n, &o, &pf, err);
    if (rc < 0)
        return rc;
    *exact = 1;
    int first_err = 0;
    for (size_t c = 0; c < engram_prefill_chunks(pf) && first_err == 0; c++)
        for (int t = 0; t < 2; t++) {
            const void *rows;
            size_t first, nt;
            int r = engram_prefill_wait(pf, t, c, &rows, &first, &nt, err);
            if (r < 0) {
                first_err = r;
                break;
            }
            const uint16_t *w = t ? w1 : w0;
            if (memcmp(rows, w + first * 24 * 256, nt * 24 * 512) != 0)
                *exact = 0;
            engram_prefill_release(pf, t, c);
        }
    engram_error e2;
    int end = engram_prefill_end(pf, first_err ? &e2 : err);
    return first_err ? first_err : end;
}

static void prefill_faults(engram_model *m)
{
    const size_t n = 120; /* 3 chunks of 40 tokens: 5,760 reads */
    uint32_t *tok = malloc(n * sizeof *tok), *ids = malloc(n * 48 * sizeof *ids);
    uint64_t seed = 78;
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 3000);
    engram_history h0, hend;
    engram_history_reset(&h0);
    hend = h0;
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &hend, tok, NULL, n, ids, NULL), 0);
    uint16_t *w0 = tu_expected(m, 0, ids, n, ENGRAM_BF16), *w1 = tu_expected(m, 1, ids, n, ENGRAM_BF16);
    static const long spots[] = {1, 2, 48, 1000, 5000};
    /* one fault of each kind (the step sweep above takes every one) */
    static const struct fault pf_faults[] = {
        {FE_QUEUE, -EIO, -EIO}, {FE_SUBMIT, -EINTR, 0}, {FE_REAP, -EIO, -EIO},
        {FE_CQE, FE_SHORT, 0},  {FE_CQE, -EIO, -EIO},   {FE_CQE, FE_EOF, -EIO},
    };
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0) {
            CHECK(0);
            continue;
        }
        long injected = 0, survived = 0, bad = 0;
        for (size_t k = 0; k < sizeof pf_faults / sizeof pf_faults[0]; k++) {
            const struct fault *f = &pf_faults[k];
            for (size_t q = 0; q < sizeof spots / sizeof spots[0]; q += (size_t)STRIDE > 1 ? 2 : 1) {
                long at = spots[q];
                if ((f->op == FE_SUBMIT || f->op == FE_REAP) && at > 48)
                    continue;
                CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
                if (getenv("TF_VERBOSE"))
                    fprintf(stderr, "prefill %s %s at %ld\n", engine_names[e], fault_name(f), at);
                fe_arm(f->op, at, f->err, 1);
                int exact = 0;
                int rc = prefill_run(s, tok, n, w0, w1, &err, &exact);
                fe_disarm();
                long fired = fe_fired();
                injected += fired;
                engram_history h1;
                engram_session_history(s, &h1);
                int ok = rc == 0 ? exact && !memcmp(&h1, &hend, sizeof h1) /* as for steps */
                                 : fired > 0 && rc == f->want && !memcmp(&h1, &h0, sizeof h1);
                /* usable afterwards */
                int rc2 = 0;
                if (rc < 0) {
                    CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
                    rc2 = prefill_run(s, tok, n, w0, w1, &err, &exact);
                    engram_session_history(s, &h1);
                    ok = ok && rc2 == 0 && exact && !memcmp(&h1, &hend, sizeof h1);
                }
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  prefill %s, %s at %ld: rc %d, then %d (%s)\n", engine_names[e],
                            fault_name(f), at, rc, rc2, err.msg);
                survived += ok && fired;
            }
        }
        engram_session_close(s);
        engram_pool_close(p);
        contract_clean("prefill faults");
        CHECK_EQ(bad, 0);
        printf("prefills,       %-8s: %ld faults injected, %ld survived with the documented outcome "
               "and an exact next prefill\n", engine_names[e], injected, survived);
        totals.injected += injected;
        totals.survived += survived;
    }
    free(tok);
    free(ids);
    free(w0);
    free(w1);
}

/* Set-up of the output stage and of sessions: every allocation and thread
 * start failed in turn: -ENOMEM / -EAGAIN, nothing leaked (LeakSanitizer in
 * the sanitizer build), and the same call then succeeds. */
static void apply_session_setup_faults(void)
{
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 3000), 0);
    char path[512];
    CHECK_EQ(tu_build("faults-w16.gguf", &l, ENGRAM_FILL_NORMAL, 16, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    if (!m)
        return;
    engram_error err;
    const char *names[] = {"engram_layer_open", "engram_applier_new (4 threads)", "engram_pool_open",
                           "engram_session_open", "engram_prefill_begin"};
    for (int what = 0; what < 5; what++) {
        engram_layer *L = NULL;
        engram_applier *A = NULL;
        engram_pool *p = NULL;
        engram_session *s = NULL;
        engram_prefill *pf = NULL;
        if (what >= 1)
            CHECK_EQ(engram_layer_open(m, 0, &L, &err), 0);
        /* rings are not kept (a cache of 1 byte): every begin allocates
         * its own, so its allocation fails in turn too */
        engram_pool_opts nocache = {.ring_cache_bytes = 1};
        if (what >= 3)
            CHECK_EQ(engram_pool_open(m, &nocache, &p, &err), 0);
        if (what >= 4)
            CHECK_EQ(engram_session_open(p, &s, &err), 0);
        uint32_t tok[300];
        for (int i = 0; i < 300; i++)
            tok[i] = (uint32_t)i * 7;
        engram_apply_opts ao = {.threads = 4};
        engram_prefill_opts po = {.chunk_tokens = 100, .dtype = ENGRAM_BF16};
        long total = 0, refused = 0;
        for (long k = 0;; k++) {
            lib_alloc = (struct lib_alloc_plan){0, k, 1}; /* k = 0: counts only */
            int rc;
            engram_layer *L2 = NULL;
            engram_session *s2 = NULL;
            engram_pool *p2 = NULL;
            switch (what) {
            case 0: rc = engram_layer_open(m, 0, &L2, &err); break;
            case 1: rc = engram_applier_new(L, &ao, &A, &err); break;
            case 2: rc = engram_pool_open(m, NULL, &p2, &err); break;
            case 3: rc = engram_session_open(p, &s2, &err); break;
            default: rc = engram_prefill_begin(s, tok, NULL, 300, &po, &pf, &err); break;
            }
            lib_alloc.armed = 0;
            if (k == 0)
                total = lib_alloc.calls;
            if (k > 0 && rc < 0) {
                CHECK_EQ(rc, -ENOMEM);
                refused++;
            }
            if (k > 0)
                CHECK(rc == 0 || rc == -ENOMEM);
            engram_layer_close(L2);
            engram_applier_free(A);
            A = NULL;
            engram_pool_close(p2);
            engram_session_close(s2);
            if (pf)
                engram_prefill_cancel(pf);
            pf = NULL;
            if (k >= total)
                break;
        }
        /* threads that cannot be started */
        long tfail = 0;
        if (what == 1 || what == 2)
            for (long k = 1; k <= (what == 1 ? 3 : 1); k++) {
                setup.thread_fail_at = k;
                setup.thread_calls = 0;
                engram_pool *p2 = NULL;
                int rc = what == 1 ? engram_applier_new(L, &ao, &A, &err)
                                   : engram_pool_open(m, NULL, &p2, &err);
                setup.thread_fail_at = 0;
                CHECK(rc == -EAGAIN);
                tfail += rc == -EAGAIN;
                engram_applier_free(A);
                A = NULL;
                engram_pool_close(p2);
            }
        /* the others succeeded through a fallback (io_uring's own set-up:
         * the thread pool takes over): only the pool's open has one */
        CHECK(what == 2 ? refused >= total - 1 : refused == total);
        printf("set-up: %ld allocations of %s failed in turn (%ld refused with ENOMEM, the others "
               "taken by a fallback)%s\n", total, names[what], refused,
               tfail ? "; each thread start failed in turn: -EAGAIN" : "");
        engram_session_close(s);
        engram_pool_close(p);
        engram_layer_close(L);
    }
    engram_model_close(m);
}

/* Each scenario runs in a child process with a time limit, so that a hang
 * (a wait for reads that will never complete) is a failure, not a stuck
 * suite. */
#define SCENARIO(name, call)                                                             \
    do {                                                                                 \
        if (getenv("TF_ONLY") && !strstr(name, getenv("TF_ONLY")))                       \
            break;                                                                       \
        fflush(stdout);                                                                  \
        pid_t pid_ = fork();                                                             \
        if (pid_ == 0) {                                                                 \
            tu_failures = 0;                                                             \
            alarm(120);                                                                  \
            call;                                                                        \
            fflush(stdout);                                                              \
            exit(tu_failures ? 1 : 0);                                                \
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
    static engram_model *m;
    m = tu_open_model(path);
    if (!m)
        return tu_finish("test_faults");
    /* Fixtures live in statics: the scenario children exit with them still
     * allocated, and LeakSanitizer must see them as reachable. */
    const size_t n = 40;
    static uint32_t *rows, *big;
    static uint16_t *w0, *w1;
    rows = tu_hashed(m, n, 11, 300);
    w0 = tu_expected(m, 0, rows, n, ENGRAM_BF16);
    w1 = tu_expected(m, 1, rows, n, ENGRAM_BF16);
    big = tu_hashed(m, ENGRAM_BATCH_TOKENS, 12, 3000);

    SCENARIO("1 close in flight", close_in_flight(m, rows));
    SCENARIO("2 transient reap error", transient_reap(m, rows, w0, w1, n));
    SCENARIO("3 renamed over", renamed_over(&l));
    SCENARIO("4 no allocation", no_allocation(m, big, ENGRAM_BATCH_TOKENS));
    SCENARIO("5 smaller defects", smaller(m, rows, w0, w1, n));
    SCENARIO("faults in batches", sweep_batches(m, rows, w0));
    SCENARIO("faults in steps", sweep_steps(m, rows, w0, w1));
    SCENARIO("step cancel", cancels(m, rows, w0, w1));
    SCENARIO("engine dies", engine_dies(m, rows, w0, w1));
    SCENARIO("engine refuses for ever", engine_refuses(m, rows, w0, w1));
    SCENARIO("set-up faults", setup_faults(m, rows, w0));
    SCENARIO("model open: every allocation", model_open_faults(path));
    SCENARIO("model open: a long string", long_string_faults());
    SCENARIO("hasher, cache, writer, pool", small_faults(&l));
    SCENARIO("engines at their limits", engine_limits());
    SCENARIO("model build: every alloc/write", build_faults());
    SCENARIO("faults in session steps", session_faults(m));
    SCENARIO("faults in prefills", prefill_faults(m));
    SCENARIO("session pool dies", pool_dies(m));
    SCENARIO("set-up: apply and sessions", apply_session_setup_faults());

    free(big);
    free(rows);
    free(w0);
    free(w1);
    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_faults");
}
