/*
 * test_blas.c - engram's projection against OpenBLAS sgemm (loaded at run
 * time from libopenblas.so.0, installed by the suite's dependencies) on the
 * same shapes, weights widened to F32 once.  OpenBLAS sums in an order of
 * its own (blocked, vectorized, threaded), so the two differ; each is an
 * F32 sum of the same K = 6144 exact products, hence within gamma_K *
 * sum|e_i w_i| of the exact sum, and the bound on their difference stated
 * and tested here is twice that: |engram - OpenBLAS| <= 2 gamma_K sum|e w|,
 * gamma_K = K u / (1 - K u), u = 2^-24.  Checked for every output of 96
 * tokens at W = 64 and W = 200, 1 and 2 threads on each side.
 */
#include <dlfcn.h>
#include <math.h>

#include "testutil.h"
#include "../src/format/gguf.h"

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif
#ifndef TSAN
#define TSAN 0
#endif

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*threads_fn)(int);

static float f16f(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static void one(uint32_t width, sgemm_fn sgemm, threads_fn set_threads)
{
    static uint32_t map[3000];
    engram_layout l;
    char path[512], name[64];
    snprintf(name, sizeof name, "blas%u.gguf", width);
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 2000), 0);
    if (tu_build(name, &l, ENGRAM_FILL_NORMAL, width, path, sizeof path) < 0) {
        CHECK(0);
        return;
    }
    engram_model *m;
    engram_layer *L;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    CHECK_EQ(engram_layer_open(m, 1, &L, &err), 0);
    const size_t K = ENGRAM_K, n = 96, N = 5 * (size_t)width;
    /* weights from the file, [N][K] */
    float *w = malloc(N * K * 4), *e = malloc(n * K * 4), *c0 = malloc(n * N * 4), *c1 = malloc(n * N * 4);
    uint16_t *h = malloc(K * 2);
    gguf_file *g = NULL;
    CHECK_EQ(gguf_open(path, &g, NULL), 0);
    const gguf_tensor *t = gguf_find_tensor(g, "blk.14.engram_kv.weight");
    for (size_t o = 0; o < N; o++) {
        CHECK_EQ(pread(g->fd, h, K * 2, (off_t)(t->offset + o * K * 2)), K * 2);
        for (size_t i = 0; i < K; i++)
            w[o * K + i] = f16f(h[i]);
    }
    gguf_close(g);
    /* rows: values of BF16 precision, mixed magnitudes */
    uint64_t seed = width;
    for (size_t i = 0; i < n * K; i++) {
        uint64_t r = tu_rand(&seed);
        union { float f; uint32_t u; } v = {.f = ldexpf((float)(r & 0xff) / 256.0f + 0.5f, (int)((r >> 8) % 9) - 4)};
        v.u &= 0xffff0000u;
        e[i] = (r >> 20) & 1 ? -v.f : v.f;
    }
    const double u = 0x1p-24, gamma = K * u / (1 - K * u);
    for (unsigned th = 1; th <= 2; th++) {
        engram_apply_opts o = {.threads = th};
        engram_applier *a;
        CHECK_EQ(engram_applier_new(L, &o, &a, &err), 0);
        CHECK_EQ(engram_project(a, e, ENGRAM_F32, n, c0, &err), 0);
        /* OpenBLAS's threads synchronize in ways ThreadSanitizer cannot
         * see (it is not instrumented): there it runs on the caller only. */
        set_threads(TSAN ? 1 : (int)th);
        sgemm(101, 111, 112, (int)n, (int)N, (int)K, 1.0f, e, (int)K, w, (int)K, 0.0f, c1, (int)N);
        long beyond = 0, differ = 0;
        double worst = 0;
        for (size_t tt = 0; tt < n; tt++)
            for (size_t oo = 0; oo < N; oo++) {
                double mag = 0;
                for (size_t i = 0; i < K; i++)
                    mag += fabs((double)e[tt * K + i] * w[oo * K + i]);
                double d = fabs((double)c0[tt * N + oo] - c1[tt * N + oo]), lim = 2 * gamma * mag;
                beyond += d > lim;
                differ += d != 0;
                if (lim > 0 && d / lim > worst)
                    worst = d / lim;
            }
        printf("W=%u, %u thread(s): %zu outputs, %ld differ from OpenBLAS, worst %.3g of the bound "
               "2 gamma_K sum|e w|, %ld beyond\n", width, th, n * N, differ, worst, beyond);
        CHECK_EQ(beyond, 0);
        engram_applier_free(a);
    }
    free(w);
    free(e);
    free(c0);
    free(c1);
    free(h);
    engram_layer_close(L);
    engram_model_close(m);
}

int main(void)
{
    void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "libopenblas.so.0 not found (Debian: libopenblas-dev, installed by make test)\n");
        return 1;
    }
    union { void *p; sgemm_fn f; } s = {dlsym(lib, "cblas_sgemm")};
    union { void *p; threads_fn f; } t = {dlsym(lib, "openblas_set_num_threads")};
    CHECK(s.p != NULL && t.p != NULL);
    if (s.p && t.p) {
        one(64, s.f, t.f);
        one(200, s.f, t.f);
    }
    tu_cleanup();
    return tu_finish("test_blas");
}
