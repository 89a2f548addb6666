/* testutil.h - tiny test harness shared by the test programs: CHECK macros,
 * a private temporary directory, and small-model helpers (a layout, a
 * built model, opened, its rows hashed and read the exact way).  Each test
 * program exits 0 on pass and 1 on failure.  cuda/'s programs include it
 * as C++ (hence the casts of malloc's result). */
#ifndef ENGRAM_TESTUTIL_H
#define ENGRAM_TESTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"

/* 1 in a build with ASan or TSan (gcc's and clang's spellings): tests run
 * lighter there, every step being several times slower. */
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
/* 1 in a TSan build: parts that run on the caller's thread alone (compute
 * kernels held to each other or to a reference) are left to the other
 * builds (gcc, ASan+UBSan, clang), TSan having no second thread to see. */
#if defined(__SANITIZE_THREAD__)
#define TSANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSANITIZED 1
#endif
#endif
#ifndef TSANITIZED
#define TSANITIZED 0
#endif

/* Under TSan, loops over the reader's engines leave out the buffered
 * fallback: it is the thread pool's engine (src/io/io_threads.c, the same
 * queue, workers and completions) over a descriptor opened without
 * O_DIRECT, differing only inside a worker's own read, so the pool's engine
 * run under TSan covers its synchronization; the other builds run it. */
static inline int tsan_dup_engine(engram_io_engine e)
{
    return TSANITIZED && e == ENGRAM_IO_BUFFERED;
}

/* Under TSan the readers' own tests (test_reader, test_ple_reader) run the
 * thread pool alone: io_uring reads on the caller's thread (the kernel's
 * writes are not TSan's to see), and the buffered fallback is the pool's
 * code (above); both are the other builds' part. */
static inline int tsan_reader_skips(engram_io_engine e)
{
    return TSANITIZED && (e == ENGRAM_IO_URING || tsan_dup_engine(e));
}

