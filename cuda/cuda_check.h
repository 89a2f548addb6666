/* cuda_check.h - CU(call): a CUDA runtime call in the GPU test and bench
 * programs, checked; on failure the file, line, call and CUDA's message,
 * then exit(1) (programs only: the library reports errors, never exits). */
#ifndef ENGRAM_CUDA_CHECK_H
#define ENGRAM_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CU(call)                                                                             \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#endif
