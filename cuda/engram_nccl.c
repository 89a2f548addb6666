/*
 * engram_nccl.c - libengram-nccl: the sharded rows' combine on device
 * buffers with NCCL, loaded at run time (include/engram_nccl.h has the
 * contract, cuda/nccl_abi.h the part of NCCL's interface used).
 */
#include "engram_nccl.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error_fill.h"
#include "nccl_abi.h"

#define DEFAULT_TIMEOUT_NS (60ull * 1000000000ull)

/* NCCL's functions as this file calls them (prototypes of our own, from
 * NCCL's documented signatures; the types from nccl_abi.h). */
typedef int (*get_version_fn)(int *);
typedef const char *(*get_error_string_fn)(int);
typedef const char *(*get_last_error_fn)(eng_nccl_comm);
typedef int (*get_unique_id_fn)(eng_nccl_id *);
typedef int (*init_rank_config_fn)(eng_nccl_comm *, int, eng_nccl_id, int, eng_nccl_config *);
typedef int (*comm_fn)(eng_nccl_comm);
typedef int (*comm_int_fn)(eng_nccl_comm, int *);
typedef int (*async_error_fn)(eng_nccl_comm, int *);
typedef int (*all_reduce_fn)(const void *, void *, size_t, int, int, eng_nccl_comm, void *);

struct fns {
    get_version_fn get_version;
    get_error_string_fn error_string;
    get_last_error_fn last_error; /* NCCL 2.13 and later; may be NULL */
    get_unique_id_fn unique_id;
    init_rank_config_fn init_rank_config;
    comm_fn finalize, destroy, abort_;
    comm_int_fn count, user_rank, cu_device;
    async_error_fn async_error;
    all_reduce_fn all_reduce;
};
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded, loaded_version; /* set once every function is found; never unloaded */
static struct fns nccl;

