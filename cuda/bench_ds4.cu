/*
 * bench_ds4.cu - engram's CUDA layer beside ds4's route for the same layer
 * (issue #25), in one run on one GPU: times (CUDA events, medians after
 * warm-up, inputs rotated among NSET sets of real-like rows and residuals)
 * and accuracy against a float64 reference of SPEC.md section 8.
 *
 * ds4's route, written here from its description (not ds4's code): the
 * rows decoded on the CPU to F32 (engram_rows_decode_f32) and uploaded
 * from page-locked memory; cast to F16 on the device; n >= 16: one
 * cublasGemmEx F16 x F16 -> F32 (CUBLAS_COMPUTE_32F, default math mode)
 * giving kv [n][(S+1)W]; n <= 8: one cublasGemmEx of one column per token
 * (a matvec; cuBLAS picks its kernel); then a gate of one 128-thread block
 * per token with fast-math arithmetic written as intrinsics (__expf,
 * __fdividef, rsqrtf, sqrt as a * rsqrtf(a); no flush to zero).  The same
 * F16 weights and q * k norms as engram's layer (engram_layer_export).
 *   bench_ds4 [MODEL]   (default /tmp/engram-bench/cuda-5120.gguf, built
 *                        as bench_cuda builds it; table 0's layer)
 * Exit 77 (skipped) without a usable GPU.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "../tests/testutil.h"
#include "engram_cuda.h"

#include "cuda_check.h"

#define CB(call)                                                                              \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { K = ENGRAM_K, NSET = 4, NMAX = 2048, MAXS = 8, NB = 7, NREF = 16 };
static const unsigned Ns[NB] = {1, 2, 4, 8, 16, 64, 2048};
/* set 0's tokens checked against float64: every token of n <= 8, and spread up to 2047 */
static const unsigned Ref[NREF] = {0, 1, 2, 3, 4, 5, 6, 7, 11, 15, 40, 63, 300, 1000, 1500, 2047};

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median ms of reps runs of fn(i) on st (fn rotates its inputs by i), after
 * a warm-up through every input set twice */
template <typename F> static float timed(cudaStream_t st, int reps, F fn)
{
    for (int i = 0; i < 2 * NSET; i++)
        fn(i);
    CU(cudaStreamSynchronize(st));
    CU(cudaGetLastError());
    float ms[200];
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(a, st));
        fn(i);
        CU(cudaEventRecord(b, st));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&ms[i], a, b));
    }
    CU(cudaGetLastError());
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    qsort(ms, (size_t)reps, sizeof ms[0], cmpf);
    return ms[reps / 2];
}

/* ---------------------------------------------------------------- ds4's route */

__global__ void cast_f16(const float4 *in, __half2 *out, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = in[i];
        out[2 * i] = __floats2half2_rn(v.x, v.y);
        out[2 * i + 1] = __floats2half2_rn(v.z, v.w);
    }
}

static __device__ float bf16r(float x)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

/* SPEC section 8 for one token per block: kv [n][(S+1)W], x [n][S][W] F32
 * holding BF16 values, updated in place */
__global__ void __launch_bounds__(128) ds4_gate(const float *kv, const float *wq, float *x, int W, int S)
{
    const float *kt = kv + (size_t)blockIdx.x * (S + 1) * W;
    float *xt = x + (size_t)blockIdx.x * S * W;
    __shared__ float part[4][3 * MAXS];
    __shared__ float g[MAXS];
    for (int s = 0; s < S; s++) {
        float p[3] = {0.0f, 0.0f, 0.0f}; /* D, Sxx, Skk */
        for (int i = threadIdx.x; i < W; i += 128) {
            float k = bf16r(kt[s * W + i]), v = xt[s * W + i];
            p[0] += v * wq[s * W + i] * k;
            p[1] += v * v;
            p[2] += k * k;
        }
        for (int j = 0; j < 3; j++) {
            for (int o = 16; o > 0; o >>= 1)
                p[j] += __shfl_xor_sync(~0u, p[j], o);
            if ((threadIdx.x & 31) == 0)
                part[threadIdx.x >> 5][3 * s + j] = p[j];
        }
    }
    __syncthreads();
    if (threadIdx.x < S) {
        float p[3], fw = (float)W;
        for (int j = 0; j < 3; j++)
            p[j] = part[0][3 * threadIdx.x + j] + part[1][3 * threadIdx.x + j] + part[2][3 * threadIdx.x + j] +
                   part[3][3 * threadIdx.x + j];
        float d = p[0] * rsqrtf(__fdividef(p[1], fw) + 1e-6f) * rsqrtf(__fdividef(p[2], fw) + 1e-6f) * rsqrtf(fw);
        float a = fmaxf(fabsf(d), 1e-6f);
        g[threadIdx.x] = __fdividef(1.0f, 1.0f + __expf(-copysignf(a * rsqrtf(a), d)));
    }
    __syncthreads();
    for (int s = 0; s < S; s++)
        for (int i = threadIdx.x; i < W; i += 128)
            xt[s * W + i] = bf16r(xt[s * W + i] + g[s] * bf16r(kt[S * W + i]));
}

