/*
 * ple_cuda.cu - the PLE output stage on an NVIDIA GPU (cuda/ple_cuda.h):
 * the host side.  The layer's upload from a CPU ple_layer, the argument
 * checks, and per block of PLE_CUDA_BLOCK tokens the dispatch:
 *   projection  ple_gemv_kernel<T> (n <= 8, FMA_ONLY, an F16 matrix; 8
 *               tokens a launch) or cuBLAS's BF16 GEMM (F32 compute and
 *               output) into the F32 workspace kv [block][5W];
 *   gate        ple_gate_kernel<BF>, a block per token;
 *   conv        ple_conv_kernel<BF>, (ceil(W / 128), ceil(n / 36)) blocks;
 * the gate and conv as programmatic dependent launches of the kernel before
 * them on compute capability 9.0+ (unless PLE_CUDA_SERIAL).  The kernels
 * are in cuda/ple_kernels.cuh; cuda/README.md ("PLE") says what is
 * measured.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ple_cuda.h"
#include "host_err.cuh"
#include "ple_kernels.cuh"

extern "C" {
#include "output/ple_apply.h"
}

static_assert(PLE_IN == PLE_K, "2560 inputs per token");

struct ple_cuda_layer {
    int device;
    uint32_t W, C, N;        /* C = 4W keys, N = 5W outputs                 */
    float eps;
    int key_f16, value_f16;  /* else BF16                                  */
    uint16_t *w;             /* [N][2560]: W_k then W_v                    */
    float *gk, *gq, *gc;     /* [C]                                        */
    float *taps;             /* [4][C], tap-major                          */
    float *kv;               /* [BLOCK][N] workspace                       */
    float *alpha;            /* [BLOCK][4]                                 */
    float *rn;               /* [BLOCK]                                    */
    uint8_t *flag;           /* [BLOCK]: 0 masked, 1 ok, 2 not finite      */
    int *status;             /* lowest non-finite token, INT_MAX           */
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_bytes;
    int pdl;                 /* programmatic dependent launch (9.0+)       */
    uint64_t bytes;
};

#define PLE_BLAS_WS ((size_t)32 << 20) /* cuBLAS's workspace: set per call, allocated once */

/* ------------------------------------------------------------ open, close */

