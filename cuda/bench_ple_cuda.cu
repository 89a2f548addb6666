/*
 * bench_ple_cuda.cu - the PLE output stage on the GPU (cuda/ple_cuda.h)
 * against the card's floors, measured in the same run (CUDA events, 3
 * warm-up calls, medians of >= 20 timed calls):
 *  - bandwidth: a device-to-device copy of 1 GiB (bytes read + written, as
 *    bench_cuda counts it) and a read kernel over 1 GiB (16-byte loads);
 *  - decode: ple_cuda_apply of B = 1, 2, 4, 8 tokens (the GEMV, the gate,
 *    the convolution) against the time to read W_k and W_v (16-bit) once at
 *    each bandwidth; back to back (part of the 65.5 MB may stay in the
 *    50 MB L2 from the call before) and with L2 flushed before every call
 *    (256 MiB read, outside the timed span: the weights come from HBM, as
 *    they would between other layers' work); the GEMV alone
 *    (ple_cuda_project), the serial launches (PLE_CUDA_SERIAL), B = 1 in a
 *    CUDA graph;
 *  - prefill: 2048 tokens (one workspace block): cuBLAS's BF16 GEMM on the
 *    same shapes (2048 x 12800 x 2560, F32 out: the floor), the library's
 *    projection, the apply with an F32 and a BF16 residual, and with
 *    PLE_CUDA_FMA_ONLY (the GEMV throughout).
 *   bench_ple_cuda [W]   (default 2560, the real width)
 * Synthetic BF16 weights and rows (uniform); the figures do not depend on
 * the values.  Runs in well under a minute on an H200.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <time.h>

#include "../tests/testutil.h"
#include "cuda_check.h"
#include "ple_cuda.h"

extern "C" {
#include "output/ple_apply.h"
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median ms of reps runs of fn() on st, after 3 warm-up runs; pre() (not
 * timed) before each */
template <typename P, typename F> static float timed_pre(cudaStream_t st, int reps, P pre, F fn)
{
    for (int i = 0; i < 3; i++) {
        pre();
        fn();
    }
    CU(cudaStreamSynchronize(st));
    float ms[200];
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        pre();
        CU(cudaEventRecord(a, st));
        fn();
        CU(cudaEventRecord(b, st));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&ms[i], a, b));
    }
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    qsort(ms, (size_t)reps, sizeof ms[0], cmpf);
    return ms[reps / 2];
}

template <typename F> static float timed(cudaStream_t st, int reps, F fn)
{
    return timed_pre(st, reps, [] {}, fn);
}

/* every 16 bytes of p read once; out written only if the xor is a value
 * no input makes (the loads stay) */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n, unsigned *out)
{
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) { /* 4 loads in flight */
        uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u)
        out[0] = acc;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53) - 0.5f;
}

