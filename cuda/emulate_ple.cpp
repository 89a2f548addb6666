/*
 * emulate_ple.cpp - the PLE kernels of cuda/ple_kernels.cuh compiled for
 * the host and run there, a CUDA thread as a fiber (a block's threads as
 * many contexts on one CPU thread, switched at barriers: __syncthreads a
 * barrier of the block, warp shuffles through a shared array and a barrier
 * of the warp), against the CPU path (src/output/ple_apply.h).
 * It checks the kernels' logic where no GPU is: the GEMV's indexing and
 * sums, the gate's Sum16 chains, the convolution's frame ring, chunks,
 * workspace blocks and the state's advance, masked positions, a BF16
 * residual.  It says nothing of what only a GPU shows (timing, the memory
 * model, dependent launches, cuBLAS): build/cuda/test_ple_cuda does that.
 *  - the GEMV (T = 1, 2, 5, 8 tokens a launch; BF16 and F16 keys) against
 *    the CPU's exact chain: within a few F32 roundings of sum |e w|, and a
 *    token alone gives the bits it gets among 8;
 *  - the gate and convolution on the CPU's own projection give the CPU's
 *    bits (up to expf: the kernels take exp in double rounded to float,
 *    glibc's expf is not always correctly rounded: a few last-bit
 *    differences at most);
 *  - the whole chain (GEMV, gate, convolution): >= 99.9% of outputs within
 *    one BF16 step of the CPU's, masked positions untouched;
 *  - a BF16 residual: bf16 of the F32 residual's result, the same state;
 *  - the convolution alone over long sequences cut into calls at random
 *    points and each call into workspace blocks (of 23, 100 or 2048
 *    positions, as PLE_CUDA_BLOCK cuts a call: blocks of several chunks of
 *    36 too), its blocks run in reverse order: the CPU's bits (up to expf).
 *   make build/cuda/emulate_ple && build/cuda/emulate_ple    (no GPU needed)
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "output/ple_apply.h"
#include "output/ple_kernels.h"
float f16_to_f32(uint16_t h);
}

/* ------------------------------------------------ CUDA, emulated */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static /* one block runs at a time */
#define PLE_EXTERN_SHARED extern

struct dim3e {
    unsigned x, y, z;
};
static dim3e blockIdx, threadIdx; /* the running fiber's (set at each switch) */
static dim3e blockDim;
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
struct __half2 {
    unsigned short a, b;
};
static inline float2 __half22float2(__half2 h)
{
    return {f16_to_f32(h.a), f16_to_f32(h.b)};
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return {a, b, c, d};
}
static inline uint4 __ldg(const uint4 *p)
{
    return *p;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* compiled with -ffp-contract=off: each rounds once, as the intrinsics */
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}

/* Fibers: the threads of the running block, resumed in turn by run();
 * one runs until it waits at a barrier (or ends), then hands back.  Until
 * 2026-12-03 each CUDA thread was a std::thread, made and joined for every
 * block, with std::barrier: 19 s on the 2-core VM and 32 s of CPU, two
 * thirds of it in the kernel (69 s in the suite's first stream); as fibers
 * 8 s.  The same report either way, line for line: one block at a time,
 * every thread's arithmetic its own. */
struct fiber {
    ucontext_t uc;
    bool done;
};
static ucontext_t sched_uc;
static fiber *cur;
/* arrivals at barriers and fibers finished: a pass of run() over a block
 * that adds none is a deadlock */
static unsigned long fiber_progress;

/* a barrier of n fibers: the last to arrive opens it */
struct fbar {
    int n, count;
    unsigned gen;
};
static void fbar_wait(fbar &b)
{
    unsigned g = b.gen;
    fiber_progress++;
    if (++b.count == b.n) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == g)
        swapcontext(&cur->uc, &sched_uc);
}

struct block_ctx {
    fbar all;
    fbar warp[32];
    float lanes[32][32];
};
static block_ctx *blk;

static void __syncthreads()
{
    fbar_wait(blk->all);
}

/* every lane of the warp publishes v, then reads lane src's (its own if
 * src is out of the warp) */
