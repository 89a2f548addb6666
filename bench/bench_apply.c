/*
 * bench_apply.c - Engram's output stage against the machine's own limits,
 * measured in the same run:
 *  (a) decode: applying one token (the projection is a GEMV over the
 *      layer's F16 weights, memory-bound) vs streaming the same weights
 *      (the layer's own panels, read once, F16 -> F32 and summed into
 *      independent accumulators with the same instruction set: what any
 *      kernel reading those bytes pays) on the same threads, the two
 *      interleaved rep by rep; a large memcpy's bandwidth beside them as a
 *      secondary reference (it moves twice the bytes and its speed differs
 *      by machine).  Per kernel set (--simd; default the selected one, and
 *      AVX2 too where AVX-512 is selected: what an AVX2-only machine runs)
 *      and per number of tokens in the call (--decode-tokens; default 1);
 *  (b) prefill: projecting a block of tokens (default 2048; the GEMM) vs
 *      OpenBLAS sgemm on the same shapes with the weights widened to F32
 *      once (the unconstrained comparator: its reduction order is its own),
 *      both in GFLOP/s, each with 1..T threads;
 *  (c) the gate and update alone, ns per token (S streams of W);
 *  (d) the whole apply of the block, tokens/s.
 * OpenBLAS is loaded at run time (libopenblas.so.0) so the build does not
 * depend on it; without it (b) has no comparator column.
 *
 *   bench_apply [--model M.gguf] [--width W] [--tokens N] [--threads 1,2]
 *               [--simd auto,avx2] [--decode-tokens 1,4] [--decode-reps R]
 *               [--reps R] [--csv OUT]
 * --threads defaults to 1, 2, 4, ... up to the cores this process may run
 * on, the last of them included.
 * Without --model it writes /tmp/engram-bench/apply-W.gguf (engram build
 * --width W --fill normal, small tables) once.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"
#include "../src/common/cpu.h"
#include "../src/output/kernels.h"
#include "../src/output/team.h"
#include "../src/format/gguf.h"

#if ENGRAM_X86_KERNELS
#include <immintrin.h>
#endif

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

/* memcpy of `bytes`, best of 5: bytes copied per second. */
static double memcpy_bw(size_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        memcpy(b, a, bytes);
        double dt = now() - t0;
        if (bytes / dt > best)
            best = bytes / dt;
        a[r] = b[bytes - 1 - (size_t)r]; /* keep the copy observable */
    }
    free(a);
    free(b);
    return best;
}

/* ------------------------------------------------ the streaming loop */

/* Reads `rows` rows of 64 F16 values once, each converted to F32 and added
 * into accumulators that no row waits on (8 vectors: the adds' latency is
 * hidden); their sum goes to sink[0..15] so nothing can be skipped.  The
 * order of the sums is free here: this is the bound on any kernel that
 * reads these bytes with this instruction set, not a result.  The SIMD
 * loops prefetch the row KC rows ahead, as the projection's kernels do
 * (the next K block), so the reference has what they have. */
static void stream_scalar(const uint16_t *w, size_t rows, float *sink)
{
    float acc[16] = {0};
    for (size_t r = 0; r < rows; r++)
        for (unsigned j = 0; j < PANEL; j++)
            acc[j % 16] += f16_to_f32(w[r * PANEL + j]);
    memcpy(sink, acc, sizeof acc);
}

