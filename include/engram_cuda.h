/*
 * engram_cuda.h - Engram's output stage on an NVIDIA GPU (libengram-cuda,
 * built when nvcc is present; it needs libengram).  The library loads and
 * links without a GPU or a driver: engram_cuda_available() says why it
 * cannot run.  Conventions as in engram.h (0 or a negative errno, an
 * engram_error naming what failed); CUDA errors map to -EIO with the CUDA
 * error's name and text in the message.  A CUDA error is reported by the
 * call that made it: apply, project, a plan's open, run and close, and sync
 * check each CUDA call and launch by its own result, so an error the
 * caller's own CUDA call left pending (cudaGetLastError's) is neither
 * reported as theirs nor cleared (a layer's open may clear it: it probes
 * the device); a failing call leaves no CUDA error of its own pending (one
 * that breaks the context, a sticky error, stays: every later call
 * reports it).  A call that fails part-way
 * has launched part of its work: the residual's contents are then
 * unspecified for the call's tokens.  Each call that reaches the device
 * (a layer's open and close, project, apply, sync, a plan's open, run and
 * close; not engram_cuda_layer_bytes, nor a call refused for its
 * arguments) makes the layer's device the calling thread's current device
 * (cudaSetDevice) and leaves it so: a caller working on other devices
 * sets its own back.  This header needs no CUDA
 * header (a stream is a void *).  How it is done, and what it measured on an
 * H200: cuda/README.md in the source tree.
 *
 * Rows arrive raw (264 bytes each, as the pool delivers them with
 * ENGRAM_RAW, already checked to decode) and are decoded on the GPU (E4M3 x
 * 2^E8M0, rounded to BF16 as SPEC.md section 7 says).  The projection, by
 * the number n of tokens of a call:
 *  - on compute capability 9.0 (sm_90a code), every n: exact products on
 *    the tensor cores, their sums promoted to F32 every 256 products, one
 *    pass over the weights for all n <= ENGRAM_CUDA_GEMV_MAX tokens
 *    (decode, batched decode) and a GEMM for more (prefill): the same
 *    arithmetic, so a token's projection is the same bits whatever the
 *    number of tokens of its call (not the CPU's bits: another order; the
 *    same accuracy).  A token whose block scales span more than 21 binades
 *    (trained tables' tokens span a few), or with a nonzero block of scale
 *    under 3 (values under 2^-116: none in trained tables), takes the GEMV's
 *    arithmetic instead: on an H200 ~0.8 ms more for a decode call that has
 *    one, ~0.2 ms more per such token in a prefill.
 *  - on other GPUs, n <= ENGRAM_CUDA_GEMV_MAX: one pass over the weights on
 *    the tensor cores (mma.sync), each block of 32 products (one E8M0
 *    scale) summed by the tensor cores and promoted to F32, the blocks in
 *    input order: the same bits for a token whatever n <= 64.  Larger n:
 *    cuBLAS's F16 GEMM, its own sums, less accurate (short of the CPU
 *    path's tolerance at W = 5120).
 *  - ENGRAM_CUDA_FMA_ONLY takes a GEMV's arithmetic (F32 FMAs on the CUDA
 *    cores) for every n.
 * Then the gate and update, fused, with engram.h's arithmetic (the device's
 * expf/sqrtf): a token is written whole or not at all, masked tokens are
 * not touched.
 * Memory on the device per layer (engram_cuda_layer_bytes): F16 weights
 * (N x 6144 x 2 bytes, 314.6 MB at W = 5120), q*k norms (S x W x 4), and
 * a workspace for ENGRAM_CUDA_BLOCK tokens: their rows as F16 (25.2 MB) and
 * kv as BF16, the wgmma GEMM's output (N x BLOCK x 2 bytes, 104.9 MB at
 * W = 5120); 445 MB in all at W = 5120.  Where the wgmma GEMM cannot run,
 * cuBLAS writes F32 kv and that part doubles (550 MB in all).  Not
 * counted: the CUDA context and cuBLAS's handle (its own workspace).
 * Not counted either: up to ENGRAM_CUDA_GRAPHS graphs of decode calls a
 * layer keeps (engram_cuda_apply below), the driver's memory for one
 * call's kernels each (no device buffer of ours), freed when replaced and
 * at close.
 * Calls on one cuda layer are ordered on the stream they are given and must
 * not run concurrently, on the device or on the host (one workspace, and
 * the layer's graphs are its state too); use a layer per stream.
 */
#ifndef ENGRAM_CUDA_H
#define ENGRAM_CUDA_H

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

