/*
 * host_err.cuh - the CUDA files' host side of the library's one error
 * convention (engram.h: 0 or a negative errno, an engram_error naming what
 * failed; a CUDA error is -EIO with its name and text), and their launches.
 *
 * A CUDA error is reported by the call that made it, and only there:
 *  - every launch is checked by the value its own launch call returns
 *    (launch() below), never by cudaGetLastError(), which would find an
 *    error the caller's own CUDA call left pending and report it as the
 *    library's (and consume it);
 *  - cuda_err() clears the runtime's last error as it reports one, so no
 *    later call (the library's or the caller's) finds it as its own.  The
 *    failing call set it, so only the library's error is cleared; an error
 *    that breaks the context (a sticky one) stays whatever is cleared.
 * cuBLAS runs on a runtime of its own (libcublas imports none of the CUDA
 * runtime's calls): its failures are statuses (blas_err), and it neither
 * sets nor reads this runtime's last error, so blas_err clears nothing.
 */
#ifndef ENGRAM_CUDA_HOST_ERR_CUH
#define ENGRAM_CUDA_HOST_ERR_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>

#include "engram.h"

/* A call whose failure is not reported (a cleanup, a query whose answer
 * is enough): its own error, if it made one, cleared, so that no later
 * call finds it as its own.  1 if it succeeded, else 0. */
static inline int quiet(cudaError_t e)
{
    if (e == cudaSuccess)
        return 1;
    (void)cudaGetLastError(); /* e's own */
    return 0;
}

static int cuda_err(engram_error *err, cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* e's own, set by the call that failed */
    if (err) {
        err->code = -EIO;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return -EIO;
}

static int set_err(engram_error *err, int code, const char *msg)
{
    if (err) {
        err->code = code;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    return code;
}

/* a cuBLAS call's failure (status s) */
static int blas_err(engram_error *err, cublasStatus_t s, const char *what)
{
    char m[128];
    snprintf(m, sizeof m, "%s failed (cuBLAS status %d)", what, (int)s);
    return set_err(err, -EIO, m);
}

#define CK(call, what)                                                                       \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return cuda_err(err, e_, what);                                                  \
    } while (0)

#define CKB(call, what)                                                                      \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return blas_err(err, s_, what);                                                  \
    } while (0)

/* kernel<<<grid, block, smem, st>>>(args) with the launch's own error as
 * the value; pdl: as a programmatic dependent of the stream's previous
 * kernel (programmatic stream serialization: the kernel waits for it
 * before reading what it wrote) */
template <typename... KArgs, typename... Args>
static cudaError_t launch(int pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                          void (*kernel)(KArgs...), Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...); /* each converted as a call converts */
}

#endif
