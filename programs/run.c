/*
 * run.c - engram run: the Engram part of a model inside a simulated engine.
 *
 * B sessions share one pool.  Each takes its own slice of the token stream:
 * the first part is its prompt (prefilled chunk by chunk through the
 * prefetch ring), the last N tokens are decode steps, all B sessions
 * stepping together (one batched round of reads per step).  The engine has
 * L layers; Engram is applied at layers 1 and 14 (the real projection,
 * gate and update, on a deterministic residual), every other layer costs
 * --layer-us of busy work on the engine's thread while the pool's I/O
 * thread reads.  Reads are begun when a step's token is known (before
 * layer 0) and waited for only at the Engram layers, so the layers before
 * hide them; the report says how much was hidden.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char *run_help =
    "usage: engram run [MODEL] [--tokens FILE] [--decode N] [--sessions B] [--layers L]\n"
    "                  [--layer-us X] [--threads N] [--no-overlap] [--no-prefetch] [--json]\n"
    "                  [--device cpu|cuda|cuda-fma|cuda-fast]\n"
    "Runs the Engram part of a model inside a simulated engine of L layers (Engram\n"
    "at layers 1 and 14; every other layer costs X us of busy work on the engine's\n"
    "thread): B sessions, each on its own slice of the token stream, prefill their\n"
    "prompt (the slice but its last N tokens) chunk by chunk through the prefetch\n"
    "ring, then take N decode steps together (one batched round of reads per step),\n"
    "applying layers 1 and 14 to a deterministic residual (engram apply's seed:1+b\n"
    "for session b).  Reads start when a token is known and are waited for at the\n"
    "Engram layers only (--no-overlap: waited for before layer 0; --no-prefetch:\n"
    "each prompt chunk read serially before its layers).  --device cuda: the Engram\n"
    "layers run on the GPU (rows delivered raw into page-locked buffers, copied up\n"
    "asynchronously per call; more than 8 tokens a call on the tensor cores, sums\n"
    "promoted to F32); cuda-fma: every sum by F32 FMAs on the CUDA cores;\n"
    "cuda-fast: cuBLAS with the tensor cores' own sums (faster, less accurate).\n"
    "Reports prefill and decode tokens/s, step latency p50/p99, rows requested vs\n"
    "distinct rows read, read time hidden behind the layers vs exposed, the I/O\n"
    "engine, page-cache growth of the tables' part of the model file and an\n"
    "FNV-1a 64 checksum of the\n"
    "final residuals (of every token, session by session).\n"
    "Defaults: the demo model next to the engram binary (demo.gguf, written there\n"
    "by engram build the first time) and the bundled GPL-3 token stream; N 64,\n"
    "B 4, L 43, X 100, 1 thread.  Exit codes as for every command.\n";

/* ------------------------------------------------------------ helpers */

static uint64_t ns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A layer of the simulated engine: busy work (not sleep) for us. */
static volatile double sink_value;
static void busy(uint64_t us)
{
    uint64_t end = ns_now() + us * 1000;
    double x = 1.0;
    while (ns_now() < end)
        for (int i = 0; i < 200; i++)
            x = x * 1.0000001 + 1e-9;
    sink_value = x;
}

/* Resident pages of the model file's bytes [lo, hi) (the model's open
 * checked that the tables lie inside the file), or -errno. */
static int64_t model_resident_pages(const char *path, uint64_t lo, uint64_t hi)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int64_t n = resident_pages(fd, lo, hi);
    close(fd);
    return n;
}