struct engram_nccl {
    eng_nccl_comm comm;
    int rank, world, device, wrapped, aborted;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* dlopen + dlsym of everything, under the lock; a failure unloads what it
 * opened and is tried again by the next call (the library may appear, or
 * ENGRAM_NCCL_LIBRARY change, as in the tests). */
static int load(engram_error *err)
{
    pthread_mutex_lock(&load_lock);
    if (loaded) {
        pthread_mutex_unlock(&load_lock);
        return 0;
    }
    const char *name = getenv("ENGRAM_NCCL_LIBRARY");
    if (!name || !*name)
        name = "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        pthread_mutex_unlock(&load_lock);
        return err_fail(err, -ENOSYS, "NCCL not found: dlopen %s: %.180s", name, why ? why : "failed");
    }
    struct fns f;
    memset(&f, 0, sizeof f);
    struct {
        const char *sym;
        void **slot;
        int optional;
    } want[] = {
        {"ncclGetVersion", (void **)&f.get_version, 0},
        {"ncclGetErrorString", (void **)&f.error_string, 0},
        {"ncclGetLastError", (void **)&f.last_error, 1},
        {"ncclGetUniqueId", (void **)&f.unique_id, 0},
        {"ncclCommInitRankConfig", (void **)&f.init_rank_config, 0},
        {"ncclCommFinalize", (void **)&f.finalize, 0},
        {"ncclCommDestroy", (void **)&f.destroy, 0},
        {"ncclCommAbort", (void **)&f.abort_, 0},
        {"ncclCommCount", (void **)&f.count, 0},
        {"ncclCommUserRank", (void **)&f.user_rank, 0},
        {"ncclCommCuDevice", (void **)&f.cu_device, 0},
        {"ncclCommGetAsyncError", (void **)&f.async_error, 0},
        {"ncclAllReduce", (void **)&f.all_reduce, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = dlsym(h, want[i].sym);
        if (!*want[i].slot && !want[i].optional) {
            dlclose(h);
            pthread_mutex_unlock(&load_lock);
            return err_fail(err, -ENOSYS, "NCCL unusable: %s has no %s (NCCL 2.14 or later is needed)", name,
                            want[i].sym);
        }
    }
    int v = 0;
    if (f.get_version(&v) != ENG_NCCL_SUCCESS || v < ENG_NCCL_VERSION(2, 14, 0)) {
        dlclose(h);
        pthread_mutex_unlock(&load_lock);
        return err_fail(err, -ENOSYS, "NCCL unusable: %s reports version %d (2.14 or later is needed)", name, v);
    }
    nccl = f;
    loaded_version = v;
    loaded = 1;
    pthread_mutex_unlock(&load_lock);
    return 0;
}

static int errno_of(int r)
{
    switch (r) {
    case ENG_NCCL_INVALID_ARGUMENT:
    case ENG_NCCL_INVALID_USAGE:
        return -EINVAL;
    case ENG_NCCL_REMOTE_ERROR:
        return -ECONNRESET;
    default:
        return -EIO;
    }
}

/* NCCL's result r of `call` as a negative errno with NCCL's texts. */
static int fail_nccl(engram_error *err, const char *call, int r, eng_nccl_comm comm, const char *after)
{
    const char *s = nccl.error_string(r);
    const char *last = nccl.last_error ? nccl.last_error(comm) : NULL;
    return err_fail(err, errno_of(r), "%s: NCCL error %d (%.80s)%s%.120s%s", call, r, s ? s : "?",
                    last && *last ? ": " : "", last ? last : "", after ? after : "");
}

static int fail_cuda(engram_error *err, const char *call, cudaError_t e)
{
    return err_fail(err, e == cudaErrorNoDevice || e == cudaErrorInvalidDevice || e == cudaErrorInsufficientDriver
                             ? -ENODEV : -EIO,
                    "%s: %s (%.150s)", call, cudaGetErrorName(e), cudaGetErrorString(e));
}

static void pause_briefly(uint64_t waited_ns)
{
    /* spin for the first 100 us (a decode step's collective), then sleep
     * 50 us between polls so a wait of seconds does not hold a core */
    if (waited_ns < 100000)
        sched_yield();
    else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static void abort_comm(engram_nccl *c)
{
    if (!c->aborted && !c->wrapped) {
        nccl.abort_(c->comm);
        c->aborted = 1;
    }
}

/* A non-blocking communicator's call returned ncclInProgress: polls its
 * asynchronous error until the call has finished, for timeout_ns. */
static int settle(eng_nccl_comm comm, int r, uint64_t timeout_ns, int *timed_out)
{
    uint64_t t0 = now_ns();
    *timed_out = 0;
    while (r == ENG_NCCL_IN_PROGRESS) {
        uint64_t waited = now_ns() - t0;
        if (timeout_ns != ENGRAM_FOREVER && waited >= timeout_ns) {
            *timed_out = 1;
            break;
        }
        pause_briefly(waited);
        int a = ENG_NCCL_SUCCESS;
        int q = nccl.async_error(comm, &a);
        r = q != ENG_NCCL_SUCCESS ? q : a;
    }
    return r;
}

int engram_nccl_available(int *version, engram_error *err)
{
    if (load(err) < 0)
        return 0;
    if (version)
        *version = loaded_version;
    return 1;
}

int engram_nccl_unique_id(uint8_t id[ENGRAM_NCCL_ID_BYTES], engram_error *err)
{
    if (!id)
        return err_fail(err, -EINVAL, "engram_nccl_unique_id: id is NULL");
    int rc = load(err);
    if (rc < 0)
        return rc;
    eng_nccl_id u;
    memset(&u, 0, sizeof u);
    int r = nccl.unique_id(&u);
    if (r != ENG_NCCL_SUCCESS)
        return fail_nccl(err, "ncclGetUniqueId", r, NULL, NULL);
    memcpy(id, u.internal, sizeof u.internal);
    return 0;
}

int engram_nccl_open(const uint8_t id[ENGRAM_NCCL_ID_BYTES], int rank, int world, int device,
                     uint64_t timeout_ns, engram_nccl **out, engram_error *err)
{
    if (!out)
        return err_fail(err, -EINVAL, "engram_nccl_open: out is NULL");
    *out = NULL;
    if (!id)
        return err_fail(err, -EINVAL, "engram_nccl_open: id is NULL");
    if (world < 1 || rank < 0 || rank >= world)
        return err_fail(err, -EINVAL, "engram_nccl_open: rank %d not in a world of %d", rank, world);
    if (device < 0)
        return err_fail(err, -EINVAL, "engram_nccl_open: device %d", device);
    int rc = load(err);
    if (rc < 0)
        return rc;
    if (timeout_ns == 0)
        timeout_ns = DEFAULT_TIMEOUT_NS;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess)
        return fail_cuda(err, "engram_nccl_open: cudaGetDeviceCount", e);
    if (device >= ndev)
        return err_fail(err, -ENODEV, "engram_nccl_open: device %d, but %d CUDA device(s)", device, ndev);
    int prev = -1;
    if ((e = cudaGetDevice(&prev)) != cudaSuccess)
        return fail_cuda(err, "engram_nccl_open: cudaGetDevice", e);
    engram_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return err_fail(err, -ENOMEM, "engram_nccl_open: out of memory");
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        free(c);
        return fail_cuda(err, "engram_nccl_open: cudaSetDevice", e);
    }
    eng_nccl_id u;
    memcpy(u.internal, id, sizeof u.internal);
    eng_nccl_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    cfg.magic = ENG_NCCL_CONFIG_MAGIC;
    cfg.version = ENG_NCCL_VERSION(2, 14, 0);
    cfg.blocking = 0;
    eng_nccl_comm comm = NULL;
    int r = nccl.init_rank_config(&comm, world, u, rank, &cfg);
    int timed_out = 0;
    if (comm && r == ENG_NCCL_IN_PROGRESS)
        r = settle(comm, r, timeout_ns, &timed_out);
    if (r != ENG_NCCL_SUCCESS || timed_out) {
        /* the half-made communicator's error text before it is freed */
        int code = timed_out ? err_fail(err, -ETIMEDOUT, "ncclCommInitRankConfig: rank %d of %d: not every rank "
                                        "joined within %.1f s (communicator aborted)", rank, world,
                                        (double)timeout_ns / 1e9)
                             : fail_nccl(err, "ncclCommInitRankConfig", r, comm,
                                         comm ? " (communicator aborted)" : "");
        if (comm)
            nccl.abort_(comm);
        free(c);
        cudaSetDevice(prev); /* a failed open leaves the thread's device as it was */
        return code;
    }
    c->comm = comm;
    c->rank = rank;
    c->world = world;
    c->device = device;
    *out = c;
    return 0;
}

