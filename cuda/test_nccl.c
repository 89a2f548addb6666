/*
 * test_nccl.c - libengram-nccl (include/engram_nccl.h).
 *  - Everywhere (CI has no GPU and no NCCL): arguments refused with -EINVAL
 *    before anything is loaded; libraries that are not a usable NCCL
 *    (cuda/nccl_stub.c: functions missing; a version before 2.14; a path
 *    that does not exist) refused with -ENOSYS naming what is missing;
 *    without NCCL every entry point says "NCCL not found" naming
 *    libnccl.so.2.
 *  - With NCCL and a GPU: a communicator of one rank leaves random buffers
 *    as they are (in place, out of place, odd sizes, 0 bytes); the caller's
 *    own communicator wrapped (made here with NCCL's ncclCommInitRank) and
 *    combined, and still the caller's after close; a world of two that the
 *    other rank never joins: open gives -ETIMEDOUT within its timeout; the
 *    real check: N ranks (processes started from this one; the unique id
 *    handed over in a file), each with a sharded pool of the model
 *    (shard_rank / shard_world), RAW rows of decode steps uploaded to the
 *    device, combined, downloaded: equal byte for byte to the one-process
 *    unsharded pool's rows of the same steps.  World 1 runs in this
 *    process, world 2 (and 4 when the machine has 4 GPUs) as processes: one
 *    GPU each where there are enough GPUs; otherwise on one GPU, where NCCL
 *    refuses ("Duplicate GPU detected") and the ranks must report that as
 *    a clean error (exit 3), never a crash, a hang or wrong rows.
 *   test_nccl [--stubs DIR] [--model PATH]
 *     DIR holds nccl_stub.so and nccl_stub_all.so (default: this program's
 *     directory); PATH a model (default: one built here, W = 64).
 *   test_nccl --child RANK WORLD IDFILE MODEL   (internal: one rank)
 * NCCL_NVLS_ENABLE=0 is set (NVLink multicast stays off on shared hosts).
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>

#include "../tests/testutil.h"
#include "engram_nccl.h"
#include "nccl_abi.h"

#define ALPHABET 4096
#define SEC 1000000000ull

#define CUDA_OK(call)                                                                            \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        tu_checks++;                                                                             \
        if (e_ != cudaSuccess) {                                                                 \
            tu_failures++;                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
        }                                                                                        \
    } while (0)

/* a host function on a stream: the stream is busy for `ms` milliseconds */
static void sleeper(void *ms)
{
    tu_sleep_ms((int)(intptr_t)ms);
}

/* waits up to 10 s for the stream to drain: 1 if it did */
static int drains(cudaStream_t st)
{
    for (int i = 0; i < 1000; i++) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess)
            return 1;
        if (e != cudaErrorNotReady)
            return 0;
        tu_sleep_ms(10);
    }
    return 0;
}

/* ---- refusals that need nothing: every argument checked before NCCL is loaded */
static void refusals(void)
{
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES] = {0};
    engram_nccl *c = (engram_nccl *)(uintptr_t)1;
    int rc = engram_nccl_open(id, 0, 1, 0, 0, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "out is NULL");
    rc = engram_nccl_open(NULL, 0, 1, 0, 0, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "id is NULL");
    CHECK(c == NULL); /* *out cleared on failure */
    rc = engram_nccl_open(id, 0, 0, 0, 0, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "world of 0");
    rc = engram_nccl_open(id, 2, 2, 0, 0, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "rank 2 not in a world of 2");
    rc = engram_nccl_open(id, -1, 2, 0, 0, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "rank -1");
    rc = engram_nccl_open(id, 0, 1, -1, 0, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "device -1");
    CHECK_EQ(engram_nccl_open(id, 0, 0, 0, 0, &c, NULL), -EINVAL); /* err may be NULL */
    rc = engram_nccl_wrap(NULL, &c, &err);
    CHECK_ERR(rc, err, -EINVAL, "communicator is NULL");
    rc = engram_nccl_wrap((void *)id, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "out is NULL");
    rc = engram_nccl_unique_id(NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "id is NULL");
    char buf[8];
    rc = engram_nccl_combine(NULL, buf, 8, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "no communicator");
    rc = engram_nccl_combine_into(NULL, buf, buf, 8, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "no communicator");
    rc = engram_nccl_wait(NULL, NULL, 0, &err);
    CHECK_ERR(rc, err, -EINVAL, "no communicator");
    engram_nccl_close(NULL);
    engram_nccl_info info;
    memset(&info, 0x5A, sizeof info);
    engram_nccl_get_info(NULL, &info);
    CHECK_EQ(info.world, 0);
    CHECK_EQ(info.version, 0);
    engram_nccl_get_info(NULL, NULL);
}

