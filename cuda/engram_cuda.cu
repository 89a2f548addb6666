/*
 * engram_cuda.cu - Engram's output stage on an NVIDIA GPU (engram_cuda.h):
 * the host side.  Opening a layer (the weights' upload, the workspace, the
 * GEMM's copy maps, cuBLAS), the argument checks, and the dispatch of each
 * call to the kernels, one header per stage, each with the CPU path
 * (src/output/kernels.c) as its reference:
 *   row_decode.cuh  rows -> values (decode1; decode16_kernel: F16 x 2^-k)
 *   mmv.cuh         decode projection on the tensor cores without wgmma (n <= 64)
 *   gemv.cuh        projection on the CUDA cores (FMA_ONLY, wide tokens)
 *   ws_gemm.cuh     projection on the tensor cores (wgmma, sm_90a): prefill
 *                   (ws_gemm_kernel) and decode (wsd_kernel), the same sums
 *   gate.cuh        gate and update (cluster kernel n <= 64, block kernel n > 64)
 *   common.cuh      what they share (K, ROW, BF16 rounding, dependent launch)
 * cuda/README.md says how the paths are chosen and what they measured.
 *
 * Dispatch, per block of ENGRAM_CUDA_BLOCK tokens (project_block):
 *  - n <= ENGRAM_CUDA_GEMV_MAX (64) where the wgmma GEMM runs:
 *    decode16_kernel (flagging the wide tokens), then wsd_kernel, its
 *    programmatic dependent, which also gives the wide tokens the GEMV's
 *    sums and, for engram_cuda_project, puts 2^k back: the prefill's
 *    arithmetic in two launches, so a token's kv is the same bits whatever
 *    n;
 *  - n <= 64 elsewhere: mmv_kernel (up to 8 tokens), or
 *    mmv_prep_kernel<NT> then mmv_staged_kernel<NT>, NT = ceil(n / 8);
 *  - ENGRAM_CUDA_FMA_ONLY: gemv1_kernel (one token) or gemv_kernel<T>
 *    (T = 2..8), 8 tokens a launch;
 *  - else decode16_kernel, then ws_gemm (where the layer's probe found the
 *    sm_90a code and the maps were made) or cuBLAS's F16 GEMM, then
 *    gemv_list_kernel for the tokens decode16 listed as too wide for F16
 *    (their kv unscaled).  For the apply the wgmma GEMM writes kv as BF16
 *    x 2^k (the gate's operand); otherwise the GEMM's kv stays x 2^-k
 *    (kshift) and the gate or scale_kernel puts 2^k back (wsd_kernel's:
 *    the gate, or wsd_kernel itself for engram_cuda_project).  mmv's and
 *    the GEMVs' kv is unscaled.
 * Then the gate (engram_cuda_apply): gate_kernel<PRE> for n <= 64 (PRE
 * where gate_pre(W, S), the model's shape; a programmatic dependent launch
 * of the projection on 9.0+, unless ENGRAM_CUDA_SERIAL_GATE; where also W
 * is a multiple of 128 (gate_parts) its sums come in chunks of 128
 * outputs, from wsd_kernel's epilogue for n <= WSD_PARTS_NB, else made by
 * the gate), gate_block_kernel<KV, V16, KEEP> otherwise.
 * A plan (engram_cuda_plan_open) is one such apply of up to 64 tokens
 * captured into a graph and instantiated; each run is one graph launch.
 * engram_cuda_apply makes the same graph of a decode call the second time
 * it sees the call's arguments, and launches it from then on (graph_call,
 * the layer's last ENGRAM_CUDA_GRAPHS distinct arguments).
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram_cuda.h"

#include "common.cuh"
#include "host_err.cuh"
#include "row_decode.cuh"
#include "gemv.cuh"
#include "ws_gemm.cuh"
#include "mmv.cuh"
#include "gate.cuh"

struct engram_cuda_layer {
    int device;
    uint32_t W, S, N;
    uint16_t *w;             /* N x K F16 bits: where tc, ws_wmap's swizzled k-tiles [K/64][N][64], else [N][K] */
    float *wq;               /* [S][W]                           */
    float *kv;               /* workspace: kv of kv_f32 tokens as F32, or of BLOCK as BF16 */
    unsigned kv_f32;         /* tokens of F32 kv the workspace holds */
    __half *e16;             /* [BLOCK][K] rows x 2^-k, F16      */
    int *kshift;             /* [BLOCK] k of each token          */
    int *wide;               /* [BLOCK] tokens too wide for F16; wide[BLOCK] = count;
                              * wide[BLOCK + 1] = ws_gemm's next unit (ws_ticket);
                              * then GEMV_MAX flags, the decode path's (wide_flags) */
    int *status;             /* first non-finite token, INT_MAX  */
    cublasHandle_t blas;
    int tc;                  /* ws_gemm runs here (sm_90a code, maps made) */
    int fit[2];              /* ws_gemm's clusters of 1, 2 CTAs at once (ws_fit) */
    /* the copy engine's maps of e16 (BLOCK rows) and w: ws_maps' three,
     * then wsd_maps' WSD_NMAPS; 7 x 128 bytes, 64-byte aligned inside
     * (calloc aligns to 16) */
    unsigned char maps[(3 + WSD_NMAPS) * sizeof(CUtensorMap) + 64];
    int pdl;                 /* programmatic dependent launch (9.0+) */
    uint64_t bytes;
    /* engram_cuda_apply's graphs of decode calls (graph_call): the last
     * ENGRAM_CUDA_GRAPHS distinct arguments seen, least recently used
     * replaced first */
    struct call_graph {
        engram_cuda_args key;    /* the call's arguments, stream NULL     */
        cudaGraphExec_t exec;    /* NULL: seen once, or not made (failed)  */
        unsigned long long last; /* the layer's tick at its last call; 0: empty */
        int failed;              /* its graph could not be made: launches */
    } graphs[ENGRAM_CUDA_GRAPHS];
    unsigned long long tick;
};