#if ENGRAM_X86_KERNELS
__attribute__((target("avx2,fma,f16c"))) static void stream_avx2(const uint16_t *w, size_t rows,
                                                                   float *sink)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    for (size_t r = 0; r < rows; r++) {
        const __m128i *p = (const __m128i *)(w + r * PANEL);
        if (r + KC < rows) {
            _mm_prefetch((const char *)(w + (r + KC) * PANEL), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + (r + KC) * PANEL) + 64, _MM_HINT_T0);
        }
        s0 = _mm256_add_ps(s0, _mm256_cvtph_ps(_mm_load_si128(p + 0)));
        s1 = _mm256_add_ps(s1, _mm256_cvtph_ps(_mm_load_si128(p + 1)));
        s2 = _mm256_add_ps(s2, _mm256_cvtph_ps(_mm_load_si128(p + 2)));
        s3 = _mm256_add_ps(s3, _mm256_cvtph_ps(_mm_load_si128(p + 3)));
        s4 = _mm256_add_ps(s4, _mm256_cvtph_ps(_mm_load_si128(p + 4)));
        s5 = _mm256_add_ps(s5, _mm256_cvtph_ps(_mm_load_si128(p + 5)));
        s6 = _mm256_add_ps(s6, _mm256_cvtph_ps(_mm_load_si128(p + 6)));
        s7 = _mm256_add_ps(s7, _mm256_cvtph_ps(_mm_load_si128(p + 7)));
    }
    s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    s4 = _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7));
    _mm256_storeu_ps(sink, s0);
    _mm256_storeu_ps(sink + 8, s4);
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) static void
stream_avx512(const uint16_t *w, size_t rows, float *sink)
{
    /* two rows per step: eight 16-wide accumulators */
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const __m256i *p = (const __m256i *)(w + r * PANEL);
        if (r + KC + 2 <= rows)
            for (unsigned l = 0; l < 4; l++)
                _mm_prefetch((const char *)(w + (r + KC) * PANEL) + 64 * l, _MM_HINT_T0);
        s0 = _mm512_add_ps(s0, _mm512_cvtph_ps(_mm256_load_si256(p + 0)));
        s1 = _mm512_add_ps(s1, _mm512_cvtph_ps(_mm256_load_si256(p + 1)));
        s2 = _mm512_add_ps(s2, _mm512_cvtph_ps(_mm256_load_si256(p + 2)));
        s3 = _mm512_add_ps(s3, _mm512_cvtph_ps(_mm256_load_si256(p + 3)));
        s4 = _mm512_add_ps(s4, _mm512_cvtph_ps(_mm256_load_si256(p + 4)));
        s5 = _mm512_add_ps(s5, _mm512_cvtph_ps(_mm256_load_si256(p + 5)));
        s6 = _mm512_add_ps(s6, _mm512_cvtph_ps(_mm256_load_si256(p + 6)));
        s7 = _mm512_add_ps(s7, _mm512_cvtph_ps(_mm256_load_si256(p + 7)));
    }
    for (; r < rows; r++) {
        const __m256i *p = (const __m256i *)(w + r * PANEL);
        s0 = _mm512_add_ps(s0, _mm512_cvtph_ps(_mm256_load_si256(p + 0)));
        s1 = _mm512_add_ps(s1, _mm512_cvtph_ps(_mm256_load_si256(p + 1)));
        s2 = _mm512_add_ps(s2, _mm512_cvtph_ps(_mm256_load_si256(p + 2)));
        s3 = _mm512_add_ps(s3, _mm512_cvtph_ps(_mm256_load_si256(p + 3)));
    }
    s0 = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
    s4 = _mm512_add_ps(_mm512_add_ps(s4, s5), _mm512_add_ps(s6, s7));
    _mm512_storeu_ps(sink, _mm512_add_ps(s0, s4));
}
#endif

struct stream_job {
    const struct engram_layer *L;
    engram_simd simd;        /* SCALAR, AVX2 or AVX512 */
    unsigned workers;
    float sink[64][16];
};

/* Worker w streams the panels the applier's projection gives it (apply.c
 * shares the panels the same way). */
static void stream_work(void *arg, unsigned w)
{
    struct stream_job *j = arg;
    unsigned panels = j->L->panels;
    unsigned lo = (unsigned)((uint64_t)panels * w / j->workers);
    unsigned hi = (unsigned)((uint64_t)panels * (w + 1) / j->workers);
    const uint16_t *p = j->L->w + (size_t)lo * ENGRAM_K * PANEL;
    size_t rows = (size_t)(hi - lo) * ENGRAM_K;
    float *sink = j->sink[w % 64];
#if ENGRAM_X86_KERNELS
    if (j->simd == ENGRAM_SIMD_AVX512)
        stream_avx512(p, rows, sink);
    else if (j->simd == ENGRAM_SIMD_AVX2)
        stream_avx2(p, rows, sink);
    else
#endif
        stream_scalar(p, rows, sink);
}