extern "C" void ple_cuda_layer_close(ple_cuda_layer *c)
{
    if (!c)
        return;
    /* close reports nothing, and leaves nothing pending */
    (void)quiet(cudaSetDevice(c->device));
    void *bufs[] = {c->w, c->gk, c->gq, c->gc, c->taps, c->kv, c->alpha, c->rn, c->flag, c->status, c->blas_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        (void)quiet(cudaFree(bufs[i]));
    if (c->blas)
        (void)cublasDestroy(c->blas);
    free(c);
}

extern "C" uint64_t ple_cuda_layer_bytes(const ple_cuda_layer *c)
{
    return c ? c->bytes : 0;
}

extern "C" uint32_t ple_cuda_layer_width(const ple_cuda_layer *c)
{
    return c ? c->W : 0;
}

/* The host copies for the upload, freed by the caller. */
struct upload {
    uint16_t *w;
    float *norms, *conv, *taps;
};

static int open_on_device(ple_cuda_layer *c, const struct ple_layer *L, engram_error *err)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (!quiet(e) || ndev == 0) {
        char m[200];
        snprintf(m, sizeof m, "no usable CUDA device: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return set_err(err, -ENODEV, m);
    }
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    int major = 0, smem_max = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device),
       "cudaDeviceGetAttribute");
    c->pdl = major >= 9;
    /* the gate stages a token's x, k and v in shared memory: 9W floats, beside its own 64 bytes */
    CK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device),
       "cudaDeviceGetAttribute");
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, ple_gate_kernel<false>), "cudaFuncGetAttributes");
    const size_t smem = ple_gate_smem((int)c->W), dyn_max = (size_t)smem_max - fa.sharedSizeBytes;
    if (smem > dyn_max) {
        char m[160];
        snprintf(m, sizeof m,
                 "width %u: the gate needs %zu bytes of shared memory a block, this device has %zu", c->W,
                 smem, dyn_max);
        return set_err(err, -ENOTSUP, m);
    }
    /* the device's limit, not this width's need: the attribute is the kernel's, shared by every layer
     * open on the device (a launch takes what its width needs) */
    CK(cudaFuncSetAttribute(ple_gate_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)dyn_max),
       "cudaFuncSetAttribute");
    CK(cudaFuncSetAttribute(ple_gate_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn_max),
       "cudaFuncSetAttribute");

    const size_t C = c->C, N = c->N, blk = PLE_CUDA_BLOCK, nw = N * PLE_K;
    CK(cudaMalloc(&c->w, nw * 2), "cudaMalloc (weights)");
    CK(cudaMalloc(&c->gk, C * 4), "cudaMalloc (norms)");
    CK(cudaMalloc(&c->gq, C * 4), "cudaMalloc (norms)");
    CK(cudaMalloc(&c->gc, C * 4), "cudaMalloc (norms)");
    CK(cudaMalloc(&c->taps, C * PLE_CUDA_TAPS * 4), "cudaMalloc (taps)");
    CK(cudaMalloc(&c->kv, blk * N * 4), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->alpha, blk * 4 * 4), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->rn, blk * 4), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->flag, blk), "cudaMalloc (workspace)");
    CK(cudaMalloc(&c->status, sizeof(int)), "cudaMalloc (status)");
    CK(cudaMalloc(&c->blas_ws, PLE_BLAS_WS), "cudaMalloc (cuBLAS workspace)");
    c->blas_ws_bytes = PLE_BLAS_WS;
    c->bytes = nw * 2 + (3 + PLE_CUDA_TAPS) * C * 4 + blk * (N * 4 + 21) + sizeof(int) + PLE_BLAS_WS;
    struct upload u;
    u.w = (uint16_t *)malloc(nw * 2);
    u.norms = (float *)malloc(3 * C * 4);
    u.conv = (float *)malloc(C * PLE_CUDA_TAPS * 4);
    u.taps = (float *)malloc(C * PLE_CUDA_TAPS * 4);
    if (!u.w || !u.norms || !u.conv || !u.taps) {
        free(u.w), free(u.norms), free(u.conv), free(u.taps);
        return set_err(err, -ENOMEM, "out of host memory for the upload");
    }
    ple_layer_export(L, u.w, u.w + C * PLE_K, u.norms, u.norms + C, u.norms + 2 * C, u.conv);
    for (size_t ch = 0; ch < C; ch++)
        for (unsigned k = 0; k < PLE_CUDA_TAPS; k++)
            u.taps[k * C + ch] = u.conv[ch * PLE_CUDA_TAPS + k];
    cudaError_t e1 = cudaMemcpy(c->w, u.w, nw * 2, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(c->gk, u.norms, C * 4, cudaMemcpyHostToDevice);
    cudaError_t e3 = cudaMemcpy(c->gq, u.norms + C, C * 4, cudaMemcpyHostToDevice);
    cudaError_t e4 = cudaMemcpy(c->gc, u.norms + 2 * C, C * 4, cudaMemcpyHostToDevice);
    cudaError_t e5 = cudaMemcpy(c->taps, u.taps, C * PLE_CUDA_TAPS * 4, cudaMemcpyHostToDevice);
    free(u.w), free(u.norms), free(u.conv), free(u.taps);
    CK(e1, "cudaMemcpy (weights)");
    CK(e2, "cudaMemcpy (norms)");
    CK(e3, "cudaMemcpy (norms)");
    CK(e4, "cudaMemcpy (norms)");
    CK(e5, "cudaMemcpy (taps)");
    int big = INT_MAX;
    CK(cudaMemcpy(c->status, &big, sizeof big, cudaMemcpyHostToDevice), "cudaMemcpy (status)");
    CK(cudaDeviceSynchronize(), "upload");
    CKB(cublasCreate(&c->blas), "cublasCreate");
    /* split-K partial sums at F32, never narrower */
    CKB(cublasSetMathMode(c->blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), "cublasSetMathMode");
    return 0;
}