/* the decode path's flags of wide tokens (decode16_kernel, wsd_kernel) */
static int *wide_flags(engram_cuda_layer *c)
{
    return c->wide + ENGRAM_CUDA_BLOCK + 2;
}

/* ws_gemm_kernel's ticket of units, zeroed with the prefill's count of wide
 * tokens (one memset) */
static int *ws_ticket(engram_cuda_layer *c)
{
    return c->wide + ENGRAM_CUDA_BLOCK + 1;
}

/* c's maps (ws_maps' three, then wsd_maps') */
static CUtensorMap *layer_maps(engram_cuda_layer *c)
{
    return (CUtensorMap *)(((uintptr_t)c->maps + 63) & ~(uintptr_t)63);
}

extern "C" int engram_cuda_available(engram_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (!quiet(e) || n == 0) {
        set_err(err, -ENODEV, e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 0;
    }
    return 1;
}

static int host_reg(void *ctx, void *p, size_t len)
{
    (void)ctx;
    return quiet(cudaHostRegister(p, len, cudaHostRegisterDefault)) ? 0 : -1; /* refused: used pageable */
}

static void host_unreg(void *ctx, void *p, size_t len)
{
    (void)ctx;
    (void)len;
    (void)quiet(cudaHostUnregister(p));
}

extern "C" void engram_cuda_host_hooks(engram_host_hooks *h)
{
    if (!h)
        return;
    h->reg = host_reg;
    h->unreg = host_unreg;
    h->ctx = NULL;
}

/* ------------------------------------------------------------ host side */

/* The thread's stream-capture mode relaxed, *mode the one to give back
 * (unrelax): making, uploading and destroying a graph are calls CUDA
 * refuses, invalidating the capture, while another capture of the global
 * mode is under way (this thread's on another stream, or another
 * thread's); relaxed, this thread may make them and that capture goes on.
 * 0, or -1 with its own error cleared. */
static int relax(cudaStreamCaptureMode *mode)
{
    *mode = cudaStreamCaptureModeRelaxed;
    return quiet(cudaThreadExchangeStreamCaptureMode(mode)) ? 0 : -1;
}

static void unrelax(cudaStreamCaptureMode mode)
{
    (void)quiet(cudaThreadExchangeStreamCaptureMode(&mode));
}

static void drop_graph(struct engram_cuda_layer::call_graph *g);

extern "C" void engram_cuda_layer_close(engram_cuda_layer *c)
{
    if (!c)
        return;
    /* close reports nothing, and leaves nothing pending */
    (void)quiet(cudaSetDevice(c->device));
    cudaStreamCaptureMode mode;
    int relaxed = relax(&mode) == 0;
    for (unsigned i = 0; i < ENGRAM_CUDA_GRAPHS; i++)
        drop_graph(&c->graphs[i]);
    if (relaxed)
        unrelax(mode);
    void *bufs[] = {c->w, c->wq, c->kv, c->e16, c->kshift, c->wide, c->status};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        (void)quiet(cudaFree(bufs[i]));
    if (c->blas)
        (void)cublasDestroy(c->blas);
    free(c);
}

extern "C" uint64_t engram_cuda_layer_bytes(const engram_cuda_layer *c)
{
    return c ? c->bytes : 0;
}

static int open_on_device(engram_cuda_layer *c, const engram_layer *L, engram_error *err)
{
    if (!engram_cuda_available(err))
        return -ENODEV;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    size_t nw = (size_t)c->N * K, blk = ENGRAM_CUDA_BLOCK;
    CK(cudaMalloc(&c->w, nw * 2), "cudaMalloc (weights)");
    CK(cudaMalloc(&c->wq, (size_t)c->S * c->W * 4), "cudaMalloc (norms)");
    CK(cudaMalloc(&c->e16, blk * K * 2), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->kshift, blk * sizeof(int)), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->wide, (blk + 2 + ENGRAM_CUDA_GEMV_MAX) * sizeof(int)), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->status, sizeof(int)), "cudaMalloc (status)");
    /* the wgmma GEMM where this device runs sm_90a code; its copy maps then
     * (a driver that runs this runtime has cuTensorMapEncodeTiled, and the
     * maps' arguments are fixed: a failure is the driver's, and named) */
    c->tc = ws_probe(c->status, c->fit);
    if (c->tc && (ws_maps(layer_maps(c), c->e16, blk, c->w, c->N) < 0 ||
                  wsd_maps(layer_maps(c) + 3, c->e16, blk) < 0))
        return set_err(err, -EIO, "cuTensorMapEncodeTiled failed or is missing from the driver");
    /* kv's workspace: the wgmma GEMM hands the gate BF16 kv, so BLOCK
     * tokens of it take the bytes of BLOCK / 2 tokens of F32 kv, which the
     * decode path (n <= GEMV_MAX) and FMA_ONLY (BLOCK / 2 tokens a round)
     * use; without it cuBLAS's GEMM writes F32 kv, BLOCK tokens of it */
    c->kv_f32 = c->tc ? (unsigned)blk / 2 : (unsigned)blk;
    CK(cudaMalloc(&c->kv, (size_t)c->kv_f32 * c->N * 4), "cudaMalloc (workspace)");
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device),
       "cudaDeviceGetAttribute");
    c->pdl = major >= 9;
    c->bytes = nw * 2 + (uint64_t)c->S * c->W * 4 + (uint64_t)c->kv_f32 * c->N * 4 + blk * K * 2 +
               (2 * blk + 3 + ENGRAM_CUDA_GEMV_MAX) * sizeof(int);
    uint16_t *hw = (uint16_t *)malloc(nw * 2);
    float *hq = (float *)malloc((size_t)c->S * c->W * 4);
    uint16_t *ht = c->tc ? (uint16_t *)malloc((size_t)c->N * WS_BK * 2) : NULL; /* a k-tile */
    if (!hw || !hq || (c->tc && !ht)) {
        free(hw);
        free(hq);
        free(ht);
        return set_err(err, -ENOMEM, "out of host memory for the upload");
    }
    engram_layer_export(L, hw, hq);
    /* in swizzled k-tiles where the wgmma kernels read them (ws_wmap),
     * row-major for cuBLAS and mmv.cuh */
    cudaError_t e1 =
        c->tc ? ws_tile_weights(c->w, hw, c->N, ht) : cudaMemcpy(c->w, hw, nw * 2, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(c->wq, hq, (size_t)c->S * c->W * 4, cudaMemcpyHostToDevice);
    free(hw);
    free(hq);
    free(ht);
    CK(e1, "cudaMemcpy (weights)");
    CK(e2, "cudaMemcpy (norms)");
    int big = INT_MAX;
    CK(cudaMemcpy(c->status, &big, sizeof big, cudaMemcpyHostToDevice), "cudaMemcpy (status)");
    CK(cudaDeviceSynchronize(), "upload");
    /* T tokens' decoded rows in shared memory: T x 12 KiB (over the 48 KiB
     * default from T = 5) */
#define SMEM(T)                                                                                \
    CK(cudaFuncSetAttribute(gemv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, T * K * 2), \
       "cudaFuncSetAttribute")
    SMEM(2); SMEM(3); SMEM(4); SMEM(5); SMEM(6); SMEM(7); SMEM(8);
#undef SMEM
    CKB(cublasCreate(&c->blas), "cublasCreate");
    /* split-K partial sums at F32, never narrower */
    CKB(cublasSetMathMode(c->blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), "cublasSetMathMode");
    return 0;
}