int engram_nccl_wrap(void *nccl_comm, engram_nccl **out, engram_error *err)
{
    if (!out)
        return err_fail(err, -EINVAL, "engram_nccl_wrap: out is NULL");
    *out = NULL;
    if (!nccl_comm)
        return err_fail(err, -EINVAL, "engram_nccl_wrap: the communicator is NULL");
    int rc = load(err);
    if (rc < 0)
        return rc;
    int world = 0, rank = 0, dev = 0, r;
    if ((r = nccl.count(nccl_comm, &world)) != ENG_NCCL_SUCCESS)
        return fail_nccl(err, "ncclCommCount", r, nccl_comm, NULL);
    if ((r = nccl.user_rank(nccl_comm, &rank)) != ENG_NCCL_SUCCESS)
        return fail_nccl(err, "ncclCommUserRank", r, nccl_comm, NULL);
    if ((r = nccl.cu_device(nccl_comm, &dev)) != ENG_NCCL_SUCCESS)
        return fail_nccl(err, "ncclCommCuDevice", r, nccl_comm, NULL);
    engram_nccl *c = calloc(1, sizeof *c);
    if (!c)
        return err_fail(err, -ENOMEM, "engram_nccl_wrap: out of memory");
    c->comm = nccl_comm;
    c->world = world;
    c->rank = rank;
    c->device = dev;
    c->wrapped = 1;
    *out = c;
    return 0;
}

void engram_nccl_close(engram_nccl *c)
{
    if (!c)
        return;
    if (!c->wrapped && !c->aborted) {
        /* finalize (flushes NCCL's work, non-blocking: polled for at most
         * 10 s), then destroy; a failure or timeout aborts instead */
        int timed_out = 0;
        int r = settle(c->comm, nccl.finalize(c->comm), 10ull * 1000000000ull, &timed_out);
        if (r == ENG_NCCL_SUCCESS && !timed_out)
            r = nccl.destroy(c->comm);
        if (r != ENG_NCCL_SUCCESS || timed_out)
            nccl.abort_(c->comm);
    }
    free(c);
}

void engram_nccl_get_info(const engram_nccl *c, engram_nccl_info *info)
{
    if (!info)
        return;
    memset(info, 0, sizeof *info);
    if (!c)
        return;
    info->rank = c->rank;
    info->world = c->world;
    info->device = c->device;
    info->version = loaded_version;
    info->wrapped = c->wrapped;
    info->aborted = c->aborted;
}

/* The communicator's pending asynchronous error, as a failure (and an
 * abort), or 0. */
