/*
 * bench_steps - the C twin of bench/bench_python.py: the same decode-step
 * loop the Python binding drives, driven from C, so the two can be compared
 * in one sitting.
 *
 *   bench_steps [MODEL] [--threads 8] [--seconds 3] [--depth 64]
 *               [--cache-rows 0] [--tokens 65536] [--seed 1]
 *               [--engine auto|uring|threads|buffered]
 *   bench_steps [MODEL] --dump-tokens N [--tokens K] [--seed 1]
 *   bench_steps [MODEL] --single [--steps 20000] [--warmup 2000]
 *               [--cache-rows 65536] [--tokens 16] ...
 *
 * MODEL defaults to build/demo.gguf.  One pool (reader depth --depth, row
 * cache of --cache-rows rows: cache_bytes (rows + 8) x (row_bytes + 9) + 64,
 * as engram.Pool(cache_rows=) sizes it).
 *
 * Threads mode: --threads pthreads, each with its own session, loop for
 * --seconds: engram_step_begin(1 token, BF16) -> wait(0) -> wait(1) ->
 * commit(1).  Prints the steps of all threads per second of wall time.
 *
 * Single mode: one session on the calling thread, --warmup steps, then
 * --steps steps of the same loop in batches of 100, each batch timed; prints
 * the mean microseconds per step and the median of the batches' means (on
 * a shared machine, interference only adds time and comes in bursts: the
 * median of short batches is the steadier figure).  With a small --tokens set and a row cache every read is served
 * from memory after the first cycle, so what is left is the library's
 * path (the pool's I/O thread handing the rows over) plus the caller's.
 *
 * Tokens: thread (or session) i's stream, token j, is
 *   mix((seed << 40) ^ (i << 32) ^ (j mod tokens)) mod vocab
 * with mix splitmix64's finalizer (after adding its golden-ratio constant);
 * bench_python.py generates the same streams.  Tokens are generated before
 * the clock starts.  --dump-tokens N prints stream 0's first N tokens (one
 * line, space-separated) and exits: bench_python.py checks its generator
 * against it.
 *
 * The last line is machine-readable:
 *   result mode=threads threads=8 steps=N seconds=S steps_per_s=X
 *   result mode=single steps=N seconds=S us_per_step=X us_per_step_median=Y
 * Exit 0, 1 on any library error (named on stderr), 2 on bad arguments.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engram.h"


static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define SINGLE_BATCH 100u /* steps per timed batch in --single */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct opts {
    const char *model;
    unsigned threads, depth, tokens;
    double seconds;
    uint64_t cache_rows, seed, steps, warmup, dump;
    int single;
    engram_io_engine engine;
};

struct shared {
    const struct opts *o;
    engram_pool *pool;
    uint32_t vocab;
    atomic_uint ready;
    atomic_int go, failed;
    uint64_t end_ns;
};

struct worker {
    struct shared *sh;
    unsigned id;
    engram_session *s;
    uint32_t *tok;   /* [o->tokens] */
    uint16_t *out;   /* [48][256] BF16 */
    uint64_t steps;
    uint64_t done_ns;
};

static int fill_tokens(const struct opts *o, unsigned id, uint32_t vocab, uint32_t **out)
{
    uint32_t *t = malloc((size_t)o->tokens * sizeof *t);
    if (!t)
        return -1;
    for (uint64_t j = 0; j < o->tokens; j++)
        t[j] = (uint32_t)(mix((o->seed << 40) ^ ((uint64_t)id << 32) ^ j) % vocab);
    *out = t;
    return 0;
}

/* One decode step as the binding's step([tok]) / wait(0) / wait(1) / commit(1). */
static int one_step(struct worker *w, uint32_t tok)
{
    engram_error e;
    int rc = engram_step_begin(w->s, &tok, NULL, 1, ENGRAM_BF16, w->out, &e);
    const char *what = "engram_step_begin";
    if (rc == 0 && (rc = engram_step_wait(w->s, 0, &e)) < 0)
        what = "engram_step_wait(0)";
    if (rc == 0 && (rc = engram_step_wait(w->s, 1, &e)) < 0)
        what = "engram_step_wait(1)";
    if (rc == 0 && (rc = engram_step_commit(w->s, 1, &e)) < 0)
        what = "engram_step_commit";
    if (rc < 0) {
        fprintf(stderr, "bench_steps: session %u: %s: %s: %s\n", w->id, what, engram_strerror(rc), e.msg);
        engram_step_abort(w->s);
    }
    return rc;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct shared *sh = w->sh;
    unsigned n = sh->o->tokens;
    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load(&sh->go))
        ;
    uint64_t j = 0;
    while (!atomic_load(&sh->failed) && now_ns() < sh->end_ns) {
        if (one_step(w, w->tok[j % n]) < 0) {
            atomic_store(&sh->failed, 1);
            break;
        }
        j++;
    }
    w->steps = j;
    w->done_ns = now_ns();
    return NULL;
}