extern "C" int engram_cuda_layer_open(const engram_layer *L, int device, engram_cuda_layer **out,
                                      engram_error *err)
{
    if (!L || !out)
        return set_err(err, -EINVAL, "NULL argument");
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    engram_cuda_layer *c = (engram_cuda_layer *)calloc(1, sizeof *c);
    if (!c)
        return set_err(err, -ENOMEM, "out of memory");
    c->device = device;
    c->W = li.width;
    c->S = li.streams;
    c->N = (li.streams + 1) * li.width;
    int rc = open_on_device(c, L, err);
    if (rc < 0) {
        engram_cuda_layer_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int check_args(const engram_cuda_layer *c, const engram_cuda_args *a, int need_resid,
                      engram_error *err)
{
    if (!c || !a || !a->raw || (need_resid && !a->resid))
        return set_err(err, -EINVAL, "NULL argument");
    if (need_resid && a->resid_dtype != ENGRAM_BF16 && a->resid_dtype != ENGRAM_F32)
        return set_err(err, -EINVAL, "the residual is BF16 or F32");
    if (a->raw_stride && (a->raw_stride < (size_t)ENGRAM_COLUMNS * ROW || a->raw_stride % 8))
        return set_err(err, -EINVAL, "raw_stride: at least 24 x 264 bytes, a multiple of 8");
    if (a->d_step && a->n > ENGRAM_CUDA_GEMV_MAX)
        return set_err(err, -EINVAL, "d_step is for the decode path (n <= ENGRAM_CUDA_GEMV_MAX = 64)");
    if ((uintptr_t)a->raw % 8 || a->raw_step % 8)
        return set_err(err, -EINVAL, "raw and raw_step: multiples of 8 bytes");
    if (a->flags & ~(unsigned)(ENGRAM_CUDA_FMA_ONLY | ENGRAM_CUDA_SERIAL_GATE | ENGRAM_CUDA_NO_GRAPH))
        return set_err(err, -EINVAL, "unknown flags");
    return 0;
}

/* Whether a kernel on the stream may begin while the stream's previous
 * kernel finishes (launch()'s pdl: programmatic stream serialization,
 * compute capability 9.0 and up, unless ENGRAM_CUDA_SERIAL_GATE): the
 * kernel waits for it with pdl_wait() before reading what it wrote. */
static int dependent(const engram_cuda_layer *c, unsigned flags)
{
    return c->pdl && !(flags & ENGRAM_CUDA_SERIAL_GATE);
}

/* wsd_kernel<nb> for n tokens (nb: n rounded up to 8, 16, 32 or 64) as a
 * dependent launch (pdl: dependent()) with the maps of wsd_maps;
 * wsd_kernel's arguments (g: the gate's sums, or g.part NULL).  The
 * launch's error, or 0. */
template <int NB>
static cudaError_t wsd_launch_nb(const engram_cuda_layer *c, int pdl, cudaStream_t st, const CUtensorMap *m, int n,
                                 float *kv, const uint8_t *raw, size_t stride, const int *ds, size_t rstep,
                                 const int *flag, const int *kshift, const wsd_gate &g)
{
    typedef wsd_shape<NB> S;
    return launch(pdl, dim3((c->N + S::bm - 1) / S::bm), dim3(S::threads), S::smem, st, wsd_kernel<NB>,
                  m[NB == 8 ? 0 : NB == 16 ? 1 : NB == 32 ? 2 : 3], n, (int)c->N, kv, (const uint16_t *)c->w, raw,
                  stride, ds, rstep, flag, kshift, g);
}

static cudaError_t wsd_launch(engram_cuda_layer *c, unsigned flags, int n, float *kv, const uint8_t *raw,
                              size_t stride, const int *ds, size_t rstep, const int *flag, const int *kshift,
                              const wsd_gate &g, cudaStream_t st)
{
    const CUtensorMap *m = layer_maps(c) + 3;
    const int pdl = dependent(c, flags);
    if (n <= 8)
        return wsd_launch_nb<8>(c, pdl, st, m, n, kv, raw, stride, ds, rstep, flag, kshift, g);
    if (n <= 16)
        return wsd_launch_nb<16>(c, pdl, st, m, n, kv, raw, stride, ds, rstep, flag, kshift, g);
    if (n <= 32)
        return wsd_launch_nb<32>(c, pdl, st, m, n, kv, raw, stride, ds, rstep, flag, kshift, g);
    return wsd_launch_nb<64>(c, pdl, st, m, n, kv, raw, stride, ds, rstep, flag, kshift, g);
}

/* kv (n x N, F32) = e16 (n x K) x W^T on the tensor cores through cuBLAS:
 * exact products, the tensor cores' own sums (where the wgmma GEMM cannot
 * run: a GPU other than compute capability 9.0). */
static int cublas_gemm(engram_cuda_layer *c, unsigned n, float *kv, cudaStream_t st, engram_error *err)
{
    CKB(cublasSetStream(c->blas, st), "cublasSetStream");
    const float one = 1.0f, zero = 0.0f;
    /* column-major: kv^T (N x n) = W (N x K, stored as K x N) ^T x E^T (K x n) */
    CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)c->N, (int)n, K, &one, c->w, CUDA_R_16F, K, c->e16,
                     CUDA_R_16F, K, &zero, kv, CUDA_R_32F, (int)c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
    return 0;
}

/* Where the decode gate takes its sums from wsd_kernel (ws_gemm.cuh's
 * wsd_gate): the gate's PRE shapes with W a multiple of 128 (a chunk of
 * 128 outputs inside one stream), the model's 4 x 5120.  The sums of a
 * call's tokens: [GEMV_MAX][N / 128][2] floats in kv's workspace past the
 * decode path's F32 kv (its GEMV_MAX tokens of it), unused there. */
static int gate_parts(const engram_cuda_layer *c)
{
    return gate_pre((int)c->W, (int)c->S) && c->W % 128 == 0;
}

static float *gate_part_buf(const engram_cuda_layer *c)
{
    return c->kv + (size_t)ENGRAM_CUDA_GEMV_MAX * c->N;
}

/* the sums' arguments of apply a (its residual resid) */
static wsd_gate gate_args(const engram_cuda_layer *c, const engram_cuda_args *a, const void *resid)
{
    wsd_gate g = {};
    g.part = gate_part_buf(c);
    g.resid = resid;
    g.wq = c->wq;
    g.d_step = a->d_step;
    g.resid_step = a->resid_step;
    g.kshift = c->kshift;
    g.bf16 = a->resid_dtype == ENGRAM_BF16;
    g.SW = (int)(c->S * c->W);
    return g;
}

/* kv for tokens [0, n) of a (n <= one block), F32 in kv, or where the
 * tensor-core GEMM runs and bf16 is set, BF16 kv x 2^k in kv's first half
 * (*bf16 cleared otherwise); *scaled: F32 kv x 2^-k (kshift).  unscale:
 * the decode GEMM puts 2^k back itself (engram_cuda_project's).  part:
 * the apply's (resid): where gate_parts and n <= WSD_PARTS_NB, wsd_kernel
 * writes the gate's sums, and *part is set to where (gate_part_buf), else
 * NULL (the gate then makes them itself where gate_parts). */
static int project_block(engram_cuda_layer *c, const engram_cuda_args *a, const uint8_t *raw,
                         unsigned n, float *kv, cudaStream_t st, int unscale, int *scaled, int *bf16,
                         const void *resid, float **part, engram_error *err)
{
    *scaled = 0;
    if (part)
        *part = NULL;
    int want16 = *bf16;
    *bf16 = 0;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    /* decode where the wgmma GEMM runs: the prefill's path below with
     * wsd_kernel for the GEMM and the wide tokens (the same sums in the
     * decode's shape), so a token's kv is the same bits whatever n (and
     * the only decode that reads the weights as they lie there: k-tiles,
     * where mmv.cuh below reads them row-major) */
    const int dec = n <= ENGRAM_CUDA_GEMV_MAX && !(a->flags & ENGRAM_CUDA_FMA_ONLY) && c->tc;
    if (n <= ENGRAM_CUDA_GEMV_MAX && !(a->flags & ENGRAM_CUDA_FMA_ONLY) && !dec) {
        /* decode without wgmma: every token in one pass over the weights
         * (mmv.cuh, mma.sync, its own order of the sums); from
         * two n-tiles on, the tokens' operands made first (mmv_prep_kernel,
         * into the F16 rows' workspace, unused otherwise on this path),
         * the projection (mmv_staged_kernel) its programmatic dependent */
        unsigned groups = (c->N + MMV_ROWS - 1) / MMV_ROWS;
        unsigned blocks = (groups + MMV_GROUPS - 1) / MMV_GROUPS;
        unsigned sblocks = (groups + MMV_SGROUPS - 1) / MMV_SGROUPS;
        unsigned nt = (n + 7) / 8;
        uint4 *frag = (uint4 *)c->e16;
        float2 *pw = (float2 *)(frag + (size_t)(K / 32) * nt * 32);
        cudaError_t e = cudaSuccess;
        switch (nt) {
        case 1:
            e = launch(0, dim3(blocks), dim3(MMV_WARPS * 32), 0, st, mmv_kernel, c->w, raw, stride, a->d_step,
                       a->raw_step, (int)n, (int)c->N, kv, (int)c->N);
            break;
#define CASE(NT)                                                                                \
    case NT:                                                                                    \
        CK(launch(0, dim3(K / 32), dim3(NT * 32), 0, st, mmv_prep_kernel<NT>, raw, stride, a->d_step, \
                  a->raw_step, (int)n, frag, pw),                                               \
           "mmv_prep_kernel");                                                                  \
        e = launch(dependent(c, a->flags), dim3(sblocks), dim3(MMV_SWARPS * 32), mmv_staged_smem(NT), st, \
                   mmv_staged_kernel<NT>, c->w, (int)n, (int)c->N, kv, (int)c->N, (const uint4 *)frag, \
                   (const float2 *)pw);                                                         \
        break;
            CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
        }
        CK(e, "the decode projection (mmv_kernel / mmv_staged_kernel)");
        return 0;
    }
    if (a->flags & ENGRAM_CUDA_FMA_ONLY) {
        unsigned warps = (c->N + GEMV_ROWS - 1) / GEMV_ROWS;
        unsigned blocks = (warps * 32 + GEMV_THREADS - 1) / GEMV_THREADS;
        for (unsigned t0 = 0; t0 < n; t0 += GEMV_TOKENS) {
            unsigned k = n - t0 < GEMV_TOKENS ? n - t0 : GEMV_TOKENS;
            const uint8_t *r = raw + (size_t)t0 * stride;
            float *o = kv + (size_t)t0 * c->N;
            if (k == 1) {
                unsigned w1 = (c->N + GEMV1_ROWS - 1) / GEMV1_ROWS;
                unsigned b1 = (w1 * 32 + GEMV1_THREADS - 1) / GEMV1_THREADS;
                CK(launch(0, dim3(b1), dim3(GEMV1_THREADS), 0, st, gemv1_kernel, c->w, c->tc, r, a->d_step,
                          a->raw_step, (int)c->N, o),
                   "gemv1_kernel");
                continue;
            }
            cudaError_t e = cudaSuccess;
            switch (k) {
#define CASE(T)                                                                                \
    case T:                                                                                    \
        e = launch(0, dim3(blocks), dim3(GEMV_THREADS), T * K * 2, st, gemv_kernel<T>, c->w, c->tc, r, \
                   stride, a->d_step, a->raw_step, (int)c->N, o, (int)c->N);                   \
        break;
                CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
            }
            CK(e, "gemv_kernel");
        }
        return 0;
    }
    /* the device-side step index and a flag per token (nothing to clear
     * first): the decode path's; the prefill's list of wide tokens starts
     * empty, and ws_gemm's ticket at 0 */
    const int *ds = dec ? a->d_step : NULL;
    size_t rstep = dec ? a->raw_step : 0;
    int *flag = dec ? wide_flags(c) : NULL;
    if (!dec)
        CK(cudaMemsetAsync(c->wide + ENGRAM_CUDA_BLOCK, 0, 2 * sizeof(int), st), "cudaMemsetAsync");
    CK(launch(0, dim3(n), dim3(ENGRAM_COLUMNS * 8), 0, st, decode16_kernel, raw, stride, ds, rstep, c->e16,
              c->kshift, c->wide, flag),
       "decode16_kernel");
    if (dec) {
        /* F32 kv x 2^-k (n <= 64: the gate's F32 kv), or x 1 (unscale);
         * a programmatic dependent of decode16_kernel, its first tiles of
         * weights asked for before it waits; the tokens' box the call's n
         * rounded up to 8, 16, 32 or 64 */
        wsd_gate g = {};
        if (part && !unscale && gate_parts(c) && n <= WSD_PARTS_NB) {
            g = gate_args(c, a, resid);
            *part = g.part;
        }
        CK(wsd_launch(c, a->flags, (int)n, kv, raw, stride, ds, rstep, flag, unscale ? c->kshift : NULL, g, st),
           "wsd_kernel");
        *scaled = !unscale;
        return 0;
    }
    unsigned warps = (c->N + GEMV_ROWS - 1) / GEMV_ROWS;
    unsigned lb = (warps * 32 + GEMV_THREADS - 1) / GEMV_THREADS;
    if (c->tc) {
        /* exact products, sums promoted to F32 every 256 products */
        CK(ws_gemm(layer_maps(c), c->fit, (int)n, (int)c->N, want16, kv, c->kshift, ws_ticket(c), st),
           "ws_gemm_kernel");
        if (want16) {
            CK(launch(0, dim3(lb), dim3(GEMV_THREADS), 0, st, gemv_list_kernel<unsigned short>, c->w, c->tc, raw,
                      stride, c->wide, (int)c->N, (unsigned short *)kv, (int)c->N),
               "gemv_list_kernel");
            *bf16 = 1;
            return 0;
        }
    } else {
        int rc = cublas_gemm(c, n, kv, st, err);
        if (rc < 0)
            return rc;
    }
    CK(launch(0, dim3(lb), dim3(GEMV_THREADS), 0, st, gemv_list_kernel<float>, c->w, c->tc, raw, stride, c->wide,
              (int)c->N, kv, (int)c->N),
       "gemv_list_kernel");
    *scaled = 1;
    return 0;
}

extern "C" int engram_cuda_project(engram_cuda_layer *c, const engram_cuda_args *a, float *kv,
                                   engram_error *err)
{
    int rc = check_args(c, a, 0, err);
    if (rc < 0 || !kv)
        return rc < 0 ? rc : set_err(err, -EINVAL, "NULL kv");
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    cudaStream_t st = (cudaStream_t)a->stream;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    for (unsigned t0 = 0; t0 < a->n; t0 += ENGRAM_CUDA_BLOCK) {
        unsigned k = a->n - t0 < ENGRAM_CUDA_BLOCK ? a->n - t0 : ENGRAM_CUDA_BLOCK;
        int scaled, bf16 = 0;
        float *out = kv + (size_t)t0 * c->N;
        if ((rc = project_block(c, a, a->raw + (size_t)t0 * stride, k, out, st, 1, &scaled, &bf16, NULL,
                                NULL, err)) < 0)
            return rc;
        if (scaled) {
            CK(launch(0, dim3(16, k), dim3(256), 0, st, scale_kernel, out, (int)c->N, c->kshift),
               "scale_kernel");
        }
    }
    return 0;
}

/* 1 if a and b are the same call's arguments (their streams aside) */
static int same_call(const engram_cuda_args *a, const engram_cuda_args *b)
{
    return a->raw == b->raw && a->raw_stride == b->raw_stride && a->resid == b->resid &&
           a->resid_dtype == b->resid_dtype && a->mask == b->mask && a->n == b->n && a->d_step == b->d_step &&
           a->raw_step == b->raw_step && a->resid_step == b->resid_step && a->flags == b->flags;
}

/* Empties a graph's entry, its graph destroyed (one in flight is freed by
 * the driver when it completes; the thread's capture mode relaxed by the
 * caller); a failure is cleared, not reported. */
static void drop_graph(struct engram_cuda_layer::call_graph *g)
{
    if (g->exec)
        (void)quiet(cudaGraphExecDestroy(g->exec));
    memset(g, 0, sizeof *g);
}

static int capture_call(engram_cuda_layer *c, const engram_cuda_args *a, cudaGraphExec_t *exec, engram_error *err);

/* A decode call of engram_cuda_apply (1 <= n <= GEMV_MAX, without
 * ENGRAM_CUDA_NO_GRAPH) on a stream not under capture, by its arguments
 * (the stream aside) among the layer's last ENGRAM_CUDA_GRAPHS distinct
 * ones: not among them, it takes the place of the least recently used
 * (whose graph is destroyed) and is launched kernel by kernel; seen
 * before, its launches are captured into a graph (capture_call, a plan's
 * capture) and the graph uploaded on the call's stream the first time,
 * and the graph launched there: the same kernels, arguments and bits, one
 * submission.  The graphs are made, uploaded and destroyed with the
 * thread's capture mode relaxed (relax).  A graph that cannot be made is
 * not an error: that entry's calls are launched kernel by kernel until it
 * is forgotten (the cause, if it lasts, is met there and reported).
 * 1: launch the call kernel by kernel; 0: launched as a graph; < 0: the
 * graph's launch failed (err; its entry emptied). */
static int graph_call(engram_cuda_layer *c, const engram_cuda_args *a, engram_error *err)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (!quiet(cudaStreamIsCapturing(st, &cs)))
        return 1; /* the launches meet its cause */
    if (cs != cudaStreamCaptureStatusNone)
        return 1; /* the caller's capture takes the launches */
    engram_cuda_args k = *a;
    k.stream = NULL;
    struct engram_cuda_layer::call_graph *g = NULL, *old = &c->graphs[0];
    for (unsigned i = 0; i < ENGRAM_CUDA_GRAPHS; i++) {
        struct engram_cuda_layer::call_graph *e = &c->graphs[i];
        if (e->last && same_call(&e->key, &k))
            g = e;
        if (e->last < old->last)
            old = e;
    }
    c->tick++;
    cudaStreamCaptureMode mode;
    if (!g) {
        if (old->exec && relax(&mode) < 0)
            return 1; /* not remembered: the graph it would replace stays */
        int relaxed = old->exec != NULL;
        drop_graph(old);
        if (relaxed)
            unrelax(mode);
        old->key = k;
        old->last = c->tick;
        return 1;
    }
    g->last = c->tick;
    if (!g->exec) {
        if (g->failed || relax(&mode) < 0)
            return 1;
        engram_error why;
        cudaGraphExec_t x = NULL;
        if (capture_call(c, a, &x, &why) == 0) {
            if (quiet(cudaGraphUpload(x, st)))
                g->exec = x;
            else
                (void)quiet(cudaGraphExecDestroy(x));
        }
        unrelax(mode);
        if (!g->exec) {
            g->failed = 1;
            return 1;
        }
    }
    cudaError_t e = cudaGraphLaunch(g->exec, st);
    if (e != cudaSuccess) {
        int rc = cuda_err(err, e, "cudaGraphLaunch (the call's graph)");
        int relaxed = relax(&mode) == 0;
        drop_graph(g);
        if (relaxed)
            unrelax(mode);
        return rc;
    }
    return 0;
}

