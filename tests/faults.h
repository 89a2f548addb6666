/*
 * faults.h - what the test_faults_* programs share: the fault table and
 * the sweeps' helpers, the scenario runner and the model they run on.
 * Each program is one area under faults, on a real file with every engine
 * (io_uring, the thread pool, the buffered fallback):
 *   test_faults_reader  the reader and its engines
 *   test_faults_files   model open, GGUF reader and writer, model build,
 *                       the hasher and the row cache
 *   test_faults_pools   sessions, prefills and pools; the output stage's
 *                       set-up (layer, applier, team)
 * The faults come through three seams: the reader's I/O engines
 * (fault_engine.h), system and library calls (fault_shim.h) and
 * allocations (alloc_shim.h).
 *
 * Each scenario runs in a child process under a time limit, so that a hang
 * (a wait for reads that will never complete) is a failure, not a stuck
 * suite; TF_ONLY=TEXT runs only the scenarios whose names hold TEXT.
 */
#ifndef ENGRAM_FAULTS_H
#define ENGRAM_FAULTS_H

#include <pthread.h>
#include <sys/wait.h>
#include <time.h>

#include "fault_engine.h"
#include "fault_shim.h"
#include "testutil.h"

static const engram_io_engine engines[] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
static const char *const engine_names[] = {"io_uring", "threads", "buffered"};

/* The fault engine's contract checks (fault_engine.h) held. */
static inline void contract_clean(const char *what)
{
    if (fe.requeue_inflight || fe.unknown_cqe || fe.destroy_inflight)
        fprintf(stderr, "%s: contract: requeued in flight %ld, unknown completions %ld, "
                        "destroyed with %ld in flight\n",
                what, fe.requeue_inflight, fe.unknown_cqe, fe.destroy_inflight);
    CHECK_EQ(fe.requeue_inflight, 0);
    CHECK_EQ(fe.unknown_cqe, 0);
    CHECK_EQ(fe.destroy_inflight, 0);
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

static inline const char *fault_name(const struct fault *f)
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

/* Faults injected by the sweeps, and those that ended as documented. */
struct sweep_totals {
    long injected, survived;
};

/* ------------------------------------------------ every call failed in turn */

/* Descriptors open in this process. */
static inline int open_fds(void)
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
static inline long fails_in_turn(const struct op *op, struct fail_plan *plan, int want, const char *msg,
                                 long *refused)
{
    engram_error err;
    *plan = (struct fail_plan){0, 0, 1};
    CHECK_EQ(op->run(op->ctx, &err), 0);
    plan->armed = 0;
    op->done(op->ctx, 0);
    long total = plan->calls, failed = 0;
    for (long k = 1; k <= total; k++) {
        *plan = (struct fail_plan){0, k, 1};
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

/* ------------------------------------------------ the scenarios' model and runner */

/* The model the scenarios run on (random fill, layout primes from 3000:
 * about 72,000 rows a table, 38 MB; map: 3000 entries): its path into
 * path; 0 or -errno. */
static inline int faults_model(engram_layout *l, uint32_t *map, char *path, size_t n)
{
    CHECK_EQ(tu_layout(l, map, 3000, 2000, 3000), 0);
    int rc = tu_build("faults.gguf", l, ENGRAM_FILL_RANDOM, 0, path, n);
    CHECK_EQ(rc, 0);
    return rc;
}

static inline int scenario_skipped(const char *name)
{
    const char *only = getenv("TF_ONLY");
    return only && !strstr(name, only);
}

/* The child: its own counts, a 120 s limit. */
static inline pid_t scenario_fork(int fd[2])
{
    fflush(stdout);
    if (pipe2(fd, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
    } else if (pid == 0) {
        close(fd[0]);
        tu_failures = 0;
        tu_checks = 0;
        alarm(120);
    }
    return pid;
}

/* The child's end: its count of checks to the parent, its verdict in the
 * exit status (exit, not _exit: LeakSanitizer checks the child there). */
static inline void scenario_exit(int fd)
{
    fflush(stdout);
    if (write(fd, &tu_checks, sizeof tu_checks) != (ssize_t)sizeof tu_checks)
        tu_failures++;
    exit(tu_failures ? 1 : 0);
}

/* The parent: one line per scenario, with the checks the child made (the
 * program's total counts them too). */
static inline void scenario_wait(const char *name, pid_t pid, int fd[2])
{
    int st = 0, checks = -1;
    if (pid > 0) {
        close(fd[1]);
        if (read(fd[0], &checks, sizeof checks) != (ssize_t)sizeof checks)
            checks = -1;
        close(fd[0]);
        waitpid(pid, &st, 0);
    } else {
        perror("pipe or fork");
        st = 1 << 8; /* exited with 1 */
    }
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (checks > 0)
        tu_checks += checks;
    printf("%-28s %s", name, ok ? "ok" : WIFSIGNALED(st) ? "FAILED (killed: hang or crash)" : "FAILED");
    if (checks >= 0)
        printf(" (%d checks)", checks);
    printf("\n");
    CHECK(ok);
}

/* Runs `call` as the scenario `name` (in a child, under a time limit). */
#define SCENARIO(name, call)                                                             \
    do {                                                                                 \
        if (scenario_skipped(name))                                                      \
            break;                                                                       \
        int fd_[2] = {-1, -1};                                                           \
        pid_t pid_ = scenario_fork(fd_);                                                 \
        if (pid_ == 0) {                                                                 \
            call;                                                                        \
            scenario_exit(fd_[1]);                                                       \
        }                                                                                \
        scenario_wait(name, pid_, fd_);                                                  \
    } while (0)

#endif