static int check_async(engram_nccl *c, const char *call, engram_error *err)
{
    int a = ENG_NCCL_SUCCESS;
    int q = nccl.async_error(c->comm, &a);
    int r = q != ENG_NCCL_SUCCESS ? q : a;
    if (r == ENG_NCCL_SUCCESS || r == ENG_NCCL_IN_PROGRESS)
        return 0;
    int code = fail_nccl(err, call, r, c->comm, c->wrapped ? "" : " (communicator aborted)");
    abort_comm(c);
    return code;
}

int engram_nccl_combine_into(engram_nccl *c, const void *send, void *recv, size_t bytes, void *stream,
                             engram_error *err)
{
    if (!c)
        return err_fail(err, -EINVAL, "engram_nccl_combine: no communicator");
    if (bytes && (!send || !recv))
        return err_fail(err, -EINVAL, "engram_nccl_combine: NULL buffer of %zu bytes", bytes);
    if (bytes && send != recv) {
        uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
        if (s < r + bytes && r < s + bytes)
            return err_fail(err, -EINVAL, "engram_nccl_combine: send and recv overlap");
    }
    if (c->aborted)
        return err_fail(err, -EIO, "engram_nccl_combine: the communicator was aborted after an earlier failure");
    if (bytes == 0)
        return 0;
    int rc = check_async(c, "engram_nccl_combine: ncclCommGetAsyncError", err);
    if (rc < 0)
        return rc;
    /* NCCL enqueues on the comm's device; the caller's current device is
     * restored after. */
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess)
        return fail_cuda(err, "engram_nccl_combine: cudaGetDevice", e);
    if (cur != c->device && (e = cudaSetDevice(c->device)) != cudaSuccess)
        return fail_cuda(err, "engram_nccl_combine: cudaSetDevice", e);
    int r = nccl.all_reduce(send, recv, bytes, ENG_NCCL_UINT8, ENG_NCCL_MAX, c->comm, stream);
    int timed_out = 0;
    if (r == ENG_NCCL_IN_PROGRESS)
        r = settle(c->comm, r, DEFAULT_TIMEOUT_NS, &timed_out);
    if (cur != c->device)
        cudaSetDevice(cur);
    if (timed_out) {
        rc = err_fail(err, -ETIMEDOUT, "ncclAllReduce: not enqueued within 60 s%s",
                      c->wrapped ? "" : " (communicator aborted)");
        abort_comm(c);
        return rc;
    }
    if (r != ENG_NCCL_SUCCESS) {
        rc = fail_nccl(err, "ncclAllReduce", r, c->comm, c->wrapped ? "" : " (communicator aborted)");
        abort_comm(c);
        return rc;
    }
    return 0;
}

int engram_nccl_combine(engram_nccl *c, void *buf, size_t bytes, void *stream, engram_error *err)
{
    return engram_nccl_combine_into(c, buf, buf, bytes, stream, err);
}

int engram_nccl_wait(engram_nccl *c, void *stream, uint64_t timeout_ns, engram_error *err)
{
    if (!c)
        return err_fail(err, -EINVAL, "engram_nccl_wait: no communicator");
    if (c->aborted)
        return err_fail(err, -EIO, "engram_nccl_wait: the communicator was aborted after an earlier failure");
    uint64_t t0 = now_ns();
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            int rc = fail_cuda(err, "engram_nccl_wait: cudaStreamQuery", e);
            abort_comm(c);
            return rc;
        }
        int rc = check_async(c, "engram_nccl_wait: ncclCommGetAsyncError", err);
        if (rc < 0)
            return rc;
        if (timeout_ns == 0) /* a poll: nothing given up */
            return err_fail(err, -EAGAIN, "engram_nccl_wait: the stream has not finished yet (a poll)");
        uint64_t waited = now_ns() - t0;
        if (timeout_ns != ENGRAM_FOREVER && waited >= timeout_ns) {
            if (c->wrapped)
                return err_fail(err, -ETIMEDOUT, "engram_nccl_wait: the stream has not finished within %.3f s "
                                "(the caller's communicator is left running)", (double)timeout_ns / 1e9);
            rc = err_fail(err, -ETIMEDOUT, "engram_nccl_wait: the stream has not finished within %.3f s "
                          "(a peer that never joined?): communicator aborted", (double)timeout_ns / 1e9);
            abort_comm(c);
            return rc;
        }
        pause_briefly(waited);
    }
}