extern "C" int engram_cuda_apply(engram_cuda_layer *c, const engram_cuda_args *a, engram_error *err)
{
    int rc = check_args(c, a, 1, err);
    if (rc < 0)
        return rc;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    if (a->n >= 1 && a->n <= ENGRAM_CUDA_GEMV_MAX && !(a->flags & ENGRAM_CUDA_NO_GRAPH) &&
        (rc = graph_call(c, a, err)) <= 0)
        return rc;
    cudaStream_t st = (cudaStream_t)a->stream;
    size_t stride = a->raw_stride ? a->raw_stride : (size_t)ENGRAM_COLUMNS * ROW;
    size_t es = a->resid_dtype == ENGRAM_BF16 ? 2 : 4;
    /* F32 kv (FMA_ONLY) takes the workspace's F32 tokens a round */
    unsigned blk = a->flags & ENGRAM_CUDA_FMA_ONLY ? c->kv_f32 : ENGRAM_CUDA_BLOCK;
    for (unsigned t0 = 0; t0 < a->n; t0 += blk) {
        unsigned k = a->n - t0 < blk ? a->n - t0 : blk;
        int scaled, kv16 = k > ENGRAM_CUDA_GEMV_MAX;
        char *resid = (char *)a->resid + (size_t)t0 * c->S * c->W * es;
        float *part;
        if ((rc = project_block(c, a, a->raw + (size_t)t0 * stride, k, c->kv, st, 0, &scaled, &kv16, resid,
                                &part, err)) < 0)
            return rc;
        const uint8_t *mk = a->mask ? a->mask + t0 : NULL;
        int bf = a->resid_dtype == ENGRAM_BF16;
        if (k <= ENGRAM_CUDA_GEMV_MAX) {
            auto gate = gate_pre((int)c->W, (int)c->S) ? gate_kernel<true> : gate_kernel<false>;
            /* the chunk sums: wsd_kernel's (part), or the gate's own */
            float *gp = part ? part : gate_parts(c) ? gate_part_buf(c) : NULL;
            CK(launch(dependent(c, a->flags), dim3(k * GATE_CTAS), dim3(GATE_THREADS), 0, st, gate,
                      (const float *)c->kv, (int)c->N, (const float *)c->wq, (void *)resid, bf, mk, (int)c->W,
                      (int)c->S, c->status, (int)t0, a->d_step, a->resid_step,
                      (const int *)(scaled ? c->kshift : NULL), gp, !part && gp),
               "gate_kernel");
        } else {
            /* 16-byte loads: W a multiple of 8, the residual 16-byte aligned
             * (the workspace and the norms are) */
            int vec = !(c->W % 8) && !((uintptr_t)a->resid % 16);
            const unsigned short *k16 = (const unsigned short *)c->kv;
            const int *ksh = scaled ? c->kshift : NULL;
            int W = (int)c->W, S = (int)c->S, N = (int)c->N;
            int keep = S <= GATEB_KS && (W + 7) / 8 <= GATEB_KC * GATEB_THREADS;
            cudaError_t e = cudaSuccess;
#define GATEB(KVT, V, KVP, KS)                                                                  \
    do {                                                                                        \
        e = launch(0, dim3(k), dim3(GATEB_THREADS), 0, st,                                      \
                   keep ? gate_block_kernel<KVT, V, true> : gate_block_kernel<KVT, V, false>,   \
                   KVP, N, c->wq, resid, bf, mk, W, S, c->status, (int)t0, KS);                 \
    } while (0)
            if (kv16 && vec)
                GATEB(unsigned short, true, k16, nullptr);
            else if (kv16)
                GATEB(unsigned short, false, k16, nullptr);
            else if (vec)
                GATEB(float, true, c->kv, ksh);
            else
                GATEB(float, false, c->kv, ksh);
#undef GATEB
            CK(e, "gate_block_kernel");
        }
    }
    return 0;
}

