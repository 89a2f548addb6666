/*
 * bench_cuda.cu - the CUDA path against the card's own floors, measured in
 * the same run (CUDA events, medians after warm-up):
 *  - the device-to-device copy bandwidth of 1 GiB (bytes read + written);
 *  - as many bytes as the weights read by a plain kernel, and streamed by
 *    bulk copies alone (cp.async.bulk, no arithmetic), each in one launch
 *    timed as the one-token apply is (what a kernel that only reads costs
 *    when called directly), and an empty kernel's launch;
 *  - decode: engram_cuda_apply (the same arguments each call: from the
 *    third on, one launch of the layer's graph of the call), the same with
 *    ENGRAM_CUDA_NO_GRAPH (kernel by kernel; at B = 1 also with arguments
 *    changing every call, never a graph) and engram_cuda_project of B =
 *    1..64 tokens per layer, and the apply through a plan (engram_cuda_plan_run: the
 *    call's launches in the library's graph, one submission) (and B = 1
 *    captured in a CUDA graph by the bench; B = 1 also against the bulk
 *    stream, and the host's time to submit a call or a run), and the apply through
 *    the CUDA-core GEMVs (ENGRAM_CUDA_FMA_ONLY, the decode path before issue
 *    #25), vs the time to read the layer's F16 weights at that bandwidth
 *    (issue #25's targets: <= 1.10x at B = 1, 1.30x at 2-8, 1.50x at 16-64);
 *    beside them cuBLAS's F16 GEMM alone on the same B (what the vendor's
 *    library does with these shapes: inexact sums, no gate);
 *  - prefill: the projection of 2048 tokens (rows decoded to F16 x 2^-k,
 *    exact; the promoted wgmma GEMM) and the whole apply, vs cuBLAS's F16
 *    GEMM on the same shapes (the speed floor; issue #25's target <= 1.05x);
 *    and the apply with ENGRAM_CUDA_FMA_ONLY (CUDA cores);
 *  - staging: a prefill chunk of raw rows copied to the GPU from pageable
 *    and from page-locked memory (engram_cuda_host_hooks).
 *   bench_cuda [MODEL]   (default: writes /tmp/engram-bench/cuda-5120.gguf)
 * BENCH_CUDA_PREFILL_ONCE=1: three prefill applies of 2048 tokens (or
 * BENCH_CUDA_ONCE_REPS) and stop
 * (for a profiler: ncu --metrics gpu__time_duration.sum bench_cuda MODEL);
 * =bf16: the same with a BF16 residual.
 * The prefill apply is timed with an F32 and with a BF16 residual.
 * BENCH_CUDA_DECODE_ONLY=1: stop after the decode rows (kernel variants).
 * BENCH_CUDA_PREFILL_ONLY=1: the prefill rows without the decode rows.
 * BENCH_CUDA_LOOP=S: after the prefill rows, the apply, the projection
 * and cuBLAS's GEMM each S seconds back to back, per batch of 20 calls
 * with the wall clock (to lay beside nvidia-smi's clocks and power).
 * BENCH_CUDA_PAIRED=S: after the prefill rows, for S seconds, batches of
 * 10 F32 applies and of 10 cuBLAS GEMMs in turn: both at the same power
 * and clock (a card at its power cap runs each at the clock its energy
 * allows), with the median of the pairs' ratios.
 * BENCH_CUDA_DIST=1: each timing's spread over its reps (min, quartiles,
 * max) before its row, and the F32 apply timed again after the BF16 one,
 * from a CUDA graph, and 8 back to back per timing.
 * BENCH_CUDA_WIDE=1: token 0 too wide for F16 (one block's scale 30 below
 * the others'), so that every decode row has a token the F16 paths hand to
 * the GEMV's sums (trained tables have none: the cost of that path).
 * BENCH_CUDA_STAMPS=R, BENCH_CUDA_STAMPS_DEC=R (a build with
 * -DENGRAM_CUDA_STAMPS only): the kernels' own stamps in R prefill or
 * decode (1 and 64 tokens) calls of each sequence (run_stamps).
 * BENCH_CUDA_DECODE_ONCE=B: three decode applies of B tokens, then stop (for ncu);
 * BENCH_CUDA_ONCE_REPS=R: R applies instead of three (for a timeline: each
 * a direct call on an idle card, synchronised before the next).
 * BENCH_CUDA_GEMM_ONCE=B: cuBLAS's GEMM of B tokens, 3 + 3 times, then stop (for ncu).
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../tests/testutil.h"
#include "engram_cuda.h"

#include "cuda_check.h"

#ifdef ENGRAM_CUDA_STAMPS /* the diagnostic build's stamps (common.cuh, engram_cuda.cu) */
#define EG_REPS_BENCH 256
#define EG_KERNELS_BENCH 12 /* common.cuh's EG_REPS and EG_KERNELS */
extern "C" int engram_cuda_stamps(void *stream, int op, unsigned long long *out, size_t cap);
#endif

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "%s: %s\n", what, msg);
    exit(1);
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A kernel that only reads: `bytes` from p (16-byte loads, 4 in flight per
 * thread, a grid of 4 blocks of 512 per SM), their xor into *out so that
 * nothing is optimised away: what a kernel gets from reading the weights
 * alone, launch and tail included. */