/* engram apply's seed:N residual, element e of session stream. */
static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void seeded(uint64_t seed, uint64_t first, size_t count, float *out)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t s = seed * 0x2545f4914f6cdd1dull + first + i;
        uint64_t r = mix64(&s);
        union { float f; uint32_t u; } v;
        v.f = ((float)(r >> 40) / (float)(1u << 24) - 0.5f) * 8.0f;
        v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
        out[i] = v.f;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t quantile(uint64_t *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static int lib_fail(int rc, const engram_error *err, const char *what)
{
    return fail_lib(rc, err, what);
}

/* ------------------------------------------------------------ the run */

struct sess {
    engram_session *s;
    const uint32_t *tok;   /* its slice                                  */
    size_t len, prompt;    /* slice length, prompt tokens                */
    float *x;              /* [len][S][W] its residual stream            */
};

struct run {
    engram_model *m;
    engram_pool *pool;
    engram_layer *L[2];
    struct dev *D[2];
    int rdt;               /* rows as the device wants them: BF16 or raw  */
    size_t rowb;           /* bytes of one row in that form               */
    struct sess *ss;
    unsigned B, layers, N;
    uint64_t layer_us;
    int overlap, prefetch, tty;
    size_t per;            /* S x W                                       */
    /* measurements */
    uint64_t prefill_ns, decode_ns;
    uint64_t read_ns[2], exposed_ns[2];
    uint64_t *step_lat;
    size_t n_steps;
    uint8_t *rows;         /* [B][24] contiguous rows of one table        */
    uint8_t *outs;         /* [B][48] rows: step deliveries               */
    float *xs;             /* [B][S][W] residual rows of one step          */
    uint8_t *ring;         /* the prefills' rings, allocated (and pinned) once */
    size_t ring_len;
};

/* The prefill options of every prompt of a run. */
static engram_prefill_opts prefill_opts(const struct run *R)
{
    engram_prefill_opts o = {.chunk_tokens = ENGRAM_BATCH_TOKENS, .ring_chunks = 2,
                             .dtype = (engram_dtype)R->rdt, .table1_delay_ns = ENGRAM_PREFILL_MANUAL,
                             .ring_mem = R->ring, .ring_bytes = R->ring_len};
    return o;
}

/* Applies table t's layer to n tokens whose rows are `stride` bytes apart. */
static int apply_layer(struct run *R, int t, const void *rows, size_t stride, float *x, size_t n,
                       engram_error *err)
{
    return dev_apply(R->D[t], rows, stride, x, NULL, n, NULL, err);
}

/* Prefill of one session's prompt through the prefetch ring. */
static int prefill(struct run *R, struct sess *q, engram_error *err)
{
    size_t n = q->prompt;
    if (n == 0)
        return 0;
    engram_prefill_opts o = prefill_opts(R);
    engram_prefill *pf = NULL;
    engram_reader *rd = NULL;
    uint32_t *rows48 = NULL;
    uint8_t *serial[2] = {NULL, NULL};
    engram_history h;
    engram_session_history(q->s, &h);
    int rc = 0;
    size_t chunk = ENGRAM_BATCH_TOKENS, chunks = (n + chunk - 1) / chunk;
    if (R->prefetch) {
        rc = engram_prefill_begin(q->s, q->tok, NULL, n, &o, &pf, err);
    } else {
        /* without prefetch: each chunk read serially by a reader of its
         * own, before the chunk's layers run */
        rc = engram_reader_open(R->m, NULL, &rd, err);
        rows48 = malloc(chunk * ENGRAM_ROWS_PER_TOKEN * sizeof *rows48);
        serial[0] = malloc(chunk * ENGRAM_COLUMNS * R->rowb);
        serial[1] = malloc(chunk * ENGRAM_COLUMNS * R->rowb);
        if (rc == 0 && (!rows48 || !serial[0] || !serial[1]))
            rc = -ENOMEM;
    }
    for (size_t c = 0; c < chunks && rc == 0; c++) {
        size_t first = c * chunk, k = n - first < chunk ? n - first : chunk;
        const void *rows[2] = {NULL, NULL};
        uint64_t layer_cost = R->layer_us * ((k + 63) / 64);
        if (!R->prefetch) {
            uint64_t t0 = ns_now();
            rc = engram_hash_tokens(engram_model_hasher(R->m), &h, q->tok + first, NULL, k, rows48, err);
            for (int t = 0; t < 2 && rc == 0; t++)
                rc = engram_reader_batch(rd, t, rows48, k, (engram_dtype)R->rdt, serial[t], err);
            uint64_t dt = ns_now() - t0;
            R->read_ns[0] += dt;
            R->exposed_ns[0] += dt;
            rows[0] = serial[0];
            rows[1] = serial[1];
        }
        for (unsigned l = 0; l < R->layers && rc == 0; l++) {
            if (l == 1 || l == 14) {
                int t = l == 14;
                if (R->prefetch) {
                    uint64_t w0 = ns_now();
                    rc = engram_prefill_wait(pf, t, c, &rows[t], NULL, NULL, err);
                    R->exposed_ns[t] += ns_now() - w0;
                }
                if (rc == 0)
                    rc = apply_layer(R, t, rows[t], ENGRAM_COLUMNS * R->rowb, q->x + first * R->per, k, err);
                if (R->prefetch)
                    engram_prefill_release(pf, t, c);
            } else {
                if (l == 2 && R->prefetch && c == 0)
                    engram_prefill_start_table1(pf); /* layer signal: 14's reads start */
                busy(layer_cost);
            }
        }
    }
    if (pf) {
        int erc = engram_prefill_end(pf, rc == 0 ? err : NULL);
        if (rc == 0)
            rc = erc;
    } else if (rc == 0) {
        rc = engram_session_set_history(q->s, &h, err);
    }
    engram_reader_close(rd);
    free(rows48);
    free(serial[0]);
    free(serial[1]);
    return rc;
}

/* One decode step of every session together. */
static int decode_step(struct run *R, size_t step, engram_error *err)
{
    unsigned B = R->B;
    engram_session *sv[1024];
    uint32_t tok[1024];
    void *outs[1024];
    for (unsigned b = 0; b < B; b++) {
        struct sess *q = &R->ss[b];
        sv[b] = q->s;
        tok[b] = q->tok[q->prompt + step];
        outs[b] = R->outs + (size_t)b * ENGRAM_ROWS_PER_TOKEN * R->rowb;
        memcpy(R->xs + (size_t)b * R->per, q->x + (q->prompt + step) * R->per, R->per * 4);
    }
    uint64_t t0 = ns_now();
    int rc = engram_step_begin_batch(sv, tok, NULL, B, (engram_dtype)R->rdt, outs, err);
    for (unsigned l = 0; l < R->layers && rc == 0; l++) {
        int t = l == 14 ? 1 : 0;
        if ((l == 1 || l == 14) || (!R->overlap && l == 0)) {
            if (!R->overlap && l == 0) {
                /* every read waited for before any layer: all exposed */
                uint64_t last[2] = {0, 0};
                for (unsigned b = 0; b < B && rc == 0; b++)
                    for (int tt = 0; tt < 2 && rc == 0; tt++) {
                        rc = engram_step_wait(sv[b], tt, err);
                        engram_step_info info;
                        engram_step_get_info(sv[b], &info);
                        if (info.ready_ns[tt] > last[tt])
                            last[tt] = info.ready_ns[tt];
                    }
                for (int tt = 0; tt < 2; tt++) {
                    uint64_t dt = last[tt] > t0 ? last[tt] - t0 : 0;
                    R->read_ns[tt] += dt;
                    R->exposed_ns[tt] += dt;
                }
                busy(R->layer_us);
                continue;
            }
            uint64_t w0 = ns_now(), last = 0;
            for (unsigned b = 0; b < B && rc == 0; b++) {
                rc = engram_step_wait(sv[b], t, err);
                engram_step_info info;
                engram_step_get_info(sv[b], &info);
                if (info.ready_ns[t] > last)
                    last = info.ready_ns[t];
            }
            if (R->overlap) {
                /* read time: begin to the last row; exposed: the part of it
                 * after the engine started waiting */
                uint64_t total = last > t0 ? last - t0 : 0, exposed = last > w0 ? last - w0 : 0;
                if (exposed > total)
                    exposed = total;
                R->read_ns[t] += total;
                R->exposed_ns[t] += exposed;
            }
            if (rc == 0 && R->rdt == ENGRAM_RAW) { /* the GPU takes them strided */
                rc = apply_layer(R, t, R->outs + (size_t)t * ENGRAM_COLUMNS * R->rowb,
                                 ENGRAM_ROWS_PER_TOKEN * R->rowb, R->xs, B, err);
            } else if (rc == 0) {
                for (unsigned b = 0; b < B; b++)
                    memcpy(R->rows + (size_t)b * ENGRAM_COLUMNS * R->rowb,
                           R->outs + ((size_t)b * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS) * R->rowb,
                           ENGRAM_COLUMNS * R->rowb);
                rc = apply_layer(R, t, R->rows, ENGRAM_COLUMNS * R->rowb, R->xs, B, err);
            }
        } else {
            busy(R->layer_us);
        }
    }
    for (unsigned b = 0; b < B; b++) {
        int crc = rc == 0 ? engram_step_commit(sv[b], 1, err) : (engram_step_abort(sv[b]), 0);
        if (rc == 0)
            rc = crc;
        struct sess *q = &R->ss[b];
        memcpy(q->x + (q->prompt + step) * R->per, R->xs + (size_t)b * R->per, R->per * 4);
    }
    R->step_lat[R->n_steps++] = ns_now() - t0;
    return rc;
}

static void progress(struct run *R, const char *what, size_t done, size_t total)
{
    if (!R->tty)
        return;
    int w = 30, k = total ? (int)((double)done / (double)total * w) : w;
    fprintf(stderr, "\r%-8s [", what);
    for (int i = 0; i < w; i++)
        fputc(i < k ? '#' : '.', stderr);
    fprintf(stderr, "] %zu/%zu", done, total);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* The demo model next to the binary, written once; says why not. */
static int default_model(char *path, size_t n)
{
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0 || (size_t)k >= sizeof exe - 1) {
        fprintf(stderr, "%s: run: cannot find the binary's directory for the demo model "
                "(/proc/self/exe: %s); give --model\n", prog, strerror(k < 0 ? errno : ENAMETOOLONG));
        return -1;
    }
    exe[k] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(path, n, "%s/demo.gguf", exe);
    if (access(path, R_OK) == 0)
        return 0;
    fprintf(stderr, "%s: writing the demo model %s (once)\n", prog, path);
    char a0[] = "build", a2[] = "--base", a3[] = "16000", a4[] = "--width", a5[] = "64",
         a6[] = "--fill", a7[] = "normal", a8[] = "--seed", a9[] = "1";
    char *argv[] = {a0, path, a2, a3, a4, a5, a6, a7, a8, a9, NULL};
    int saved = dup(1);
    if (saved >= 0)
        dup2(2, 1); /* build's report to stderr */
    int rc = cmd_build(10, argv);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, 1);
        close(saved);
    }
    if (rc != 0)
        fprintf(stderr, "%s: run: cannot write the demo model next to the binary\n", prog);
    return rc == 0 ? 0 : -1;
}