static int parse_u64(const char *name, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || v[0] == '-' || x < lo || x > hi) {
        fprintf(stderr, "bench_steps: %s: '%s' is not an integer in %" PRIu64 " .. %" PRIu64 "\n", name,
                v ? v : "(missing)", lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.model = "build/demo.gguf", .threads = 8, .depth = 64, .seconds = 3.0, .seed = 1,
                       .steps = 20000, .warmup = 2000, .engine = ENGRAM_IO_AUTO};
    int have_tokens = 0, have_cache = 0;
    uint64_t x;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: bench_steps [MODEL] [--threads 8] [--seconds 3] [--depth 64] [--cache-rows N]\n"
                   "                   [--tokens K] [--seed 1] [--engine auto|uring|threads|buffered]\n"
                   "       bench_steps [MODEL] --single [--steps 20000] [--warmup 2000] ...\n"
                   "       bench_steps [MODEL] --dump-tokens N [--tokens K] [--seed 1]\n");
            exit(0);
        } else if (!strcmp(a, "--single")) {
            o->single = 1;
            continue;
        } else if (a[0] != '-') {
            o->model = a;
            continue;
        }
        i++;
        if (!strcmp(a, "--threads")) {
            if (parse_u64(a, v, 1, 256, &x) < 0)
                return -1;
            o->threads = (unsigned)x;
        } else if (!strcmp(a, "--depth")) {
            if (parse_u64(a, v, 1, ENGRAM_READER_MAX_DEPTH, &x) < 0)
                return -1;
            o->depth = (unsigned)x;
        } else if (!strcmp(a, "--tokens")) {
            if (parse_u64(a, v, 1, 1u << 24, &x) < 0)
                return -1;
            o->tokens = (unsigned)x;
            have_tokens = 1;
        } else if (!strcmp(a, "--cache-rows")) {
            if (parse_u64(a, v, 0, 1ull << 32, &o->cache_rows) < 0)
                return -1;
            have_cache = 1;
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(a, v, 0, 0xffffff, &o->seed) < 0)
                return -1;
        } else if (!strcmp(a, "--steps")) {
            if (parse_u64(a, v, 1, 1ull << 40, &o->steps) < 0)
                return -1;
        } else if (!strcmp(a, "--dump-tokens")) {
            if (parse_u64(a, v, 1, 1u << 20, &o->dump) < 0)
                return -1;
        } else if (!strcmp(a, "--warmup")) {
            if (parse_u64(a, v, 0, 1ull << 40, &o->warmup) < 0)
                return -1;
        } else if (!strcmp(a, "--seconds")) {
            char *end;
            o->seconds = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(o->seconds > 0 && o->seconds <= 3600)) {
                fprintf(stderr, "bench_steps: --seconds: '%s' is not in (0, 3600]\n", v ? v : "(missing)");
                return -1;
            }
        } else if (!strcmp(a, "--engine")) {
            static const struct { const char *name; engram_io_engine e; } eng[] = {
                {"auto", ENGRAM_IO_AUTO}, {"uring", ENGRAM_IO_URING},
                {"threads", ENGRAM_IO_THREADS}, {"buffered", ENGRAM_IO_BUFFERED}};
            size_t k = 0;
            while (v && k < 4 && strcmp(v, eng[k].name))
                k++;
            if (!v || k == 4) {
                fprintf(stderr, "bench_steps: --engine: '%s' is not auto|uring|threads|buffered\n",
                        v ? v : "(missing)");
                return -1;
            }
            o->engine = eng[k].e;
        } else {
            fprintf(stderr, "bench_steps: unknown option '%s' (--help)\n", a);
            return -1;
        }
    }
    if (!have_tokens)
        o->tokens = o->single ? 16 : 65536;
    if (!have_cache)
        o->cache_rows = o->single ? 65536 : 0;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_opts(argc, argv, &o) < 0)
        return 2;
    engram_error e = {0};
    engram_model *m = NULL;
    int rc = engram_model_open(o.model, &m, &e);
    if (rc < 0) {
        fprintf(stderr, "bench_steps: %s: %s: %s\n", o.model, engram_strerror(rc), e.msg);
        return 1;
    }
    engram_model_info mi;
    engram_model_get_info(m, &mi);
    if (mi.family.member != ENGRAM_MEMBER_V41) {
        fprintf(stderr, "bench_steps: %s: a DeepSeek V4.1 model is needed (two tables)\n", o.model);
        engram_model_close(m);
        return 2;
    }
    if (o.dump) {
        uint32_t *t;
        if (fill_tokens(&o, 0, mi.family.vocab, &t) < 0) {
            fprintf(stderr, "bench_steps: out of memory\n");
            engram_model_close(m);
            return 1;
        }
        for (uint64_t j = 0; j < o.dump; j++)
            printf("%s%" PRIu32, j ? " " : "", t[j % o.tokens]);
        printf("\n");
        free(t);
        engram_model_close(m);
        return 0;
    }
    struct shared sh = {.o = &o, .vocab = mi.family.vocab};
    atomic_init(&sh.ready, 0);
    atomic_init(&sh.go, 0);
    atomic_init(&sh.failed, 0);
    unsigned nw = o.single ? 1 : o.threads;
    struct worker *w = calloc(nw, sizeof *w);
    pthread_t *th = calloc(nw, sizeof *th);
    unsigned started = 0;
    int exit_rc = 1;
    if (!w || !th) {
        fprintf(stderr, "bench_steps: out of memory\n");
        goto done;
    }
    engram_pool_opts popts;
    memset(&popts, 0, sizeof popts);
    popts.reader.engine = o.engine;
    popts.reader.depth = o.depth;
    if (o.cache_rows) {
        popts.reader.cache_bytes = (o.cache_rows + 8) * (mi.family.row_bytes + 9ull) + 64;
        if (popts.reader.cache_bytes < ENGRAM_READER_MIN_CACHE)
            popts.reader.cache_bytes = ENGRAM_READER_MIN_CACHE;
    }
    if ((rc = engram_pool_open(m, &popts, &sh.pool, &e)) < 0) {
        fprintf(stderr, "bench_steps: engram_pool_open: %s: %s\n", engram_strerror(rc), e.msg);
        goto done;
    }
    for (unsigned i = 0; i < nw; i++) {
        w[i].sh = &sh;
        w[i].id = i;
        w[i].out = malloc((size_t)ENGRAM_ROWS_PER_TOKEN * 256 * sizeof(uint16_t));
        if (!w[i].out || fill_tokens(&o, i, sh.vocab, &w[i].tok) < 0) {
            fprintf(stderr, "bench_steps: out of memory\n");
            goto done;
        }
        if ((rc = engram_session_open(sh.pool, &w[i].s, &e)) < 0) {
            fprintf(stderr, "bench_steps: engram_session_open: %s: %s\n", engram_strerror(rc), e.msg);
            goto done;
        }
    }
    if (o.single) {
        struct worker *x = &w[0];
        uint64_t j = 0;
        for (; j < o.warmup; j++)
            if (one_step(x, x->tok[j % o.tokens]) < 0)
                goto done;
        size_t nb = (size_t)((o.steps + SINGLE_BATCH - 1) / SINGLE_BATCH);
        uint64_t *bt = malloc(nb * sizeof *bt), total = 0, steps = 0;
        if (!bt) {
            fprintf(stderr, "bench_steps: out of memory\n");
            goto done;
        }
        for (size_t b = 0; b < nb; b++) {
            uint64_t n = o.steps - steps < SINGLE_BATCH ? o.steps - steps : SINGLE_BATCH;
            uint64_t t0 = now_ns();
            for (uint64_t k = 0; k < n; k++, j++)
                if (one_step(x, x->tok[j % o.tokens]) < 0) {
                    free(bt);
                    goto done;
                }
            uint64_t dt = now_ns() - t0;
            total += dt;
            steps += n;
            bt[b] = dt * SINGLE_BATCH / n; /* per SINGLE_BATCH steps */
        }
        qsort(bt, nb, sizeof *bt, cmp_u64);
        double med = (double)(bt[(nb - 1) / 2] + bt[nb / 2]) / 2 / 1e3 / SINGLE_BATCH;
        free(bt);
        printf("result mode=single steps=%" PRIu64 " seconds=%.6f us_per_step=%.3f us_per_step_median=%.3f\n",
               o.steps, (double)total / 1e9, (double)total / 1e3 / (double)o.steps, med);
        exit_rc = 0;
        goto done;
    }
    for (; started < nw; started++)
        if ((rc = pthread_create(&th[started], NULL, worker_main, &w[started])) != 0) {
            fprintf(stderr, "bench_steps: pthread_create: %s\n", strerror(rc));
            atomic_store(&sh.failed, 1);
            break;
        }
    while (atomic_load(&sh.ready) < started)
        ;
    uint64_t t0 = now_ns();
    sh.end_ns = t0 + (uint64_t)(o.seconds * 1e9);
    atomic_store(&sh.go, 1);
    uint64_t steps = 0, t1 = t0;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        steps += w[i].steps;
        if (w[i].done_ns > t1)
            t1 = w[i].done_ns;
    }
    started = 0;
    if (atomic_load(&sh.failed))
        goto done;
    double s = (double)(t1 - t0) / 1e9;
    printf("result mode=threads threads=%u steps=%" PRIu64 " seconds=%.6f steps_per_s=%.1f\n", nw, steps, s,
           (double)steps / s);
    exit_rc = 0;
done:
    for (unsigned i = 0; i < started; i++) /* only after a failed pthread_create */
        pthread_join(th[i], NULL);
    for (unsigned i = 0; w && i < nw; i++) {
        if (w[i].s)
            engram_session_close(w[i].s);
        free(w[i].tok);
        free(w[i].out);
    }
    if (sh.pool)
        engram_pool_close(sh.pool);
    engram_model_close(m);
    free(w);
    free(th);
    return exit_rc;
}