/* ---- libraries that are not a usable NCCL, through ENGRAM_NCCL_LIBRARY */
static void stubs(const char *dir)
{
    char path[600];
    engram_error err;
    int v = -7;
    uint8_t id[ENGRAM_NCCL_ID_BYTES];
    snprintf(path, sizeof path, "%s/nccl_stub.so", dir);
    setenv("ENGRAM_NCCL_LIBRARY", path, 1);
    CHECK_EQ(engram_nccl_available(&v, &err), 0);
    CHECK_ERR(err.code, err, -ENOSYS, "has no ncclGetUniqueId");
    CHECK_EQ(v, -7); /* not written */
    CHECK_ERR(engram_nccl_unique_id(id, &err), err, -ENOSYS, "has no ncclGetUniqueId");
    snprintf(path, sizeof path, "%s/nccl_stub_all.so", dir);
    setenv("ENGRAM_NCCL_LIBRARY", path, 1);
    CHECK_EQ(engram_nccl_available(&v, &err), 0);
    CHECK_ERR(err.code, err, -ENOSYS, "reports version 21300");
    engram_nccl *c = NULL;
    CHECK_ERR(engram_nccl_open(id, 0, 1, 0, 0, &c, &err), err, -ENOSYS, "2.14 or later");
    CHECK(c == NULL);
    setenv("ENGRAM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    CHECK_EQ(engram_nccl_available(NULL, &err), 0);
    CHECK_ERR(err.code, err, -ENOSYS, "NCCL not found: dlopen /nonexistent/libnccl.so.2");
    CHECK_EQ(engram_nccl_available(NULL, NULL), 0); /* err may be NULL */
    unsetenv("ENGRAM_NCCL_LIBRARY");
}

/* ---- no NCCL on this machine (CI): every entry point says so */
static void without_nccl(const engram_error *why)
{
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES] = {0};
    engram_nccl *c = NULL;
    CHECK_EQ(why->code, -ENOSYS);
    CHECK(strstr(why->msg, "NCCL not found") && strstr(why->msg, "libnccl.so.2"));
    CHECK_ERR(engram_nccl_unique_id(id, &err), err, -ENOSYS, "libnccl.so.2");
    CHECK_ERR(engram_nccl_open(id, 0, 1, 0, 0, &c, &err), err, -ENOSYS, "NCCL not found");
    CHECK(c == NULL);
    CHECK_ERR(engram_nccl_wrap((void *)id, &c, &err), err, -ENOSYS, "NCCL not found");
    printf("test_nccl: no NCCL here: %s\n", why->msg);
}