struct Ds4 {
    cublasHandle_t h;
    const __half *w; /* [N][K] */
    const float *wq; /* [S][W] */
    float *kv;       /* [NMAX][N] */
    int N, W, S;
    cudaStream_t st;
};

static void ds4_cast(const Ds4 &d, const float *ef, __half *e16, unsigned n)
{
    size_t n4 = (size_t)n * K / 4;
    unsigned blocks = (unsigned)((n4 + 255) / 256);
    cast_f16<<<blocks < 2048 ? blocks : 2048, 256, 0, d.st>>>((const float4 *)ef, (__half2 *)e16, n4);
}

static void ds4_project_gate(const Ds4 &d, const __half *e16, float *x, unsigned n)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 8) /* decode: a matvec per token */
        for (unsigned t = 0; t < n; t++)
            CB(cublasGemmEx(d.h, CUBLAS_OP_T, CUBLAS_OP_N, d.N, 1, K, &one, d.w, CUDA_R_16F, K,
                            e16 + (size_t)t * K, CUDA_R_16F, K, &zero, d.kv + (size_t)t * d.N, CUDA_R_32F,
                            d.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CB(cublasGemmEx(d.h, CUBLAS_OP_T, CUBLAS_OP_N, d.N, (int)n, K, &one, d.w, CUDA_R_16F, K, e16,
                        CUDA_R_16F, K, &zero, d.kv, CUDA_R_32F, d.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    ds4_gate<<<n, 128, 0, d.st>>>(d.kv, d.wq, x, d.W, d.S);
}

/* ---------------------------------------------------------------- float64 reference */

/* the BF16 quantum at |a| (2^-133 below 2^-126) */
static double ulp_bf16(double a)
{
    int e;
    frexp(a, &e);
    return ldexp(1.0, (a == 0 || e - 1 < -126 ? -126 : e - 1) - 7);
}

/* x rounded to BF16, ties to even */
static double bf16d(double x)
{
    double q = ulp_bf16(fabs(x));
    return isfinite(x) ? nearbyint(x / q) * q : x;
}

/* SPEC section 8 in double for the NREF tokens of set 0: e [NREF][K] (the
 * rows' BF16 values), hw F16 weights [N][K], wq = q * k norms as exported
 * (F32), x [NMAX][S][W]; out [NREF][S][W], and op [NREF][S][W] the update's
 * operands max(|x|, |g v|) */
static void reference(const uint16_t *hw, const float *wq, const double *e, const float *x, int W, int S,
                      double *out, double *op)
{
    const int N = (S + 1) * W;
    double *f16 = (double *)malloc(65536 * 8), *wd = (double *)malloc(K * 8),
           *kv = (double *)malloc((size_t)NREF * N * 8);
    for (int b = 0; b < 65536; b++) {
        int ex = (b >> 10) & 31, m = b & 1023;
        double v = ex ? ldexp(1024 + m, ex - 25) : ldexp(m, -24);
        f16[b] = b & 0x8000 ? -v : v;
    }
    for (int o = 0; o < N; o++) {
        for (int i = 0; i < K; i++)
            wd[i] = f16[hw[(size_t)o * K + i]];
        for (int r = 0; r < NREF; r += 4) { /* four tokens: four independent sums */
            double acc[4] = {0, 0, 0, 0};
            for (int i = 0; i < K; i++)
                for (int j = 0; j < 4; j++)
                    acc[j] += e[(size_t)(r + j) * K + i] * wd[i];
            for (int j = 0; j < 4; j++)
                kv[(size_t)(r + j) * N + o] = acc[j];
        }
    }
    for (int r = 0; r < NREF; r++) {
        const double *kr = kv + (size_t)r * N;
        const float *xt = x + (size_t)Ref[r] * S * W;
        for (int s = 0; s < S; s++) {
            double D = 0, xx = 0, kk = 0;
            for (int i = 0; i < W; i++) {
                double k = bf16d(kr[s * W + i]), v = xt[s * W + i];
                D += v * wq[s * W + i] * k;
                xx += v * v;
                kk += k * k;
            }
            double d = D / sqrt(xx / W + 1e-6) / sqrt(kk / W + 1e-6) / sqrt((double)W);
            double g = 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(d), 1e-6)), d)));
            for (int i = 0; i < W; i++) {
                double gv = g * bf16d(kr[S * W + i]);
                out[((size_t)r * S + s) * W + i] = bf16d(xt[s * W + i] + gv);
                op[((size_t)r * S + s) * W + i] = fmax(fabs((double)xt[s * W + i]), fabs(gv));
            }
        }
    }
    free(f16);
    free(wd);
    free(kv);
}