struct engram_cuda_plan {
    int device;              /* the layer's (close needs no layer)         */
    cudaGraphExec_t exec;    /* the call's launches, instantiated          */
    cudaStream_t st;         /* the stream the arguments named              */
};

/* *exec: the call a captured on a stream of its own (a capture of its
 * own thread's mode: other threads are not restricted by it), then
 * instantiated.  The capture is always ended and the stream destroyed
 * before returning.  0, or a negative errno with err filled. */
static int capture_call(engram_cuda_layer *c, const engram_cuda_args *a, cudaGraphExec_t *exec, engram_error *err)
{
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing((cudaStream_t)a->stream, &cs);
    if (e == cudaErrorStreamCaptureImplicit) {
        (void)cudaGetLastError(); /* the query's own */
        return set_err(err, -EINVAL, "the legacy default stream cannot be used while a blocking stream is being "
                                     "captured");
    }
    if (e != cudaSuccess)
        return cuda_err(err, e, "cudaStreamIsCapturing");
    if (cs != cudaStreamCaptureStatusNone)
        return set_err(err, -EINVAL, "the arguments' stream is being captured: capture engram_cuda_apply there");
    cudaStream_t cap;
    CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (the plan's capture)");
    int rc = 0;
    const char *what = "cudaStreamBeginCapture";
    e = cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        engram_cuda_args b = *a;
        b.stream = cap;
        rc = engram_cuda_apply(c, &b, err);
        cudaGraph_t g = NULL;
        what = "cudaStreamEndCapture";
        e = cudaStreamEndCapture(cap, &g); /* always: the stream leaves capture */
        if (rc < 0)
            (void)quiet(e); /* the apply's failure is the one reported */
        if (rc == 0 && e == cudaSuccess) {
            what = "cudaGraphInstantiate";
            e = cudaGraphInstantiate(exec, g, 0);
        }
        if (g)
            (void)quiet(cudaGraphDestroy(g)); /* not reported: the plan is made or not without it */
    }
    (void)quiet(cudaStreamDestroy(cap));
    if (rc == 0 && e != cudaSuccess)
        rc = cuda_err(err, e, what);
    return rc;
}