int cmd_run(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(run_help, stdout);
        return 0;
    }
    const char *path = NULL, *tok_path = NULL, *device = "cpu";
    uint64_t N = 64, B = 4, L = 43, X = 100, threads = 1;
    int json = 0, overlap = 1, prefetch = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *dst = !strcmp(a, "--decode") ? &N : !strcmp(a, "--sessions") ? &B
                      : !strcmp(a, "--layers") ? &L : !strcmp(a, "--layer-us") ? &X
                      : !strcmp(a, "--threads") ? &threads : NULL;
        if (dst) {
            uint64_t max = dst == &B ? 1024 : dst == &L ? 1000 : dst == &threads ? ENGRAM_APPLY_MAX_THREADS
                         : dst == &X ? 10000000 : 100000000;
            if (i + 1 >= argc || parse_u64(argv[i + 1], max, dst) < 0)
                return fail_usage("run: %s takes a number <= %" PRIu64, a, max);
            i++;
        } else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            tok_path = argv[++i];
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            device = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--no-overlap")) {
            overlap = 0;
        } else if (!strcmp(a, "--no-prefetch")) {
            prefetch = 0;
        } else if (a[0] == '-') {
            return fail_usage("run: unknown option '%s'", a);
        } else if (!path) {
            path = a;
        } else {
            return fail_usage("run: more than one MODEL");
        }
    }
    if (B == 0 || threads == 0 || L < 15)
        return fail_usage("run: --sessions and --threads are >= 1, --layers >= 15 (Engram at 1 and 14)");
    if (!dev_name_ok(device))
        return fail_usage("run: unknown device '%s' (cpu, cuda, cuda-fma or cuda-fast)", device);
    char defpath[4200];
    if (!path) {
        if (default_model(defpath, sizeof defpath) < 0)
            return EXIT_SYSTEM;
        path = defpath;
    }
    uint32_t *tokens = NULL;
    size_t n = 0;
    if (tok_path) {
        int st = read_numbers(tok_path, UINT32_MAX, &tokens, &n, "token");
        if (st)
            return st;
    } else {
        n = engram_bundled_tokens_n;
        tokens = malloc(n * sizeof *tokens);
        if (!tokens)
            return EXIT_SYSTEM;
        memcpy(tokens, engram_bundled_tokens, n * sizeof *tokens);
    }
    if (n / B < N + 1) {
        free(tokens);
        fprintf(stderr, "%s: run: %zu tokens give %u sessions %zu each: fewer than --decode %" PRIu64
                        " + 1\n", prog, n, (unsigned)B, n / B, N);
        return EXIT_DATA;
    }

    struct run R;
    memset(&R, 0, sizeof R);
    R.B = (unsigned)B;
    R.layers = (unsigned)L;
    R.N = (unsigned)N;
    R.layer_us = X;
    R.overlap = overlap;
    R.prefetch = prefetch;
    R.tty = isatty(2);
    engram_error err = {0};
    int rc = 0, st = open_model(path, &R.m);
    if (st) {
        free(tokens);
        return st;
    }

    for (int t = 0; t < 2 && rc == 0; t++) {
        rc = engram_layer_open(R.m, t, &R.L[t], &err);
        if (rc == 0)
            rc = dev_open(device, R.L[t], (unsigned)threads, ENGRAM_BATCH_TOKENS, &R.D[t], &err);
    }
    R.rdt = R.D[0] ? dev_rows_dtype(R.D[0]) : ENGRAM_BF16;
    R.rowb = R.rdt == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2;
    engram_model_info mi;
    engram_model_get_info(R.m, &mi);
    uint64_t tab_lo = mi.table[0].offset, tab_hi = mi.table[1].offset + mi.table[1].bytes;
    /* the tables' resident pages, after the weights were loaded */
    int64_t pages0 = model_resident_pages(path, tab_lo, tab_hi);
    engram_pool_opts po;
    memset(&po, 0, sizeof po);
    if (rc == 0) { /* on a GPU: the reader's buffers page-locked, where reads land */
        dev_host_hooks(R.D[0], &po.reader.host);
        rc = engram_pool_open(R.m, &po, &R.pool, &err);
    }
    engram_layer_info li = {0};
    if (rc == 0)
        engram_layer_get_info(R.L[0], &li);
    R.per = (size_t)li.streams * li.width;
    R.ss = calloc(B, sizeof *R.ss);
    R.step_lat = malloc((N ? N : 1) * sizeof *R.step_lat);
    R.rows = malloc(B * ENGRAM_COLUMNS * 512);
    R.outs = malloc(B * ENGRAM_ROWS_PER_TOKEN * 512); /* room for BF16 or raw rows */
    R.xs = malloc(B * (R.per ? R.per : 1) * 4);
    if (rc == 0 && (!R.ss || !R.step_lat || !R.rows || !R.outs || !R.xs))
        rc = -ENOMEM;
    if (rc == 0 && prefetch) { /* one ring for every prompt */
        engram_prefill_opts o = prefill_opts(&R);
        R.ring_len = engram_prefill_ring_bytes(&o);
        R.ring = aligned_alloc(4096, (R.ring_len + 4095) / 4096 * 4096);
        if (!R.ring)
            rc = -ENOMEM;
    }
    if (rc == 0 && R.D[0]) { /* page-locked for the GPU's copies (one registration serves both layers) */
        dev_pin(R.D[0], R.outs, B * ENGRAM_ROWS_PER_TOKEN * 512);
        dev_pin(R.D[0], R.xs, B * R.per * 4);
        if (R.ring)
            dev_pin(R.D[0], R.ring, R.ring_len);
    }
    size_t slice = n / B;
    for (unsigned b = 0; b < B && rc == 0; b++) {
        struct sess *q = &R.ss[b];
        q->tok = tokens + (size_t)b * slice;
        q->len = slice;
        q->prompt = slice - N;
        q->x = malloc(slice * R.per * 4);
        if (!q->x) {
            rc = -ENOMEM;
            break;
        }
        seeded(1 + b, 0, slice * R.per, q->x);
        dev_pin(R.D[0], q->x, slice * R.per * 4);
        rc = engram_session_open(R.pool, &q->s, &err);
    }
    /* prefill, session by session */
    uint64_t t0 = ns_now();
    size_t prompt_tokens = 0;
    for (unsigned b = 0; b < B && rc == 0; b++) {
        rc = prefill(&R, &R.ss[b], &err);
        prompt_tokens += R.ss[b].prompt;
        progress(&R, "prefill", b + 1, B);
    }
    R.prefill_ns = ns_now() - t0;
    uint64_t pre_read[2] = {R.read_ns[0], R.read_ns[1]}, pre_exp[2] = {R.exposed_ns[0], R.exposed_ns[1]};
    /* decode */
    t0 = ns_now();
    for (size_t s = 0; s < N && rc == 0; s++) {
        rc = decode_step(&R, s, &err);
        if (s % 8 == 7 || s + 1 == N)
            progress(&R, "decode", s + 1, N);
    }
    R.decode_ns = ns_now() - t0;
    int64_t pages1 = model_resident_pages(path, tab_lo, tab_hi);

    if (rc < 0) {
        st = rc == -ENOENT ? (fprintf(stderr, "%s: run: %s\n", prog, err.msg), EXIT_DATA)
                           : lib_fail(rc, &err, "run");
    } else {
        uint64_t fnv = 0xcbf29ce484222325ull;
        for (unsigned b = 0; b < B; b++) {
            const unsigned char *p = (const unsigned char *)R.ss[b].x;
            for (size_t i = 0; i < R.ss[b].len * R.per * 4; i++)
                fnv = (fnv ^ p[i]) * 0x100000001b3ull;
        }
        engram_pool_stats ps;
        engram_pool_get_stats(R.pool, &ps);
        uint64_t p50 = quantile(R.step_lat, R.n_steps, 0.5), p99 = quantile(R.step_lat, R.n_steps, 0.99);
        double pre_s = (double)R.prefill_ns / 1e9, dec_s = (double)R.decode_ns / 1e9;
        uint64_t dread[2] = {R.read_ns[0] - pre_read[0], R.read_ns[1] - pre_read[1]};
        uint64_t dexp[2] = {R.exposed_ns[0] - pre_exp[0], R.exposed_ns[1] - pre_exp[1]};
        uint64_t tot_read = dread[0] + dread[1], tot_exp = dexp[0] + dexp[1];
        uint64_t ptot = pre_read[0] + pre_read[1], pexp = pre_exp[0] + pre_exp[1];
        /* prefill with prefetch: exposed = waiting at layers 1/14; the rest
         * of the prompt's read time ran behind the layers */
        int64_t growth = pages0 >= 0 && pages1 >= 0 ? pages1 - pages0 : 0;
        int count_err = (int)(pages0 < 0 ? pages0 : pages1 < 0 ? pages1 : 0);
        char growth_s[4400];
        if (count_err && json)
            snprintf(growth_s, sizeof growth_s, "null,\"page_cache_error\":\"%s\"", strerror(-count_err));
        else if (count_err)
            snprintf(growth_s, sizeof growth_s, "not counted (%s: %s)", path, strerror(-count_err));
        else if (json)
            snprintf(growth_s, sizeof growth_s, "%" PRId64, growth);
        else
            snprintf(growth_s, sizeof growth_s, "grew by %" PRId64 " pages", growth);
        if (json) {
            printf("{\"model\":\"%s\",\"device\":\"%s\",\"sessions\":%u,\"layers\":%u,\"layer_us\":%" PRIu64
                   ",\"threads\":%" PRIu64 ",\"overlap\":%s,\"prefetch\":%s,"
                   "\"width\":%u,\"streams\":%u,"
                   "\"prefill\":{\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,"
                   "\"rows_requested\":%" PRIu64 ",\"rows_read\":%" PRIu64 ",\"chunks\":%" PRIu64
                   ",\"wait_ns\":%" PRIu64 "},"
                   "\"decode\":{\"steps\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,"
                   "\"step_p50_ns\":%" PRIu64 ",\"step_p99_ns\":%" PRIu64 ",\"rows_requested\":%" PRIu64
                   ",\"rows_read\":%" PRIu64 ",\"rounds\":%" PRIu64 ","
                   "\"read_ns\":[%" PRIu64 ",%" PRIu64 "],\"exposed_ns\":[%" PRIu64 ",%" PRIu64
                   "],\"hidden_ns\":[%" PRIu64 ",%" PRIu64 "],\"read_total_ns\":%" PRIu64
                   ",\"exposed_total_ns\":%" PRIu64 ",\"hidden_total_ns\":%" PRIu64 "},"
                   "\"io\":{\"engine\":\"%s\",\"direct\":%d,\"note\":\"%s\",\"host_registered\":%" PRIu64 "},\"page_cache_growth_pages\":%s"
                   ",\"checksum\":\"%016" PRIx64 "\"}\n",
                   path, device, R.B, R.layers, X, threads, overlap ? "true" : "false",
                   prefetch ? "true" : "false", li.width, li.streams, prompt_tokens, pre_s,
                   pre_s > 0 ? (double)prompt_tokens / pre_s : 0.0, ps.prefill_rows_requested,
                   ps.prefill_rows_read, ps.prefill_chunks, pexp, R.n_steps, R.n_steps * B, dec_s,
                   dec_s > 0 ? (double)(R.n_steps * B) / dec_s : 0.0, p50, p99,
                   ps.step_rows_requested, ps.step_rows_read, ps.rounds, dread[0], dread[1], dexp[0],
                   dexp[1], dread[0] - dexp[0], dread[1] - dexp[1], tot_read, tot_exp,
                   tot_read - tot_exp, ps.io.engine, ps.io.direct, ps.io.note ? ps.io.note : "", ps.io.host_registered, growth_s, fnv);
        } else {
            printf("engram run: %s, W %u, %u streams; %u sessions, %u layers of %" PRIu64
                   " us (Engram at 1 and 14 on the %s), %" PRIu64 " apply thread%s%s%s\n",
                   path, li.width, li.streams, R.B, R.layers, X, device, threads, threads > 1 ? "s" : "",
                   overlap ? "" : ", reads waited before layer 0", prefetch ? "" : ", no prefetch");
            printf("prefill: %zu tokens in %.3f s = %.1f tokens/s; %" PRIu64 " rows requested, %" PRIu64
                   " distinct read (%" PRIu64 " chunks)%s; waiting at the Engram layers %.3f s%s\n",
                   prompt_tokens, pre_s, pre_s > 0 ? (double)prompt_tokens / pre_s : 0.0,
                   ps.prefill_rows_requested, ps.prefill_rows_read, ps.prefill_chunks,
                   prefetch ? "" : " (serial reader: not counted here)", (double)pexp / 1e9,
                   prefetch ? "" : " (all of the read time)");
            (void)ptot;
            printf("decode:  %zu steps x %u sessions in %.3f s = %.1f tokens/s; step p50 %.3f ms, "
                   "p99 %.3f ms\n", R.n_steps, R.B, dec_s,
                   dec_s > 0 ? (double)(R.n_steps * B) / dec_s : 0.0, (double)p50 / 1e6,
                   (double)p99 / 1e6);
            printf("         rows: %" PRIu64 " requested, %" PRIu64 " distinct read (%.1f%% saved by "
                   "merging sessions' reads), %" PRIu64 " rounds\n", ps.step_rows_requested,
                   ps.step_rows_read,
                   ps.step_rows_requested ? 100.0 * (1.0 - (double)ps.step_rows_read /
                                                              (double)ps.step_rows_requested) : 0.0,
                   ps.rounds);
            for (int t = 0; t < 2; t++)
                printf("         table %d read time %.3f ms: hidden %.3f ms (%.1f%%), exposed %.3f ms\n",
                       t, (double)dread[t] / 1e6, (double)(dread[t] - dexp[t]) / 1e6,
                       dread[t] ? 100.0 * (double)(dread[t] - dexp[t]) / (double)dread[t] : 0.0,
                       (double)dexp[t] / 1e6);
            printf("         all reads: %.3f ms, hidden %.1f%%\n", (double)tot_read / 1e6,
                   tot_read ? 100.0 * (double)(tot_read - tot_exp) / (double)tot_read : 0.0);
            printf("io:      %s%s%s%s%s; page cache of the tables %s\n",
                   ps.io.engine, ps.io.direct ? ", O_DIRECT" : ", buffered",
                   ps.io.note && ps.io.note[0] ? " (" : "", ps.io.note && ps.io.note[0] ? ps.io.note : "",
                   ps.io.note && ps.io.note[0] ? ")" : "", growth_s);
            if (ps.io.host_registered)
                printf("         the reader's buffers (%" PRIu64 " KiB, where reads land) and the prefill "
                       "ring page-locked for the GPU's copies\n", ps.io.host_registered >> 10);
            printf("checksum of the final residuals (FNV-1a 64): %016" PRIx64 "\n", fnv);
        }
    }
    for (unsigned b = 0; b < B && R.ss; b++) {
        engram_session_close(R.ss[b].s);
        free(R.ss[b].x);
    }
    engram_pool_close(R.pool);
    for (int t = 0; t < 2; t++) {
        dev_close(R.D[t]);
        engram_layer_close(R.L[t]);
    }
    engram_model_close(R.m);
    free(R.ss);
    free(R.step_lat);
    free(R.rows);
    free(R.outs);
    free(R.xs);
    free(R.ring);
    free(tokens);
    return st;
}
