/*
 * bench_ple_apply.c - the PLE output stage (src/output/ple_apply.h) against
 * the machine's own limits, measured in the same run, on a synthetic layer
 * (BF16 W_k and W_v, as the HF checkpoint holds them):
 *  (a) the floor: a plain streaming read of the layer's weight bytes (the
 *      two matrices' panels, the widest loads into 4 accumulators), 1..T
 *      threads: GB/s and the time of one pass (what a decode token must at
 *      least take, its projection being a GEMV over every weight); where
 *      the weights fit in the last-level cache that is the cache's rate, so
 *      the same loop over 1 GiB gives memory's rate too;
 *  (b) decode: one position per call, the state carried, ms per token and
 *      the weights' GB/s, for each kernel set and thread count: warm (the
 *      weights left in cache by the token before) and cold (1 GiB streamed
 *      between tokens, as the rest of a model would), each against its
 *      floor;
 *  (c) prefill: one call of N positions, tokens/s and GFLOP/s of the
 *      projection's 2 x 2560 x 5W flops per token, beside OpenBLAS sgemm on
 *      the same shapes with the weights widened to F32 (the unconstrained
 *      comparator, its order its own), loaded at run time if present.
 *
 *   bench_ple_apply [--width W] [--tokens N] [--threads 1,2] [--reps R]
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "format/gguf.h"
#include "output/kernels.h"
#include "output/ple_apply.h"
#include "output/ple_kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v; its median.  v[0] is then the best (least) time: on a machine
 * shared with other work, the figure least disturbed by it. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-a, a) */
static float unif(uint64_t *s, float a)
{
    return (float)(((double)(rng(s) >> 11) * 0x1p-53 * 2.0 - 1.0) * a);
}

/* ------------------------------------------------ (a) streaming floor */

struct stream_arg {
    const uint64_t *p[2];  /* this thread's share of each matrix */
    size_t n[2];
    uint64_t sum;
};

/* The widest loads this CPU has (the kernels' own width), 4 accumulators:
 * 4 x 64 bytes per step with AVX-512, 4 x 32 with AVX2, else 8 x 8. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx512f"))) static uint64_t sum512(const uint64_t *p, size_t n)
{
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512((const void *)(p + i)));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512((const void *)(p + i + 8)));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512((const void *)(p + i + 16)));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512((const void *)(p + i + 24)));
    }
    uint64_t r = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (; i < n; i++)
        r += p[i];
    return r;
}
__attribute__((target("avx2"))) static uint64_t sum256(const uint64_t *p, size_t n)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    uint64_t r = l[0] + l[1] + l[2] + l[3];
    for (; i < n; i++)
        r += p[i];
    return r;
}
#endif

static uint64_t sum64(const uint64_t *p, size_t n)
{
    uint64_t s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += p[i + l];
    for (; i < n; i++)
        s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static uint64_t (*sum_fn)(const uint64_t *p, size_t n) = sum64;
static const char *sum_name = "64-bit";

static void pick_sum(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (engram_simd_supported(ENGRAM_SIMD_AVX512)) {
        sum_fn = sum512;
        sum_name = "512-bit";
    } else if (engram_simd_supported(ENGRAM_SIMD_AVX2)) {
        sum_fn = sum256;
        sum_name = "256-bit";
    }
#endif
}

static void *stream_part(void *varg)
{
    struct stream_arg *a = varg;
    a->sum = sum_fn(a->p[0], a->n[0]) + sum_fn(a->p[1], a->n[1]);
    return NULL;
}

/* One pass over buffers b[0] and b[1] (bytes[m] each), each split over th
 * threads, in one fork-join (as a decode token's projection reads the two
 * matrices): seconds. */