#define ENGRAM_CUDA_GEMV_MAX 64u     /* tokens taking the decode path        */
#define ENGRAM_CUDA_BLOCK 2048u      /* tokens per GEMM block                 */
/* engram_cuda_args.flags: every token through the GEMV's arithmetic (F32
 * FMAs rounded to nearest on the CUDA cores, no tensor cores), whatever n:
 * the CPU path's accuracy for prefill too, at a fraction of the speed. */
#define ENGRAM_CUDA_FMA_ONLY 1u
/* (2u was ENGRAM_CUDA_FAST_SUMS, cuBLAS's sums for prefill: removed, short
 * of the tolerance; refused as an unknown flag) */
/* engram_cuda_args.flags: for n <= ENGRAM_CUDA_GEMV_MAX, every kernel of
 * the call launched only when the one before has finished (the decode
 * projection follows a kernel that prepares the tokens' operands, except
 * for up to 8 tokens without wgmma).  By default (compute capability 9.0
 * and up) the projection and the gate are programmatic dependent launches:
 * with wgmma the projection asks for its first weights while the operands
 * are made; the gate's blocks are scheduled before the projection's last
 * kernel finishes; each waits on the device for the results it reads (the
 * same bits; hides the launches).  For measuring, and for tools that
 * cannot follow such edges. */
#define ENGRAM_CUDA_SERIAL_GATE 4u
/* engram_cuda_args.flags: the call launched kernel by kernel, never as a
 * graph of the layer's (engram_cuda_apply below); the same bits.  Plans
 * and engram_cuda_project accept it and have nothing to change. */
#define ENGRAM_CUDA_NO_GRAPH 8u
#define ENGRAM_CUDA_GRAPHS 4u        /* decode calls' graphs kept per layer */

/* 1 if a CUDA device can be used (err not touched); else 0, and err (if
 * not NULL) holds code -ENODEV, offset ENGRAM_NO_OFFSET, row ENGRAM_NO_ROW
 * and the reason in msg (the CUDA runtime's error text, or "no CUDA
 * device").  A predicate, not a 0-or-errno call. */
int engram_cuda_available(engram_error *err);

/*
 * Staging: fills engram_pool_opts.reader.host so that every buffer the
 * library allocates for rows (the reader's buffers, the rings of prefills)
 * is page-locked with cudaHostRegister on the current device: reads land
 * in page-locked memory, and copies from it to the GPU on the caller's
 * stream are asynchronous DMA.  Buffers the caller owns (step outputs,
 * prefill_opts.ring_mem: allocated and registered once, reused for every
 * prompt) are registered by the caller.  A registration the driver refuses
 * (no GPU) leaves the buffer pageable; nothing fails.
 */
void engram_cuda_host_hooks(engram_host_hooks *h);

typedef struct engram_cuda_layer engram_cuda_layer;

/* Uploads a layer's weights (from an engram_layer, which may be closed
 * afterwards) to `device`.  -ENODEV (no usable GPU, why in err), -ENOMEM,
 * -EIO. */
int engram_cuda_layer_open(const engram_layer *L, int device, engram_cuda_layer **out,
                           engram_error *err);
/* Frees the layer, its graphs (engram_cuda_apply) too; reports nothing and
 * leaves no CUDA error of its own pending. */
void engram_cuda_layer_close(engram_cuda_layer *c);
uint64_t engram_cuda_layer_bytes(const engram_cuda_layer *c);

typedef struct engram_cuda_args {
    const uint8_t *raw;      /* device: rows of the layer's table, 24 x 264 bytes per token */
    size_t raw_stride;       /* bytes from one token's rows to the next's (0 = 24 x 264);
                                48 x 264 for the pool's [token][48][264] deliveries,
                                with raw pointing at the table's first row          */
    void *resid;             /* device: [n][S][W], updated in place                 */
    engram_dtype resid_dtype;/* ENGRAM_BF16 or ENGRAM_F32                           */
    const uint8_t *mask;     /* device: [n], 0 = masked (untouched); NULL: none       */
    unsigned n;
    /* For graph capture: if not NULL, a device int i read by the kernels at
     * run time: raw += i * raw_step, resid += i * resid_step bytes (decode
     * path only: n <= ENGRAM_CUDA_GEMV_MAX), so one captured graph serves
     * every step. */
    const int *d_step;
    size_t raw_step, resid_step;
    void *stream;            /* cudaStream_t; NULL = the default stream          */
    unsigned flags;          /* 0 or ENGRAM_CUDA_FMA_ONLY, or'd with
                                ENGRAM_CUDA_SERIAL_GATE and ENGRAM_CUDA_NO_GRAPH    */
} engram_cuda_args;