extern "C" int ple_cuda_layer_open(const struct ple_layer *L, int device, ple_cuda_layer **out,
                                   engram_error *err)
{
    if (!L || !out)
        return set_err(err, -EINVAL, "NULL argument");
    struct ple_weights d;
    ple_layer_describe(L, &d);
    if (d.kernel != PLE_CUDA_TAPS) {
        char m[120];
        snprintf(m, sizeof m, "a convolution of %u taps: the GPU path serves %u only", d.kernel,
                 PLE_CUDA_TAPS);
        return set_err(err, -ENOTSUP, m);
    }
    const uint32_t types[2] = {d.key_type, d.value_type};
    for (int k = 0; k < 2; k++)
        if (types[k] != GGML_BF16 && types[k] != GGML_F16) {
            char m[120];
            snprintf(m, sizeof m, "tensor '%s' is F32: the GPU path keeps BF16 or F16 projection weights",
                     k ? "ple_value" : "ple_key");
            return set_err(err, -ENOTSUP, m);
        }
    ple_cuda_layer *c = (ple_cuda_layer *)calloc(1, sizeof *c);
    if (!c)
        return set_err(err, -ENOMEM, "out of memory");
    c->device = device;
    c->W = d.width;
    c->C = 4 * d.width;
    c->N = 5 * d.width;
    c->eps = d.eps;
    c->key_f16 = d.key_type == GGML_F16;
    c->value_f16 = d.value_type == GGML_F16;
    int rc = open_on_device(c, L, err);
    if (rc < 0) {
        ple_cuda_layer_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* ------------------------------------------------------------ calls */

static int check_args(const ple_cuda_layer *c, const ple_cuda_args *a, int apply, engram_error *err)
{
    if (!c || !a)
        return set_err(err, -EINVAL, "NULL argument");
    if (a->n == 0)
        return 0;
    if (!a->rows || (apply && (!a->resid || !a->state)))
        return set_err(err, -EINVAL, "NULL argument");
    if ((uintptr_t)a->rows % 16)
        return set_err(err, -EINVAL, "rows: 16-byte aligned");
    if (apply && a->resid_dtype != ENGRAM_F32 && a->resid_dtype != ENGRAM_BF16)
        return set_err(err, -EINVAL, "the residual is F32 or BF16");
    if (apply && ((uintptr_t)a->resid % (a->resid_dtype == ENGRAM_F32 ? 4 : 2) || (uintptr_t)a->state % 4))
        return set_err(err, -EINVAL, "residual or state misaligned for its type");
    if (a->flags & ~(unsigned)(PLE_CUDA_FMA_ONLY | PLE_CUDA_SERIAL))
        return set_err(err, -EINVAL, "unknown flags");
    return 0;
}

/* Outputs [o_lo, o_hi) of n tokens by the GEMV, 8 tokens a launch. */
static int gemv(ple_cuda_layer *c, const uint16_t *e, unsigned n, float *kv, unsigned o_lo, unsigned o_hi,
                cudaStream_t st, engram_error *err)
{
    const unsigned warps = (o_hi - o_lo + PG_ROWS - 1) / PG_ROWS;
    const unsigned blocks = (warps * 32 + PG_THREADS - 1) / PG_THREADS;
    for (unsigned t0 = 0; t0 < n; t0 += PLE_CUDA_GEMV_MAX) {
        const unsigned k = n - t0 < PLE_CUDA_GEMV_MAX ? n - t0 : PLE_CUDA_GEMV_MAX;
        const uint16_t *et = e + (size_t)t0 * PLE_K;
        float *o = kv + (size_t)t0 * c->N;
        cudaError_t le = cudaSuccess;
        switch (k) {
#define CASE(T)                                                                                   \
    case T:                                                                                       \
        le = launch(0, dim3(blocks), dim3(PG_THREADS), 0, st, ple_gemv_kernel<T>, c->w, c->key_f16, \
                   c->value_f16, (int)c->C, (int)o_lo, (int)o_hi, et, o, (int)c->N);               \
        break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
        }
        CK(le, "ple_gemv_kernel");
    }
    return 0;
}

/* Outputs [o_lo, o_hi) (a BF16 matrix) of n tokens by cuBLAS: column-major
 * kv^T (m x n, ld N) = W[o_lo..o_hi) (stored [m][K]: K x m) ^T x E^T (K x n). */
static int gemm(ple_cuda_layer *c, const uint16_t *e, unsigned n, float *kv, unsigned o_lo, unsigned o_hi,
                cudaStream_t st, engram_error *err)
{
    CKB(cublasSetStream(c->blas, st), "cublasSetStream");
    /* cublasSetStream resets the workspace to cuBLAS's own pool */
    CKB(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes), "cublasSetWorkspace");
    const float one = 1.0f, zero = 0.0f;
    CKB(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)(o_hi - o_lo), (int)n, PLE_K, &one,
                     c->w + (size_t)o_lo * PLE_K, CUDA_R_16BF, PLE_K, e, CUDA_R_16BF, PLE_K, &zero, kv + o_lo,
                     CUDA_R_32F, (int)c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
    return 0;
}

/* kv [n][N] of n tokens (any n), by the path ple_cuda.h describes. */
static int project(ple_cuda_layer *c, const uint16_t *e, unsigned n, float *kv, unsigned flags,
                   cudaStream_t st, engram_error *err)
{
    const int fma = n <= PLE_CUDA_GEMV_MAX || (flags & PLE_CUDA_FMA_ONLY);
    const int bk = !fma && !c->key_f16, bv = !fma && !c->value_f16; /* by cuBLAS */
    int rc = 0;
    if (bk && bv)
        return gemm(c, e, n, kv, 0, c->N, st, err);
    if (bk)
        rc = gemm(c, e, n, kv, 0, c->C, st, err);
    if (rc == 0 && bv)
        rc = gemm(c, e, n, kv, c->C, c->N, st, err);
    if (rc == 0 && !bk)
        rc = gemv(c, e, n, kv, 0, bv ? c->C : c->N, st, err);
    if (rc == 0 && !bv && bk)
        rc = gemv(c, e, n, kv, c->C, c->N, st, err);
    return rc;
}

extern "C" int ple_cuda_project(ple_cuda_layer *c, const ple_cuda_args *a, float *kv, engram_error *err)
{
    int rc = check_args(c, a, 0, err);
    if (rc < 0)
        return rc;
    if (a->n > 0 && !kv)
        return set_err(err, -EINVAL, "NULL kv");
    if (a->n == 0)
        return 0;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    return project(c, a->rows, a->n, kv, a->flags, (cudaStream_t)a->stream, err);
}

/* The gate and the convolution of k positions (one workspace block whose
 * projection is in c->kv; t0: its first position in the call). */
template <bool BF>
static int epilogue(ple_cuda_layer *c, int pdl, unsigned k, unsigned t0, void *resid, const uint8_t *mask,
                    float *state, cudaStream_t st, engram_error *err)
{
    const int W = (int)c->W, N = (int)c->N;
    const dim3 conv_grid((c->W + PCONV_THREADS - 1) / PCONV_THREADS, (k + PCONV_CHUNK - 1) / PCONV_CHUNK);
    CK(launch(pdl, dim3(k), dim3(PGATE_THREADS), ple_gate_smem(W), st, ple_gate_kernel<BF>, c->kv, N, resid,
              mask, c->gk, c->gq, W, c->eps, c->alpha, c->rn, c->flag, c->status, (int)t0),
       "ple_gate_kernel");
    CK(launch(pdl, conv_grid, dim3(PCONV_THREADS), 0, st, ple_conv_kernel<BF>, c->kv, N, resid, c->alpha,
              c->rn, c->flag, c->gc, c->taps, state, W, (int)k, c->status, (int)t0),
       "ple_conv_kernel");
    return 0;
}

extern "C" int ple_cuda_apply(ple_cuda_layer *c, const ple_cuda_args *a, engram_error *err)
{
    int rc = check_args(c, a, 1, err);
    if (rc < 0 || a->n == 0)
        return rc;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    cudaStream_t st = (cudaStream_t)a->stream;
    const int bf = a->resid_dtype == ENGRAM_BF16, pdl = c->pdl && !(a->flags & PLE_CUDA_SERIAL);
    const size_t es = bf ? 2 : 4;
    for (unsigned t0 = 0; t0 < a->n; t0 += PLE_CUDA_BLOCK) {
        const unsigned k = a->n - t0 < PLE_CUDA_BLOCK ? a->n - t0 : PLE_CUDA_BLOCK;
        if ((rc = project(c, a->rows + (size_t)t0 * PLE_K, k, c->kv, a->flags, st, err)) < 0)
            return rc;
        void *resid = (char *)a->resid + (size_t)t0 * c->C * es;
        const uint8_t *mk = a->mask ? a->mask + t0 : NULL;
        rc = bf ? epilogue<true>(c, pdl, k, t0, resid, mk, a->state, st, err)
                : epilogue<false>(c, pdl, k, t0, resid, mk, a->state, st, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

extern "C" int ple_cuda_sync(ple_cuda_layer *c, void *stream, engram_error *err)
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
                 "token %d: a sum or an output is not finite; it was left untouched, the tokens before it "
                 "were updated, the later ones and the state are unspecified",
                 first);
    }
    return -EDOM;
}