__global__ void __launch_bounds__(512) read_kernel(const uint4 *__restrict__ p, size_t n16, unsigned *out)
{
    unsigned x = 0;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
              d = __ldg(p + i + 3 * stride);
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = __ldg(p + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (x == 0x9e3779b9u) /* almost never: the loads must happen */
        *out = x;
}

/* As many bytes as the weights streamed by bulk copies alone (the TMA
 * unit): each block takes its contiguous share of `chunks` chunks of
 * STREAM_CHUNK bytes from p, through a ring of STREAM_STAGES stages of
 * shared memory (one thread asks for a chunk with cp.async.bulk and waits
 * for it; no arithmetic, nothing written).  Beside read_kernel, a second
 * kernel that only reads, launched and timed as issue #25's one-token row
 * is (launch and tail included): what reading the bytes alone costs a
 * direct call (run 59, H100: 1.007-1.009x the copy floor, read_kernel
 * 1.003-1.005x; not a proven limit).  Compute capability 9.0 and up;
 * elsewhere it does nothing (bench_cuda is built for sm_90a). */
#define STREAM_CHUNK 16384
#define STREAM_STAGES 6
__global__ void __launch_bounds__(32) stream_kernel(const uint8_t *p, int chunks, unsigned long long *span)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ uint8_t stream_smem[];
    __shared__ __align__(8) uint64_t bar[STREAM_STAGES];
    if (threadIdx.x != 0)
        return;
    unsigned long long t;
    if (span) { /* the kernel's own span: the first block's start, the last one's end (%globaltimer, ns) */
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMin(&span[0], t);
    }
    const int c0 = (int)((long long)chunks * blockIdx.x / gridDim.x),
              c1 = (int)((long long)chunks * (blockIdx.x + 1) / gridDim.x), nc = c1 - c0;
    uint32_t sbase = ((uint32_t)__cvta_generic_to_shared(stream_smem) + 1023) & ~1023u,
             b0 = (uint32_t)__cvta_generic_to_shared(bar);
    for (int s = 0; s < STREAM_STAGES; s++)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b0 + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int q = 0; q < nc + STREAM_STAGES; q++) {
        if (q >= STREAM_STAGES) { /* chunk q - STAGES has landed: its stage is free */
            int r = q - STREAM_STAGES;
            asm volatile("{\n.reg .pred p;\nSTREAM_WAIT:\n"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                         "@!p bra STREAM_WAIT;\n}\n" ::"r"(b0 + 8 * (r % STREAM_STAGES)),
                         "r"((unsigned)((r / STREAM_STAGES) & 1))
                         : "memory");
        }
        if (q < nc) {
            uint32_t bb = b0 + 8 * (q % STREAM_STAGES), dst = sbase + (q % STREAM_STAGES) * STREAM_CHUNK;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bb), "r"(STREAM_CHUNK)
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                         "l"(p + (size_t)(c0 + q) * STREAM_CHUNK), "r"(STREAM_CHUNK), "r"(bb)
                         : "memory");
        }
    }
    if (span) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMax(&span[1], t);
    }
#else
    (void)p, (void)chunks, (void)span;
#endif
}

__global__ void empty_kernel() {}

/* p[i] = a hash of i: no run of equal bytes for the reads to profit from */
__global__ void fill_kernel(unsigned *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u;
        x ^= x >> 15;
        p[i] = x * 2246822519u;
    }
}

#ifdef ENGRAM_CUDA_STAMPS
/* A sequence of calls for run_stamps: n tokens, the card idle 2 ms before
 * each call (idle), engram_cuda_project instead of the apply (project), a
 * BF16 residual (bf16). */
struct stamp_seq {
    const char *name;
    unsigned n;
    int idle, project, bf16;
};

/* R calls of each of the ns sequences (a's other arguments; d_x16: the BF16
 * residual), with each call's event time and, from the kernels' own
 * %globaltimer stamps, each kernel's start (from the call's first kernel)
 * and time, and the card's gap before the call: where a slow call's time
 * goes.  0, or -1 with a message. */
static int run_stamps(engram_cuda_layer *c, engram_cuda_args a, float *d_kv, void *d_x16, cudaStream_t st,
                      const stamp_seq *seqs, int ns, int R)
{
    engram_error err;
    R = R < 1 ? 1 : R > EG_REPS_BENCH / ns - 1 ? EG_REPS_BENCH / ns - 1 : R;
    int slot[EG_REPS_BENCH], next = 0; /* call q's stamps: slot[q] (the warm-ups take one each) */
    static cudaEvent_t ev[EG_REPS_BENCH][2];
    static unsigned long long sts[EG_REPS_BENCH][EG_KERNELS_BENCH][2];
    void *x32 = a.resid;
    a.flags |= ENGRAM_CUDA_NO_GRAPH; /* the kernels' stamps launch by launch, as before the layer's graphs */
    for (int i = 0; i < ns * R; i++)
        for (int j = 0; j < 2; j++)
            CU(cudaEventCreate(&ev[i][j]));
    if (engram_cuda_stamps(st, 0, NULL, 0) < 0)
        return -1;
    for (int w = 0; w < ns; w++) {
        a.n = seqs[w].n;
        a.resid = seqs[w].bf16 ? d_x16 : x32;
        a.resid_dtype = seqs[w].bf16 ? ENGRAM_BF16 : ENGRAM_F32;
        for (int i = 0; i < 3; i++) /* warm-up, stamped into a slot of its own */
            if ((seqs[w].project ? engram_cuda_project(c, &a, d_kv, &err) : engram_cuda_apply(c, &a, &err)) < 0) {
                fprintf(stderr, "BENCH_CUDA_STAMPS: %s\n", err.msg);
                return -1;
            }
        if (engram_cuda_stamps(st, 1, NULL, 0) < 0)
            return -1;
        next++;
        CU(cudaStreamSynchronize(st));
        for (int r = 0; r < R; r++) {
            int q = w * R + r;
            if (seqs[w].idle) {
                CU(cudaStreamSynchronize(st));
                usleep(2000);
            }
            CU(cudaEventRecord(ev[q][0], st));
            int rc = seqs[w].project ? engram_cuda_project(c, &a, d_kv, &err) : engram_cuda_apply(c, &a, &err);
            CU(cudaEventRecord(ev[q][1], st));
            if (rc < 0 || engram_cuda_stamps(st, 1, NULL, 0) < 0) {
                fprintf(stderr, "BENCH_CUDA_STAMPS: %s\n", rc < 0 ? err.msg : "the stamps' rep");
                return -1;
            }
            slot[q] = next++;
        }
        CU(cudaStreamSynchronize(st));
    }
    if (engram_cuda_stamps(st, 2, &sts[0][0][0], sizeof sts / sizeof sts[0][0][0]) < 0) {
        fprintf(stderr, "BENCH_CUDA_STAMPS: the stamps' table is not this program's size\n");
        return -1;
    }
    const char *kn[EG_KERNELS_BENCH] = {"dec16", "gemm",   "list",   "gate",    "scale", "wsd",
                                        "gate1", "g1wait", "g1sums", "g1xchg", "g1wrote", "-"};
    unsigned long long prev_end = 0;
    for (int q = 0; q < ns * R; q++) {
        float ms;
        CU(cudaEventElapsedTime(&ms, ev[q][0], ev[q][1]));
        const unsigned long long(*sq)[2] = sts[slot[q]];
        unsigned long long t0 = sq[0][0], end = 0;
        printf("stamp %-14s %3d ev %7.1f us |", seqs[q / R].name, q % R, ms * 1e3);
        for (int k = 0; k < EG_KERNELS_BENCH; k++) {
            if (sq[k][0] == ~0ull || !sq[k][1])
                continue;
            printf(" %s %+.1f %.1f", kn[k], (double)(long long)(sq[k][0] - t0) * 1e-3,
                   (double)(long long)(sq[k][1] - sq[k][0]) * 1e-3);
            end = sq[k][1] > end ? sq[k][1] : end;
        }
        printf(" | span %.1f gap-before %.1f\n", (double)(long long)(end - t0) * 1e-3,
               q % R && prev_end ? (double)(long long)(t0 - prev_end) * 1e-3 : -1.0);
        prev_end = end;
    }
    for (int i = 0; i < ns * R; i++)
        for (int j = 0; j < 2; j++)
            CU(cudaEventDestroy(ev[i][j]));
    return 0;
}
#endif

