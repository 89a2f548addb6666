/* nccl_stub.c - libraries that are not a usable NCCL, for test_nccl (loaded
 * through ENGRAM_NCCL_LIBRARY):
 *  - built plain: two of NCCL's functions, no communicator calls: refused
 *    with -ENOSYS naming the first missing one;
 *  - with -DSTUB_ALL: every function the library looks up, but a version
 *    code of 2.13.0 (before non-blocking communicators): refused with
 *    -ENOSYS naming the version;
 *  - with -DSTUB_FAULTS: a fault injector at the NCCL seam: version 2.28.0,
 *    every call answering what the environment says at the time of the
 *    call (STUB_INIT: ncclCommInitRankConfig's result, STUB_ASYNC:
 *    ncclCommGetAsyncError's, STUB_ALLREDUCE: ncclAllReduce's; 0 when
 *    unset), no GPU work at all; counters of aborts and destroys for the
 *    test to read (dlsym).  The config is checked as NCCL checks it. */
#include <stdlib.h>
#include <string.h>

int ncclGetVersion(int *v);
const char *ncclGetErrorString(int r);

#ifndef STUB_FAULTS
int ncclGetVersion(int *v)
{
    *v = 21300;
    return 0;
}
#endif

const char *ncclGetErrorString(int r)
{
    return r ? "stub error" : "no error";
}

#ifdef STUB_ALL
#define STUB(name) int name(void); int name(void) { return 3; }
STUB(ncclGetUniqueId)
STUB(ncclCommInitRankConfig)
STUB(ncclCommFinalize)
STUB(ncclCommDestroy)
STUB(ncclCommAbort)
STUB(ncclCommCount)
STUB(ncclCommUserRank)
STUB(ncclCommCuDevice)
STUB(ncclCommGetAsyncError)
STUB(ncclAllReduce)
#endif

#ifdef STUB_FAULTS
typedef struct {
    char internal[128];
} stub_id;
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking;
} stub_config;

int stub_aborts, stub_destroys, stub_allreduces;
static int fake_comm;

static int env(const char *name)
{
    const char *s = getenv(name);
    return s ? atoi(s) : 0;
}

const char *ncclGetLastError(void *comm);
int ncclGetUniqueId(stub_id *id);
int ncclCommInitRankConfig(void **comm, int n, stub_id id, int rank, stub_config *cfg);
int ncclCommFinalize(void *comm);
int ncclCommDestroy(void *comm);
int ncclCommAbort(void *comm);
int ncclCommCount(void *comm, int *n);
int ncclCommUserRank(void *comm, int *r);
int ncclCommCuDevice(void *comm, int *d);
int ncclCommGetAsyncError(void *comm, int *a);
int ncclAllReduce(const void *s, void *r, size_t n, int type, int op, void *comm, void *stream);

int ncclGetVersion(int *v)
{
    *v = 22800;
    return 0;
}
const char *ncclGetLastError(void *comm)
{
    (void)comm;
    return "the stub's last error";
}
int ncclGetUniqueId(stub_id *id)
{
    memset(id->internal, 7, sizeof id->internal);
    return 0;
}
int ncclCommInitRankConfig(void **comm, int n, stub_id id, int rank, stub_config *cfg)
{
    if (!cfg || cfg->magic != 0xcafebeefu || cfg->version < 21400 || cfg->blocking != 0 || n < 1 || rank < 0 ||
        rank >= n || id.internal[0] != 7)
        return 4;
    *comm = &fake_comm;
    return env("STUB_INIT");
}
int ncclCommFinalize(void *comm)
{
    (void)comm;
    return 0;
}
int ncclCommDestroy(void *comm)
{
    (void)comm;
    stub_destroys++;
    return 0;
}
int ncclCommAbort(void *comm)
{
    (void)comm;
    stub_aborts++;
    return 0;
}
int ncclCommCount(void *comm, int *n)
{
    (void)comm;
    *n = 2;
    return 0;
}
int ncclCommUserRank(void *comm, int *r)
{
    (void)comm;
    *r = 1;
    return 0;
}
int ncclCommCuDevice(void *comm, int *d)
{
    (void)comm;
    *d = 0;
    return 0;
}
int ncclCommGetAsyncError(void *comm, int *a)
{
    (void)comm;
    *a = env("STUB_ASYNC");
    return 0;
}
int ncclAllReduce(const void *s, void *r, size_t n, int type, int op, void *comm, void *stream)
{
    (void)s, (void)r, (void)n, (void)comm, (void)stream;
    stub_allreduces++;
    return type == 1 && op == 2 ? env("STUB_ALLREDUCE") : 4; /* ncclUint8, ncclMax */
}
#endif