/* ---- a communicator of one: the combine is the identity */
static void world_one(void)
{
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES];
    engram_nccl *c = NULL;
    CHECK_EQ(engram_nccl_unique_id(id, &err), 0);
    int rc = engram_nccl_open(id, 0, 1, 0, 30 * SEC, &c, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "world of one: %s\n", err.msg);
        return;
    }
    engram_nccl_info info;
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.rank, 0);
    CHECK_EQ(info.world, 1);
    CHECK_EQ(info.wrapped, 0);
    CHECK_EQ(info.aborted, 0);
    CHECK(info.version >= 21400);
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t sizes[] = {1, 264, 12345, 48 * 264 * 8, (size_t)3 << 20};
    uint64_t seed = 11;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        uint8_t *h = malloc(n), *back = malloc(n);
        for (size_t b = 0; b < n; b++)
            h[b] = (uint8_t)tu_rand(&seed);
        void *d = NULL, *d2 = NULL;
        CUDA_OK(cudaMalloc(&d, n));
        CUDA_OK(cudaMalloc(&d2, n));
        CUDA_OK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemsetAsync(d2, 0xA5, n, st)); /* poisoned: out of place must write it all */
        CHECK_EQ(engram_nccl_combine(c, d, n, st, &err), 0);
        CHECK_EQ(engram_nccl_combine_into(c, d, d2, n, st, &err), 0);
        CHECK_EQ(engram_nccl_wait(c, st, 30 * SEC, &err), 0);
        memset(back, 0, n);
        CUDA_OK(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
        CHECK(memcmp(back, h, n) == 0);
        memset(back, 0, n);
        CUDA_OK(cudaMemcpy(back, d2, n, cudaMemcpyDeviceToHost));
        CHECK(memcmp(back, h, n) == 0);
        if (n > 2) /* overlapping send and recv refused */
            CHECK_ERR(engram_nccl_combine_into(c, d, (uint8_t *)d + 1, n - 1, st, &err), err, -EINVAL,
                      "overlap");
        CUDA_OK(cudaFree(d));
        CUDA_OK(cudaFree(d2));
        free(h);
        free(back);
    }
    CHECK_EQ(engram_nccl_combine(c, NULL, 0, st, &err), 0); /* 0 bytes: nothing */
    CHECK_ERR(engram_nccl_combine(c, NULL, 5, st, &err), err, -EINVAL, "NULL buffer");
    CHECK_EQ(engram_nccl_wait(c, st, 0, &err), 0); /* done: 0 at once even with no time */
    /* a combine queued behind 1.5 s of other work, a wait of 0.3 s: it
     * times out, the communicator is aborted, and the stream still drains */
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, 4096));
    CUDA_OK(cudaLaunchHostFunc(st, sleeper, (void *)(intptr_t)1500));
    CHECK_EQ(engram_nccl_combine(c, d, 4096, st, &err), 0);
    /* a wait of no time is a poll: not yet, and nothing aborted */
    CHECK_ERR(engram_nccl_wait(c, st, 0, &err), err, -EAGAIN, "a poll");
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.aborted, 0);
    uint64_t t0 = tu_now_ns();
    int rc2 = engram_nccl_wait(c, st, 300000000ull, &err);
    double secs = (double)(tu_now_ns() - t0) / 1e9;
    CHECK_ERR(rc2, err, -ETIMEDOUT, "communicator aborted");
    CHECK(secs >= 0.3 && secs < 10); /* the wait, then ncclCommAbort */
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.aborted, 1);
    CHECK_ERR(engram_nccl_combine(c, d, 4096, st, &err), err, -EIO, "aborted");
    CHECK_ERR(engram_nccl_wait(c, st, SEC, &err), err, -EIO, "aborted");
    CHECK(drains(st));
    printf("test_nccl: world 1: a wait of 0.3 s on a busy stream: -ETIMEDOUT after %.2f s, aborted, "
           "the stream drained\n", secs);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(st));
    engram_nccl_close(c);
}

/* ---- the caller's own communicator, made with NCCL directly (dlsym: this
 * test has no nccl.h either) */
static void wrapped(void)
{
    void *h = dlopen(getenv("ENGRAM_NCCL_LIBRARY") ? getenv("ENGRAM_NCCL_LIBRARY") : "libnccl.so.2",
                     RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    if (!h)
        return;
    int (*get_id)(eng_nccl_id *) = NULL;
    int (*init)(eng_nccl_comm *, int, eng_nccl_id, int) = NULL;
    int (*destroy)(eng_nccl_comm) = NULL;
    *(void **)&get_id = dlsym(h, "ncclGetUniqueId"); /* POSIX's way to a function pointer */
    *(void **)&init = dlsym(h, "ncclCommInitRank");
    *(void **)&destroy = dlsym(h, "ncclCommDestroy");
    CHECK(get_id && init && destroy);
    eng_nccl_id u;
    eng_nccl_comm comm = NULL;
    CUDA_OK(cudaSetDevice(0));
    CHECK_EQ(get_id(&u), ENG_NCCL_SUCCESS);
    CHECK_EQ(init(&comm, 1, u, 0), ENG_NCCL_SUCCESS);
    engram_nccl *c = NULL;
    engram_error err;
    CHECK_EQ(engram_nccl_wrap(comm, &c, &err), 0);
    engram_nccl_info info;
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.wrapped, 1);
    CHECK_EQ(info.world, 1);
    CHECK_EQ(info.rank, 0);
    CHECK_EQ(info.device, 0);
    uint8_t hbuf[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        hbuf[i] = (uint8_t)(i * 7 + 1);
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, sizeof hbuf));
    CUDA_OK(cudaMemcpy(d, hbuf, sizeof hbuf, cudaMemcpyHostToDevice));
    CHECK_EQ(engram_nccl_combine(c, d, sizeof hbuf, NULL, &err), 0);
    CHECK_EQ(engram_nccl_wait(c, NULL, 30 * SEC, &err), 0);
    CUDA_OK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
    CHECK(memcmp(back, hbuf, sizeof back) == 0);
    engram_nccl_close(c);
    CHECK_EQ(destroy(comm), ENG_NCCL_SUCCESS); /* still the caller's to destroy */
    CUDA_OK(cudaFree(d));
}