/* median ms of reps runs of fn(ctx) on stream st, after warm-up */
template <typename F> static float timed(cudaStream_t st, int reps, F fn)
{
    for (int i = 0; i < 3; i++)
        fn();
    CU(cudaStreamSynchronize(st));
    float ms[200];
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(a, st));
        fn();
        CU(cudaEventRecord(b, st));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&ms[i], a, b));
    }
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    qsort(ms, (size_t)reps, sizeof ms[0], cmpf);
    if (getenv("BENCH_CUDA_DIST")) /* the spread of the reps (for runs whose medians disagree) */
        printf("    [%d reps, us: min %.1f  p25 %.1f  median %.1f  p75 %.1f  max %.1f]\n", reps, ms[0] * 1e3,
               ms[reps / 4] * 1e3, ms[reps / 2] * 1e3, ms[3 * reps / 4] * 1e3, ms[reps - 1] * 1e3);
    return ms[reps / 2];
}

/* The host's side of a call: the time fn takes to return (its launches
 * submitted), the card idle before each; us[0] the median of 100, us[1]
 * the 90th percentile. */
template <typename F> static void host_us(cudaStream_t st, F fn, double us[2])
{
    double hs[100];
    for (int i = 0; i < 100; i++) {
        CU(cudaStreamSynchronize(st));
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        hs[i] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    CU(cudaStreamSynchronize(st));
    qsort(hs, 100, sizeof hs[0], cmpd);
    us[0] = hs[50];
    us[1] = hs[90];
}

/* A plan of the call a (engram_cuda_plan_open), or die */
static engram_cuda_plan *plan_of(engram_cuda_layer *c, const engram_cuda_args *a)
{
    engram_error err;
    engram_cuda_plan *p;
    if (engram_cuda_plan_open(c, a, &p, &err) < 0)
        die("engram_cuda_plan_open", err.msg);
    return p;
}

/* One run of plan p, or die */
static void plan_run(engram_cuda_plan *p)
{
    engram_error err;
    if (engram_cuda_plan_run(p, &err) < 0)
        die("engram_cuda_plan_run", err.msg);
}

/* *exec: one engram_cuda_apply of a, captured on st and instantiated; 0,
 * or -1 with the reason printed */
static int apply_graph(engram_cuda_layer *c, const engram_cuda_args *a, cudaStream_t st, cudaGraphExec_t *exec)
{
    engram_error err;
    cudaGraph_t graph;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    int grc = engram_cuda_apply(c, a, &err);
    CU(cudaStreamEndCapture(st, &graph));
    if (grc < 0) {
        fprintf(stderr, "capture: %s\n", err.msg);
        return -1;
    }
    CU(cudaGraphInstantiate(exec, graph, 0));
    CU(cudaGraphDestroy(graph));
    return 0;
}

int main(int argc, char **argv)
{
    engram_error why;
    if (!engram_cuda_available(&why)) {
        fprintf(stderr, "no CUDA device: %s\n", why.msg);
        return 1;
    }
    char path[512];
    engram_error err;
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        snprintf(path, sizeof path, "/tmp/engram-bench/cuda-5120.gguf");
        mkdir("/tmp/engram-bench", 0755);
        static uint32_t map[3000];
        engram_layout l;
        tu_layout(&l, map, 3000, 2000, 20000);
        engram_build_opts o;
        memset(&o, 0, sizeof o);
        o.layout = l;
        o.width = 5120;
        o.fill = ENGRAM_FILL_NORMAL;
        o.seed = 1;
        if (access(path, R_OK) != 0 && engram_build_model(path, &o, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    engram_model *m;
    engram_layer *L;
    engram_cuda_layer *c;
    if (engram_model_open(path, &m, &err) < 0 || engram_layer_open(m, 0, &L, &err) < 0 ||
        engram_cuda_layer_open(L, 0, &c, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    const int K = ENGRAM_K, N = (int)((li.streams + 1) * li.width);
    const size_t per = (size_t)li.streams * li.width;
    const double wbytes = (double)N * K * 2;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    time_t tt = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    printf("bench_cuda  %s  %s, %d SMs; W %u, S %u: weights %.1f MB F16\n", date, prop.name,
           prop.multiProcessorCount, li.width, li.streams, wbytes / 1e6);
    cudaStream_t st;
    CU(cudaStreamCreate(&st));

    /* the card's copy bandwidth */
    size_t cb = (size_t)1 << 30;
    void *s0, *s1;
    CU(cudaMalloc(&s0, cb));
    CU(cudaMalloc(&s1, cb));
    fill_kernel<<<1024, 256, 0, st>>>((unsigned *)s0, cb / 4);
    CU(cudaGetLastError());
    float cms = timed(st, 20, [&] { CU(cudaMemcpyAsync(s1, s0, cb, cudaMemcpyDeviceToDevice, st)); });
    double bw = 2.0 * cb / (cms * 1e-3);
    printf("device copy of 1 GiB: %.3f ms = %.0f GB/s (read + written)\n", cms, bw / 1e9);
    double floor_ms = wbytes / bw * 1e3;
    printf("floor for one layer's weights at that rate: %.1f us\n", floor_ms * 1e3);
    {
        unsigned *d_o;
        CU(cudaMalloc(&d_o, sizeof(unsigned)));
        size_t n16 = (size_t)(wbytes / 16);
        int grid = prop.multiProcessorCount * 4;
        float rms = timed(st, 100, [&] { read_kernel<<<grid, 512, 0, st>>>((const uint4 *)s0, n16, d_o); });
        CU(cudaGetLastError());
        printf("a kernel that only reads those %.1f MB: %.1f us = %.0f GB/s = %.3f x the floor\n", wbytes / 1e6,
               rms * 1e3, wbytes / (rms * 1e-3) / 1e9, rms / floor_ms);
        CU(cudaFree(d_o));
    }
    /* a direct call that only reads: the same bytes through bulk copies
     * alone (stream_kernel, two blocks an SM), one launch timed on an idle
     * card as the apply's direct rows are, and 32 back to back; an empty
     * kernel's launch the same way */
    float stream_ms = 0.0f;
    {
        int chunks = (int)(wbytes / STREAM_CHUNK), grid = 2 * prop.multiProcessorCount;
        size_t smem = (size_t)STREAM_STAGES * STREAM_CHUNK + 1024;
        CU(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        stream_ms = timed(st, 100, [&] { stream_kernel<<<grid, 32, smem, st>>>((const uint8_t *)s0, chunks, NULL); });
        CU(cudaGetLastError());
        float s32 = timed(st, 20, [&] {
            for (int i = 0; i < 32; i++)
                stream_kernel<<<grid, 32, smem, st>>>((const uint8_t *)s0, chunks, NULL);
        });
        float ems = timed(st, 100, [&] { empty_kernel<<<1, 32, 0, st>>>(); });
        /* the same stream's span inside the kernel (its blocks' own
         * %globaltimer: launch and end left out), 21 launches, each alone */
        unsigned long long *d_span, hspan[2], init[2] = {~0ull, 0};
        double spans[21];
        CU(cudaMalloc(&d_span, sizeof init));
        for (int i = 0; i < 21; i++) {
            CU(cudaMemcpy(d_span, init, sizeof init, cudaMemcpyHostToDevice));
            stream_kernel<<<grid, 32, smem, st>>>((const uint8_t *)s0, chunks, d_span);
            CU(cudaGetLastError());
            CU(cudaMemcpy(hspan, d_span, sizeof hspan, cudaMemcpyDeviceToHost));
            spans[i] = (double)(hspan[1] - hspan[0]) * 1e-3;
        }
        CU(cudaFree(d_span));
        qsort(spans, 21, sizeof spans[0], cmpd);
        CU(cudaGetLastError());
        printf("the same bytes by the copy engine alone (cp.async.bulk, %d blocks, %d stages of %d KB), called directly:\n"
               "  %.1f us = %.3f x the floor (32 back to back: %.1f us each = %.3f x); an empty kernel called directly: "
               "%.1f us\n  inside the kernel (its blocks' own clock, 21 launches): min %.1f, median %.1f us = %.3f x the "
               "floor\n\n",
               grid, STREAM_STAGES, STREAM_CHUNK / 1024, stream_ms * 1e3, stream_ms / floor_ms, s32 * 1e3 / 32,
               s32 / 32 / floor_ms, ems * 1e3, spans[0], spans[10], spans[10] * 1e-3 / floor_ms);
    }

    /* inputs: 2048 tokens of random valid rows (normal-like values) */
    const unsigned n = 2048;
    uint8_t *raw = (uint8_t *)malloc((size_t)n * 24 * 264);
    uint64_t seed = 3;
    float vals[256];
    for (size_t r = 0; r < (size_t)n * 24; r++) {
        for (int i = 0; i < 256; i++)
            vals[i] = ((float)(tu_rand(&seed) & 0xffff) / 65536.0f - 0.5f) * 3.0f;
        engram_rows_quantize_f32(vals, 1, raw + r * 264, NULL, NULL);
    }
    if (getenv("BENCH_CUDA_WIDE")) {
        if (raw[256] < 31) {
            fprintf(stderr, "BENCH_CUDA_WIDE: token 0's first scale is %d\n", raw[256]);
            return 1;
        }
        raw[256] = (uint8_t)(raw[256] - 30);
        printf("token 0 too wide for F16 (BENCH_CUDA_WIDE): its first block's scale set 30 below\n");
    }
    uint8_t *d_raw;
    float *d_x, *d_kv;
    CU(cudaMalloc(&d_raw, (size_t)n * 24 * 264));
    CU(cudaMalloc(&d_x, n * per * 4));
    CU(cudaMalloc(&d_kv, (size_t)n * N * 4));
    CU(cudaMemcpy(d_raw, raw, (size_t)n * 24 * 264, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_x, 0, n * per * 4));
    engram_cuda_args a;
    memset(&a, 0, sizeof a);
    a.raw = d_raw;
    a.resid = d_x;
    a.resid_dtype = ENGRAM_F32;
    a.stream = st;
    /* the calls the rows time, checked: a failed call ends the bench with
     * its message instead of being timed as if it ran */
    auto apply = [&] {
        if (engram_cuda_apply(c, &a, &err) < 0)
            die("engram_cuda_apply", err.msg);
    };
    auto project = [&] {
        if (engram_cuda_project(c, &a, d_kv, &err) < 0)
            die("engram_cuda_project", err.msg);
    };
    /* for a profiler: three applies of the prefill's 2048 tokens or of B
     * decode tokens, then stop */
    const char *dec_once = getenv("BENCH_CUDA_DECODE_ONCE"), *pre_once = getenv("BENCH_CUDA_PREFILL_ONCE");
    if (pre_once || dec_once) {
        a.n = dec_once ? (unsigned)atoi(dec_once) : n;
        if (pre_once && !dec_once && !strcmp(pre_once, "bf16")) {
            CU(cudaMalloc(&a.resid, n * per * 2));
            CU(cudaMemset(a.resid, 0, n * per * 2));
            a.resid_dtype = ENGRAM_BF16;
        }
        const char *rs = getenv("BENCH_CUDA_ONCE_REPS");
        int reps = rs && atoi(rs) > 0 ? atoi(rs) : 3;
        for (int i = 0; i < reps; i++)
            if (engram_cuda_apply(c, &a, &err) < 0 || engram_cuda_sync(c, st, &err) < 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        printf("%d applies of %u tokens done\n", reps, a.n);
        return 0;
    }

    /* cuBLAS's F16 GEMM on the same shapes (the layer's weights, F16 tokens,
     * F32 out): the vendor's speed for B tokens, and prefill's floor */
    __half *e16, *w16;
    CU(cudaMalloc(&e16, (size_t)n * K * 2));
    CU(cudaMalloc(&w16, (size_t)N * K * 2));
    uint16_t *hw = (uint16_t *)malloc((size_t)N * K * 2);
    engram_layer_export(L, hw, NULL);
    CU(cudaMemcpy(w16, hw, (size_t)N * K * 2, cudaMemcpyHostToDevice));
    __half *he = (__half *)malloc((size_t)n * K * 2);
    for (size_t i = 0; i < (size_t)n * K; i++)
        he[i] = __float2half((float)((int)(i % 97) - 48) / 64.0f);
    CU(cudaMemcpy(e16, he, (size_t)n * K * 2, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    cublasSetStream(h, st);
    const float one = 1.0f, zero = 0.0f;
    auto blas_call = [&](unsigned m) { /* its status: the loops below check it */
        return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)m, K, &one, w16, CUDA_R_16F, K, e16, CUDA_R_16F, K,
                            &zero, d_kv, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto gemm = [&](unsigned m, int reps) {
        return timed(st, reps, [&] {
            if (blas_call(m) != CUBLAS_STATUS_SUCCESS)
                die("cublasGemmEx", "failed");
        });
    };
    if (const char *g1 = getenv("BENCH_CUDA_GEMM_ONCE")) { /* for a profiler: which kernels cuBLAS runs */
        gemm((unsigned)atoi(g1), 3);
        printf("cuBLAS GEMMs of %u tokens done\n", (unsigned)atoi(g1));
        return 0;
    }

    if (!getenv("BENCH_CUDA_PREFILL_ONLY")) { /* the decode rows */
        printf("decode (B <= %u: the tensor cores, one pass over the F16 weights for all B; FMA_ONLY: the CUDA-core\n"
               "GEMVs, 8 tokens a pass, the decode path before issue #25; cuBLAS: its F16 GEMM alone on\n"
               "the same shapes, inexact sums, no gate)\n", ENGRAM_CUDA_GEMV_MAX);
        printf("(plan: the same apply through engram_cuda_plan_run, the call's launches in the library's graph,\n"
               "one submission; apply: engram_cuda_apply with the same arguments each call, from the third call\n"
               "on one launch of the layer's graph of the call; launches: the same with ENGRAM_CUDA_NO_GRAPH,\n"
               "kernel by kernel; all timed the same way, a call on an idle card)\n");
        printf("   B   apply us  / floor   projection us  / floor   FMA_ONLY apply us  / floor   "
               "cuBLAS GEMM us  / floor    plan us  / floor   launches us  / floor\n");
        const unsigned Bs[] = {1, 2, 3, 4, 5, 6, 8, 16, 24, 32, 40, 48, 56, 64};
        for (unsigned q = 0; q < sizeof Bs / sizeof Bs[0]; q++) {
            a.n = Bs[q];
            a.flags = 0;
            float ms = timed(st, 100, [&] { apply(); });
            a.flags = ENGRAM_CUDA_NO_GRAPH;
            float ln = timed(st, 100, [&] { apply(); });
            a.flags = 0;
            float pj = timed(st, 100, [&] { project(); });
            a.flags = ENGRAM_CUDA_FMA_ONLY | ENGRAM_CUDA_NO_GRAPH; /* as before #25: launch by launch */
            float fm = timed(st, 30, [&] { apply(); });
            a.flags = 0;
            float cb = gemm(Bs[q], 100);
            engram_cuda_plan *pl = plan_of(c, &a);
            float pm = timed(st, 100, [&] { plan_run(pl); });
            engram_cuda_plan_close(pl);
            printf("%4u %10.1f   %6.3f %12.1f   %6.3f %16.1f   %6.3f %14.1f   %6.3f %10.1f   %6.3f %13.1f   %6.3f\n",
                   Bs[q], ms * 1e3, ms / floor_ms, pj * 1e3, pj / floor_ms, fm * 1e3, fm / floor_ms, cb * 1e3,
                   cb / floor_ms, pm * 1e3, pm / floor_ms, ln * 1e3, ln / floor_ms);
        }
        a.n = 1;
        a.flags = ENGRAM_CUDA_SERIAL_GATE | ENGRAM_CUDA_NO_GRAPH; /* these rows launch by launch, as before */
        float sms = timed(st, 100, [&] { apply(); });
        a.flags = ENGRAM_CUDA_NO_GRAPH;
        float dms = timed(st, 100, [&] { apply(); });
        a.flags = 0;
        printf("   1 %10.1f   %6.2f   (launch by launch, ENGRAM_CUDA_NO_GRAPH: the gate launched after the GEMV, "
               "ENGRAM_CUDA_SERIAL_GATE; without it again: %.1f us = %.2f x)\n", sms * 1e3, sms / floor_ms, dms * 1e3, dms / floor_ms);
        float pms = timed(st, 100, [&] { project(); });
        printf("   1 (projection alone) %.1f us = %.2f x floor\n", pms * 1e3, pms / floor_ms);
        printf("   1 against the copy engine's stream of the same bytes, called the same way: apply launch by launch (again: %.1f us) "
               "%.3f x, projection (%.1f us) %.3f x\n", dms * 1e3, dms / stream_ms, pms * 1e3, pms / stream_ms);
        /* the host's side of a direct call: the time engram_cuda_apply takes
         * to return (its launches submitted), the card idle before each */
        {
            double hs[2];
            host_us(st, apply, hs);
            printf("   1 (the host's side: engram_cuda_apply, the layer's graph, returns after %.1f us, median of 100; p90 %.1f)\n", hs[0],
                   hs[1]);
        }
        /* 32 direct calls back to back: the host's launches ahead of the card,
         * as in a decode loop without a graph (the rows above time one call on
         * an idle card, its host-side launch included) */
        float d32 = timed(st, 20, [&] {
            for (int i = 0; i < 32; i++)
                apply();
        });
        printf("   1 (32 direct calls back to back, the layer's graph) %.1f us each = %.2f x floor\n", d32 * 1e3 / 32,
               d32 / 32 / floor_ms);
        /* the same launch by launch (ENGRAM_CUDA_NO_GRAPH: the direct call
         * before the layer's graphs), and with arguments that change every
         * call (8 residuals in turn: none seen again among the layer's last
         * ENGRAM_CUDA_GRAPHS, so never a graph), both ways */
        {
            engram_cuda_args keep = a;
            a.flags = ENGRAM_CUDA_NO_GRAPH;
            float l1 = timed(st, 100, [&] { apply(); });
            double hl[2];
            host_us(st, apply, hl);
            float l32 = timed(st, 20, [&] {
                for (int i = 0; i < 32; i++)
                    apply();
            });
            unsigned turn = 0;
            auto rot = [&] {
                a.resid = (char *)keep.resid + (size_t)(turn++ % 8) * per * 4;
                apply();
            };
            a.flags = 0;
            float r1 = timed(st, 100, rot);
            double hr[2];
            host_us(st, rot, hr);
            a.flags = ENGRAM_CUDA_NO_GRAPH;
            float r0 = timed(st, 100, rot);
            /* the host's side of a first and a second sighting (the graph made
             * and uploaded): 20 residuals never used before, each called twice */
            double first[20], second[20];
            a.flags = 0;
            for (int i = 0; i < 20; i++) {
                a.resid = (char *)keep.resid + (size_t)(16 + i) * per * 4;
                double one[2];
                for (int k = 0; k < 2; k++) {
                    CU(cudaStreamSynchronize(st));
                    struct timespec t0, t1;
                    clock_gettime(CLOCK_MONOTONIC, &t0);
                    apply();
                    clock_gettime(CLOCK_MONOTONIC, &t1);
                    one[k] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
                }
                first[i] = one[0];
                second[i] = one[1];
            }
            CU(cudaStreamSynchronize(st));
            qsort(first, 20, sizeof first[0], cmpd);
            qsort(second, 20, sizeof second[0], cmpd);
            a = keep;
            float g1 = timed(st, 100, [&] { apply(); });
            printf("   1 (launch by launch, ENGRAM_CUDA_NO_GRAPH) %.1f us = %.3f x floor (the default again: %.1f us = "
                   "%.3f x); engram_cuda_apply returns after %.1f us (p90 %.1f); 32 back to back %.1f us each = %.3f "
                   "x\n",
                   l1 * 1e3, l1 / floor_ms, g1 * 1e3, g1 / floor_ms, hl[0], hl[1], l32 * 1e3 / 32,
                   l32 / 32 / floor_ms);
            printf("   1 (arguments changing every call, 8 residuals in turn) %.1f us = %.3f x floor, returns after "
                   "%.1f us (p90 %.1f); launch by launch the same way %.1f us = %.3f x\n",
                   r1 * 1e3, r1 / floor_ms, hr[0], hr[1], r0 * 1e3, r0 / floor_ms);
            printf("   1 (new arguments, 20 residuals: the first call returns after %.1f us, the second, which makes "
                   "and uploads the graph, after %.1f us; medians, max %.1f / %.1f)\n",
                   first[10], second[10], first[19], second[19]);
        }
        /* a plan of the same call: idle (again, beside the direct call
         * again), 32 runs back to back, and the host's side of a run */
        {
            engram_cuda_plan *pl = plan_of(c, &a);
            auto run = [&] { plan_run(pl); };
            float d1 = timed(st, 100, [&] { apply(); });
            float p1 = timed(st, 100, run);
            float p32 = timed(st, 20, [&] {
                for (int i = 0; i < 32; i++)
                    run();
            });
            double hs[2];
            host_us(st, run, hs);
            engram_cuda_plan_close(pl);
            printf("   1 (a plan) %.1f us = %.3f x floor (the direct call, the layer's graph, again: %.1f us = %.3f x); 32 runs back to "
                   "back: %.1f us each = %.3f x; engram_cuda_plan_run returns after %.1f us (median of 100; p90 "
                   "%.1f)\n",
                   p1 * 1e3, p1 / floor_ms, d1 * 1e3, d1 / floor_ms, p32 * 1e3 / 32, p32 / 32 / floor_ms, hs[0],
                   hs[1]);
        }
        /* B = 1 as an engine runs it: captured once into a graph with a device-side step index */
        {
            int *d_step;
            CU(cudaMalloc(&d_step, sizeof(int)));
            CU(cudaMemset(d_step, 0, sizeof(int)));
            for (int serial = 1; serial >= 0; serial--) {
                engram_cuda_args g = a;
                g.d_step = d_step;
                g.raw_step = 24 * 264;
                g.resid_step = per * 4;
                g.flags = serial ? ENGRAM_CUDA_SERIAL_GATE : 0;
                cudaGraphExec_t exec;
                if (apply_graph(c, &g, st, &exec) < 0)
                    return 1;
                float gms = timed(st, 100, [&] { CU(cudaGraphLaunch(exec, st)); });
                /* 32 steps back to back, as a decode loop without host syncs */
                float g32 = timed(st, 20, [&] {
                    for (int i = 0; i < 32; i++)
                        CU(cudaGraphLaunch(exec, st));
                });
                printf("   1 (apply in a CUDA graph%s) %.1f us = %.2f x floor; 32 graph launches back to back: "
                       "%.1f us each = %.2f x floor\n%s",
                       serial ? ", gate serial" : "", gms * 1e3, gms / floor_ms, g32 * 1e3 / 32,
                       g32 / 32 / floor_ms, serial ? "" : "\n");
                cudaGraphExecDestroy(exec);
            }
            cudaFree(d_step);
        }
    }

#ifdef ENGRAM_CUDA_STAMPS
    /* BENCH_CUDA_STAMPS_DEC=R: the same stamps (run_stamps) of R one-token
     * applies with the card idle before each, R back to back, and R
     * one-token projections with the card idle before each; then the same
     * three of 64 tokens (the widest box) */
    if (const char *sr = getenv("BENCH_CUDA_STAMPS_DEC")) {
        const stamp_seq seqs[6] = {{"apply 1 idle", 1, 1, 0, 0},     {"apply 1", 1, 0, 0, 0},
                                   {"project 1 idle", 1, 1, 1, 0},   {"apply 64 idle", 64, 1, 0, 0},
                                   {"apply 64", 64, 0, 0, 0},        {"project 64 idle", 64, 1, 1, 0}};
        if (run_stamps(c, a, d_kv, NULL, st, seqs, 6, atoi(sr)) < 0)
            return 1;
    }
#endif
    if (getenv("BENCH_CUDA_DECODE_ONLY")) /* kernel variants: the decode rows alone */
        return 0;
    /* prefill vs cuBLAS F16 */
    a.n = n;
    float proj = timed(st, 30, [&] { project(); });
    float app = timed(st, 30, [&] { apply(); });
    void *d_x16;
    CU(cudaMalloc(&d_x16, n * per * 2));
    CU(cudaMemset(d_x16, 0, n * per * 2));
    a.resid = d_x16;
    a.resid_dtype = ENGRAM_BF16;
    float app16 = timed(st, 30, [&] { apply(); });
    a.resid = d_x;
    a.resid_dtype = ENGRAM_F32;
    if (getenv("BENCH_CUDA_DIST")) {
        float again = timed(st, 30, [&] { apply(); });
        printf("  (engram apply, F32 residual, again: %.3f ms)\n", again);
        /* the same apply with its launches from a graph (no host between
         * kernels), and 8 applies back to back per timing (no idle card
         * before each) */
        cudaGraphExec_t exec;
        if (apply_graph(c, &a, st, &exec) < 0)
            return 1;
        float gr = timed(st, 30, [&] { CU(cudaGraphLaunch(exec, st)); });
        printf("  (engram apply, F32 residual, from a graph: %.3f ms)\n", gr);
        float b8 = timed(st, 10, [&] {
            for (int i = 0; i < 8; i++)
                apply();
        });
        printf("  (engram apply, F32 residual, 8 back to back: %.3f ms each)\n", b8 / 8);
        cudaGraphExecDestroy(exec);
    }
    float blas = gemm(n, 30);
    double fl = 2.0 * n * N * K;
    printf("prefill, %u tokens x %d outputs x %d inputs (%.0f GFLOP)\n", n, N, K, fl / 1e9);
    printf("  cuBLAS F16 GEMM (inexact floor) %8.3f ms = %6.0f TFLOP/s\n", blas, fl / (blas * 1e-3) / 1e12);
    printf("  engram projection (promoted wgmma) %5.3f ms = %6.0f TFLOP/s  %.2f x cuBLAS F16\n", proj,
           fl / (proj * 1e-3) / 1e12, proj / blas);
    printf("  engram apply (project + gate)   %8.3f ms = %.0f tokens/s   %.2f x cuBLAS F16 (F32 residual)\n",
           app, n / (app * 1e-3), app / blas);
    printf("  engram apply, BF16 residual     %8.3f ms = %.0f tokens/s   %.2f x cuBLAS F16\n", app16,
           n / (app16 * 1e-3), app16 / blas);
    /* what the gate must move whatever its kernel (kv as BF16 read once, the
     * residual read and written) at the card's copy rate, after a GEMM at
     * cuBLAS's time: about the floor of any apply whose gate does not
     * overlap its GEMM (about: cuBLAS writes kv as F32, the apply's GEMM as
     * BF16) */
    for (int q = 0; q < 2; q++) {
        double gb = (double)n * N * 2 + 2.0 * n * per * (q ? 2 : 4), gms = gb / bw * 1e3;
        printf("  gate's traffic (%s residual) %.1f MB at the copy rate %.1f us; cuBLAS + that %.3f ms: apply "
               "%.2f x it\n", q ? "BF16" : "F32", gb / 1e6, gms * 1e3, blas + gms, (q ? app16 : app) / (blas + gms));
    }
    a.flags = ENGRAM_CUDA_FMA_ONLY;
    float fma = timed(st, 3, [&] { apply(); });
    printf("  engram apply, ENGRAM_CUDA_FMA_ONLY %5.3f ms = %.0f tokens/s   %.2f x cuBLAS F16\n", fma,
           n / (fma * 1e-3), fma / blas);
    a.flags = 0;
    CU(cudaStreamSynchronize(st));

    /* BENCH_CUDA_LOOP=S: the F32 apply, the projection and cuBLAS's GEMM of
     * the prefill's 2048 tokens, each for S seconds back to back in batches
     * of 20, each batch's time per call with the wall clock (CLOCK_REALTIME,
     * ms) at its end, to lay beside the card's clocks and power sampled
     * meanwhile (nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,...
     * -lms 20): is a slow apply a slow clock? */
    if (const char *ls = getenv("BENCH_CUDA_LOOP")) {
        double secs = atof(ls);
        const char *what[3] = {"apply F32", "projection", "cuBLAS GEMM"};
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        for (int w = 0; w < 3; w++) {
            uint64_t start = tu_now_ns();
            while ((double)(tu_now_ns() - start) * 1e-9 < secs) {
                CU(cudaEventRecord(e0, st));
                for (int i = 0; i < 20; i++) {
                    int rc = w == 0   ? engram_cuda_apply(c, &a, &err)
                             : w == 1 ? engram_cuda_project(c, &a, d_kv, &err)
                                      : (blas_call(n) == CUBLAS_STATUS_SUCCESS ? 0 : -1);
                    if (rc < 0) {
                        fprintf(stderr, "BENCH_CUDA_LOOP: %s failed: %s\n", what[w], w < 2 ? err.msg : "cuBLAS");
                        return 1;
                    }
                }
                CU(cudaEventRecord(e1, st));
                CU(cudaEventSynchronize(e1));
                float ms;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                printf("loop %-12s %.3f ms a call, wall %lld.%03ld\n", what[w], ms / 20, (long long)ts.tv_sec,
                       ts.tv_nsec / 1000000);
            }
        }
        CU(cudaEventDestroy(e0));
        CU(cudaEventDestroy(e1));
    }
    if (const char *ps = getenv("BENCH_CUDA_PAIRED")) {
        double secs = atof(ps);
        static float pa[4096], pb[4096], pr[4096];
        int np = 0;
        cudaEvent_t e0, e1, e2;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        CU(cudaEventCreate(&e2));
        uint64_t start = tu_now_ns();
        while (np < 4096 && (double)(tu_now_ns() - start) * 1e-9 < secs) {
            CU(cudaEventRecord(e0, st));
            for (int i = 0; i < 10; i++)
                if (engram_cuda_apply(c, &a, &err) < 0) {
                    fprintf(stderr, "BENCH_CUDA_PAIRED: the apply failed: %s\n", err.msg);
                    return 1;
                }
            CU(cudaEventRecord(e1, st));
            for (int i = 0; i < 10; i++)
                if (blas_call(n) != CUBLAS_STATUS_SUCCESS) {
                    fprintf(stderr, "BENCH_CUDA_PAIRED: cublasGemmEx failed\n");
                    return 1;
                }
            CU(cudaEventRecord(e2, st));
            CU(cudaEventSynchronize(e2));
            CU(cudaEventElapsedTime(&pa[np], e0, e1));
            CU(cudaEventElapsedTime(&pb[np], e1, e2));
            pr[np] = pa[np] / pb[np];
            np++;
        }
        CU(cudaEventDestroy(e0));
        CU(cudaEventDestroy(e1));
        CU(cudaEventDestroy(e2));
        qsort(pa, (size_t)np, sizeof pa[0], cmpf);
        qsort(pb, (size_t)np, sizeof pb[0], cmpf);
        qsort(pr, (size_t)np, sizeof pr[0], cmpf);
        printf("paired, %d pairs of 10 F32 applies and 10 cuBLAS GEMMs in turn: apply median %.3f ms, cuBLAS "
               "median %.3f ms; the pairs' ratio: median %.3f (p25 %.3f, p75 %.3f)\n", np, pa[np / 2] / 10,
               pb[np / 2] / 10, pr[np / 2], pr[np / 4], pr[3 * np / 4]);
    }
#ifdef ENGRAM_CUDA_STAMPS
    /* BENCH_CUDA_STAMPS=R (a build with -DENGRAM_CUDA_STAMPS only): R calls
     * of each of four sequences of the prefill's 2048 tokens -- the F32
     * apply back to back, the F32 apply with the card idle 2 ms before each,
     * the projection back to back, the BF16 apply back to back (run_stamps) */
    if (const char *sr = getenv("BENCH_CUDA_STAMPS")) {
        const stamp_seq seqs[4] = {{"apply F32", n, 0, 0, 0},
                                   {"apply F32 idle", n, 1, 0, 0},
                                   {"projection", n, 0, 1, 0},
                                   {"apply BF16", n, 0, 0, 1}};
        if (run_stamps(c, a, d_kv, d_x16, st, seqs, 4, atoi(sr)) < 0)
            return 1;
    }
#endif

    /* staging: one prefill chunk of raw rows (2048 tokens x 24 x 264 B) to
     * the GPU from pageable memory and from memory page-locked by
     * engram_cuda_host_hooks (as the pool's buffers and rings are): the
     * copy's time on the stream, and the host's time inside the call (what
     * the host cannot spend on the next chunk's reads). */
    {
        size_t cbytes = (size_t)n * 24 * 264;
        uint8_t *pg = (uint8_t *)aligned_alloc(4096, cbytes), *pl = (uint8_t *)aligned_alloc(4096, cbytes);
        memset(pg, 1, cbytes);
        memset(pl, 1, cbytes);
        engram_host_hooks hh;
        engram_cuda_host_hooks(&hh);
        if (hh.reg(hh.ctx, pl, cbytes) != 0) {
            fprintf(stderr, "cudaHostRegister refused\n");
            return 1;
        }
        uint8_t *d_c;
        CU(cudaMalloc(&d_c, cbytes));
        printf("\nstaging: one prefill chunk of raw rows, %.1f MB, host to GPU on the stream\n", cbytes / 1e6);
        const char *what[2] = {"pageable", "page-locked (engram_cuda_host_hooks)"};
        for (int q = 0; q < 2; q++) {
            uint8_t *src = q ? pl : pg;
            float ms = timed(st, 20, [&] { CU(cudaMemcpyAsync(d_c, src, cbytes, cudaMemcpyHostToDevice, st)); });
            double host_us[20];
            for (int i = 0; i < 20; i++) {
                CU(cudaStreamSynchronize(st));
                uint64_t t0 = tu_now_ns();
                CU(cudaMemcpyAsync(d_c, src, cbytes, cudaMemcpyHostToDevice, st));
                host_us[i] = (double)(tu_now_ns() - t0) / 1e3;
            }
            CU(cudaStreamSynchronize(st));
            qsort(host_us, 20, sizeof host_us[0], [](const void *x, const void *y) {
                double u = *(const double *)x, v = *(const double *)y;
                return u < v ? -1 : u > v;
            });
            printf("  %-38s copy %7.3f ms = %5.1f GB/s; host blocked in the call %8.1f us (median)\n",
                   what[q], ms, cbytes / (ms * 1e-3) / 1e9, host_us[10]);
        }
        hh.unreg(hh.ctx, pl, cbytes);
        CU(cudaFree(d_c));
        free(pg);
        free(pl);
    }
    printf("\nlayer memory on the device: %.1f MB\n", engram_cuda_layer_bytes(c) / 1e6);
    cublasDestroy(h);
    engram_cuda_layer_close(c);
    engram_layer_close(L);
    engram_model_close(m);
    return 0;
}
