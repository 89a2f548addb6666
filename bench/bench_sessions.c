/*
 * bench_sessions - issue #20's fairness figures: S decode sessions stepping
 * independently on one pool while P prompts are prefilled through it.
 *
 *   bench_sessions [MODEL] [--sessions 16] [--prefills 2] [--prompt 8192]
 *                  [--stagger-ms 50] [--seconds 10] [--layer-us 50]
 *                  [--think-us 0] [--depth 64] [--engine auto|uring|threads|buffered]
 *                  [--csv FILE] [--seed N] [--max-seconds 60]
 *
 * MODEL defaults to build/demo.gguf.  Each decode session runs on its own
 * thread: begin a 1-token step, wait table 0, busy-loop layers 1..13, wait
 * table 1, busy-loop the other 30 layers of a 43-layer engine, commit(1),
 * sleep think-us.  Each prefill runs on its own thread and session, prompt
 * i starting 0.5 s + i x stagger after the decoders (so their load is
 * steady), 2048-token chunks, ring 2, BF16, table 1 started by hand after
 * chunk 0's table-0 wait (the engine's layer signal), the same layer work per
 * 64 tokens of a chunk.  Decoders run for --seconds and on until every
 * prefill has ended, but never past --max-seconds: a scheduler that starves
 * prefills would otherwise keep the run going for minutes.  A prompt still
 * running when the decoders stop finishes without their load, and is marked
 * so in the table (its times are then lower bounds of the loaded case).
 *
 * Reported: per table, step latency (ready_ns[t] - begin_ns) and the time
 * blocked in engram_step_wait, p50/p99/max, for the whole run and for the
 * window in which prefills ran; steps and rows/s; per prompt the time to
 * the first chunk (begin -> return of wait(table 0, chunk 0)), each chunk's
 * ready times and the total.  The device's floor is measured in the same
 * run before the pool opens (single 512-B O_DIRECT preads at queue depth 1
 * inside the tables) and the p50s are given as multiples of it.
 *
 * Only the session/prefill calls whose names and signatures are stable
 * across the session layer's rewrite are used (no pool or reader stats), so
 * the same source measures either library (bench/ab_sessions.sh).
 *
 * Correctness is checked cheaply: one step in 64 of every session (the
 * output poisoned before begin) and 8 tokens of every prefill chunk are
 * copied out and, after the run, compared with engram_model_read_bf16 of the
 * row ids hashed from the benchmark's own copy of each history.  A mismatch
 * fails the run (exit 1), as does any library error.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"

#define LAYERS 43          /* layers of the engine modelled               */
#define LAYERS_T0 13       /* layers 1..13: between table 0 and table 1   */
#define CHUNK_TOKENS 2048u
#define SAMPLE_EVERY 64u   /* decode steps: one in 64 of each session checked */
#define PF_SAMPLES 8u      /* prefill: tokens checked per chunk and table  */
#define MAX_SAMPLES 4096u  /* per decode session                          */
#define FLOOR_READS 2000

/* ------------------------------------------------------------ helpers */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of engram_step_info */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Layer work of an engine whose layers run elsewhere (a GPU): the time
 * passes whether or not this thread has a core, so it is wall time. */
static void busy_ns(uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        ;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct pct {
    size_t n;
    double p50, p99, max; /* microseconds */
};

/* Nearest-rank percentiles of v (sorted in place), in microseconds. */
static struct pct percentiles(uint64_t *v, size_t n)
{
    struct pct p = {n, 0, 0, 0};
    if (n == 0)
        return p;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i50 = (n * 50 + 99) / 100, i99 = (n * 99 + 99) / 100;
    p.p50 = (double)v[i50 ? i50 - 1 : 0] / 1e3;
    p.p99 = (double)v[i99 ? i99 - 1 : 0] / 1e3;
    p.max = (double)v[n - 1] / 1e3;
    return p;
}

/* ------------------------------------------------------------ options */

struct opts {
    const char *model, *csv, *engine_name;
    engram_io_engine engine;
    unsigned sessions, prefills, depth;
    size_t prompt;
    uint64_t stagger_ns, run_ns, max_ns, layer_ns, think_ns, seed;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_sessions [MODEL] [--sessions 16] [--prefills 2] [--prompt 8192]\n"
            "                      [--stagger-ms 50] [--seconds 10] [--layer-us 50] [--think-us 0]\n"
            "                      [--depth 64] [--engine auto|uring|threads|buffered]\n"
            "                      [--csv FILE] [--seed N] [--max-seconds 60]\n"
            "MODEL defaults to build/demo.gguf (build/engram build build/demo.gguf --base 16000\n"
            "--width 64 --fill normal --seed 1 writes it).\n");
}