/* ---- a world of two that the other rank never joins: a bounded open */
static void lonely(void)
{
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES];
    engram_nccl *c = NULL;
    CHECK_EQ(engram_nccl_unique_id(id, &err), 0);
    uint64_t t0 = tu_now_ns();
    int rc = engram_nccl_open(id, 0, 2, 0, 3 * SEC, &c, &err);
    double s = (double)(tu_now_ns() - t0) / 1e9;
    CHECK_ERR(rc, err, -ETIMEDOUT, "not every rank joined");
    CHECK(c == NULL);
    CHECK(s >= 3.0 && s < 30.0);
    printf("test_nccl: open of a world of 2 nobody joins: %d after %.2f s: %s\n", rc, s, err.msg);
}

/* ---- the real check: one rank's sharded rows, combined, vs one process's */
static int rows_check(engram_nccl *c, const char *model_path, int rank, int world, size_t *moved)
{
    engram_model *model = tu_open_model(model_path);
    CHECK(model != NULL);
    if (!model)
        return -1;
    engram_model_info mi;
    engram_model_get_info(model, &mi);
    unsigned alphabet = mi.family.vocab && mi.family.vocab < ALPHABET ? mi.family.vocab : ALPHABET;
    engram_pool_opts po;
    memset(&po, 0, sizeof po);
    po.shard_rank = (unsigned)rank;
    po.shard_world = (unsigned)world;
    engram_pool *pool = NULL, *full = NULL;
    engram_session *s = NULL, *fs = NULL;
    engram_error err;
    CHECK_EQ(engram_pool_open(model, &po, &pool, &err), 0);
    CHECK_EQ(engram_pool_open(model, NULL, &full, &err), 0);
    CHECK_EQ(engram_session_open(pool, &s, &err), 0);
    CHECK_EQ(engram_session_open(full, &fs, &err), 0);
    const size_t rb = 264, step_max = (size_t)ENGRAM_MAX_DRAFT * 48 * rb;
    enum { STEPS = 24 };
    /* all steps' shares end to end, then combined once more as one buffer
     * (a prefill chunk's size class) */
    uint8_t *all = calloc(STEPS, step_max), *all_want = calloc(STEPS, step_max);
    uint8_t *back = malloc(step_max * STEPS);
    void *d = NULL;
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&d, step_max * STEPS));
    uint64_t seed = 5;
    size_t total = 0, mine_differs = 0;
    int bad = 0;
    for (int step = 0; step < STEPS && s && fs; step++) {
        unsigned k = 1 + (unsigned)step % ENGRAM_MAX_DRAFT;
        size_t bytes = (size_t)k * 48 * rb;
        uint32_t tok[ENGRAM_MAX_DRAFT];
        uint8_t mask[ENGRAM_MAX_DRAFT];
        for (unsigned i = 0; i < k; i++) {
            tok[i] = (uint32_t)(tu_rand(&seed) % alphabet);
            mask[i] = tu_rand(&seed) % 5 != 0;
        }
        uint8_t *out = all + total, *want = all_want + total; /* zero: masked rows stay zero everywhere */
        CHECK_EQ(engram_step_begin(s, tok, mask, k, ENGRAM_RAW, out, &err), 0);
        CHECK_EQ(engram_step_begin(fs, tok, mask, k, ENGRAM_RAW, want, &err), 0);
        for (int t = 0; t < 2; t++) {
            CHECK_EQ(engram_step_wait(s, t, &err), 0);
            CHECK_EQ(engram_step_wait(fs, t, &err), 0);
        }
        mine_differs += memcmp(out, want, bytes) != 0;
        CUDA_OK(cudaMemsetAsync(d, 0xC3, bytes, st));
        CUDA_OK(cudaMemcpyAsync(d, out, bytes, cudaMemcpyHostToDevice, st));
        CHECK_EQ(engram_nccl_combine(c, d, bytes, st, &err), 0);
        memset(back, 0x3C, bytes);
        CUDA_OK(cudaMemcpyAsync(back, d, bytes, cudaMemcpyDeviceToHost, st));
        int rc = engram_nccl_wait(c, st, 30 * SEC, &err);
        CHECK_EQ(rc, 0);
        if (rc < 0)
            fprintf(stderr, "rank %d: wait: %s\n", rank, err.msg);
        if (rc == 0 && memcmp(back, want, bytes) != 0) {
            printf("rank %d/%d: WRONG ROWS at step %d (k = %u)\n", rank, world, step, k);
            bad = 1;
            tu_failures++;
        }
        CHECK_EQ(engram_step_commit(s, k, &err), 0);
        CHECK_EQ(engram_step_commit(fs, k, &err), 0);
        total += bytes;
    }
    /* the same shares as one buffer */
    CUDA_OK(cudaMemcpyAsync(d, all, total, cudaMemcpyHostToDevice, st));
    CHECK_EQ(engram_nccl_combine(c, d, total, st, &err), 0);
    memset(back, 0x3C, total);
    CUDA_OK(cudaMemcpyAsync(back, d, total, cudaMemcpyDeviceToHost, st));
    CHECK_EQ(engram_nccl_wait(c, st, 30 * SEC, &err), 0);
    if (memcmp(back, all_want, total) != 0) {
        printf("rank %d/%d: WRONG ROWS in the %zu-byte buffer\n", rank, world, total);
        bad = 1;
        tu_failures++;
    }
    /* with world > 1 the share alone is not the answer: the combine did it */
    if (world > 1)
        CHECK(mine_differs > 0);
    else
        CHECK_EQ(mine_differs, 0);
    *moved = total;
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(st));
    free(all);
    free(all_want);
    free(back);
    engram_session_close(s);
    engram_session_close(fs);
    engram_pool_close(pool);
    engram_pool_close(full);
    engram_model_close(model);
    return bad ? -1 : 0;
}