/* *exec: the call a's graph (capture_call), made with the thread's
 * capture mode relaxed (and restored): instantiating a graph is a call
 * CUDA refuses, invalidating the capture, while another capture of the
 * global mode is under way (this thread's on another stream, or another
 * thread's); relaxed, this thread may make it and that capture goes on.
 * Every CUDA failure clears the runtime's last error (its own,
 * host_err.cuh), so that no later call of the library (or the caller's)
 * finds it as its own; a refusal that made no CUDA error clears nothing.
 * A plan's graph (engram_cuda_apply's own: graph_call, the same way). */
static int make_graph(engram_cuda_layer *c, const engram_cuda_args *a, cudaGraphExec_t *exec, engram_error *err)
{
    int rc;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        rc = cuda_err(err, e, "cudaThreadExchangeStreamCaptureMode");
    } else {
        rc = capture_call(c, a, exec, err);
        (void)quiet(cudaThreadExchangeStreamCaptureMode(&mode)); /* the thread's own mode back */
    }
    return rc;
}

/* The plan is allocated before any CUDA call. */
extern "C" int engram_cuda_plan_open(engram_cuda_layer *c, const engram_cuda_args *a, engram_cuda_plan **out,
                                     engram_error *err)
{
    if (!out)
        return set_err(err, -EINVAL, "NULL argument");
    int rc = check_args(c, a, 1, err);
    if (rc < 0)
        return rc;
    if (a->n < 1 || a->n > ENGRAM_CUDA_GEMV_MAX)
        return set_err(err, -EINVAL, "a plan is for 1 to ENGRAM_CUDA_GEMV_MAX (64) tokens");
    engram_cuda_plan *p = (engram_cuda_plan *)calloc(1, sizeof *p);
    if (!p)
        return set_err(err, -ENOMEM, "host memory (the plan)");
    if ((rc = make_graph(c, a, &p->exec, err)) < 0) {
        free(p);
        return rc;
    }
    p->device = c->device;
    p->st = (cudaStream_t)a->stream;
    *out = p;
    return 0;
}