/* A non-negative number no larger than max; scale multiplies it (ms/us/s to ns). */
static int parse_num(const char *name, const char *s, double max, double scale, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > max) {
        fprintf(stderr, "bench_sessions: %s: '%s' is not a number in 0..%g\n", name, s, max);
        return -1;
    }
    *out = (uint64_t)(v * scale + 0.5);
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.model = "build/demo.gguf", .engine_name = "auto", .engine = ENGRAM_IO_AUTO,
                       .sessions = 16, .prefills = 2, .depth = 64, .prompt = 8192,
                       .stagger_ns = 50000000ull, .run_ns = 10000000000ull,
                       .max_ns = 60000000000ull, .layer_ns = 50000,
                       .think_ns = 0, .seed = 1};
    int have_model = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        int rc = 0;
        if (a[0] != '-' && !have_model) {
            o->model = a;
            have_model = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            exit(0);
        }
        if (!v) {
            usage();
            return -1;
        }
        i++;
        if (!strcmp(a, "--sessions")) {
            rc = parse_num(a, v, 1024, 1, &x);
            o->sessions = (unsigned)x;
        } else if (!strcmp(a, "--prefills")) {
            rc = parse_num(a, v, 64, 1, &x);
            o->prefills = (unsigned)x;
        } else if (!strcmp(a, "--prompt")) {
            rc = parse_num(a, v, 1 << 24, 1, &x);
            o->prompt = (size_t)x;
        } else if (!strcmp(a, "--stagger-ms")) {
            rc = parse_num(a, v, 1e6, 1e6, &o->stagger_ns);
        } else if (!strcmp(a, "--seconds")) {
            rc = parse_num(a, v, 1e5, 1e9, &o->run_ns);
        } else if (!strcmp(a, "--max-seconds")) {
            rc = parse_num(a, v, 1e5, 1e9, &o->max_ns);
        } else if (!strcmp(a, "--layer-us")) {
            rc = parse_num(a, v, 1e6, 1e3, &o->layer_ns);
        } else if (!strcmp(a, "--think-us")) {
            rc = parse_num(a, v, 1e7, 1e3, &o->think_ns);
        } else if (!strcmp(a, "--depth")) {
            rc = parse_num(a, v, ENGRAM_READER_MAX_DEPTH, 1, &x);
            o->depth = (unsigned)x;
        } else if (!strcmp(a, "--seed")) {
            rc = parse_num(a, v, 1e15, 1, &o->seed);
        } else if (!strcmp(a, "--csv")) {
            o->csv = v;
        } else if (!strcmp(a, "--engine")) {
            static const struct { const char *name; engram_io_engine e; } eng[] = {
                {"auto", ENGRAM_IO_AUTO}, {"uring", ENGRAM_IO_URING},
                {"threads", ENGRAM_IO_THREADS}, {"buffered", ENGRAM_IO_BUFFERED}};
            rc = -1;
            for (size_t k = 0; k < sizeof eng / sizeof eng[0]; k++)
                if (!strcmp(v, eng[k].name)) {
                    o->engine = eng[k].e;
                    o->engine_name = eng[k].name;
                    rc = 0;
                }
            if (rc)
                fprintf(stderr, "bench_sessions: --engine: '%s' is not auto|uring|threads|buffered\n", v);
        } else {
            fprintf(stderr, "bench_sessions: unknown option '%s'\n", a);
            usage();
            return -1;
        }
        if (rc)
            return -1;
    }
    if (o->max_ns < o->run_ns)
        o->max_ns = o->run_ns;
    if (o->sessions == 0 && o->prefills == 0) {
        fprintf(stderr, "bench_sessions: nothing to run (--sessions 0 --prefills 0)\n");
        return -1;
    }
    if (o->prefills && o->prompt == 0) {
        fprintf(stderr, "bench_sessions: --prompt must be > 0 with prefills\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ shared state */

struct shared {
    const struct opts *o;
    engram_model *m;
    const engram_hasher *hs;
    uint32_t vocab;
    uint64_t t_start, t_deadline, t_cap;
    atomic_int prefills_left; /* decoders run until this is 0 and the deadline passed */
    atomic_int failed;
    pthread_mutex_t mu;       /* guards msg */
    char msg[600];            /* the first failure */
};

static void fail(struct shared *sh, const char *who, const char *call, int rc, const engram_error *e)
{
    pthread_mutex_lock(&sh->mu);
    if (!atomic_load(&sh->failed))
        snprintf(sh->msg, sizeof sh->msg, "%s: %s: %s%s%s", who, call, engram_strerror(rc),
                 e && e->msg[0] ? ": " : "", e ? e->msg : "");
    atomic_store(&sh->failed, 1);
    pthread_mutex_unlock(&sh->mu);
}

/* ------------------------------------------------------------ decode */

struct step_rec {
    uint64_t begin_ns;         /* engram_step_info.begin_ns */
    uint64_t lat[2];           /* ready_ns[t] - begin_ns    */
    uint64_t blocked[2];       /* time inside engram_step_wait(t) */
    unsigned rows;             /* rows[0] + rows[1]         */
};

struct dsample {
    size_t step;
    uint32_t rows[ENGRAM_ROWS_PER_TOKEN];
    uint16_t out[ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];
};

struct dec {
    struct shared *sh;
    unsigned id;
    char name[32];
    engram_session *s;
    uint64_t rng;
    struct step_rec *rec;
    size_t n, cap;
    struct dsample *smp;
    size_t nsmp;
    uint64_t t_last;           /* when its last step committed */
    uint16_t out[ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];
};

static int dec_step(struct dec *d, size_t step, engram_history *h)
{
    struct shared *sh = d->sh;
    const struct opts *o = sh->o;
    engram_error e = {0};
    uint32_t tok = (uint32_t)(rnd(&d->rng) % sh->vocab);
    int sample = step % SAMPLE_EVERY == d->id % SAMPLE_EVERY && d->nsmp < MAX_SAMPLES;
    if (sample) /* NaN everywhere: a row the library does not deliver cannot pass */
        memset(d->out, 0xff, sizeof d->out);
    struct step_rec r = {0};
    int rc = engram_step_begin(d->s, &tok, NULL, 1, ENGRAM_BF16, d->out, &e);
    if (rc < 0) {
        fail(sh, d->name, "engram_step_begin", rc, &e);
        return rc;
    }
    const char *call = "engram_step_wait(0)";
    uint64_t w = now_ns();
    rc = engram_step_wait(d->s, 0, &e);
    r.blocked[0] = now_ns() - w;
    if (rc == 0) {
        busy_ns(LAYERS_T0 * o->layer_ns);
        call = "engram_step_wait(1)";
        w = now_ns();
        rc = engram_step_wait(d->s, 1, &e);
        r.blocked[1] = now_ns() - w;
    }
    if (rc < 0) {
        engram_step_abort(d->s);
        fail(sh, d->name, call, rc, &e);
        return rc;
    }
    engram_step_info info;
    engram_step_get_info(d->s, &info);
    if (info.k != 1 || info.rows[0] != ENGRAM_COLUMNS || info.rows[1] != ENGRAM_COLUMNS ||
        info.ready_ns[0] < info.begin_ns || info.ready_ns[1] < info.begin_ns ||
        info.begin_ns < sh->t_start) {
        engram_step_abort(d->s);
        snprintf(e.msg, sizeof e.msg,
                 "step %zu: k %u, rows %u/%u, begin %" PRIu64 ", ready %" PRIu64 "/%" PRIu64
                 " (want k 1, rows 24/24, ready >= begin >= run start)",
                 step, info.k, info.rows[0], info.rows[1], info.begin_ns, info.ready_ns[0],
                 info.ready_ns[1]);
        fail(sh, d->name, "engram_step_get_info", -EPROTO, &e);
        return -EPROTO;
    }
    r.begin_ns = info.begin_ns;
    r.lat[0] = info.ready_ns[0] - info.begin_ns;
    r.lat[1] = info.ready_ns[1] - info.begin_ns;
    r.rows = info.rows[0] + info.rows[1];
    busy_ns((LAYERS - LAYERS_T0) * o->layer_ns);
    rc = engram_step_commit(d->s, 1, &e);
    if (rc < 0) {
        fail(sh, d->name, "engram_step_commit", rc, &e);
        return rc;
    }
    d->t_last = now_ns();
    /* the benchmark's own history, hashed the way the session must have */
    uint32_t rows[ENGRAM_ROWS_PER_TOKEN];
    rc = engram_hash_tokens(sh->hs, h, &tok, NULL, 1, rows, &e);
    if (rc < 0) {
        fail(sh, d->name, "engram_hash_tokens", rc, &e);
        return rc;
    }
    if (sample) {
        struct dsample *ds = &d->smp[d->nsmp++];
        ds->step = step;
        memcpy(ds->rows, rows, sizeof rows);
        memcpy(ds->out, d->out, sizeof d->out);
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 1024;
        struct step_rec *p = realloc(d->rec, cap * sizeof *p);
        if (!p) {
            fail(sh, d->name, "realloc", -ENOMEM, NULL);
            return -ENOMEM;
        }
        d->rec = p;
        d->cap = cap;
    }
    d->rec[d->n++] = r;
    if (o->think_ns)
        sleep_until(now_ns() + o->think_ns);
    return 0;
}

static void *dec_main(void *arg)
{
    struct dec *d = arg;
    struct shared *sh = d->sh;
    engram_history h;
    engram_history_reset(&h); /* a new session's history */
    for (size_t step = 0; !atomic_load(&sh->failed); step++) {
        uint64_t t = now_ns();
        if (t >= sh->t_cap || (t >= sh->t_deadline && atomic_load(&sh->prefills_left) == 0))
            break;
        if (dec_step(d, step, &h) < 0)
            break;
    }
    return NULL;
}

/* ------------------------------------------------------------ prefill */

struct psample {
    size_t token;
    int table;
    uint16_t row[ENGRAM_COLUMNS * ENGRAM_ROW_VALUES];
};

struct pre {
    struct shared *sh;
    unsigned id;
    char name[32];
    engram_session *s;
    uint32_t *tok;
    size_t n, chunks;
    uint64_t start_at;         /* when to begin (absolute)                */
    uint64_t t_begin, t_end;   /* before begin, after end returned        */
    uint64_t *ready[2];        /* [chunk]: wait(t, c) returned, ns after t_begin */
    uint64_t blocked[2];       /* total time inside engram_prefill_wait(t) */
    int done;                  /* ended with 0                             */
    struct psample *smp;
    size_t nsmp;
};

/* Copies PF_SAMPLES tokens' rows of a chunk, spread over it. */
static void pre_sample(struct pre *p, int t, size_t first, size_t k, const void *rows)
{
    const uint16_t *r = rows;
    for (unsigned j = 0; j < PF_SAMPLES; j++) {
        size_t i = k > 1 ? (size_t)j * (k - 1) / (PF_SAMPLES - 1) : 0;
        struct psample *ps = &p->smp[p->nsmp++];
        ps->token = first + i;
        ps->table = t;
        memcpy(ps->row, r + i * ENGRAM_COLUMNS * ENGRAM_ROW_VALUES, sizeof ps->row);
    }
}

static int pre_wait(struct pre *p, engram_prefill *pf, int t, size_t c, const void **rows,
                    size_t *k)
{
    engram_error e = {0};
    size_t first = SIZE_MAX, nt = 0;
    uint64_t w = now_ns();
    int rc = engram_prefill_wait(pf, t, c, rows, &first, &nt, &e);
    uint64_t done = now_ns();
    p->blocked[t] += done - w;
    p->ready[t][c] = done - p->t_begin;
    if (rc < 0) {
        fail(p->sh, p->name, t ? "engram_prefill_wait(1)" : "engram_prefill_wait(0)", rc, &e);
        return rc;
    }
    size_t want = (size_t)c * CHUNK_TOKENS, wk = p->n - want < CHUNK_TOKENS ? p->n - want : CHUNK_TOKENS;
    if (first != want || nt != wk || !*rows) {
        snprintf(e.msg, sizeof e.msg, "table %d chunk %zu: tokens %zu.. (%zu), want %zu.. (%zu)", t, c,
                 first, nt, want, wk);
        fail(p->sh, p->name, "engram_prefill_wait", -EPROTO, &e);
        return -EPROTO;
    }
    pre_sample(p, t, first, nt, *rows);
    *k = nt;
    return 0;
}

static void *pre_main(void *arg)
{
    struct pre *p = arg;
    struct shared *sh = p->sh;
    const struct opts *o = sh->o;
    sleep_until(p->start_at);
    if (atomic_load(&sh->failed)) {
        atomic_fetch_sub(&sh->prefills_left, 1);
        return NULL;
    }
    engram_prefill_opts po = {.chunk_tokens = CHUNK_TOKENS, .ring_chunks = 2, .dtype = ENGRAM_BF16,
                              .table1_delay_ns = ENGRAM_PREFILL_MANUAL};
    engram_prefill *pf = NULL;
    engram_error e = {0};
    p->t_begin = now_ns();
    int rc = engram_prefill_begin(p->s, p->tok, NULL, p->n, &po, &pf, &e);
    if (rc < 0) {
        fail(sh, p->name, "engram_prefill_begin", rc, &e);
    } else if (engram_prefill_chunks(pf) != p->chunks) {
        snprintf(e.msg, sizeof e.msg, "%zu chunks, want %zu", engram_prefill_chunks(pf), p->chunks);
        fail(sh, p->name, "engram_prefill_chunks", rc = -EPROTO, &e);
    }
    for (size_t c = 0; rc == 0 && c < p->chunks && !atomic_load(&sh->failed); c++) {
        const void *rows;
        size_t k;
        if ((rc = pre_wait(p, pf, 0, c, &rows, &k)) < 0)
            break;
        if (c == 0)
            engram_prefill_start_table1(pf); /* the engine's layer signal */
        uint64_t per64 = (k + 63) / 64;
        busy_ns(LAYERS_T0 * o->layer_ns * per64);
        engram_prefill_release(pf, 0, c);
        if ((rc = pre_wait(p, pf, 1, c, &rows, &k)) < 0)
            break;
        busy_ns((LAYERS - LAYERS_T0) * o->layer_ns * per64);
        engram_prefill_release(pf, 1, c);
    }
    if (pf) {
        int erc = engram_prefill_end(pf, rc == 0 ? &e : NULL);
        p->t_end = now_ns();
        if (rc == 0 && erc < 0)
            fail(sh, p->name, "engram_prefill_end", rc = erc, &e);
        p->done = rc == 0 && !atomic_load(&sh->failed);
    }
    atomic_fetch_sub(&sh->prefills_left, 1);
    return NULL;
}

/* ------------------------------------------------------------ device floor */

struct floor {
    int ok;
    unsigned bytes;      /* read size (512, or the larger alignment the device wants) */
    double p50, p99;     /* us */
    char note[160];
};

/* Single O_DIRECT reads at queue depth 1, random aligned offsets inside the
 * two tables: what one of the library's row reads cannot beat. */
static void measure_floor(const char *path, const engram_model_info *mi, uint64_t seed,
                          struct floor *fl)
{
    memset(fl, 0, sizeof *fl);
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        snprintf(fl->note, sizeof fl->note, "open O_DIRECT: %s", strerror(errno));
        return;
    }
    void *buf = NULL;
    uint64_t *lat = malloc(FLOOR_READS * sizeof *lat);
    if (posix_memalign(&buf, 4096, 4096) != 0 || !lat) {
        snprintf(fl->note, sizeof fl->note, "out of memory");
        goto out;
    }
    uint64_t s = seed ^ 0x666c6f6f72ull;
    for (unsigned bytes = 512; bytes <= 4096; bytes *= 8) {
        int refused = 0;
        for (int i = -16; i < FLOOR_READS; i++) { /* 16 unmeasured first */
            const engram_table_info *ti = &mi->table[rnd(&s) & 1];
            uint64_t lo = (ti->offset + bytes - 1) / bytes * bytes;
            uint64_t hi = (ti->offset + ti->bytes) / bytes * bytes;
            if (hi < lo + bytes) {
                snprintf(fl->note, sizeof fl->note, "a table smaller than one %u-B block", bytes);
                goto out;
            }
            uint64_t off = lo + rnd(&s) % ((hi - lo) / bytes) * bytes;
            uint64_t t0 = now_ns();
            ssize_t got;
            do
                got = pread(fd, buf, bytes, (off_t)off);
            while (got < 0 && errno == EINTR);
            uint64_t dt = now_ns() - t0;
            if (got < 0 && errno == EINVAL && bytes == 512 && i == -16) {
                refused = 1; /* the device wants larger blocks */
                break;
            }
            if (got != (ssize_t)bytes) {
                snprintf(fl->note, sizeof fl->note, "pread of %u B at %" PRIu64 ": %s", bytes, off,
                         got < 0 ? strerror(errno) : "short read");
                goto out;
            }
            if (i >= 0)
                lat[i] = dt;
        }
        if (refused) {
            snprintf(fl->note, sizeof fl->note, "512-B O_DIRECT reads refused (EINVAL); 4096-B reads");
            continue;
        }
        struct pct p = percentiles(lat, FLOOR_READS);
        fl->ok = 1;
        fl->bytes = bytes;
        fl->p50 = p.p50;
        fl->p99 = p.p99;
        break;
    }
out:
    free(buf);
    free(lat);
    close(fd);
}

/* ------------------------------------------------------------ checking */

/* Compares every copied row with engram_model_read_bf16; 0, or the number
 * of mismatches (each reported) / -1 on a read error. */
static long check_rows(const engram_model *m, const struct dec *d, unsigned nd, const struct pre *p,
                       unsigned np, size_t *checked)
{
    const engram_hasher *hs = engram_model_hasher(m);
    uint16_t want[ENGRAM_COLUMNS * ENGRAM_ROW_VALUES];
    engram_error e = {0};
    long bad = 0;
    *checked = 0;
    for (unsigned i = 0; i < nd; i++)
        for (size_t j = 0; j < d[i].nsmp; j++) {
            const struct dsample *ds = &d[i].smp[j];
            for (int t = 0; t < ENGRAM_TABLES; t++) {
                int rc = engram_model_read_bf16(m, t, ds->rows + t * ENGRAM_COLUMNS, ENGRAM_COLUMNS,
                                                want, &e);
                if (rc < 0) {
                    fprintf(stderr, "check: engram_model_read_bf16: %s: %s\n", engram_strerror(rc), e.msg);
                    return -1;
                }
                (*checked)++;
                if (memcmp(want, ds->out + t * ENGRAM_COLUMNS * ENGRAM_ROW_VALUES, sizeof want)) {
                    if (bad++ < 10)
                        fprintf(stderr, "MISMATCH: %s step %zu table %d: delivered rows differ from the model's\n",
                                d[i].name, ds->step, t);
                }
            }
        }
    uint32_t *rows = NULL;
    for (unsigned i = 0; i < np; i++) {
        if (!p[i].done)
            continue;
        free(rows);
        rows = malloc(p[i].n * ENGRAM_ROWS_PER_TOKEN * sizeof *rows);
        engram_history h;
        engram_history_reset(&h);
        int rc = rows ? engram_hash_tokens(hs, &h, p[i].tok, NULL, p[i].n, rows, &e) : -ENOMEM;
        if (rc < 0) {
            fprintf(stderr, "check: engram_hash_tokens: %s: %s\n", engram_strerror(rc), e.msg);
            free(rows);
            return -1;
        }
        for (size_t j = 0; j < p[i].nsmp; j++) {
            const struct psample *ps = &p[i].smp[j];
            rc = engram_model_read_bf16(m, ps->table,
                                        rows + ps->token * ENGRAM_ROWS_PER_TOKEN + ps->table * ENGRAM_COLUMNS,
                                        ENGRAM_COLUMNS, want, &e);
            if (rc < 0) {
                fprintf(stderr, "check: engram_model_read_bf16: %s: %s\n", engram_strerror(rc), e.msg);
                free(rows);
                return -1;
            }
            (*checked)++;
            if (memcmp(want, ps->row, sizeof want) && bad++ < 10)
                fprintf(stderr, "MISMATCH: %s token %zu table %d: delivered rows differ from the model's\n",
                        p[i].name, ps->token, ps->table);
        }
    }
    free(rows);
    return bad;
}

/* ------------------------------------------------------------ report */

static FILE *csv;
static engram_output csv_file;

/* An exit before the end leaves no CSV and no temporary (atexit). */
static void csv_abandon(void)
{
    if (csv)
        engram_output_fclose(&csv_file, csv, 0, NULL);
    csv = NULL;
}

static void csv_row(const char *scope, const char *quantity, const char *stat, double v, const char *unit)
{
    if (csv)
        fprintf(csv, "%s,%s,%s,%.3f,%s\n", scope, quantity, stat, v, unit);
}

struct dstats {
    const char *scope, *label;
    double seconds, rows_per_s;
    size_t steps;
    struct pct lat[2], blk[2];
};

/* Decode statistics of the steps that began in [lo, hi]. */
static int decode_stats(const struct dec *d, unsigned nd, uint64_t lo, uint64_t hi, struct dstats *st)
{
    size_t n = 0;
    for (unsigned i = 0; i < nd; i++)
        n += d[i].n;
    uint64_t *v[4];
    for (int k = 0; k < 4; k++)
        v[k] = malloc((n ? n : 1) * sizeof *v[k]);
    if (!v[0] || !v[1] || !v[2] || !v[3]) {
        for (int k = 0; k < 4; k++)
            free(v[k]);
        return -ENOMEM;
    }
    size_t m = 0;
    uint64_t rows = 0;
    for (unsigned i = 0; i < nd; i++)
        for (size_t j = 0; j < d[i].n; j++) {
            const struct step_rec *r = &d[i].rec[j];
            if (r->begin_ns < lo || r->begin_ns > hi)
                continue;
            v[0][m] = r->lat[0];
            v[1][m] = r->lat[1];
            v[2][m] = r->blocked[0];
            v[3][m] = r->blocked[1];
            rows += r->rows;
            m++;
        }
    st->steps = m;
    st->seconds = (double)(hi - lo) / 1e9;
    st->rows_per_s = st->seconds > 0 ? (double)rows / st->seconds : 0;
    for (int t = 0; t < 2; t++) {
        st->lat[t] = percentiles(v[t], m);
        st->blk[t] = percentiles(v[2 + t], m);
    }
    for (int k = 0; k < 4; k++)
        free(v[k]);
    return 0;
}

static void print_dstats(const struct dstats *st, const struct floor *fl)
{
    printf("  %-15s %8.2f s %8zu %9.0f |", st->label, st->seconds, st->steps, st->rows_per_s);
    for (int t = 0; t < 2; t++) {
        printf(" %8.0f %8.0f %8.0f", st->lat[t].p50, st->lat[t].p99, st->lat[t].max);
        if (fl->ok)
            printf(" %6.1fx", st->lat[t].p50 / fl->p50);
        else
            printf("     n/a");
        printf(" |");
    }
    printf(" %8.0f %8.0f | %8.0f %8.0f\n", st->blk[0].p50, st->blk[0].p99, st->blk[1].p50, st->blk[1].p99);
    static const char *q[2][2] = {{"table0_latency", "table1_latency"}, {"table0_blocked", "table1_blocked"}};
    for (int t = 0; t < 2; t++) {
        csv_row(st->scope, q[0][t], "p50", st->lat[t].p50, "us");
        csv_row(st->scope, q[0][t], "p99", st->lat[t].p99, "us");
        csv_row(st->scope, q[0][t], "max", st->lat[t].max, "us");
        if (fl->ok)
            csv_row(st->scope, q[0][t], "p50_over_floor", st->lat[t].p50 / fl->p50, "x");
        csv_row(st->scope, q[1][t], "p50", st->blk[t].p50, "us");
        csv_row(st->scope, q[1][t], "p99", st->blk[t].p99, "us");
        csv_row(st->scope, q[1][t], "max", st->blk[t].max, "us");
    }
    csv_row(st->scope, "steps", "count", (double)st->steps, "steps");
    csv_row(st->scope, "rows_per_s", "value", st->rows_per_s, "rows/s");
    csv_row(st->scope, "window", "value", st->seconds, "s");
}

static void print_machine(const struct opts *o, const engram_model_info *mi)
{
    char cpu[256] = "unknown", line[512], date[64];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += c[1] == ' ' ? 2 : 1;
                c[strcspn(c, "\n")] = 0;
                snprintf(cpu, sizeof cpu, "%s", c);
            }
            break;
        }
    if (f)
        fclose(f);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    struct utsname u;
    uname(&u);
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench_sessions  %s  |  %s, nproc %ld, kernel %s\n", date, cpu, nproc, u.release);
    printf("model   %s (%" PRIu64 " bytes; tables %" PRIu64 " + %" PRIu64 " rows)\n", o->model,
           mi->file_bytes, mi->table[0].rows, mi->table[1].rows);
    printf("engine  %s (as asked%s), depth %u, no row cache\n", o->engine_name,
           o->engine == ENGRAM_IO_AUTO ? "; the library picks, ENGRAM_IO honoured" : "", o->depth);
    printf("params  %u sessions, %u prefills of %zu tokens (chunks of %u, ring 2, BF16, table 1 at "
           "chunk 0's layer signal), stagger %.1f ms, %.2f s (at most %.2f s), layer %.1f us x %d "
           "layers, think %.1f us, seed %" PRIu64 "\n",
           o->sessions, o->prefills, o->prompt, CHUNK_TOKENS, (double)o->stagger_ns / 1e6,
           (double)o->run_ns / 1e9, (double)o->max_ns / 1e9, (double)o->layer_ns / 1e3, LAYERS,
           (double)o->think_ns / 1e3, o->seed);
    csv_row("machine", "nproc", "value", (double)nproc, "cores");
    csv_row("model", "file_bytes", "value", (double)mi->file_bytes, "B");
}