struct Acc {
    long n, exact, within;
    double max, opmax;
};

/* got against ref in BF16 steps of max(|ref|, |got|) and in steps of the
 * update's operands, max(|x|, |g v|, |ref|, |got|) (where x + g v cancels,
 * a k or v rounded to the other BF16 moves the output by a step of its
 * operands: many of the small result's); a non-finite output is off by
 * infinity */
static void compare(Acc *a, const float *got, const double *ref, const double *op, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) {
        double g = got[i], r = ref[i];
        a->n++;
        if (!isfinite(g)) {
            a->max = a->opmax = INFINITY;
            continue;
        }
        double steps = fabs(g - r) / ulp_bf16(fmax(fabs(r), fabs(g)));
        a->exact += g == r;
        a->within += steps <= 1.0;
        a->max = fmax(a->max, steps);
        a->opmax = fmax(a->opmax, fabs(g - r) / ulp_bf16(fmax(fmax(op[i], fabs(r)), fabs(g))));
    }
}

/* ---------------------------------------------------------------- main */

/* an engram call (err in scope), checked: the call and its message, then exit(1) */
#define EK(call)                                                                              \
    do {                                                                                      \
        if ((call) < 0) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg);          \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv)
{
    engram_error err;
    if (!engram_cuda_available(&err)) {
        printf("bench_ds4: skipped, no CUDA device: %s\n", err.msg);
        return 77;
    }
    char path[512];
    snprintf(path, sizeof path, "%s", argc > 1 ? argv[1] : "/tmp/engram-bench/cuda-5120.gguf");
    if (argc <= 1 && access(path, R_OK) != 0) {
        mkdir("/tmp/engram-bench", 0755);
        static uint32_t map[3000];
        engram_build_opts o;
        memset(&o, 0, sizeof o);
        tu_layout(&o.layout, map, 3000, 2000, 20000);
        o.width = 5120;
        o.fill = ENGRAM_FILL_NORMAL;
        o.seed = 1;
        EK(engram_build_model(path, &o, &err));
    }
    engram_model *m;
    engram_layer *L;
    engram_cuda_layer *c;
    EK(engram_model_open(path, &m, &err));
    EK(engram_layer_open(m, 0, &L, &err));
    EK(engram_cuda_layer_open(L, 0, &c, &err));
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    const int W = (int)li.width, S = (int)li.streams, N = (S + 1) * W;
    if (S > MAXS) {
        fprintf(stderr, "%d streams: this benchmark's gate holds %d\n", S, MAXS);
        return 1;
    }
    const size_t per = (size_t)S * W, raw_tok = 24 * 264;
    const double wbytes = (double)N * K * 2;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    time_t tt = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    printf("bench_ds4  %s  %s, %d SMs; %s table 0: W %d, S %d, weights %.1f MB F16\n", date, prop.name,
           prop.multiProcessorCount, path, W, S, wbytes / 1e6);
    cudaStream_t st;
    CU(cudaStreamCreate(&st));

    /* the floor: device copy bandwidth (1 GiB, bytes read + written) */
    size_t cb = (size_t)1 << 30;
    void *s0, *s1;
    CU(cudaMalloc(&s0, cb));
    CU(cudaMalloc(&s1, cb));
    CU(cudaMemset(s0, 1, cb));
    float cms = timed(st, 20, [&](int) { CU(cudaMemcpyAsync(s1, s0, cb, cudaMemcpyDeviceToDevice, st)); });
    const double bw = 2.0 * cb / (cms * 1e-3), floor_ms = wbytes / bw * 1e3;
    CU(cudaFree(s0));
    CU(cudaFree(s1));
    printf("device copy of 1 GiB: %.3f ms = %.0f GB/s; the weights' floor: %.4f ms\n", cms, bw / 1e9, floor_ms);

    /* ds4's route gets the layer's own F16 weights and q * k norms */
    uint16_t *hw = (uint16_t *)malloc((size_t)N * K * 2);
    float *hq = (float *)malloc(per * 4);
    engram_layer_export(L, hw, hq);
    __half *w16;
    float *wq, *kv;
    CU(cudaMalloc(&w16, (size_t)N * K * 2));
    CU(cudaMalloc(&wq, per * 4));
    CU(cudaMalloc(&kv, (size_t)NMAX * N * 4));
    CU(cudaMemcpy(w16, hw, (size_t)N * K * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(wq, hq, per * 4, cudaMemcpyHostToDevice));
    Ds4 d = {NULL, w16, wq, kv, N, W, S, st};
    CB(cublasCreate(&d.h));
    CB(cublasSetStream(d.h, st));

    /* NSET input sets of NMAX tokens: real-like rows (random tokens hashed,
     * table 0's rows read from the file), residuals of BF16 values about
     * N(0, 2) (a sum of 4 uniforms); set 0's kept on the host (h_x0) */
    uint8_t *h_raw[NSET], *d_raw[NSET];
    float *h_ef[NSET], *d_ef[NSET], *d_x[NSET], *d_x0[NSET];
    __half *d_e16[NSET];
    float *h_x0 = (float *)malloc(NMAX * per * 4), *h_x = (float *)malloc(NMAX * per * 4);
    uint32_t *tok = (uint32_t *)malloc(NMAX * 4), *rows = (uint32_t *)malloc(NMAX * 48 * 4),
             *ids = (uint32_t *)malloc(NMAX * 24 * 4);
    uint64_t seed = 25;
    double dec_ms = 0;
    for (int q = 0; q < NSET; q++) {
        for (int i = 0; i < NMAX; i++)
            tok[i] = (uint32_t)(tu_rand(&seed) % 2999);
        engram_history hist;
        engram_history_reset(&hist);
        EK(engram_hash_tokens(engram_model_hasher(m), &hist, tok, NULL, NMAX, rows, &err));
        for (int i = 0; i < NMAX; i++)
            memcpy(ids + i * 24, rows + i * 48, 24 * 4);
        CU(cudaMallocHost(&h_raw[q], NMAX * raw_tok));
        CU(cudaMallocHost(&h_ef[q], (size_t)NMAX * K * 4));
        EK(engram_model_read_raw(m, 0, ids, NMAX * 24, h_raw[q], &err));
        uint64_t t0 = tu_now_ns();
        EK(engram_rows_decode_f32(ENGRAM_SIMD_AUTO, h_raw[q], NMAX * 24, h_ef[q], &err));
        dec_ms += (double)(tu_now_ns() - t0) / 1e6 / NSET;
        float *hx = q ? h_x : h_x0;
        for (size_t i = 0; i < NMAX * per; i++) {
            uint64_t r = tu_rand(&seed);
            double u = 0;
            for (int j = 0; j < 4; j++)
                u += ((double)((r >> 16 * j) & 0xffff) + 0.5) / 65536.0;
            hx[i] = (float)bf16d((u - 2.0) * 3.4641016151377544);
        }
        CU(cudaMalloc(&d_raw[q], NMAX * raw_tok));
        CU(cudaMalloc(&d_ef[q], (size_t)NMAX * K * 4));
        CU(cudaMalloc(&d_e16[q], (size_t)NMAX * K * 2));
        CU(cudaMalloc(&d_x[q], NMAX * per * 4));
        CU(cudaMalloc(&d_x0[q], NMAX * per * 4));
        CU(cudaMemcpy(d_raw[q], h_raw[q], NMAX * raw_tok, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_ef[q], h_ef[q], (size_t)NMAX * K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_x0[q], hx, NMAX * per * 4, cudaMemcpyHostToDevice));
        ds4_cast(d, d_ef[q], d_e16[q], NMAX);
    }
    CU(cudaStreamSynchronize(st));
    CU(cudaGetLastError());
    printf("ds4's CPU decode of %d tokens' rows to F32 (1 thread, engram_rows_decode_f32): %.2f ms, "
           "in none of the times below\n", NMAX, dec_ms);

    /* the float64 reference for set 0's tokens Ref (rows: the decode's
     * F32 values, each exactly a BF16) */
    double *e = (double *)malloc((size_t)NREF * K * 8), *ref = (double *)malloc((size_t)NREF * per * 8),
           *op = (double *)malloc((size_t)NREF * per * 8);
    for (int r = 0; r < NREF; r++)
        for (int i = 0; i < K; i++)
            e[(size_t)r * K + i] = h_ef[0][(size_t)Ref[r] * K + i];
    uint64_t t0 = tu_now_ns();
    reference(hw, hq, e, h_x0, W, S, ref, op);
    printf("float64 reference of %d tokens: %.1f s on the CPU\n\n", NREF, (double)(tu_now_ns() - t0) / 1e9);

    engram_cuda_args a;
    memset(&a, 0, sizeof a);
    a.resid_dtype = ENGRAM_F32;
    a.stream = st;
    auto eapply = [&](int q, unsigned n) {
        a.raw = d_raw[q];
        a.resid = d_x[q];
        a.n = n;
        EK(engram_cuda_apply(c, &a, &err));
    };
    auto reset = [&](unsigned n) { /* every set's residuals back to their first values */
        for (int q = 0; q < NSET; q++)
            CU(cudaMemcpyAsync(d_x[q], d_x0[q], n * per * 4, cudaMemcpyDeviceToDevice, st));
    };
    auto full = [&](int q, unsigned n) { /* ds4's route from the host's F32 rows */
        CU(cudaMemcpyAsync(d_ef[q], h_ef[q], (size_t)n * K * 4, cudaMemcpyHostToDevice, st));
        ds4_cast(d, d_ef[q], d_e16[q], n);
        ds4_project_gate(d, d_e16[q], d_x[q], n);
    };
    float t_en[NB], t_kern[NB], t_cast[NB], t_up[NB], t_upraw[NB], t_full[NB];
    Acc acc[NB][2];
    float *got = (float *)malloc(per * 4);
    printf("per n, ms (uploads: host to GPU from page-locked memory, F32 rows for ds4, raw rows for engram)\n");
    for (int b = 0; b < NB; b++) {
        const unsigned n = Ns[b];
        const int reps = n <= 64 ? 100 : 20;
        /* accuracy first, from set 0's residuals; then the times */
        memset(acc[b], 0, sizeof acc[b]);
        for (int route = 0; route < 2; route++) {
            reset(n);
            if (route == 0)
                eapply(0, n);
            else
                full(0, n);
            EK(engram_cuda_sync(c, st, &err)); /* waits for the stream either way */
            CU(cudaGetLastError());
            for (int r = 0; r < NREF && Ref[r] < n; r++) {
                CU(cudaMemcpy(got, d_x[0] + Ref[r] * per, per * 4, cudaMemcpyDeviceToHost));
                compare(&acc[b][route], got, ref + r * per, op + r * per, per);
            }
        }
        reset(n);
        t_en[b] = timed(st, reps, [&](int i) { eapply(i % NSET, n); });
        EK(engram_cuda_sync(c, st, &err));
        reset(n);
        t_kern[b] = timed(st, reps, [&](int i) { ds4_project_gate(d, d_e16[i % NSET], d_x[i % NSET], n); });
        t_cast[b] = timed(st, reps, [&](int i) { ds4_cast(d, d_ef[i % NSET], d_e16[i % NSET], n); });
        t_up[b] = timed(st, reps, [&](int i) {
            CU(cudaMemcpyAsync(d_ef[i % NSET], h_ef[i % NSET], (size_t)n * K * 4, cudaMemcpyHostToDevice, st));
        });
        t_upraw[b] = timed(st, reps, [&](int i) {
            CU(cudaMemcpyAsync(d_raw[i % NSET], h_raw[i % NSET], n * raw_tok, cudaMemcpyHostToDevice, st));
        });
        reset(n);
        t_full[b] = timed(st, reps, [&](int i) { full(i % NSET, n); });
        printf("n %4u  engram apply %.4f (%.2f x floor), its raw upload %.4f | ds4 %s + gate %.4f, "
               "cast %.4f, F32 upload %.4f, the three in sequence %.4f\n", n, t_en[b], t_en[b] / floor_ms,
               t_upraw[b], n <= 8 ? "matvecs" : "GEMM", t_kern[b], t_cast[b], t_up[b], t_full[b]);
    }
    /* cuBLAS's F16 GEMM alone at NMAX on the same rows */
    const float one = 1.0f, zero = 0.0f;
    float blas = timed(st, 20, [&](int i) {
        CB(cublasGemmEx(d.h, CUBLAS_OP_T, CUBLAS_OP_N, N, NMAX, K, &one, w16, CUDA_R_16F, K, d_e16[i % NSET],
                        CUDA_R_16F, K, &zero, kv, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    double fl = 2.0 * NMAX * N * K;

    printf("\nsummary (ms, medians; ds4 kern = GEMM or matvecs + gate; ds4 full = F32 upload + cast + kern;\n"
           "accuracy of e(ngram) and d(s4) on set 0's tokens (all of n <= 8) vs the BF16 of float64 SPEC 8:\n"
           "%% exact, %% within one BF16 step, max steps of the output, max steps of the update's operands)\n");
    printf("%5s %8s %6s %8s %8s %6s %6s | %7s %7s %6s %5s | %7s %7s %6s %5s %3s\n", "n", "engram", "/floor",
           "ds4 kern", "ds4 full", "kern/e", "full/e", "e exact", "e <=1", "e max", "e op", "d exact", "d <=1",
           "d max", "d op", "tok");
    for (int b = 0; b < NB; b++) {
        const Acc *e0 = &acc[b][0], *d0 = &acc[b][1];
        printf("%5u %8.4f %6.2f %8.4f %8.4f %6.2f %6.2f | %7.3f %7.3f %6.1f %5.2f | %7.3f %7.3f %6.1f %5.2f %3ld\n",
               Ns[b], t_en[b], t_en[b] / floor_ms, t_kern[b], t_full[b], t_kern[b] / t_en[b], t_full[b] / t_en[b],
               100.0 * e0->exact / e0->n, 100.0 * e0->within / e0->n, e0->max, e0->opmax,
               100.0 * d0->exact / d0->n, 100.0 * d0->within / d0->n, d0->max, d0->opmax, e0->n / (long)per);
    }
    printf("weights' floor: %.1f MB / %.0f GB/s (1 GiB device copy, read + written) = %.4f ms\n", wbytes / 1e6,
           bw / 1e9, floor_ms);
    printf("cuBLAS F16 GEMM alone, n = %d (kv F32): %.4f ms = %.0f TFLOP/s; engram apply %.2f x it\n", NMAX,
           blas, fl / (blas * 1e-3) / 1e12, t_en[NB - 1] / blas);

    cublasDestroy(d.h);
    engram_cuda_layer_close(c);
    engram_layer_close(L);
    engram_model_close(m);
    return 0;
}