static int build_model(const char *path, uint32_t width)
{
    static uint32_t map[129280];
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    engram_layout *l = &o.layout;
    l->vocab = 129280;
    l->compressed_vocab = 99092;
    for (uint32_t t = 0; t < l->vocab; t++)
        map[t] = t % l->compressed_vocab;
    l->token_map = map;
    l->pad_id = 2;
    uint32_t primes[48];
    if (engram_layout_primes(5000, 2, 4, 8, primes, 48) < 0)
        return -1;
    for (int t = 0; t < 2; t++) {
        engram_layout_multipliers(l->compressed_vocab, t ? 14 : 1, 4, l->multipliers[t]);
        for (int c = 0; c < 24; c++) {
            l->primes[t][c] = primes[t * 24 + c];
            l->rows[t] += primes[t * 24 + c];
        }
    }
    o.width = width;
    o.fill = ENGRAM_FILL_NORMAL;
    o.seed = 1;
    engram_error err;
    if (engram_build_model(path, &o, &err) < 0) {
        fprintf(stderr, "build %s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*set_threads_fn)(int);

/* --csv before anything runs: a kind of path the writer takes, and not the
 * input (engram_tools.h); 0, or 2 after saying why. */
static int csv_refused(const char *prog_name, const char *csv_path, const char *input)
{
    engram_error ce;
    if (engram_output_check(csv_path, 0, &ce) < 0) {
        fprintf(stderr, "%s: %s\n", prog_name, ce.msg);
        return 2;
    }
    if (input && engram_output_same(csv_path, input)) {
        fprintf(stderr, "%s: --csv '%s' and the input '%s' are the same file\n", prog_name,
                csv_path, input);
        return 2;
    }
    return 0;
}

static FILE *out;
static engram_output out_file;

/* An exit before the end leaves no CSV and no temporary (atexit). */
static void csv_abandon(void)
{
    if (out)
        engram_output_fclose(&out_file, out, 0, NULL);
    out = NULL;
}

/* ------------------------------------------------ (a) decode rows */

struct decode_in {
    const struct engram_layer *L;
    const uint16_t *rows;      /* n tokens' BF16 rows                     */
    const float *x0;           /* n tokens' residuals (per floats each)   */
    float *x;                  /* a working copy                          */
    size_t n, per;
    int reps;
    double weight_bytes, memcpy_bw;
};

/* One row of (a): nd tokens applied with kernels `want` on th threads
 * against the stream (instruction set lvl) on the same team, rep by rep.
 * 0, or an exit code after saying why. */
static int decode_row(const struct decode_in *in, engram_simd want, engram_simd lvl, unsigned th,
                      unsigned nd)
{
    const size_t K = ENGRAM_K;
    struct team *team = NULL;
    if (th > 1 && team_new(th, &team) < 0) {
        fprintf(stderr, "bench_apply: cannot start %u threads\n", th);
        return 3;
    }
    engram_apply_opts o = {.threads = th, .simd = want};
    if (team) {
        o.fork_join = team_run;
        o.fork_join_ctx = team;
    }
    engram_applier *a;
    engram_error err;
    if (engram_applier_new(in->L, &o, &a, &err) < 0) {
        fprintf(stderr, "bench_apply: %s\n", err.msg);
        team_free(team);
        return 1;
    }
    static struct stream_job job;
    job.L = in->L;
    job.simd = lvl;
    job.workers = th;
    double ta[99], tsr[99], ratio[99];
    size_t starts = in->n - nd + 1; /* where nd consecutive tokens may begin */
    int rc = 0;
    for (int r = -1; r < in->reps && rc == 0; r++) { /* r = -1 warms both */
        size_t t0i = (r < 0 ? 0 : (size_t)r * 7) % starts;
        memcpy(in->x, in->x0 + t0i * in->per, nd * in->per * 4);
        double t0 = now();
        rc = engram_apply(a, in->rows + t0i * K, ENGRAM_BF16, in->x, ENGRAM_F32, NULL, nd, &err);
        double t1 = now();
        if (team)
            team_run(team, th, stream_work, &job);
        else
            stream_work(&job, 0);
        double t2 = now();
        /* the sums are read, so the stream cannot be dropped */
        volatile float seen = job.sink[0][0];
        (void)seen;
        if (r >= 0) {
            ta[r] = t1 - t0;
            tsr[r] = t2 - t1;
            ratio[r] = tsr[r] / ta[r];
        }
    }
    engram_applier_free(a);
    team_free(team);
    if (rc < 0) {
        fprintf(stderr, "bench_apply: %s\n", err.msg);
        return 1;
    }
    double rlo = ratio[0], rhi = ratio[0];
    for (int r = 1; r < in->reps; r++) {
        rlo = ratio[r] < rlo ? ratio[r] : rlo;
        rhi = ratio[r] > rhi ? ratio[r] : rhi;
    }
    double ma = median(ta, in->reps), ms = median(tsr, in->reps), wb = in->weight_bytes;
    printf("    %6u  %7u  %8.2f  %5.1f  %9.2f  %5.1f   %5.3f (%.2f-%.2f)     %6.2f\n", nd, th,
           ma * 1e3, wb / ma / 1e9, ms * 1e3, wb / ms / 1e9, ms / ma, rlo, rhi,
           wb / ma / in->memcpy_bw);
    if (out) {
        const char *name = engram_simd_name(lvl);
        fprintf(out, "decode_apply_ms:%s:%u,%u,%.4f,ms,%.3f\n", name, nd, th, ma * 1e3, ms / ma);
        fprintf(out, "decode_stream_ms:%s:%u,%u,%.4f,ms,1\n", name, nd, th, ms * 1e3);
        fprintf(out, "decode_apply_vs_memcpy:%s:%u,%u,%.3f,ratio,%.3f\n", name, nd, th,
                wb / ma / in->memcpy_bw, wb / ma / in->memcpy_bw);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *csv = NULL;
    uint32_t width = 5120;
    size_t n = ENGRAM_BATCH_TOKENS;
    unsigned threads_list[8], n_threads = 0;
    engram_simd simd_list[4];
    unsigned n_simd = 0;
    int reps = 3, decode_reps = 20;
    unsigned dec_list[8] = {1}, n_dec = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--width") && i + 1 < argc)
            width = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-reps") && i + 1 < argc)
            decode_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-tokens") && i + 1 < argc) {
            n_dec = 0;
            for (char *p = argv[++i]; *p && n_dec < 8; p++) {
                dec_list[n_dec++] = (unsigned)strtoul(p, &p, 10);
                if (!*p)
                    break;
            }
        }
        else if (!strcmp(argv[i], "--simd") && i + 1 < argc) {
            n_simd = 0;
            for (char *p = argv[++i]; *p && n_simd < 4;) {
                size_t len = strcspn(p, ",");
                engram_simd sv = ENGRAM_SIMD_AUTO;
                int known = 0;
                for (int k = ENGRAM_SIMD_AUTO; k <= ENGRAM_SIMD_AVX512; k++)
                    if (strlen(engram_simd_name((engram_simd)k)) == len &&
                        !strncmp(p, engram_simd_name((engram_simd)k), len)) {
                        sv = (engram_simd)k;
                        known = 1;
                    }
                if (!known) {
                    fprintf(stderr, "bench_apply: --simd takes auto, scalar, avx2, avx512\n");
                    return 2;
                }
                simd_list[n_simd++] = sv;
                p += len + (p[len] == ',');
            }
        }
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = 0;
            for (char *p = argv[++i]; *p && n_threads < 8; p++) {
                threads_list[n_threads++] = (unsigned)strtoul(p, &p, 10);
                if (!*p)
                    break;
            }
        } else {
            fprintf(stderr, "usage: bench_apply [--model M] [--width W] [--tokens N] "
                            "[--threads 1,2] [--simd auto,avx2] [--decode-tokens 1,4] [--decode-reps R] "
                            "[--reps R] "
                            "[--csv OUT]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 99 || decode_reps < 1 || decode_reps > 99 || n == 0)
        return 2;
    if (n_threads == 0) {
        /* 1, 2, 4, ... and the cores this process may run on */
        cpu_set_t set;
        CPU_ZERO(&set);
        unsigned cores = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
        cores = cores < 1 ? 1 : cores > 64 ? 64 : cores;
        for (unsigned t = 1; t < cores && n_threads < 7; t *= 2)
            threads_list[n_threads++] = t;
        threads_list[n_threads++] = cores;
    }
    for (unsigned ti = 0; ti < n_threads; ti++)
        if (threads_list[ti] < 1 || threads_list[ti] > 64) {
            fprintf(stderr, "bench_apply: --threads takes 1..64\n");
            return 2;
        }
    for (unsigned di = 0; di < n_dec; di++)
        if (dec_list[di] < 1 || dec_list[di] > n) {
            fprintf(stderr, "bench_apply: --decode-tokens takes 1 .. --tokens (%zu)\n", n);
            return 2;
        }
    if (n_simd == 0) {
        simd_list[n_simd++] = ENGRAM_SIMD_AUTO;
        if (engram_simd_selected() == ENGRAM_SIMD_AVX512)
            simd_list[n_simd++] = ENGRAM_SIMD_AVX2;
    }
    if (csv && csv_refused("bench_apply", csv, model))
        return 2;
    char path[256];
    if (!model) {
        /* a folder in /tmp that only we can write (anyone can make one by
         * that name first: then a model there could be theirs) */
        struct stat sb;
        (void)mkdir("/tmp/engram-bench", 0755);
        if (lstat("/tmp/engram-bench", &sb) < 0 || !S_ISDIR(sb.st_mode) ||
            sb.st_uid != geteuid() || (sb.st_mode & 022)) {
            fprintf(stderr, "bench_apply: /tmp/engram-bench is not a folder of this user that "
                            "only it can write; remove it or give --model\n");
            return 3;
        }
        snprintf(path, sizeof path, "/tmp/engram-bench/apply-%u.gguf", width);
        if (access(path, R_OK) != 0 && build_model(path, width) < 0)
            return 1;
        model = path;
    }
    engram_model *m;
    engram_layer *L;
    engram_error err;
    if (engram_model_open(model, &m, &err) < 0 || engram_layer_open(m, 0, &L, &err) < 0) {
        fprintf(stderr, "%s: %s\n", model, err.msg);
        return 1;
    }
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    const uint32_t W = li.width, S = li.streams, N = (S + 1) * W;
    const size_t K = ENGRAM_K;
    const double weight_bytes = (double)L->panels * K * PANEL * 2;

    char cpu[300] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                snprintf(cpu, sizeof cpu, "%s", c ? c + 2 : line);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    time_t tt = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&tt));
    printf("bench_apply  %s  %s, %ld cores  kernels %s\n", date, cpu, sysconf(_SC_NPROCESSORS_ONLN),
           engram_simd_name(engram_simd_selected()));
    printf("layer: W %u, S %u, N %u outputs x K %zu, F16 weights %.1f MB\n\n", W, S, N, K,
           weight_bytes / 1e6);

    /* inputs: rows of n tokens as BF16 (normal-like values through BF16),
     * residual BF16 values in F32 */
    uint64_t seed = 42;
    uint16_t *rows = malloc(n * K * 2);
    float *rowsf = malloc(n * K * 4);
    size_t per = (size_t)S * W;
    float *x0 = malloc(n * per * 4), *x = malloc(n * per * 4), *kv = malloc(n * N * 4);
    if (!rows || !rowsf || !x0 || !x || !kv)
        return 3;
    for (size_t i = 0; i < n * K; i++) {
        float v = ((float)(rng(&seed) & 0xffff) / 65536.0f - 0.5f) * 3.0f;
        rows[i] = f32_to_bf16_bits(v);
        rowsf[i] = bf16_to_f32(rows[i]);
    }
    for (size_t i = 0; i < n * per; i++)
        x0[i] = bf16_round(((float)(rng(&seed) & 0xffff) / 65536.0f - 0.5f) * 8.0f);

    if (csv && engram_output_fopen(&out_file, csv, 0, &out, &err) < 0) {
        fprintf(stderr, "bench_apply: %s\n", err.msg);
        return 3;
    }
    atexit(csv_abandon);
    if (out)
        fprintf(out, "what,threads,value,unit,ratio\n");

    /* (a) decode */
    double bw = memcpy_bw((size_t)1 << 30);
    printf("(a) decode: applying %s token%s, a pass over the weights, vs streaming the same\n"
           "    weights once (F16 -> F32, summed; the same instruction set) on the same threads;\n"
           "    %d reps of each, interleaved; medians.  x stream = stream ms / apply ms, the\n"
           "    apply's speed as a fraction of the stream's (range: of the per-rep ratio)\n",
           n_dec == 1 && dec_list[0] == 1 ? "one" : "a few", n_dec == 1 && dec_list[0] == 1 ? "" : "s",
           decode_reps);
    printf("    memcpy of 1 GiB: %.2f GB/s (bytes copied per second, best of 5; secondary)\n",
           bw / 1e9);
    struct decode_in din = {L, rows, x0, x, n, per, decode_reps, weight_bytes, bw};
    for (unsigned si = 0; si < n_simd; si++) {
        engram_simd want = simd_list[si];
        const struct apply_kernels *kern = apply_kernels_for(want);
        if (!kern) {
            printf("    kernels %s: not supported here\n", engram_simd_name(want));
            continue;
        }
        /* the stream runs the instruction set the kernels do */
        engram_simd lvl = want == ENGRAM_SIMD_AUTO ? engram_simd_selected() : want;
        if (kern == &apply_kernels_scalar)
            lvl = ENGRAM_SIMD_SCALAR;
        printf("    kernels %s%s\n", engram_simd_name(lvl), want == ENGRAM_SIMD_AUTO ? " (auto)" : "");
        printf("    tokens  threads  apply ms  GB/s   stream ms  GB/s   x stream (range)       apply/memcpy\n");
        for (unsigned di = 0; di < n_dec; di++)
            for (unsigned ti = 0; ti < n_threads; ti++) {
                int rc = decode_row(&din, want, lvl, threads_list[ti], dec_list[di]);
                if (rc)
                    return rc;
            }
    }

    /* (b) prefill projection vs OpenBLAS */
    double flops = 2.0 * (double)n * N * K;
    void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    /* dlsym returns an object pointer; a union turns it into a function pointer */
    union { void *p; sgemm_fn f; } sg = {blas ? dlsym(blas, "cblas_sgemm") : NULL};
    union { void *p; set_threads_fn f; } st = {blas ? dlsym(blas, "openblas_set_num_threads") : NULL};
    sgemm_fn sgemm = sg.f;
    set_threads_fn set_threads = st.f;
    float *wf = NULL, *cb = NULL;
    if (sgemm) {
        /* weights widened to F32 once, [N][K] as in the file */
        gguf_file *g = NULL;
        wf = malloc((size_t)N * K * 4);
        cb = malloc(n * N * 4);
        uint16_t *h = malloc(K * 2);
        const gguf_tensor *wt = NULL;
        if (wf && cb && h && gguf_open(model, &g, NULL) == 0 &&
            (wt = gguf_find_tensor(g, "blk.1.engram_kv.weight")) != NULL) {
            for (uint32_t o = 0; o < N; o++) {
                if (pread(g->fd, h, K * 2, (off_t)(wt->offset + (uint64_t)o * K * 2)) != (ssize_t)(K * 2))
                    break;
                for (size_t i = 0; i < K; i++)
                    wf[(size_t)o * K + i] = f16_to_f32(h[i]);
            }
        } else {
            sgemm = NULL;
        }
        free(h);
        gguf_close(g);
    }
    printf("\n(b) prefill projection: %zu tokens x %u outputs x %zu inputs (%.0f GFLOP)\n", n, N, K,
           flops / 1e9);
    printf("    engram: fixed order (batch-invariant, every kernel the same bits);\n");
    printf("    OpenBLAS sgemm (%s): unconstrained order, weights widened to F32\n",
           sgemm ? "loaded" : "not found");
    printf("    threads  engram s  GFLOP/s   OpenBLAS s  GFLOP/s   engram/OpenBLAS\n");
    for (unsigned ti = 0; ti < n_threads; ti++) {
        unsigned th = threads_list[ti];
        engram_apply_opts o = {.threads = th};
        engram_applier *a;
        if (engram_applier_new(L, &o, &a, &err) < 0)
            return 1;
        double te[99], tbl[99];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            engram_project(a, rows, ENGRAM_BF16, n, kv, &err);
            te[r] = now() - t0;
        }
        double me = median(te, reps), mb = 0;
        if (sgemm) {
            if (set_threads)
                set_threads((int)th);
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                sgemm(101 /* row major */, 111 /* no trans */, 112 /* trans */, (int)n, (int)N, (int)K,
                      1.0f, rowsf, (int)K, wf, (int)K, 0.0f, cb, (int)N);
                tbl[r] = now() - t0;
            }
            mb = median(tbl, reps);
        }
        printf("    %7u  %8.3f  %7.1f   %10.3f  %7.1f   %6.2f\n", th, me, flops / me / 1e9, mb,
               mb > 0 ? flops / mb / 1e9 : 0.0, mb > 0 ? mb / me : 0.0);
        if (out) {
            fprintf(out, "prefill_project_gflops,%u,%.2f,GFLOP/s,%.3f\n", th, flops / me / 1e9,
                    mb > 0 ? mb / me : 0.0);
            if (mb > 0)
                fprintf(out, "openblas_sgemm_gflops,%u,%.2f,GFLOP/s,1\n", th, flops / mb / 1e9);
        }
        /* the same outputs, within the F32 bound (spot check of 1000) */
        if (sgemm) {
            double worst = 0;
            for (int k = 0; k < 1000; k++) {
                size_t t = rng(&seed) % n, oo = rng(&seed) % N;
                double mag = 0;
                for (size_t i = 0; i < K; i++)
                    mag += fabs((double)rowsf[t * K + i] * wf[oo * K + i]);
                double d = fabs((double)kv[t * N + oo] - cb[t * N + oo]);
                double lim = 2 * K * 0x1p-24 * mag;
                if (lim > 0 && d / lim > worst)
                    worst = d / lim;
            }
            printf("             (engram vs OpenBLAS: worst |difference| %.3g of 2 gamma_K sum|e w|)\n",
                   worst);
        }
        engram_applier_free(a);
    }

    /* (c) gate and update alone */
    {
        const struct apply_kernels *k = apply_kernels_for(ENGRAM_SIMD_AUTO);
        engram_applier *a;
        engram_apply_opts o = {.threads = 1};
        engram_applier_new(L, &o, &a, &err);
        engram_project(a, rows, ENGRAM_BF16, n < 64 ? n : 64, kv, &err);
        size_t nt = n < 64 ? n : 64;
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            memcpy(x, x0, nt * per * 4);
            double t0 = now();
            for (size_t t = 0; t < nt; t++)
                for (uint32_t s = 0; s < S; s++) {
                    float red[3];
                    float *xs = x + t * per + (size_t)s * W;
                    const float *kvt = kv + t * N;
                    k->reduce(xs, 0, kvt + (size_t)s * W, L->wq + (size_t)s * W, W, red);
                    float gv = gate_value(red[0], red[1], red[2], W);
                    k->update(xs, 0, kvt + (size_t)S * W, gv, W, NULL, 0);
                    k->update(xs, 0, kvt + (size_t)S * W, gv, W, xs, 0);
                }
            double dt = (now() - t0) / (double)nt;
            if (dt < best)
                best = dt;
        }
        printf("\n(c) gate + update (check pass and write pass) of %u streams x %u: %.0f ns per token\n",
               S, W, best * 1e9);
        if (out)
            fprintf(out, "gate_update_ns_per_token,1,%.1f,ns,\n", best * 1e9);
        engram_applier_free(a);
    }

    /* (d) whole apply */
    printf("\n(d) apply of %zu tokens (project, gate, update), F32 residual\n", n);
    printf("    threads  s        tokens/s\n");
    for (unsigned ti = 0; ti < n_threads; ti++) {
        engram_apply_opts o = {.threads = threads_list[ti]};
        engram_applier *a;
        engram_applier_new(L, &o, &a, &err);
        memcpy(x, x0, n * per * 4);
        double t0 = now();
        int rc = engram_apply(a, rows, ENGRAM_BF16, x, ENGRAM_F32, NULL, n, &err);
        double dt = now() - t0;
        printf("    %7u  %7.3f  %8.1f%s\n", threads_list[ti], dt, (double)n / dt, rc ? "  (failed)" : "");
        if (out)
            fprintf(out, "prefill_apply_tokens_per_s,%u,%.2f,tokens/s,\n", threads_list[ti], (double)n / dt);
        engram_applier_free(a);
    }
    FILE *done = out;
    out = NULL;
    if (done && engram_output_fclose(&out_file, done, 1, &err) < 0) {
        fprintf(stderr, "bench_apply: %s\n", err.msg);
        return 3;
    }
    free(wf);
    free(cb);
    free(rows);
    free(rowsf);
    free(x0);
    free(x);
    free(kv);
    engram_layer_close(L);
    engram_model_close(m);
    return 0;
}