/* ---- NCCL's failures, injected (cuda/nccl_stub.c built with STUB_FAULTS,
 * loaded in a process of its own: the library keeps what it loaded) */
static int faults(void)
{
    void *h = dlopen(getenv("ENGRAM_NCCL_LIBRARY"), RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    if (!h)
        return tu_finish("test_nccl faults");
    int *aborts = (int *)dlsym(h, "stub_aborts"), *destroys = (int *)dlsym(h, "stub_destroys");
    int *allreduces = (int *)dlsym(h, "stub_allreduces");
    CHECK(aborts && destroys && allreduces);
    if (!aborts || !destroys || !allreduces)
        return tu_finish("test_nccl faults");
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES];
    engram_nccl *c = NULL;
    engram_nccl_info info;
    int v = 0;
    CHECK(engram_nccl_available(&v, &err));
    CHECK_EQ(v, 22800);
    CHECK_EQ(engram_nccl_unique_id(id, &err), 0);
    static const struct {
        const char *r;
        int want;
    } codes[] = {{"1", -EIO}, {"2", -EIO}, {"3", -EIO}, {"4", -EINVAL}, {"5", -EINVAL}, {"6", -ECONNRESET}};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "ncclCommInitRankConfig: NCCL error %s", codes[i].r);
        setenv("STUB_INIT", codes[i].r, 1);
        int a0 = *aborts;
        c = (engram_nccl *)(uintptr_t)1;
        CHECK_ERR(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), err, codes[i].want, needle);
        CHECK(strstr(err.msg, "the stub's last error") != NULL);
        CHECK(c == NULL);
        CHECK_EQ(*aborts, a0 + 1);
    }
    /* set-up that never finishes: bounded; one that fails later */
    setenv("STUB_INIT", "7", 1);
    setenv("STUB_ASYNC", "7", 1);
    int a0 = *aborts;
    uint64_t t0 = tu_now_ns();
    CHECK_ERR(engram_nccl_open(id, 0, 2, 0, 300000000ull, &c, &err), err, -ETIMEDOUT, "not every rank joined");
    double secs = (double)(tu_now_ns() - t0) / 1e9;
    CHECK(secs >= 0.3 && secs < 5);
    CHECK_EQ(*aborts, a0 + 1);
    setenv("STUB_ASYNC", "5", 1);
    CHECK_ERR(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), err, -EINVAL, "NCCL error 5");
    CHECK_EQ(*aborts, a0 + 2);
    setenv("STUB_ASYNC", "0", 1);
    /* the all-reduce refused: aborted, and every later call says so */
    CHECK_EQ(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), 0);
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.world, 2);
    CHECK_EQ(info.aborted, 0);
    void *d = NULL;
    cudaStream_t st;
    CUDA_OK(cudaMalloc(&d, 4096));
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    setenv("STUB_ALLREDUCE", "2", 1);
    a0 = *aborts;
    int d0 = *destroys;
    CHECK_ERR(engram_nccl_combine(c, d, 4096, st, &err), err, -EIO, "ncclAllReduce: NCCL error 2");
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.aborted, 1);
    CHECK_EQ(*aborts, a0 + 1);
    int r0 = *allreduces;
    CHECK_ERR(engram_nccl_combine(c, d, 4096, st, &err), err, -EIO, "aborted");
    CHECK_ERR(engram_nccl_wait(c, st, SEC, &err), err, -EIO, "aborted");
    CHECK_EQ(*allreduces, r0); /* nothing enqueued on an aborted communicator */
    engram_nccl_close(c);
    CHECK_EQ(*destroys, d0); /* aborted: not destroyed again */
    CHECK_EQ(*aborts, a0 + 1);
    unsetenv("STUB_ALLREDUCE");
    /* an asynchronous error seen by the combine before it enqueues */
    CHECK_EQ(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), 0);
    setenv("STUB_ASYNC", "6", 1);
    r0 = *allreduces;
    CHECK_ERR(engram_nccl_combine(c, d, 4096, st, &err), err, -ECONNRESET, "ncclCommGetAsyncError");
    CHECK_EQ(*allreduces, r0);
    engram_nccl_close(c);
    setenv("STUB_ASYNC", "0", 1);
    /* a busy stream: the wait times out, aborts */
    CHECK_EQ(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), 0);
    CHECK_EQ(engram_nccl_combine(c, d, 4096, st, &err), 0);
    CUDA_OK(cudaLaunchHostFunc(st, sleeper, (void *)(intptr_t)800));
    a0 = *aborts;
    CHECK_ERR(engram_nccl_wait(c, st, 200000000ull, &err), err, -ETIMEDOUT, "communicator aborted");
    CHECK_EQ(*aborts, a0 + 1);
    CHECK(drains(st));
    engram_nccl_close(c);
    /* a busy stream and an asynchronous error: reported without waiting out the stream */
    CHECK_EQ(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), 0);
    CUDA_OK(cudaLaunchHostFunc(st, sleeper, (void *)(intptr_t)800));
    setenv("STUB_ASYNC", "3", 1);
    t0 = tu_now_ns();
    CHECK_ERR(engram_nccl_wait(c, st, 5 * SEC, &err), err, -EIO, "NCCL error 3");
    CHECK((double)(tu_now_ns() - t0) / 1e9 < 0.5);
    CHECK_EQ(*aborts, a0 + 2);
    CHECK(drains(st));
    engram_nccl_close(c);
    setenv("STUB_ASYNC", "0", 1);
    /* all well: close destroys */
    d0 = *destroys;
    a0 = *aborts;
    CHECK_EQ(engram_nccl_open(id, 0, 2, 0, SEC, &c, &err), 0);
    CHECK_EQ(engram_nccl_combine(c, d, 4096, st, &err), 0);
    CHECK_EQ(engram_nccl_wait(c, st, SEC, &err), 0);
    engram_nccl_close(c);
    CHECK_EQ(*destroys, d0 + 1);
    CHECK_EQ(*aborts, a0);
    /* the caller's communicator: never aborted nor destroyed here */
    static int callers;
    CHECK_EQ(engram_nccl_wrap(&callers, &c, &err), 0);
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.wrapped, 1);
    CHECK_EQ(info.world, 2);
    CHECK_EQ(info.rank, 1);
    CUDA_OK(cudaLaunchHostFunc(st, sleeper, (void *)(intptr_t)800));
    CHECK_ERR(engram_nccl_wait(c, st, 200000000ull, &err), err, -ETIMEDOUT, "left running");
    setenv("STUB_ALLREDUCE", "2", 1);
    CHECK_ERR(engram_nccl_combine(c, d, 4096, st, &err), err, -EIO, "ncclAllReduce");
    engram_nccl_get_info(c, &info);
    CHECK_EQ(info.aborted, 0);
    CHECK(drains(st));
    engram_nccl_close(c);
    CHECK_EQ(*aborts, a0);
    CHECK_EQ(*destroys, d0 + 1);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(st));
    return tu_finish("test_nccl faults (NCCL's failures injected)");
}