static float exchange(float v, int src)
{
    int w = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32;
    blk->lanes[w][l] = v;
    fbar_wait(blk->warp[w]);
    float r = src >= 0 && src < 32 ? blk->lanes[w][src] : v;
    fbar_wait(blk->warp[w]);
    return r;
}
static float __shfl_sync(unsigned, float v, int src)
{
    return exchange(v, src);
}
static float __shfl_xor_sync(unsigned, float v, int m)
{
    return exchange(v, (int)(threadIdx.x % 32) ^ m);
}
static float __shfl_down_sync(unsigned, float v, int d)
{
    int l = (int)(threadIdx.x % 32);
    return exchange(v, l + d < 32 ? l + d : l);
}
static int atomicMin(int *p, int v) /* one fiber runs at a time */
{
    int o = *p;
    if (v < o)
        *p = v;
    return o;
}
using std::min;

#include "ple_kernels.cuh"

float4 ple_smem4[(9 * 4096 + 32) / 4 + 1];

/* a grid, one block at a time, every thread of a block a fiber (stacks of
 * FIBER_STACK bytes for the kernels' locals: the run passed with 4 KB) */
#define FIBER_STACK (256 * 1024)
static void (*fiber_body)(void *);
/* one step of the xorshift generator in s (the schedule's and the data's) */
static uint64_t xorshift(uint64_t &s)
{
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}
static uint64_t fiber_rs = 0x9e3779b97f4a7c15ull; /* the schedule's */
static void *fiber_arg;

static void fiber_entry()
{
    fiber_body(fiber_arg);
    cur->done = true;
    fiber_progress++;
} /* then back to run() through uc_link */

/* GCC takes getcontext for a function that returns twice (as setjmp) and
 * would warn that run()'s loop counters may be clobbered (-Wclobbered):
 * the context calls live in these two */
static __attribute__((noinline)) void fiber_init(fiber &f, char *stack)
{
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = stack;
    f.uc.uc_stack.ss_size = FIBER_STACK;
    f.uc.uc_link = &sched_uc;
    f.done = false;
    makecontext(&f.uc, fiber_entry, 0);
}

static __attribute__((noinline)) void fiber_resume(fiber &f)
{
    cur = &f;
    swapcontext(&sched_uc, &f.uc);
}

/* The stacks of `threads` fibers, each above an inaccessible page (an
 * overflow faults), one pool for every grid (allocated and faulted in anew
 * for each grid they took 14.0 s of the run instead of 8.2).  *slot: the
 * bytes from one stack's guard page to the next's. */
static char *fiber_stacks(unsigned threads, size_t *slot)
{
    static char *stacks;
    static unsigned stacks_for;
    static size_t page, step;
    if (!page) {
        page = (size_t)sysconf(_SC_PAGESIZE);
        step = page + (FIBER_STACK + page - 1) / page * page;
    }
    *slot = step;
    if (threads > stacks_for) {
        if (stacks)
            munmap(stacks, (size_t)stacks_for * step);
        void *m = mmap(NULL, (size_t)threads * step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "emulate_ple: no memory for %u stacks\n", threads);
            exit(2);
        }
        stacks = (char *)m;
        stacks_for = threads;
        for (unsigned t = 0; t < threads; t++)
            if (mprotect(stacks + (size_t)t * step, page, PROT_NONE) != 0) {
                fprintf(stderr, "emulate_ple: mprotect failed\n");
                exit(2);
            }
    }
    return stacks;
}

/* blocks (bx0 + x, by0 + y), x < gx, y < gy, in that order */
template <typename F>
static void run(unsigned gx, unsigned gy, unsigned threads, F body, unsigned bx0 = 0, unsigned by0 = 0)
{
    blockDim = {threads, 1, 1};
    std::vector<fiber> f(threads);
    std::vector<unsigned> order(threads);
    for (unsigned t = 0; t < threads; t++)
        order[t] = t;
    size_t slot;
    char *stacks = fiber_stacks(threads, &slot);
    fiber_body = [](void *p) { (*(F *)p)(); };
    fiber_arg = &body;
    block_ctx b;
    blk = &b;
    for (unsigned by = by0; by < by0 + gy; by++)
        for (unsigned bx = bx0; bx < bx0 + gx; bx++) {
            b.all = fbar{(int)threads, 0, 0};
            for (unsigned w = 0; w < threads / 32; w++)
                b.warp[w] = fbar{32, 0, 0};
            for (unsigned t = 0; t < threads; t++)
                fiber_init(f[t], stacks + (size_t)t * slot + (slot - FIBER_STACK));
            /* each pass in its own order (a fixed-seed shuffle): between two
             * barriers a thread runs whole, so a read of another thread's
             * write that a missing barrier leaves unordered sees the old
             * value about half the times it happens (with a fixed order, or
             * forward and backward in turn, a removed __syncthreads went
             * unnoticed that the threads' version caught).  What fibers
             * cannot show: a race inside one such stretch (a plain
             * read-modify-write of shared data by several threads). */
            for (unsigned live = threads; live;) {
                for (unsigned i = threads - 1; i > 0; i--)
                    std::swap(order[i], order[xorshift(fiber_rs) % (i + 1)]);
                const unsigned long before = fiber_progress;
                for (unsigned i = 0; i < threads; i++) {
                    unsigned t = order[i];
                    if (f[t].done)
                        continue;
                    blockIdx = {bx, by, 0};
                    threadIdx = {t, 0, 0};
                    fiber_resume(f[t]);
                    live -= f[t].done;
                }
                if (live && fiber_progress == before) {
                    /* every live thread waits at a barrier the others will never reach */
                    fprintf(stderr,
                            "emulate_ple: block (%u, %u) of %u threads deadlocked at a barrier (%u still running)\n",
                            bx, by, threads, live);
                    exit(3);
                }
            }
        }
}