static int tu_failures, tu_checks;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        tu_checks++;                                                                 \
        if (!(cond)) {                                                               \
            tu_failures++;                                                           \
            if (tu_failures <= 50)                                                   \
                fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECK_EQ(a, b)                                                               \
    do {                                                                             \
        unsigned long long va_ = (unsigned long long)(a), vb_ = (unsigned long long)(b); \
        tu_checks++;                                                                 \
        if (va_ != vb_) {                                                            \
            tu_failures++;                                                           \
            if (tu_failures <= 50)                                                   \
                fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %llu, %s = %llu\n",   \
                        __FILE__, __LINE__, #a, va_, #b, vb_);                       \
        }                                                                            \
    } while (0)

/* Checks a library error: the code, and that the message mentions `needle`. */
#define CHECK_ERR(rc, err, want, needle)                                             \
    do {                                                                             \
        CHECK_EQ((rc), (want));                                                      \
        CHECK((err).code == (want));                                                 \
        if (strstr((err).msg, (needle)) == NULL) {                                   \
            tu_failures++;                                                           \
            fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__,  \
                    (err).msg, (needle));                                            \
        }                                                                            \
    } while (0)

static inline int tu_finish(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

/* A private directory under $TMPDIR (or /tmp), removed by tu_cleanup, and
 * also, by the process that made it only (forked scenario children leave
 * through exit() too), at exit() on a path that never reached tu_cleanup
 * (a fatal error) and on TERM, INT, HUP (an interrupted suite: run.sh
 * sends TERM) or ALRM (a test's alarm() limit), where the disposition was
 * the default.  The signal's handler does only async-signal-safe work: it
 * unblocks the signal (an exec keeps the mask, and not every shell clears
 * it) and execs a shell that removes the directory and then sends itself
 * the same signal, so the test still ends killed by it.  Still left
 * behind: a directory after _exit(), abort() or a sanitizer's report. */
#define TU_SIGS 4
static const int tu_sigs[TU_SIGS] = {SIGTERM, SIGINT, SIGHUP, SIGALRM};
static char tu_dir[256];
static pid_t tu_dir_owner;
static char tu_dir_rm[TU_SIGS][400]; /* the shell commands, one a signal */

static inline void tu_cleanup(void);

static inline void tu_cleanup_at_exit(void)
{
    if (tu_dir[0] && getpid() == tu_dir_owner)
        tu_cleanup();
}

static inline void tu_cleanup_on_signal(int sig)
{
    int k = 0;
    while (k < TU_SIGS - 1 && tu_sigs[k] != sig)
        k++;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    if (tu_dir[0] && getpid() == tu_dir_owner && tu_dir_rm[k][0]) {
        static char sh[] = "sh", c[] = "-c";
        char *const argv[] = {sh, c, tu_dir_rm[k], NULL};
        sigprocmask(SIG_UNBLOCK, &set, NULL); /* the exec resets the handler */
        execv("/bin/sh", argv);
    }
    signal(sig, SIG_DFL); /* the exec failed, or not ours: die of it */
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
}

static inline const char *tu_tmpdir(void)
{
    if (!tu_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tu_dir, sizeof tu_dir, "%s/engram-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tu_dir)) {
            perror("mkdtemp");
            exit(2);
        }
        static int hooked;
        tu_dir_owner = getpid();
        static const char *names[TU_SIGS] = {"TERM", "INT", "HUP", "ALRM"};
        for (int k = 0; k < TU_SIGS; k++) /* the directory's name holds no quote */
            snprintf(tu_dir_rm[k], sizeof tu_dir_rm[k], "rm -rf '%s'; kill -s %s $$", tu_dir, names[k]);
        if (!hooked) {
            hooked = 1;
            atexit(tu_cleanup_at_exit);
            for (int k = 0; k < TU_SIGS; k++) {
                struct sigaction old, sa;
                memset(&sa, 0, sizeof sa);
                sa.sa_handler = tu_cleanup_on_signal;
                sigemptyset(&sa.sa_mask);
                /* a disposition the test or its caller chose (ignored, a
                 * handler of its own) stays */
                if (sigaction(tu_sigs[k], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
                    sigaction(tu_sigs[k], &sa, NULL);
            }
        }
    }
    return tu_dir;
}

static inline void tu_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tu_tmpdir(), name);
}

static inline void tu_cleanup(void)
{
    if (tu_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cleanup of %s failed\n", tu_dir);
        tu_dir[0] = 0; /* gone: a later tu_tmpdir makes another */
    }
}

/* Resident pages of path's bytes [lo, hi), counted with mincore() on a
 * mapping of it (mapping alone reads nothing); UINT64_MAX on failure. */
static inline uint64_t tu_resident(const char *path, uint64_t lo, uint64_t hi)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    fstat(fd, &st);
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return UINT64_MAX;
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (len + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = (unsigned char *)malloc(pages);
    uint64_t n = 0;
    if (mincore(p, len, vec) == 0)
        for (size_t i = lo / (size_t)page; i < pages && i * (size_t)page < hi; i++)
            n += vec[i] & 1;
    else
        n = UINT64_MAX;
    free(vec);
    munmap(p, len);
    return n;
}

/* Drops path's pages from the page cache. */
static inline void tu_evict(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static inline uint64_t tu_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t tu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void tu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* 1 if thread tid of this process is exiting: its stat's flags (the 7th
 * field after the command's closing parenthesis) hold PF_EXITING (0x4), set
 * when the thread begins to exit, before pthread_join can return for it,
 * though it stays in /proc a moment longer; or it is a zombie, or gone. */
static inline int tu_task_exiting(const char *tid)
{
    char path[320], buf[512]; /* tid: a d_name, at most 255 bytes */
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    char state = 0;
    unsigned long flags = 0;
    if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2)
        return 1;
    return state == 'Z' || state == 'X' || (flags & 0x4) != 0;
}

/* Threads of this process that are not exiting (tu_task_exiting): the
 * entries of /proc/self/task (-1 where it cannot be read). */
static inline long tu_task_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.' && !tu_task_exiting(e->d_name);
    closedir(d);
    return n;
}

/* tu_task_count() once it equals want, or its value after a second (a
 * thread just created or just joined may take a moment to be seen so). */
static inline long tu_task_count_settled(long want)
{
    long n = tu_task_count();
    for (int i = 0; i < 1000 && n != want; i++) {
        tu_sleep_ms(1);
        n = tu_task_count();
    }
    return n;
}

/* SPEC.md section 5 known answers: V4.1 multipliers for V' = 99092. */
static const uint64_t tu_v41_mult[2][4] = {
    {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull},
    {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull},
};

/* A layout with the V4.1 multipliers, primes from `base`, and a scrambled
 * token map of `vocab` entries into V' = cvocab (map must hold vocab). */
static inline int tu_layout(engram_layout *l, uint32_t *map, uint32_t vocab, uint32_t cvocab,
                            uint32_t base)
{
    memset(l, 0, sizeof *l);
    l->vocab = vocab;
    l->compressed_vocab = cvocab;
    for (uint32_t t = 0; t < vocab; t++)
        map[t] = (uint32_t)(((uint64_t)t * 2654435761u) % cvocab);
    l->token_map = map;
    l->pad_id = map[2 % vocab];
    memcpy(l->multipliers, tu_v41_mult, sizeof tu_v41_mult);
    uint32_t primes[2 * 24];
    int rc = engram_layout_primes(base, 2, 4, 8, primes, 48);
    if (rc < 0)
        return rc;
    for (int t = 0; t < 2; t++) {
        uint64_t sum = 0;
        for (int c = 0; c < 24; c++) {
            l->primes[t][c] = primes[t * 24 + c];
            sum += primes[t * 24 + c];
        }
        l->rows[t] = (uint32_t)sum;
    }
    return 0;
}

/* Builds a model file in the temporary directory; returns 0 or -errno. */
static inline int tu_build(const char *name, const engram_layout *l, engram_fill fill,
                           uint32_t width, char *path_out, size_t n)
{
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    o.layout = *l;
    o.fill = fill;
    o.width = width;
    o.seed = 42;
    tu_path(path_out, n, name);
    engram_error err;
    int rc = engram_build_model(path_out, &o, &err);
    if (rc < 0)
        fprintf(stderr, "build %s: %s\n", name, err.msg);
    return rc;
}

/* Opens a model, saying why not on stderr; NULL on failure. */
static inline engram_model *tu_open_model(const char *path)
{
    engram_model *m = NULL;
    engram_error err;
    if (engram_model_open(path, &m, &err) < 0)
        fprintf(stderr, "open %s: %s\n", path, err.msg);
    return m;
}

/* The rows of n random tokens of [0, alphabet) hashed from an empty
 * history: [n][48] (table 0's 24 ids, then table 1's); the caller frees. */
static inline uint32_t *tu_hashed(engram_model *m, size_t n, uint64_t seed, unsigned alphabet)
{
    uint32_t *tok = (uint32_t *)malloc(n * sizeof *tok), *rows = (uint32_t *)malloc(n * 48 * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % alphabet);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &h, tok, NULL, n, rows, NULL), 0);
    free(tok);
    return rows;
}

/* Table t's values of those rows through the exact single-row path:
 * [n][24][256] of d (ENGRAM_BF16 or ENGRAM_F32); the caller frees. */
static inline void *tu_expected(engram_model *m, int t, const uint32_t *rows, size_t n, engram_dtype d)
{
    size_t es = d == ENGRAM_F32 ? 4 : 2;
    uint8_t *out = (uint8_t *)malloc(n * 24 * 256 * es);
    uint32_t *ids = (uint32_t *)malloc(n * 24 * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        memcpy(ids + i * 24, rows + i * 48 + t * 24, 24 * sizeof *ids);
    engram_error err;
    int rc = d == ENGRAM_F32 ? engram_model_read_f32(m, t, ids, n * 24, (float *)out, &err)
                             : engram_model_read_bf16(m, t, ids, n * 24, (uint16_t *)out, &err);
    CHECK_EQ(rc, 0);
    free(ids);
    return out;
}

#endif