extern "C" int engram_cuda_plan_run(engram_cuda_plan *p, engram_error *err)
{
    if (!p)
        return set_err(err, -EINVAL, "NULL argument");
    const char *what = "cudaSetDevice";
    cudaError_t e = cudaSetDevice(p->device);
    if (e == cudaSuccess) {
        what = "cudaGraphLaunch";
        e = cudaGraphLaunch(p->exec, p->st);
    }
    if (e != cudaSuccess)
        return cuda_err(err, e, what);
    return 0;
}

extern "C" void engram_cuda_plan_close(engram_cuda_plan *p)
{
    if (!p)
        return;
    if (quiet(cudaSetDevice(p->device))) /* close reports nothing, and leaves nothing pending */
        (void)quiet(cudaGraphExecDestroy(p->exec));
    free(p);
}

#ifdef ENGRAM_CUDA_STAMPS
/* The diagnostic build's stamps (common.cuh): op 0 clears them and sets the
 * rep to 0, 1 advances the rep in the stream's order, 2 copies all of them
 * (EG_REPS x EG_KERNELS x 2 values, [rep][kernel][start, end]) to out after
 * a sync, where out holds cap values (-1 if fewer). */
static __global__ void eg_next_kernel(int by)
{
    eg_rep += by;
}

extern "C" __attribute__((visibility("default"))) int engram_cuda_stamps(void *stream, int op,
                                                                         unsigned long long *out, size_t cap)
{
    static unsigned long long init[EG_REPS][EG_KERNELS][2];
    cudaStream_t st = (cudaStream_t)stream;
    if (op == 0) {
        for (int r = 0; r < EG_REPS; r++)
            for (int k = 0; k < EG_KERNELS; k++)
                init[r][k][0] = ~0ull, init[r][k][1] = 0;
        int z = 0;
        if (cudaMemcpyToSymbol(eg_stamps, init, sizeof init) != cudaSuccess ||
            cudaMemcpyToSymbol(eg_rep, &z, sizeof z) != cudaSuccess)
            return -1;
        return 0;
    }
    if (op == 1) {
        return quiet(launch(0, dim3(1), dim3(1), 0, st, eg_next_kernel, 1)) ? 0 : -1;
    }
    if (cap < sizeof init / sizeof init[0][0][0] || cudaStreamSynchronize(st) != cudaSuccess)
        return -1;
    return cudaMemcpyFromSymbol(out, eg_stamps, sizeof init) == cudaSuccess ? 0 : -1;
}
#endif

extern "C" int engram_cuda_sync(engram_cuda_layer *c, void *stream, engram_error *err)
{
    if (!c)
        return set_err(err, -EINVAL, "NULL argument");
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    CK(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    int first = INT_MAX, big = INT_MAX;
    CK(cudaMemcpy(&first, c->status, sizeof first, cudaMemcpyDeviceToHost), "cudaMemcpy (status)");
    if (first == INT_MAX)
        return 0;
    CK(cudaMemcpy(c->status, &big, sizeof big, cudaMemcpyHostToDevice), "cudaMemcpy (status)");
    if (err) {
        err->code = -EDOM;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
        snprintf(err->msg, sizeof err->msg,
                 "token %d: the residual or the result is not finite; that token was left "
                 "untouched (others were updated)", first);
    }
    return -EDOM;
}