/* ------------------------------------------------ data */

static uint64_t rs = 88172645463325252ull;
static double U()
{
    return (double)(xorshift(rs) >> 11) * 0x1p-53;
}
static double N()
{
    double u = U(), v = U();
    return sqrt(-2 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}
static uint16_t bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float fb(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}
static int ulps(float a, float b)
{
    int32_t p, q;
    memcpy(&p, &a, 4);
    memcpy(&q, &b, 4);
    return abs(p - q);
}

/* |got - want| in F32 ulps of the update's operands max(|x|, |want|,
 * |want - x|) (where x + g + y cancels, ulps of the small result say
 * nothing) */
static double op_ulps(float got, float want, float x)
{
    double m = std::max(std::max(fabs((double)x), fabs((double)want)), fabs((double)want - x));
    int e;
    frexp(m, &e);
    return fabs((double)got - want) / ldexp(1.0, e - 24);
}

static const size_t K = PLE_K;
static int failures;

static void verdict(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void verdict(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("  %s\n", ok ? "PASS" : "FAIL");
    failures += !ok;
}

struct layer {
    uint32_t W;
    size_t C, NN;
    int kf16;
    std::vector<uint16_t> w; /* [5W][K]: keys (F16 if kf16, else BF16), values BF16 */
    std::vector<float> gk, gq, gc, conv, taps;
    struct ple_layer *L;
};

static void layer_make(layer &l, uint32_t W, int kf16)
{
    l.W = W;
    l.C = 4 * (size_t)W;
    l.NN = 5 * (size_t)W;
    l.kf16 = kf16;
    l.w.resize(l.NN * K);
    for (size_t o = 0; o < l.NN; o++)
        for (size_t i = 0; i < K; i++) {
            float v = (float)(N() / 50);
            l.w[o * K + i] = o < l.C && kf16 ? f16(v) : bf(v);
        }
    l.gk.resize(l.C), l.gq.resize(l.C), l.gc.resize(l.C), l.conv.resize(l.C * 4), l.taps.resize(4 * l.C);
    for (size_t i = 0; i < l.C; i++)
        l.gk[i] = (float)(1 + N() * 0.1), l.gq[i] = (float)(1 + N() * 0.1), l.gc[i] = (float)(1 + N() * 0.1);
    for (auto &c : l.conv)
        c = (float)(U() - 0.5);
    for (size_t c = 0; c < l.C; c++)
        for (int k = 0; k < 4; k++)
            l.taps[k * l.C + c] = l.conv[c * 4 + k];
    const uint32_t kt = kf16 ? (uint32_t)GGML_F16 : (uint32_t)GGML_BF16;
    struct ple_weights pw = {W, 4, 1e-6f, kt, GGML_BF16, l.w.data(), l.w.data() + l.C * K,
                             l.gk.data(), l.gq.data(), l.gc.data(), l.conv.data()};
    engram_error err;
    if (ple_layer_new(&pw, &l.L, &err) < 0) {
        fprintf(stderr, "ple_layer_new: %s\n", err.msg);
        exit(1);
    }
}

struct sequence {
    size_t n;
    std::vector<uint16_t> rows;
    std::vector<float> x, state;
    std::vector<uint8_t> mask;
};

static void seq_make(sequence &q, const layer &l, size_t n)
{
    q.n = n;
    q.rows.resize(n * K);
    q.x.resize(n * l.C);
    q.state.resize(9 * l.C);
    q.mask.resize(n);
    for (auto &r : q.rows)
        r = bf((float)N());
    for (auto &v : q.x)
        v = fb(bf((float)(2 * N())));
    for (auto &v : q.state)
        v = (float)N();
    for (size_t t = 0; t < n; t++)
        q.mask[t] = t == 0 || (int)(U() * 6) != 0;
    if (n > 1) { /* position 1: a stream of zeros, s = +0 */
        q.mask[1] = 1;
        std::fill(q.x.begin() + l.C + 2 * l.W, q.x.begin() + l.C + 3 * l.W, 0.0f);
    }
}

static void cpu(const layer &l, const sequence &q, std::vector<float> &x, std::vector<float> &s)
{
    x = q.x;
    s = q.state;
    struct ple_applier *a;
    struct ple_apply_opts o = {1, ENGRAM_SIMD_AUTO, 0, NULL, NULL};
    engram_error err;
    if (ple_applier_new(l.L, &o, &a, &err) < 0 ||
        ple_apply(a, q.rows.data(), x.data(), ENGRAM_F32, q.mask.data(), q.n, s.data(), &err) < 0) {
        fprintf(stderr, "CPU: %s\n", err.msg);
        exit(1);
    }
    ple_applier_free(a);
}

/* kv by the CPU's order (one FMA chain per output, input order), and
 * sum |e w| per output */
static void exact_kv(const layer &l, const sequence &q, std::vector<float> &kv, std::vector<double> &mag)
{
    kv.assign(q.n * l.NN, 0.0f);
    mag.assign(q.n * l.NN, 0.0);
    for (size_t t = 0; t < q.n; t++)
        for (size_t o = 0; o < l.NN; o++) {
            float acc = 0;
            double m = 0;
            for (size_t i = 0; i < K; i++) {
                float w = o < l.C && l.kf16 ? f16_to_f32(l.w[o * K + i]) : fb(l.w[o * K + i]);
                float e = fb(q.rows[t * K + i]);
                acc = fmaf(e, w, acc);
                m += fabs((double)e * w);
            }
            kv[t * l.NN + o] = acc;
            mag[t * l.NN + o] = m;
        }
}

/* the GEMV over tokens [t0, t0 + T) into kv */
static void gemv(const layer &l, const uint16_t *e, unsigned T, float *kv)
{
    const unsigned warps = (unsigned)(l.NN + PG_ROWS - 1) / PG_ROWS;
    const unsigned blocks = (warps * 32 + PG_THREADS - 1) / PG_THREADS;
    const int C = (int)l.C, NN = (int)l.NN, kf = l.kf16;
    const uint16_t *w = l.w.data();
    run(blocks, 1, PG_THREADS, [=] {
        switch (T) {
        case 1: ple_gemv_kernel<1>(w, kf, 0, C, 0, NN, e, kv, NN); break;
        case 2: ple_gemv_kernel<2>(w, kf, 0, C, 0, NN, e, kv, NN); break;
        case 5: ple_gemv_kernel<5>(w, kf, 0, C, 0, NN, e, kv, NN); break;
        case 8: ple_gemv_kernel<8>(w, kf, 0, C, 0, NN, e, kv, NN); break;
        default: abort();
        }
    });
}

/* the gate and the convolution of one call (one workspace block) */
template <bool BF>
static int gate_conv(const layer &l, const sequence &q, const float *kv, void *x, float *state)
{
    const size_t n = q.n;
    std::vector<float> alpha(n * 4), rn(n);
    std::vector<uint8_t> flag(n);
    int status = 1 << 30;
    const int W = (int)l.W, NN = (int)l.NN;
    run((unsigned)n, 1, PGATE_THREADS, [&] {
        ple_gate_kernel<BF>(kv, NN, x, q.mask.data(), l.gk.data(), l.gq.data(), W, 1e-6f, alpha.data(),
                            rn.data(), flag.data(), &status, 0);
    });
    run((unsigned)(W + PCONV_THREADS - 1) / PCONV_THREADS, (unsigned)((n + PCONV_CHUNK - 1) / PCONV_CHUNK),
        PCONV_THREADS, [&] {
            ple_conv_kernel<BF>(kv, NN, x, alpha.data(), rn.data(), flag.data(), l.gc.data(), l.taps.data(),
                                state, W, (int)n, &status, 0);
        });
    return status;
}

static void kernels(uint32_t W, int kf16)
{
    layer l;
    layer_make(l, W, kf16);
    const size_t C = l.C, NN = l.NN;
    for (size_t n : {1ul, 8ul, 21ul}) {
        sequence q;
        seq_make(q, l, n);
        std::vector<float> xc, sc, kvx, kvg(n * NN, NAN);
        std::vector<double> mag;
        cpu(l, q, xc, sc);
        exact_kv(l, q, kvx, mag);
        /* GEMV: 8 tokens a launch, the rest in 5, 2, 1 (as T varies) */
        for (size_t t0 = 0; t0 < n;) {
            unsigned T = n - t0 >= 8 ? 8 : n - t0 >= 5 ? 5 : n - t0 >= 2 ? 2 : 1;
            gemv(l, q.rows.data() + t0 * K, T, kvg.data() + t0 * NN);
            t0 += T;
        }
        double worst = 0;
        long nans = 0;
        for (size_t i = 0; i < n * NN; i++) {
            nans += isnan(kvg[i]);
            worst = std::max(worst, fabs((double)kvg[i] - kvx[i]) / mag[i]);
        }
        std::vector<float> one(NN, NAN);
        gemv(l, q.rows.data() + (n - 1) * K, 1, one.data());
        int inv = memcmp(one.data(), kvg.data() + (n - 1) * NN, NN * 4) == 0;
        verdict(nans == 0 && worst < 1e-6 && inv,
                "W %u%s n %2zu  GEMV: max |err| / sum|e w| = %.2g (%ld not written); the last token "
                "alone = in its batch: %s",
                W, kf16 ? " (F16 keys)" : "", n, worst, nans, inv ? "yes" : "no");
        /* gate + convolution on the CPU's kv: the CPU's bits */
        std::vector<float> xe = q.x, se = q.state;
        int s1 = gate_conv<false>(l, q, kvx.data(), xe.data(), se.data());
        long dx = 0, ds = 0;
        double mu = 0;
        for (size_t i = 0; i < n * C; i++)
            if (memcmp(&xe[i], &xc[i], 4))
                dx++, mu = std::max(mu, op_ulps(xe[i], xc[i], q.x[i]));
        for (size_t i = 0; i < 9 * C; i++)
            if (memcmp(&se[i], &sc[i], 4))
                ds++, mu = std::max(mu, (double)ulps(se[i], sc[i]));
        verdict(s1 == 1 << 30 && dx + ds <= (long)(n * C / 1000) && mu <= 8,
                "W %u%s n %2zu  gate + convolution on the CPU's projection: %ld of %zu outputs and %ld of "
                "%zu state values differ from the CPU's (max %.2f ulps of the operands)",
                W, kf16 ? " (F16 keys)" : "", n, dx, n * C, ds, 9 * C, mu);
        /* the whole chain */
        std::vector<float> xg = q.x, sg = q.state;
        int s2 = gate_conv<false>(l, q, kvg.data(), xg.data(), sg.data());
        long within = 0, outs = 0, masked = 0;
        for (size_t t = 0; t < n; t++) {
            if (!q.mask[t]) {
                masked += memcmp(&xg[t * C], &q.x[t * C], C * 4) != 0;
                continue;
            }
            for (size_t i = 0; i < C; i++) {
                double d = fabs((double)xg[t * C + i] - xc[t * C + i]);
                double m = std::max(fabs((double)xg[t * C + i]), fabs((double)xc[t * C + i]));
                int e;
                frexp(m, &e);
                outs++;
                within += m == 0 ? d == 0 : d <= ldexp(1.0, e - 1 - 7);
            }
        }
        verdict(s2 == 1 << 30 && within >= 0.999 * outs && masked == 0,
                "W %u%s n %2zu  GEMV + gate + convolution: %.4f%% of outputs within one BF16 step of the "
                "CPU's, masked changed: %ld",
                W, kf16 ? " (F16 keys)" : "", n, 100.0 * within / outs, masked);
        /* a BF16 residual */
        std::vector<uint16_t> xb(n * C);
        for (size_t i = 0; i < n * C; i++)
            xb[i] = bf(q.x[i]);
        std::vector<float> sb = q.state;
        int s3 = gate_conv<true>(l, q, kvg.data(), xb.data(), sb.data());
        long bd = memcmp(sb.data(), sg.data(), 9 * C * 4) != 0;
        for (size_t i = 0; i < n * C; i++)
            bd += xb[i] != bf(xg[i]);
        verdict(s3 == 1 << 30 && bd == 0,
                "W %u%s n %2zu  BF16 residual: %ld differ from bf16 of the F32 residual's", W,
                kf16 ? " (F16 keys)" : "", n, bd);
    }
    ple_layer_free(l.L);
}

/* The convolution over long sequences in calls cut at random points, each
 * call in workspace blocks of 23 positions, blocks in reverse order;
 * alpha and rn as the CPU computes them. */
static void chunks(uint32_t W, size_t B, double cut_p)
{
    layer l;
    layer_make(l, W, 0);
    const size_t C = l.C, NN = l.NN;
    for (size_t n : {2ul, 9ul, 10ul, 37ul, 100ul, 230ul}) {
        sequence q;
        seq_make(q, l, n);
        std::vector<float> xc, sc, kvx;
        std::vector<double> mag;
        cpu(l, q, xc, sc);
        exact_kv(l, q, kvx, mag);
        std::vector<float> alpha(n * 4), rn(n);
        std::vector<uint8_t> flag(n);
        for (size_t t = 0; t < n; t++) {
            flag[t] = q.mask[t];
            if (!q.mask[t])
                continue;
            float G[4];
            for (int s = 0; s < 4; s++) {
                float r[3];
                ple_kernels_scalar.gate(&kvx[t * NN + s * W], &q.x[t * C + s * W], &l.gk[s * W],
                                        &l.gq[s * W], W, 1e-6f, r);
                alpha[t * 4 + s] = ple_alpha(r[2] / sqrtf((float)W));
                G[s] = ple_kernels_scalar.sumsq(&kvx[t * NN + C], alpha[t * 4 + s], W);
            }
            rn[t] = 1.0f / sqrtf((((G[0] + G[1]) + G[2]) + G[3]) / (float)C + 1e-6f);
        }
        std::vector<size_t> cuts;
        for (size_t i = 1; i < n; i++)
            if (U() < cut_p)
                cuts.push_back(i);
        cuts.push_back(n);
        std::vector<float> xe = q.x, se = q.state;
        int status = 1 << 30;
        size_t at = 0;
        for (size_t cut : cuts) {
            for (size_t b0 = at; b0 < cut; b0 += B) {
                const size_t k = std::min(B, cut - b0);
                const unsigned gx = (W + PCONV_THREADS - 1) / PCONV_THREADS,
                               gy = (unsigned)((k + PCONV_CHUNK - 1) / PCONV_CHUNK);
                for (int by = (int)gy - 1; by >= 0; by--)
                    for (int bx = (int)gx - 1; bx >= 0; bx--)
                        run(
                            1, 1, PCONV_THREADS,
                            [&] {
                                ple_conv_kernel<false>(kvx.data() + b0 * NN, (int)NN, xe.data() + b0 * C,
                                                       alpha.data() + b0 * 4, rn.data() + b0, flag.data() + b0,
                                                       l.gc.data(), l.taps.data(), se.data(), (int)W, (int)k,
                                                       &status, (int)b0);
                            },
                            (unsigned)bx, (unsigned)by);
            }
            at = cut;
        }
        long dx = 0, ds = 0;
        double mu = 0;
        for (size_t i = 0; i < n * C; i++)
            if (memcmp(&xe[i], &xc[i], 4))
                dx++, mu = std::max(mu, op_ulps(xe[i], xc[i], q.x[i]));
        for (size_t i = 0; i < 9 * C; i++)
            if (memcmp(&se[i], &sc[i], 4))
                ds++, mu = std::max(mu, (double)ulps(se[i], sc[i]));
        verdict(status == 1 << 30 && dx + ds <= (long)(n * C / 1000) + 1 && mu <= 8,
                "W %u n %3zu  convolution in %zu calls, blocks of %zu: %ld of %zu outputs and %ld of %zu "
                "state values differ from the CPU's (max %.2f ulps of the operands)",
                W, n, cuts.size(), B, dx, n * C, ds, 9 * C, mu);
    }
    ple_layer_free(l.L);
}

int main(void)
{
    printf("emulate_ple: cuda/ple_kernels.cuh on the host against the CPU path\n");
    kernels(40, 0);
    kernels(37, 1);
    chunks(130, 23, 0.25); /* many short calls, blocks shorter than a chunk of 36 */
    chunks(130, 100, 0.0); /* one call, blocks of 100: chunks starting at 36 and 72 recompute their ring */
    chunks(70, 2048, 0.01); /* a call in one block of up to 7 chunks */
    printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