/*
 * Projection, gate and update on the stream, asynchronously: the host does
 * not wait, and the call can be captured into a CUDA graph (with d_step,
 * one graph serves every decode step).  Non-finite values (the policy): a
 * token whose residual input or outputs are not all finite is left
 * untouched and recorded; engram_cuda_sync() reports the first such token
 * (-EDOM).  -EINVAL for bad arguments (checked on the host first).
 * A decode call (1 <= n <= ENGRAM_CUDA_GEMV_MAX) on a stream not under
 * capture, without ENGRAM_CUDA_NO_GRAPH, is looked up by its arguments
 * (all of them but the stream) among the layer's last ENGRAM_CUDA_GRAPHS
 * distinct ones: the first time, it is launched kernel by kernel and
 * remembered (the least recently used forgotten, its graph destroyed);
 * the second time, its launches are captured into a graph, as a plan's
 * are (below), and the graph uploaded; from then on the call is that
 * graph's launch on the call's stream: the same kernels and bits, one
 * submission (BENCHMARKS.md measures both ways).  The thread's capture
 * mode is relaxed while a graph is made, uploaded or destroyed, so other
 * captures under way go on.  So a decode loop that passes the same
 * buffers each step gets a plan's speed without one; the second call of a
 * set of arguments allocates the graph (driver and host memory) and does
 * a plan's open's work on the host (a capture, an instantiation) and the
 * upload, and no other call allocates.  A
 * graph that cannot be made is not an error: those arguments are then
 * launched kernel by kernel until forgotten.  -EIO naming cudaGraphLaunch
 * if the graph's launch fails (the call not submitted; its arguments
 * forgotten).  Launches of one graph are ordered among themselves, so
 * calls with the same arguments on two streams also run one after the
 * other.
 */
int engram_cuda_apply(engram_cuda_layer *c, const engram_cuda_args *a, engram_error *err);
/* The projection alone: kv [n][(S+1)W] F32 on the device. */
int engram_cuda_project(engram_cuda_layer *c, const engram_cuda_args *a, float *kv,
                        engram_error *err);
/*
 * A plan: one decode call's launches made once into a CUDA graph the
 * library instantiates, then submitted as one graph launch per run (the
 * host hands the card the call's kernels at once instead of launch by
 * launch; BENCHMARKS.md measures both).  For a decode loop whose
 * arguments stay the same from step to step: with d_step, one plan serves
 * every step (the kernels read the step index on the device).  A run is
 * engram_cuda_apply(c, a) with the arguments given at open (their stream
 * included): the same kernels, the same bits, the same non-finite policy
 * (engram_cuda_sync reports).
 * open: a must pass engram_cuda_apply's checks and have 1 <= n <=
 * ENGRAM_CUDA_GEMV_MAX (-EINVAL otherwise); the buffers it names must stay
 * valid while the plan lives.  Open allocates (the plan, a capture stream
 * destroyed before it returns, the graph: host and driver memory, no
 * device buffer of ours); run allocates nothing and does not wait (the
 * first run uploads the graph to the device, as a first launch does).  Runs
 * of a plan are calls on its layer (one at a time, in stream order), so
 * its layer must stay open while it runs; close may come before or after
 * the layer's.  Open may be called while other captures are under way
 * (the thread's capture mode is relaxed while it makes the plan, then
 * restored): they go on.  Errors: -EINVAL where a's stream is being
 * captured (capture engram_cuda_apply itself there) or is the legacy
 * default stream while a blocking stream is; -ENOMEM (the plan's host
 * memory); -EIO (the CUDA call named: among them the capture stream, the
 * capture, the instantiation; run: the graph's launch).  Nothing is
 * returned on failure, and a failure leaves no CUDA error of its own
 * pending (an error that breaks the context, a sticky one, stays).
 */
typedef struct engram_cuda_plan engram_cuda_plan;
int engram_cuda_plan_open(engram_cuda_layer *c, const engram_cuda_args *a, engram_cuda_plan **out,
                          engram_error *err);
int engram_cuda_plan_run(engram_cuda_plan *p, engram_error *err);
void engram_cuda_plan_close(engram_cuda_plan *p);

/* Waits for the stream; reports (and clears) a non-finite token recorded by
 * earlier applies (-EDOM naming it) or a CUDA error (-EIO). */
int engram_cuda_sync(engram_cuda_layer *c, void *stream, engram_error *err);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