static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void check(int rc, const engram_error &err, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", what, err.msg);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        fprintf(stderr, "no CUDA device: %s\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "none");
        return 1;
    }
    const uint32_t W = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 2560;
    if (W == 0 || W > 16384) {
        fprintf(stderr, "usage: bench_ple_cuda [W]\n");
        return 2;
    }
    const size_t C = 4 * (size_t)W, N = 5 * (size_t)W, KIN = PLE_K;
    /* the layer: BF16 weights ~ U(-0.5, 0.5) / 25, norms ~ 1, taps U(-0.5, 0.5) */
    uint16_t *key = (uint16_t *)malloc(C * KIN * 2), *val = (uint16_t *)malloc((size_t)W * KIN * 2);
    float *nk = (float *)malloc(C * 4), *nq = (float *)malloc(C * 4), *nc = (float *)malloc(C * 4),
          *conv = (float *)malloc(C * 4 * 4);
    for (size_t i = 0; i < C * KIN; i++)
        key[i] = bf16_bits(urand() / 25);
    for (size_t i = 0; i < (size_t)W * KIN; i++)
        val[i] = bf16_bits(urand() / 25);
    for (size_t i = 0; i < C; i++)
        nk[i] = 1 + urand() / 5, nq[i] = 1 + urand() / 5, nc[i] = 1 + urand() / 5;
    for (size_t i = 0; i < C * 4; i++)
        conv[i] = urand();
    struct ple_weights pw = {W, 4, 1e-6f, GGML_BF16, GGML_BF16, key, val, nk, nq, nc, conv};
    struct ple_layer *L = NULL;
    ple_cuda_layer *c = NULL;
    engram_error err;
    check(ple_layer_new(&pw, &L, &err), err, "ple_layer_new");
    check(ple_cuda_layer_open(L, 0, &c, &err), err, "ple_cuda_layer_open");
    free(key), free(val), free(nk), free(nq), free(nc), free(conv);
    ple_layer_free(L);

    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    time_t tt = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    const double wbytes = (double)N * KIN * 2;
    printf("bench_ple_cuda  %s  %s, %d SMs, L2 %.0f MB; W %u: W_k + W_v %.1f MB BF16; layer on the device "
           "%.1f MB\n",
           date, prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, W, wbytes / 1e6,
           ple_cuda_layer_bytes(c) / 1e6);
    cudaStream_t st;
    CU(cudaStreamCreate(&st));

    /* bandwidth: a copy and a read kernel over 1 GiB */
    const size_t cb = (size_t)1 << 30;
    void *s0, *s1;
    unsigned *d_sink;
    CU(cudaMalloc(&s0, cb));
    CU(cudaMalloc(&s1, cb));
    CU(cudaMalloc(&d_sink, 4));
    CU(cudaMemset(s0, 1, cb));
    float cms = timed(st, 20, [&] { cudaMemcpyAsync(s1, s0, cb, cudaMemcpyDeviceToDevice, st); });
    const double bw_copy = 2.0 * cb / (cms * 1e-3);
    const int rblocks = prop.multiProcessorCount * 8;
    float rms =
        timed(st, 20, [&] { read_kernel<<<rblocks, 256, 0, st>>>((const uint4 *)s0, cb / 16, d_sink); });
    const double bw_read = cb / (rms * 1e-3);
    const double floor_copy = wbytes / bw_copy * 1e3, floor_read = wbytes / bw_read * 1e3; /* ms */
    printf("device copy of 1 GiB: %.3f ms = %.0f GB/s (read + written); read kernel over 1 GiB: %.3f ms = "
           "%.0f GB/s\n",
           cms, bw_copy / 1e9, rms, bw_read / 1e9);
    printf("decode floor, W_k + W_v read once: %.1f us at the copy's rate, %.1f us at the read kernel's\n\n",
           floor_copy * 1e3, floor_read * 1e3);
    CU(cudaFree(s1));
    /* what flushes L2 between timed calls: 256 MiB read (read, not written: no dirty lines left
     * to write back while the next call reads its weights) */
    const size_t fb = (size_t)256 << 20;
    auto flush = [&] { read_kernel<<<rblocks, 256, 0, st>>>((const uint4 *)s0, fb / 16, d_sink); };

    /* inputs for up to 2048 tokens */
    const unsigned nmax = 2048;
    uint16_t *hrows = (uint16_t *)malloc((size_t)nmax * KIN * 2);
    for (size_t i = 0; i < (size_t)nmax * KIN; i++)
        hrows[i] = bf16_bits(urand() * 3);
    float *hx = (float *)malloc((size_t)nmax * C * 4);
    for (size_t i = 0; i < (size_t)nmax * C; i++)
        hx[i] = urand() * 4;
    uint16_t *d_rows;
    float *d_x, *d_state, *d_kv;
    uint16_t *d_x16;
    CU(cudaMalloc(&d_rows, (size_t)nmax * KIN * 2));
    CU(cudaMalloc(&d_x, (size_t)nmax * C * 4));
    CU(cudaMalloc(&d_x16, (size_t)nmax * C * 2));
    CU(cudaMalloc(&d_state, 9 * C * 4));
    CU(cudaMalloc(&d_kv, (size_t)nmax * N * 4));
    CU(cudaMemcpy(d_rows, hrows, (size_t)nmax * KIN * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_x, hx, (size_t)nmax * C * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_x16, 0, (size_t)nmax * C * 2));
    CU(cudaMemset(d_state, 0, 9 * C * 4));
    ple_cuda_args a;
    memset(&a, 0, sizeof a);
    a.rows = d_rows;
    a.resid = d_x;
    a.resid_dtype = ENGRAM_F32;
    a.state = d_state;
    a.stream = st;
    int rc = 0;
    auto apply = [&] { rc |= ple_cuda_apply(c, &a, &err); };
    auto proj = [&] { rc |= ple_cuda_project(c, &a, d_kv, &err); };

    printf("decode: apply of B tokens (GEMV, gate, convolution), median us of 100 calls; floors as above\n");
    printf("   B | back to back     /copy  /read | L2 flushed       /copy  /read | GEMV alone, flushed "
           "/copy | serial launches, flushed\n");
    const unsigned Bs[4] = {1, 2, 4, 8};
    for (int q = 0; q < 4; q++) {
        a.n = Bs[q];
        a.flags = 0;
        float warm = timed(st, 100, apply);
        float cold = timed_pre(st, 100, flush, apply);
        float gemv = timed_pre(st, 100, flush, proj);
        a.flags = PLE_CUDA_SERIAL;
        float ser = timed_pre(st, 100, flush, apply);
        a.flags = 0;
        printf("%4u | %8.1f us   %6.2f %6.2f | %8.1f us   %6.2f %6.2f | %8.1f us        %6.2f | %8.1f us\n",
               Bs[q], warm * 1e3, warm / floor_copy, warm / floor_read, cold * 1e3, cold / floor_copy,
               cold / floor_read, gemv * 1e3, gemv / floor_copy, ser * 1e3);
    }
    check(rc, err, "decode");
    CU(cudaStreamSynchronize(st));
    check(ple_cuda_sync(c, st, &err), err, "sync");
    /* B = 1 as an engine would run it: captured once into a CUDA graph */
    {
        a.n = 1;
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        int grc = ple_cuda_apply(c, &a, &err);
        cudaError_t e1 = cudaStreamEndCapture(st, &graph);
        cudaError_t e2 = grc == 0 && e1 == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : cudaSuccess;
        if (grc < 0 || e1 != cudaSuccess || e2 != cudaSuccess) {
            printf("   1 in a CUDA graph: capture failed (%s)\n\n",
                   grc < 0 ? err.msg : cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
            cudaGetLastError();
            goto prefill;
        }
        float g1 = timed(st, 100, [&] { cudaGraphLaunch(exec, st); });
        float gf = timed_pre(st, 100, flush, [&] { cudaGraphLaunch(exec, st); });
        float g32 = timed(st, 20, [&] {
            for (int i = 0; i < 32; i++)
                cudaGraphLaunch(exec, st);
        });
        printf("   1 in a CUDA graph: %.1f us (%.2f x copy floor) back to back, %.1f us (%.2f x) L2 flushed; "
               "32 launches back to back: %.1f us each (%.2f x)\n\n",
               g1 * 1e3, g1 / floor_copy, gf * 1e3, gf / floor_copy, g32 * 1e3 / 32, g32 / 32 / floor_copy);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
prefill:

    /* prefill of 2048 tokens against cuBLAS's GEMM of the same shapes */
    a.n = nmax;
    a.flags = 0;
    float pproj = timed(st, 20, proj);
    float papp = timed(st, 20, apply);
    a.resid = d_x16;
    a.resid_dtype = ENGRAM_BF16;
    float papp16 = timed(st, 20, apply);
    a.resid = d_x;
    a.resid_dtype = ENGRAM_F32;
    a.flags = PLE_CUDA_FMA_ONLY;
    float pfma = timed(st, 20, apply);
    a.flags = 0;
    check(rc, err, "prefill");
    CU(cudaStreamSynchronize(st));
    check(ple_cuda_sync(c, st, &err), err, "sync");
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    void *ws;
    CU(cudaMalloc(&ws, (size_t)32 << 20));
    cublasSetStream(h, st);
    cublasSetWorkspace(h, ws, (size_t)32 << 20);
    cublasSetMathMode(h, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    uint16_t *d_w;
    CU(cudaMalloc(&d_w, N * KIN * 2));
    CU(cudaMemset(d_w, 0x3c, N * KIN * 2)); /* BF16 0x3c3c = 0.0115: the time does not depend on it */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    float blas = timed(st, 20, [&] {
        bs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)nmax, (int)KIN, &one, d_w, CUDA_R_16BF,
                          (int)KIN, d_rows, CUDA_R_16BF, (int)KIN, &zero, d_kv, CUDA_R_32F, (int)N,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    if (bs != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx: status %d\n", (int)bs);
        return 1;
    }
    const double fl = 2.0 * nmax * N * KIN;
    printf("prefill of %u tokens: %u x %zu x %zu (%.0f GFLOP), median ms of 20 calls\n", nmax, nmax, N, KIN,
           fl / 1e9);
    printf("  cuBLAS BF16 GEMM alone, F32 out (the floor)  %8.3f ms  %5.0f TFLOP/s   1.00 x\n", blas,
           fl / (blas * 1e-3) / 1e12);
    printf("  projection (ple_cuda_project: cuBLAS)        %8.3f ms  %5.0f TFLOP/s   %.2f x\n", pproj,
           fl / (pproj * 1e-3) / 1e12, pproj / blas);
    printf("  apply, F32 residual                          %8.3f ms  %7.0f tokens/s  %.2f x\n", papp,
           nmax / (papp * 1e-3), papp / blas);
    printf("  apply, BF16 residual                         %8.3f ms  %7.0f tokens/s  %.2f x\n", papp16,
           nmax / (papp16 * 1e-3), papp16 / blas);
    printf("  gate + convolution (apply - projection)      %8.3f ms\n", papp - pproj);
    printf("  apply, PLE_CUDA_FMA_ONLY (GEMV throughout)   %8.3f ms  %7.0f tokens/s  %.2f x\n", pfma,
           nmax / (pfma * 1e-3), pfma / blas);
    cublasDestroy(h);
    CU(cudaFree(ws));
    CU(cudaFree(d_w));
    CU(cudaFree(s0));
    CU(cudaFree(d_sink));
    CU(cudaFree(d_rows));
    CU(cudaFree(d_x));
    CU(cudaFree(d_x16));
    CU(cudaFree(d_state));
    CU(cudaFree(d_kv));
    free(hrows);
    free(hx);
    ple_cuda_layer_close(c);
    CU(cudaStreamDestroy(st));
    return 0;
}