/* runs this program with `mode` in a process of its own, ENGRAM_NCCL_LIBRARY = lib */
static void in_child(const char *mode, const char *lib)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("ENGRAM_NCCL_LIBRARY", lib, 1);
        execl("/proc/self/exe", "test_nccl", mode, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- one rank of several (a process of its own) */
static int child(int rank, int world, const char *idfile, const char *model_path)
{
    engram_error err;
    uint8_t id[ENGRAM_NCCL_ID_BYTES];
    char tmp[600];
    if (rank == 0) {
        CHECK_EQ(engram_nccl_unique_id(id, &err), 0);
        snprintf(tmp, sizeof tmp, "%s.tmp", idfile);
        FILE *f = fopen(tmp, "wb");
        CHECK(f && fwrite(id, 1, sizeof id, f) == sizeof id);
        CHECK(f && fclose(f) == 0);
        CHECK_EQ(rename(tmp, idfile), 0);
    } else {
        int got = 0;
        for (int i = 0; i < 3000 && !got; i++) {
            FILE *f = fopen(idfile, "rb");
            if (f) {
                got = fread(id, 1, sizeof id, f) == sizeof id;
                fclose(f);
            }
            if (!got)
                tu_sleep_ms(10);
        }
        CHECK(got);
        if (!got)
            return 1;
    }
    int ndev = 0;
    CUDA_OK(cudaGetDeviceCount(&ndev));
    int device = ndev >= world ? rank : 0;
    engram_nccl *c = NULL;
    int rc = engram_nccl_open(id, rank, world, device, 60 * SEC, &c, &err);
    if (rc < 0) {
        /* a clean refusal: a negative errno with a message, no crash */
        printf("rank %d/%d on GPU %d: open refused: %d (%s): %s\n", rank, world, device, rc,
               engram_strerror(rc), err.msg);
        CHECK(err.code == rc && err.msg[0]);
        return tu_failures ? 1 : 3;
    }
    size_t moved = 0;
    rc = rows_check(c, model_path, rank, world, &moved);
    engram_nccl_close(c);
    printf("rank %d/%d on GPU %d: %s (%zu bytes of RAW rows combined per pass)\n", rank, world, device,
           rc == 0 && !tu_failures ? "rows equal to the one-process pool's" : "FAILED", moved);
    char name[64];
    snprintf(name, sizeof name, "test_nccl rank %d/%d", rank, world);
    return tu_finish(name);
}

/* ---- several ranks: processes of this program, bounded in time */
static void ranks(int world, const char *model_path)
{
    char idfile[512];
    char wname[32];
    snprintf(wname, sizeof wname, "nccl_id_%d", world);
    tu_path(idfile, sizeof idfile, wname);
    pid_t pid[8];
    char r[16], w[16];
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < world; i++) {
        snprintf(r, sizeof r, "%d", i);
        snprintf(w, sizeof w, "%d", world);
        pid[i] = fork();
        if (pid[i] == 0) {
            execl("/proc/self/exe", "test_nccl", "--child", r, w, idfile, model_path, (char *)NULL);
            _exit(127);
        }
        CHECK(pid[i] > 0);
    }
    int status[8], done = 0, refused = 0, ok = 0;
    for (int i = 0; i < world; i++)
        status[i] = -1;
    uint64_t t0 = tu_now_ns();
    while (done < world && tu_now_ns() - t0 < 240 * SEC) {
        for (int i = 0; i < world; i++)
            if (status[i] == -1 && pid[i] > 0 && waitpid(pid[i], &status[i], WNOHANG) == pid[i])
                done++;
        tu_sleep_ms(20);
    }
    for (int i = 0; i < world; i++) {
        if (status[i] == -1) { /* a hung rank: a failure; ended by its pid */
            kill(pid[i], SIGKILL);
            waitpid(pid[i], NULL, 0);
            printf("test_nccl: world %d: rank %d HUNG (killed after 240 s)\n", world, i);
            tu_failures++;
            continue;
        }
        if (WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
            ok++;
        else if (WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 3)
            refused++;
        else {
            printf("test_nccl: world %d: rank %d FAILED (%s %d)\n", world, i,
                   WIFEXITED(status[i]) ? "exit" : "signal",
                   WIFEXITED(status[i]) ? WEXITSTATUS(status[i]) : WTERMSIG(status[i]));
            tu_failures++;
        }
    }
    tu_checks++;
    if (ok == world)
        printf("test_nccl: world %d: every rank's combined rows equal the one-process rows\n", world);
    else if (ok + refused == world && refused > 0)
        printf("test_nccl: world %d: REFUSED by NCCL (%d of %d ranks; the error above), no rows compared\n",
               world, refused, world);
    else
        tu_failures++;
}

int main(int argc, char **argv)
{
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log even if a hang gets us killed */
    if (argc == 6 && strcmp(argv[1], "--child") == 0)
        return child(atoi(argv[2]), atoi(argv[3]), argv[4], argv[5]);
    if (argc == 2 && strcmp(argv[1], "--faults") == 0)
        return faults();
    char dir[512];
    snprintf(dir, sizeof dir, "%s", argv[0]);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    const char *stub_dir = dir, *model_arg = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--stubs") == 0)
            stub_dir = argv[i + 1];
        else if (strcmp(argv[i], "--model") == 0)
            model_arg = argv[i + 1];
        else {
            fprintf(stderr, "usage: test_nccl [--stubs DIR] [--model PATH]\n");
            return 2;
        }
    }
    /* the environment's own override, if any, is used for the real NCCL */
    const char *user_lib = getenv("ENGRAM_NCCL_LIBRARY");
    char saved[512] = {0};
    if (user_lib)
        snprintf(saved, sizeof saved, "%s", user_lib);
    refusals();
    stubs(stub_dir);
    if (saved[0])
        setenv("ENGRAM_NCCL_LIBRARY", saved, 1);
    engram_error why;
    int version = 0;
    if (!engram_nccl_available(&version, &why)) {
        without_nccl(&why);
        return tu_finish("test_nccl (no NCCL: refusals only)");
    }
    printf("test_nccl: NCCL %d.%d.%d loaded\n", version / 10000, version / 100 % 100, version % 100);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        uint8_t id[ENGRAM_NCCL_ID_BYTES] = {0};
        engram_nccl *c = NULL;
        engram_error err;
        CHECK_ERR(engram_nccl_open(id, 0, 1, 0, 0, &c, &err), err, -ENODEV, "");
        return tu_finish("test_nccl (NCCL, no GPU)");
    }
    char path[512] = {0};
    if (model_arg)
        snprintf(path, sizeof path, "%s", model_arg);
    else {
        static uint32_t map[ALPHABET];
        engram_layout l;
        CHECK_EQ(tu_layout(&l, map, ALPHABET, 2000, 3000), 0);
        CHECK_EQ(tu_build("nccl.gguf", &l, ENGRAM_FILL_NORMAL, 64, path, sizeof path), 0);
    }
    char faults_lib[600];
    snprintf(faults_lib, sizeof faults_lib, "%s/nccl_stub_faults.so", stub_dir);
    in_child("--faults", faults_lib);
    world_one();
    wrapped();
    {
        /* world 1 through the rows check, in this process */
        uint8_t id[ENGRAM_NCCL_ID_BYTES];
        engram_nccl *c = NULL;
        engram_error err;
        size_t moved = 0;
        CHECK_EQ(engram_nccl_unique_id(id, &err), 0);
        CHECK_EQ(engram_nccl_open(id, 0, 1, 0, 30 * SEC, &c, &err), 0);
        if (c) {
            CHECK_EQ(rows_check(c, path, 0, 1, &moved), 0);
            printf("test_nccl: world 1: sharded pool (rank 0 of 1) rows after the combine equal the "
                   "one-process rows (%zu bytes)\n", moved);
        }
        engram_nccl_close(c);
    }
    ranks(2, path);
    if (ndev >= 4)
        ranks(4, path);
    lonely(); /* last: it aborts a communicator in the middle of its set-up */
    tu_cleanup();
    printf("test_nccl: %d GPU(s)\n", ndev);
    return tu_finish("test_nccl");
}