static double stream_pass(const void *const b[2], const size_t bytes[2], unsigned th, uint64_t *sink)
{
    struct stream_arg args[64];
    pthread_t tid[64];
    for (unsigned t = 0; t < th; t++)
        for (int m = 0; m < 2; m++) {
            size_t words = bytes[m] / 8, lo = words * t / th, hi = words * (t + 1) / th;
            args[t].p[m] = (const uint64_t *)b[m] + lo;
            args[t].n[m] = hi - lo;
        }
    double t0 = now();
    for (unsigned t = 1; t < th; t++)
        pthread_create(&tid[t], NULL, stream_part, &args[t]);
    stream_part(&args[0]);
    for (unsigned t = 1; t < th; t++)
        pthread_join(tid[t], NULL);
    double dt = now() - t0;
    for (unsigned t = 0; t < th; t++)
        *sink += args[t].sum;
    return dt;
}

/* ------------------------------------------------ OpenBLAS */

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                         int lda, const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*set_threads_fn)(int);

int main(int argc, char **argv)
{
    uint32_t W = 2560;
    size_t n = 256;
    int reps = 5;
    unsigned threads_list[8] = {1, 2}, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--width") && i + 1 < argc)
            W = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            for (char *s = strtok(argv[++i], ","); s && n_threads < 8; s = strtok(NULL, ","))
                threads_list[n_threads++] = (unsigned)atoi(s);
        } else {
            fprintf(stderr, "usage: bench_ple_apply [--width W] [--tokens N] [--threads 1,2] [--reps R]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 12 || n < 1 || W < 1 || n_threads == 0)
        return 2;
    for (unsigned ti = 0; ti < n_threads; ti++)
        if (threads_list[ti] < 1 || threads_list[ti] > 64)
            return 2;
    const size_t K = PLE_K, C = 4 * (size_t)W, N = 5 * (size_t)W;
    char cpu[256] = "?";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[256];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                snprintf(cpu, sizeof cpu, "%s", c ? c + 2 : line);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(ci);
    }
    printf("bench_ple_apply: W %u (C %zu channels, %zu projection outputs), K %zu\n", W, C, N, K);
    printf("machine: %s, %ld online CPUs\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));

    /* the layer */
    uint64_t s = 1;
    uint16_t *key = malloc(C * K * 2), *val = malloc((size_t)W * K * 2);
    float *gk = malloc(C * 4), *gq = malloc(C * 4), *gc = malloc(C * 4), *conv = malloc(C * 4 * 4);
    if (!key || !val || !gk || !gq || !gc || !conv)
        return 1;
    const float a = 0.034f; /* uniform with sd 1/sqrt(K) */
    for (size_t i = 0; i < C * K; i++)
        key[i] = f32_to_bf16_bits(unif(&s, a));
    for (size_t i = 0; i < (size_t)W * K; i++)
        val[i] = f32_to_bf16_bits(unif(&s, a));
    for (size_t i = 0; i < C; i++)
        gk[i] = 1 + unif(&s, 0.1f), gq[i] = 1 + unif(&s, 0.1f), gc[i] = 1 + unif(&s, 0.1f);
    for (size_t i = 0; i < C * 4; i++)
        conv[i] = unif(&s, 0.5f);
    struct ple_weights pw = {W, 4, 1e-6f, GGML_BF16, GGML_BF16, key, val, gk, gq, gc, conv};
    struct ple_layer *L = NULL;
    engram_error err;
    if (ple_layer_new(&pw, &L, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const double wbytes = (double)(L->m[0].bytes + L->m[1].bytes);
    printf("layer: %.1f MB of BF16 projection weights in panels, %.1f MB in all\n", wbytes / 1e6,
           (double)ple_layer_bytes(L) / 1e6);

    /* inputs: n positions, the residual kept aside */
    uint16_t *rows = malloc(n * K * 2);
    float *x0 = malloc(n * C * 4), *x = malloc(n * C * 4), *state = calloc(ple_state_floats(L), 4);
    for (size_t i = 0; i < n * K; i++)
        rows[i] = f32_to_bf16_bits(unif(&s, 1.7f));
    for (size_t i = 0; i < n * C; i++)
        x0[i] = bf16_round(unif(&s, 3.4f));

    /* (a) */
    const void *wb[2] = {L->m[0].w, L->m[1].w};
    const size_t wsz[2] = {L->m[0].bytes, L->m[1].bytes};
    const size_t big = (size_t)1 << 30; /* past the last-level cache: memory */
    uint8_t *flush = malloc(big);
    if (!flush)
        return 1;
    memset(flush, 1, big);
    const void *fb[2] = {flush, flush + big / 2};
    const size_t fsz[2] = {big / 2, big / 2};
    pick_sum();
    printf("\n(a) floor: streaming reads (%s loads, 4 accumulators per thread)\n", sum_name);
    printf("    the %.1f MB of weights again and again (cache-resident if they fit), and 1 GiB (memory)\n",
           wbytes / 1e6);
    printf("    (best of %d passes)\n", 3 * reps);
    printf("    threads  weights pass ms  GB/s   | 1 GiB GB/s  -> weights at that rate, ms\n");
    double floor_ms[8], dram_ms[8];
    uint64_t sink = 0;
    for (unsigned ti = 0; ti < n_threads; ti++) {
        double t[99];
        stream_pass(wb, wsz, threads_list[ti], &sink);
        for (int r = 0; r < 3 * reps; r++)
            t[r] = stream_pass(wb, wsz, threads_list[ti], &sink);
        median(t, 3 * reps);
        double m = t[0];
        for (int r = 0; r < 3; r++)
            t[r] = stream_pass(fb, fsz, threads_list[ti], &sink);
        median(t, 3);
        double md = t[0];
        floor_ms[ti] = m * 1e3;
        dram_ms[ti] = wbytes / (big / md) * 1e3;
        printf("    %7u  %15.2f  %6.2f | %10.2f  %8.2f\n", threads_list[ti], m * 1e3, wbytes / m / 1e9,
               big / md / 1e9, dram_ms[ti]);
    }

    static const engram_simd simds[3] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512};
    /* (b) */
    printf("\n(b) decode: one position per call, state carried (median and best of %d tokens); warm:\n"
           "    the weights in cache from the token before; cold: 1 GiB streamed before each token\n"
           "    (median and best of 5); the ratios are of the best to the floor\n", 8 * reps);
    printf("    kernels  threads  warm ms/token (best)   GB/s  / floor | cold ms/token (best)   GB/s  / memory floor\n");
    for (int k = 0; k < 3; k++) {
        if (!ple_kernels_for(simds[k]))
            continue;
        for (unsigned ti = 0; ti < n_threads; ti++) {
            struct ple_apply_opts o = {threads_list[ti], simds[k], 0, NULL, NULL};
            struct ple_applier *ap;
            if (ple_applier_new(L, &o, &ap, &err) < 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            int toks = k == 0 ? 3 : 8 * reps;
            double t[99];
            memcpy(x, x0, n * C * 4);
            ple_apply(ap, rows, x, ENGRAM_F32, NULL, 1, state, &err); /* warm */
            for (int r = 0; r < toks; r++) {
                size_t at = (size_t)(r + 1) % n;
                double t0 = now();
                if (ple_apply(ap, rows + at * K, x + at * C, ENGRAM_F32, NULL, 1, state, &err) < 0)
                    fprintf(stderr, "%s\n", err.msg);
                t[r] = now() - t0;
            }
            double m = median(t, toks);
            double b = t[0];
            int cold = k == 0 ? 0 : 5;
            for (int r = 0; r < cold; r++) {
                size_t at = (size_t)(r + 1) % n;
                stream_pass(fb, fsz, threads_list[ti], &sink);
                double t0 = now();
                if (ple_apply(ap, rows + at * K, x + at * C, ENGRAM_F32, NULL, 1, state, &err) < 0)
                    fprintf(stderr, "%s\n", err.msg);
                t[r] = now() - t0;
            }
            printf("    %-7s  %7u  %8.3f (%7.3f)  %5.1f  %5.2fx", engram_simd_name(simds[k]), threads_list[ti],
                   m * 1e3, b * 1e3, wbytes / b / 1e9, b * 1e3 / floor_ms[ti]);
            if (cold) {
                double mc = median(t, cold);
                printf(" | %8.3f (%7.3f)  %5.1f  %5.2fx", mc * 1e3, t[0] * 1e3, wbytes / t[0] / 1e9,
                       t[0] * 1e3 / dram_ms[ti]);
            }
            printf("\n");
            ple_applier_free(ap);
        }
    }

    /* (c) */
    const double flops = 2.0 * (double)K * (double)N; /* per token, the projection */
    void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    union { void *p; sgemm_fn f; } sg = {blas ? dlsym(blas, "cblas_sgemm") : NULL};
    union { void *p; set_threads_fn f; } st = {blas ? dlsym(blas, "openblas_set_num_threads") : NULL};
    float *wf = NULL, *ef = NULL, *cb = NULL;
    if (sg.f) {
        wf = malloc(N * K * 4);
        ef = malloc(n * K * 4);
        cb = malloc(n * N * 4);
        if (!wf || !ef || !cb)
            sg.f = NULL;
        else {
            for (size_t i = 0; i < C * K; i++)
                wf[i] = bf16_to_f32(key[i]);
            for (size_t i = 0; i < (size_t)W * K; i++)
                wf[C * K + i] = bf16_to_f32(val[i]);
            for (size_t i = 0; i < n * K; i++)
                ef[i] = bf16_to_f32(rows[i]);
        }
    }
    printf("\n(c) prefill: one call of %zu positions (blocks of %u), %.1f MFLOP of projection per token\n", n,
           PLE_APPLY_BLOCK, flops / 1e6);
    printf("    OpenBLAS sgemm of the same projection (F32 weights, its own order): %s\n",
           sg.f ? "loaded" : "not found");
    printf("    (median and best of %d calls)\n", reps);
    printf("    kernels  threads  tokens/s (best)  GFLOP/s (best) | sgemm tokens/s (best)  GFLOP/s (best)\n");
    for (int k = 0; k < 3; k++) {
        if (!ple_kernels_for(simds[k]))
            continue;
        size_t nk = k == 0 ? (n < 16 ? n : 16) : n;
        for (unsigned ti = 0; ti < n_threads; ti++) {
            struct ple_apply_opts o = {threads_list[ti], simds[k], 0, NULL, NULL};
            struct ple_applier *ap;
            if (ple_applier_new(L, &o, &ap, &err) < 0)
                return 1;
            int rr = k == 0 ? 1 : reps;
            double t[99], tb[99];
            for (int r = 0; r < rr; r++) {
                memcpy(x, x0, nk * C * 4);
                memset(state, 0, ple_state_floats(L) * 4);
                double t0 = now();
                if (ple_apply(ap, rows, x, ENGRAM_F32, NULL, nk, state, &err) < 0)
                    fprintf(stderr, "%s\n", err.msg);
                t[r] = now() - t0;
            }
            double m = median(t, rr), b = t[0], mb = 0, bb = 0;
            if (sg.f && simds[k] == engram_simd_selected()) {
                if (st.f)
                    st.f((int)threads_list[ti]);
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    sg.f(101 /* row major */, 111 /* no trans */, 112 /* trans */, (int)nk, (int)N, (int)K,
                         1.0f, ef, (int)K, wf, (int)K, 0.0f, cb, (int)N);
                    tb[r] = now() - t0;
                }
                mb = median(tb, reps);
                bb = tb[0];
            }
            printf("    %-7s  %7u  %6.0f (%6.0f)  %6.1f (%6.1f)", engram_simd_name(simds[k]), threads_list[ti],
                   nk / m, nk / b, flops * nk / m / 1e9, flops * nk / b / 1e9);
            if (mb > 0)
                printf(" | %6.0f (%6.0f)         %6.1f (%6.1f)", nk / mb, nk / bb, flops * nk / mb / 1e9,
                       flops * nk / bb / 1e9);
            printf("\n");
            ple_applier_free(ap);
        }
    }
    printf("(checksum %llx %g)\n", (unsigned long long)sink, (double)x[0]);
    free(wf), free(ef), free(cb), free(flush);
    free(rows), free(x0), free(x), free(state);
    free(key), free(val), free(gk), free(gq), free(gc), free(conv);
    ple_layer_free(L);
    return 0;
}
