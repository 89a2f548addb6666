/*
 * trace_pending.h - run 93's instrument (not part of the library): force-
 * included (nvcc -include) into a copy of engram_cuda.o, it redefines
 * host_err.cuh's CK and quiet() to read the runtime's pending error just
 * before and just after each wrapped call and to print the call's text
 * when a pending cudaErrorInvalidDevice (test_cuda's caller's error) was
 * there before it and gone after it.
 */
#include "host_err.cuh"
#include <stdio.h>

static inline void trace_pending(cudaError_t before, const char *what)
{
    cudaError_t after = cudaPeekAtLastError();
    if (before == cudaErrorInvalidDevice && after != cudaErrorInvalidDevice)
        fprintf(stderr, "TRACE: the pending error gone after %s (now %s)\n", what, cudaGetErrorName(after));
}

#undef CK
#define CK(call, what)                                                                       \
    do {                                                                                     \
        cudaError_t b_ = cudaPeekAtLastError();                                              \
        cudaError_t e_ = (call);                                                             \
        trace_pending(b_, #call);                                                            \
        if (e_ != cudaSuccess)                                                               \
            return cuda_err(err, e_, what);                                                  \
    } while (0)

#define quiet(e) ([&]() {                                                                    \
        cudaError_t b_ = cudaPeekAtLastError();                                              \
        cudaError_t e_ = (e);                                                                \
        trace_pending(b_, #e);                                                               \
        return (quiet)(e_);                                                                  \
    }())