/* ------------------------------------------------------------ main */

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

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_opts(argc, argv, &o) < 0)
        return 2;
    if (o.csv && csv_refused("bench_sessions", o.csv, o.model))
        return 2;
    if (o.csv) {
        engram_error ce;
        if (engram_output_fopen(&csv_file, o.csv, 0, &csv, &ce) < 0) {
            fprintf(stderr, "bench_sessions: %s\n", ce.msg);
            return 2;
        }
        atexit(csv_abandon);
        fprintf(csv, "scope,quantity,stat,value,unit\n");
    }
    struct shared sh = {.o = &o};
    pthread_mutex_init(&sh.mu, NULL);
    engram_error e = {0};
    int rc = engram_model_open(o.model, &sh.m, &e);
    if (rc < 0) {
        fprintf(stderr, "bench_sessions: %s: %s: %s\n", o.model, engram_strerror(rc), e.msg);
        if (rc == -ENOENT)
            fprintf(stderr, "  (make it: build/engram build %s --base 16000 --width 64 --fill normal "
                            "--seed 1)\n", o.model);
        return 1;
    }
    engram_model_info mi;
    engram_model_get_info(sh.m, &mi);
    sh.hs = engram_model_hasher(sh.m);
    sh.vocab = engram_model_layout(sh.m)->vocab;
    print_machine(&o, &mi);

    struct floor fl;
    measure_floor(o.model, &mi, o.seed, &fl);
    if (fl.ok) {
        printf("floor   %u-B O_DIRECT pread, queue depth 1, %d reads at random offsets in the tables: "
               "p50 %.1f us, p99 %.1f us%s%s\n",
               fl.bytes, FLOOR_READS, fl.p50, fl.p99, fl.note[0] ? "  -- " : "", fl.note);
        csv_row("floor", "pread_latency", "p50", fl.p50, "us");
        csv_row("floor", "pread_latency", "p99", fl.p99, "us");
        csv_row("floor", "pread_bytes", "value", fl.bytes, "B");
    } else {
        printf("floor   not measured (%s): no ratios\n", fl.note);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0 && o.sessions + o.prefills + 1 > (unsigned long)ncpu)
        printf("note    %u busy threads + the pool's I/O thread on %ld cores: the figures include CPU "
               "contention\n", o.sessions + o.prefills, ncpu);
    fflush(stdout);

    engram_pool_opts popts;
    memset(&popts, 0, sizeof popts);
    popts.reader.engine = o.engine;
    popts.reader.depth = o.depth;
    engram_pool *pool = NULL;
    struct dec *d = calloc(o.sessions ? o.sessions : 1, sizeof *d);
    struct pre *p = calloc(o.prefills ? o.prefills : 1, sizeof *p);
    pthread_t *th = calloc(o.sessions + o.prefills + 1, sizeof *th);
    unsigned started = 0;
    int exit_rc = 1;
    if (!d || !p || !th) {
        fprintf(stderr, "bench_sessions: out of memory\n");
        goto done;
    }
    rc = engram_pool_open(sh.m, &popts, &pool, &e);
    if (rc < 0) {
        fprintf(stderr, "bench_sessions: engram_pool_open: %s: %s\n", engram_strerror(rc), e.msg);
        goto done;
    }
    { /* what the library chose (the header line says what was asked) */
        engram_pool_stats ps;
        engram_pool_get_stats(pool, &ps);
        printf("reader  %s%s%s%s, %s, depth %u\n", ps.io.engine, ps.io.note[0] ? " (" : "", ps.io.note,
               ps.io.note[0] ? ")" : "", ps.io.direct ? "O_DIRECT" : "buffered", ps.io.depth);
        fflush(stdout);
    }
    uint64_t seed = o.seed;
    for (unsigned i = 0; i < o.sessions; i++) {
        d[i].sh = &sh;
        d[i].id = i;
        d[i].rng = rnd(&seed);
        snprintf(d[i].name, sizeof d[i].name, "decode session %u", i);
        d[i].smp = malloc(MAX_SAMPLES * sizeof *d[i].smp);
        if (!d[i].smp) {
            fprintf(stderr, "bench_sessions: out of memory\n");
            goto done;
        }
        if ((rc = engram_session_open(pool, &d[i].s, &e)) < 0) {
            fprintf(stderr, "bench_sessions: engram_session_open: %s: %s\n", engram_strerror(rc), e.msg);
            goto done;
        }
    }
    for (unsigned i = 0; i < o.prefills; i++) {
        p[i].sh = &sh;
        p[i].id = i;
        p[i].n = o.prompt;
        p[i].chunks = (o.prompt + CHUNK_TOKENS - 1) / CHUNK_TOKENS;
        snprintf(p[i].name, sizeof p[i].name, "prefill %u", i);
        p[i].tok = malloc(o.prompt * sizeof *p[i].tok);
        p[i].ready[0] = calloc(p[i].chunks, sizeof(uint64_t));
        p[i].ready[1] = calloc(p[i].chunks, sizeof(uint64_t));
        p[i].smp = malloc(p[i].chunks * 2 * PF_SAMPLES * sizeof *p[i].smp);
        if (!p[i].tok || !p[i].ready[0] || !p[i].ready[1] || !p[i].smp) {
            fprintf(stderr, "bench_sessions: out of memory\n");
            goto done;
        }
        uint64_t ps = rnd(&seed);
        for (size_t j = 0; j < o.prompt; j++)
            p[i].tok[j] = (uint32_t)(rnd(&ps) % sh.vocab);
        if ((rc = engram_session_open(pool, &p[i].s, &e)) < 0) {
            fprintf(stderr, "bench_sessions: engram_session_open: %s: %s\n", engram_strerror(rc), e.msg);
            goto done;
        }
    }

    atomic_store(&sh.prefills_left, (int)o.prefills);
    sh.t_start = now_ns();
    sh.t_deadline = sh.t_start + o.run_ns;
    sh.t_cap = sh.t_start + o.max_ns;
    for (unsigned i = 0; i < o.prefills; i++)
        p[i].start_at = sh.t_start + (o.sessions ? 500000000ull : 0) + i * o.stagger_ns;
    for (unsigned i = 0; i < o.sessions + o.prefills; i++) {
        int err = i < o.sessions ? pthread_create(&th[i], NULL, dec_main, &d[i])
                                 : pthread_create(&th[i], NULL, pre_main, &p[i - o.sessions]);
        if (err) {
            fail(&sh, "main", "pthread_create", -err, NULL);
            /* prefills not started never end: let the decoders stop */
            atomic_fetch_sub(&sh.prefills_left, (int)(o.sessions + o.prefills - (i > o.sessions ? i : o.sessions)));
            break;
        }
        started++;
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    uint64_t t_stop = sh.t_start;
    for (unsigned i = 0; i < o.sessions; i++)
        if (d[i].t_last > t_stop)
            t_stop = d[i].t_last;
    if (atomic_load(&sh.failed)) {
        fprintf(stderr, "bench_sessions: FAILED: %s\n", sh.msg);
        goto done;
    }

    /* ---- decode table */
    uint64_t win_lo = UINT64_MAX, win_hi = 0;
    for (unsigned i = 0; i < o.prefills; i++) {
        if (p[i].t_begin < win_lo)
            win_lo = p[i].t_begin;
        if (p[i].t_end > win_hi)
            win_hi = p[i].t_end;
    }
    struct dstats all = {.scope = "decode_all", .label = "whole run"};
    struct dstats win = {.scope = "decode_prefill_window", .label = "during prefills"};
    if (o.sessions) {
        /* the window ends where the prefills or the decode load ended */
        uint64_t win_end = win_hi < t_stop ? win_hi : t_stop;
        if (decode_stats(d, o.sessions, sh.t_start, t_stop, &all) < 0 ||
            (o.prefills && decode_stats(d, o.sessions, win_lo, win_end > win_lo ? win_end : win_lo, &win) < 0)) {
            fprintf(stderr, "bench_sessions: out of memory\n");
            goto done;
        }
        printf("\ndecode, %u sessions; latency = ready_ns[t] - begin_ns, blocked = time inside "
               "engram_step_wait(t); us\n", o.sessions);
        printf("  %-15s %10s %8s %9s | %-34s | %-34s | %-17s | %-17s\n", "", "window", "steps", "rows/s",
               "table 0: p50, p99, max, p50/floor", "table 1: p50, p99, max, p50/floor",
               "blocked t0 p50 p99", "blocked t1 p50 p99");
        print_dstats(&all, &fl);
        if (o.prefills)
            print_dstats(&win, &fl);
    }

    /* ---- prompts */
    if (o.prefills) {
        printf("\nprefills, %zu tokens each; ms after the prompt's begin\n", o.prompt);
        printf("  %-7s %9s %13s %10s %10s %7s %9s %9s  %s\n", "prompt", "start", "first chunk",
               "total", "tokens/s", "chunks", "blocked0", "blocked1", "chunk c ready: table 0 / table 1");
    }
    for (unsigned i = 0; i < o.prefills; i++) {
        const struct pre *q = &p[i];
        double first = (double)q->ready[0][0] / 1e6, total = (double)(q->t_end - q->t_begin) / 1e6;
        printf("  %-7u %9.1f %13.2f %10.2f %10.0f %7zu %9.2f %9.2f ", i,
               (double)(q->t_begin - sh.t_start) / 1e6, first, total,
               total > 0 ? (double)q->n / (total / 1e3) : 0.0, q->chunks, (double)q->blocked[0] / 1e6,
               (double)q->blocked[1] / 1e6);
        char scope[32];
        snprintf(scope, sizeof scope, "prefill%u", i);
        for (size_t c = 0; c < q->chunks; c++) {
            printf(" %.1f/%.1f", (double)q->ready[0][c] / 1e6, (double)q->ready[1][c] / 1e6);
            char what[48];
            snprintf(what, sizeof what, "chunk%zu_table0_ready", c);
            csv_row(scope, what, "value", (double)q->ready[0][c] / 1e6, "ms");
            snprintf(what, sizeof what, "chunk%zu_table1_ready", c);
            csv_row(scope, what, "value", (double)q->ready[1][c] / 1e6, "ms");
        }
        if (o.sessions && q->t_end > t_stop)
            printf("  [decode load ended %.1f ms after begin%s]", (double)(t_stop - q->t_begin) / 1e6,
                   t_stop < q->t_begin + q->ready[0][0] ? ", before the first chunk" : "");
        printf("\n");
        csv_row(scope, "decode_load_to_end", "value", o.sessions && q->t_end > t_stop ? 0.0 : 1.0, "bool");
        csv_row(scope, "start_after_decode_start", "value", (double)(q->t_begin - sh.t_start) / 1e6, "ms");
        csv_row(scope, "time_to_first_chunk", "value", first, "ms");
        csv_row(scope, "total", "value", total, "ms");
        csv_row(scope, "chunks", "count", (double)q->chunks, "chunks");
        csv_row(scope, "table0_blocked", "total", (double)q->blocked[0] / 1e6, "ms");
        csv_row(scope, "table1_blocked", "total", (double)q->blocked[1] / 1e6, "ms");
    }

    /* ---- correctness */
    size_t checked = 0;
    long bad = check_rows(sh.m, d, o.sessions, p, o.prefills, &checked);
    if (bad != 0) {
        fprintf(stderr, "bench_sessions: FAILED: %s\n",
                bad < 0 ? "the check could not read the model" : "the pool delivered wrong rows");
        if (bad > 0)
            fprintf(stderr, "  %ld of %zu checked row sets differ\n", bad, checked);
        goto done;
    }
    printf("\ncheck   %zu sets of 24 rows (one decode step in %u per session, %u tokens per prefill "
           "chunk and table) equal engram_model_read_bf16: ok\n", checked, SAMPLE_EVERY, PF_SAMPLES);

    /* one line for scripts (bench/ab_sessions.sh) */
    printf("summary");
    if (o.sessions)
        printf(" | t0 p50 %.1f p99 %.1f | t1 p50 %.1f p99 %.1f", all.lat[0].p50, all.lat[0].p99,
               all.lat[1].p50, all.lat[1].p99);
    if (o.sessions && o.prefills)
        printf(" | in prefills t0 p50 %.1f p99 %.1f t1 p50 %.1f p99 %.1f", win.lat[0].p50,
               win.lat[0].p99, win.lat[1].p50, win.lat[1].p99);
    if (o.prefills) {
        printf(" | first chunk ms");
        for (unsigned i = 0; i < o.prefills; i++)
            printf(" %.1f", (double)p[i].ready[0][0] / 1e6);
        printf(" | total ms");
        for (unsigned i = 0; i < o.prefills; i++)
            printf(" %.1f", (double)(p[i].t_end - p[i].t_begin) / 1e6);
    }
    if (o.sessions)
        printf(" | steps %zu", all.steps);
    if (fl.ok)
        printf(" | floor %.1f", fl.p50);
    printf(" (us unless ms)\n");
    exit_rc = 0;

done:
    if (d)
        for (unsigned i = 0; i < o.sessions; i++) {
            engram_session_close(d[i].s);
            free(d[i].rec);
            free(d[i].smp);
        }
    if (p)
        for (unsigned i = 0; i < o.prefills; i++) {
            engram_session_close(p[i].s);
            free(p[i].tok);
            free(p[i].ready[0]);
            free(p[i].ready[1]);
            free(p[i].smp);
        }
    engram_pool_close(pool);
    engram_model_close(sh.m);
    free(d);
    free(p);
    free(th);
    pthread_mutex_destroy(&sh.mu);
    engram_error ce;
    FILE *done = csv;
    csv = NULL;
    if (done && engram_output_fclose(&csv_file, done, exit_rc == 0, &ce) < 0 && exit_rc == 0) {
        fprintf(stderr, "bench_sessions: %s\n", ce.msg);
        exit_rc = 1;
    }
    return exit_rc;
}
