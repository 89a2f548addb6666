/*
 * ple_cuda.h - the PLE output stage (SPEC.md section 10, "Consumption";
 * the CPU contract is src/output/ple_apply.h) on an NVIDIA GPU.  Internal
 * and in progress (issue #22 item 7): not installed, not part of
 * engram_cuda.h; built into libengram-cuda.a beside the V4.1 path.  C API,
 * no CUDA header needed (a stream is a void *).  CUDA errors as
 * engram_cuda.h says: -EIO naming the call, reported only by the call
 * that made it (a caller's pending error is neither reported nor
 * cleared), none of the library's own left pending.
 *
 * Open from a CPU ple_layer: W_k and W_v go up in their 16-bit type (BF16
 * or F16, output-major [5W][2560]: the 4W keys, then the W values), the
 * norms and taps as F32; a workspace for PLE_CUDA_BLOCK tokens is
 * allocated once.  A call allocates nothing, does not wait for the device
 * and may be captured into a CUDA graph.
 *
 * Per call, in blocks of PLE_CUDA_BLOCK tokens:
 *  1. the projection kv = [W_k; W_v] e into the F32 workspace:
 *     n <= PLE_CUDA_GEMV_MAX (decode), PLE_CUDA_FMA_ONLY, or a matrix in
 *     F16: a GEMV on the CUDA cores, 8 tokens a launch (exact products,
 *     F32 FMAs per lane then a fixed xor-shuffle tree: a token's bits do
 *     not depend on n or its place in the call);
 *     else (a BF16 matrix, n > 8): cuBLAS's BF16 GEMM, F32 compute and
 *     output (exact products, the tensor cores' sums);
 *  2. the gate, one block per token (its x, k and v staged in shared
 *     memory, a warp per stream): Skk, Sxx, D and G in the CPU's order
 *     (ple_apply.h's Sum16, 16 lanes a chain), alpha (sign(0) = 0), rn;
 *  3. the convolution and update, one thread per (index i, 36 tokens), the
 *     4 streams of i at once, the last 9 frames kept in registers; frames
 *     are recomputed from kv, alpha and rn (frame t, channel c = ((alpha v)
 *     rn) gamma_conv), the state read for t < 9 and rewritten at the end.
 * Steps 2 and 3 compute every element as the CPU does (the same
 * operations, rounded once each); expf is taken in double and rounded
 * (the C library's expf is correctly rounded or nearly so).  So the GPU's
 * results differ from the CPU's only through the projection's order of
 * summation (and rare last-bit differences of expf).
 *
 * Masked tokens (mask[t] == 0): their residual is not read or written;
 * their frame is +0 and enters later tokens' convolutions and the state,
 * as on the CPU.  The projection still runs over their rows (whatever
 * they hold, NaN too: the results are not used).
 *
 * Non-finite values (unlike the CPU, nothing is checked before the call):
 * a token whose Skk, Sxx, D or Sgg is not finite (a NaN or infinite row or
 * residual value, an overflow) is left untouched; an output that is not
 * finite is not written (a non-finite state value shows up there).  The
 * lowest such token index of a call is recorded, and ple_cuda_sync reports
 * it (-EDOM).  After that, the tokens before it are as the CPU would have
 * them; it, the tokens after it and the state are unspecified: drop the
 * sequence.
 *
 * Calls on one layer are ordered on the stream they are given and must
 * not run concurrently (one workspace); use a layer per stream.
 */
#ifndef ENGRAM_PLE_CUDA_H
#define ENGRAM_PLE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ple_layer;

#define PLE_CUDA_GEMV_MAX 8u   /* tokens a GEMV launch takes; n <= this: decode */
#define PLE_CUDA_BLOCK 2048u   /* tokens per block of the workspace              */
#define PLE_CUDA_TAPS 4u       /* the only convolution served (T = 4, F = 9)      */

/* ple_cuda_args.flags: every n through the GEMV (no cuBLAS). */
#define PLE_CUDA_FMA_ONLY 1u
/* ple_cuda_args.flags: each kernel launched only when the one before it
 * has finished.  By default (compute capability 9.0+) the gate and the
 * convolution are programmatic dependent launches: their blocks are
 * scheduled while the kernel before them finishes and wait on the device
 * for its results (the same bits; hides launch latency). */
#define PLE_CUDA_SERIAL 2u

typedef struct ple_cuda_layer ple_cuda_layer;

/* Uploads L (which may be freed afterwards) to `device`.  -ENODEV (no
 * usable GPU, why in err), -ENOTSUP (F32 projection weights, taps other
 * than 4, or a width whose 9W floats do not fit a block's shared memory:
 * W above about 6400 on an H100/H200), -ENOMEM, -EIO (a CUDA or cuBLAS
 * call, named). */
int ple_cuda_layer_open(const struct ple_layer *L, int device, ple_cuda_layer **out,
                        engram_error *err);
void ple_cuda_layer_close(ple_cuda_layer *c);
/* Bytes on the device: weights (5W x 2560 x 2), norms and taps (7 x 4W x
 * 4), workspace (PLE_CUDA_BLOCK x (5W x 4 + 21)), cuBLAS's workspace. */
uint64_t ple_cuda_layer_bytes(const ple_cuda_layer *c);
uint32_t ple_cuda_layer_width(const ple_cuda_layer *c);

typedef struct ple_cuda_args {
    const uint16_t *rows;      /* device: [n][2560] BF16 bits, 16-byte aligned        */
    void *resid;               /* device: [n][4][W], updated in place                 */
    engram_dtype resid_dtype;  /* ENGRAM_F32 or ENGRAM_BF16 (stores bf16 of the result) */
    const uint8_t *mask;       /* device: [n], 0 = masked; NULL: none                  */
    float *state;              /* device: [9][4W] F32, oldest frame first; read and
                                  advanced over the n positions (zeros at a start)    */
    unsigned n;
    void *stream;              /* cudaStream_t; NULL = the default stream            */
    unsigned flags;            /* 0, PLE_CUDA_FMA_ONLY, PLE_CUDA_SERIAL (or'd)         */
} ple_cuda_args;

/* Applies the stage to n consecutive positions of one sequence, on the
 * stream, asynchronously.  -EINVAL (NULL, alignment, type, flags; checked
 * on the host, nothing queued), -EIO (a launch or cuBLAS failed: what was
 * queued before it stays queued). */
int ple_cuda_apply(ple_cuda_layer *c, const ple_cuda_args *a, engram_error *err);
/* The projection alone: kv [n][5W] F32 (4W keys, then W values) on the
 * device, by the path apply would take (resid, mask and state unused). */
int ple_cuda_project(ple_cuda_layer *c, const ple_cuda_args *a, float *kv, engram_error *err);
/* Waits for the stream; reports (and clears) the lowest non-finite token
 * recorded since the last sync (-EDOM naming it) or a CUDA error (-EIO). */
int ple_cuda_sync(ple_cuda_layer *c, void *stream, engram_error *err);

#ifdef __cplusplus
}
#endif

#endif
