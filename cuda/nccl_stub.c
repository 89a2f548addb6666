/* nccl_stub.c - libraries that are not a usable NCCL, for test_nccl's
 * refusals (loaded through ENGRAM_NCCL_LIBRARY):
 *  - built plain: two of NCCL's functions, no communicator calls: refused
 *    with -ENOSYS naming the first missing one;
 *  - with -DSTUB_ALL: every function the library looks up, but a version
 *    code of 2.13.0 (before non-blocking communicators): refused with
 *    -ENOSYS naming the version.  None of them is ever called. */
#include <stddef.h>

int ncclGetVersion(int *v);
const char *ncclGetErrorString(int r);

int ncclGetVersion(int *v)
{
    *v = 21300;
    return 0;
}

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
