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
    "distinct rows read, read time, the I/O engine, page-cache growth of the tables'\n"
    "part of the model file and an FNV-1a 64 checksum of the final residuals (of\n"
    "every token, session by session).  Read time, summed over steps (prompts):\n"
    "  span     a decode step's begin to its last row of either table (both from\n"
    "           engram_step_get_info); a prompt's engram_prefill_begin call to the\n"
    "           engine seeing every chunk read (a wait's return or a look at\n"
    "           engram_prefill_ready between layers; how late it may be is shown);\n"
    "           --no-prefetch: the serial reads' own time\n"
    "  exposed  the engine thread's time inside engram_step_wait (prefill:\n"
    "           engram_prefill_wait) within the span\n"
    "  hidden   span - exposed: reads while the engine ran layers or applies (or\n"
    "           was not running); the part still inside the begin call is shown\n"
    "  after    time inside the waits after the span (wake-up, rows already in)\n"
    "Per table (decode): each table's own span and exposed time; they overlap.\n"
    "--json names them read_span_ns, exposed_wait_ns, hidden_ns,\n"
    "hidden_in_begin_ns, wait_outside_span_ns, with a \"definitions\" object.\n"
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

/* Where a prefill's reads stand, as the engine sees them: engram_prefill_ready
 * looked at often (an atomic load) between layers, and right before and
 * after every wait, so the end of the read span is known to within the time
 * between two looks (or, when a wait returns with the last chunk, its
 * wake-up, which lies in both the span and the time waited). */
struct look {
    engram_prefill *pf;
    size_t chunks;
    uint64_t last_ns;      /* the latest look that found a chunk not yet read */
    uint64_t seen_ns;      /* the first look that found every chunk of both
                              tables read (0: not yet)                       */
    uint64_t late_ns;      /* how much of the span may follow the last read,
                              apart from a wait's wake-up                    */
};

/* wait_w0: the entry of the wait that just returned (0 if none): if it
 * returned with the last chunk, the chunk was read after last_ns and the
 * span's end is the wait's return. */
static void look(struct look *lk, uint64_t wait_w0)
{
    if (!lk || lk->seen_ns)
        return;
    uint64_t now = ns_now();
    if (engram_prefill_ready(lk->pf, 0) >= lk->chunks && engram_prefill_ready(lk->pf, 1) >= lk->chunks) {
        lk->seen_ns = now;
        lk->late_ns = (wait_w0 ? wait_w0 : now) - lk->last_ns;
    } else {
        lk->last_ns = now;
    }
}

/* A layer of the simulated engine: busy work (not sleep) for us, looking
 * at a prefill's progress (lk, or NULL) as it goes. */
static volatile double sink_value;
static void busy(uint64_t us, struct look *lk)
{
    uint64_t end = ns_now() + us * 1000;
    double x = 1.0;
    while (ns_now() < end) {
        for (int i = 0; i < 200; i++)
            x = x * 1.0000001 + 1e-9;
        look(lk, 0);
    }
    look(lk, 0);
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

/* Read time, summed over decode steps or prompts: the span of the reads,
 * the part of it the engine spent inside the waits (exposed), the rest of
 * the time inside the waits (after the span: wake-up, waits for rows
 * already in), and, for prefill, how late the span's end may have been seen. */
struct reads {
    uint64_t span_ns, exposed_ns, outside_ns, late_ns;
    uint64_t in_begin_ns;  /* of the span's non-waiting part: still inside the begin call */
};

/* One call to engram_step_wait on the engine's thread. */
struct wait {
    uint64_t w0, w1;
    int table;
};

/* The part of [a0, a1] inside [b0, b1]. */
static uint64_t overlap_ns(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1)
{
    uint64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

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
    /* measurements (what they cover: def_dec, def_pre below) */
    uint64_t prefill_ns, decode_ns;
    struct reads pre, dec;
    uint64_t dec_read_t[2], dec_exposed_t[2]; /* per table                */
    struct wait *waits;    /* [2B] the waits of the step in progress       */
    size_t n_waits;
    uint64_t begun_ns;     /* when the step's begin call returned          */
    uint64_t *step_lat;
    size_t n_steps;
    unsigned inconsistent; /* figures that broke their own definitions     */
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

/* Prefill of one session's prompt through the prefetch ring (or, without
 * prefetch, chunk by chunk with serial reads on the engine's thread). */
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
    struct look lk = {0}, *lkp = NULL;
    uint64_t in_wait = 0, t_begin = ns_now(), wait_lo = UINT64_MAX;
    struct reads acc = {0};
    if (R->prefetch) {
        rc = engram_prefill_begin(q->s, q->tok, NULL, n, &o, &pf, err);
        acc.in_begin_ns = ns_now() - t_begin;
        lk = (struct look){.pf = pf, .chunks = chunks, .last_ns = t_begin};
        lkp = pf ? &lk : NULL;
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
            rc = engram_hash_tokens(engram_model_hasher(R->m), &h, q->tok + first, NULL, k, rows48, err);
            uint64_t r0 = ns_now();
            for (int t = 0; t < 2 && rc == 0; t++)
                rc = engram_reader_batch(rd, t, rows48, k, (engram_dtype)R->rdt, serial[t], err);
            uint64_t dt = ns_now() - r0;
            acc.span_ns += dt; /* the reads block the engine: all exposed */
            acc.exposed_ns += dt;
            rows[0] = serial[0];
            rows[1] = serial[1];
        }
        for (unsigned l = 0; l < R->layers && rc == 0; l++) {
            if (l == 1 || l == 14) {
                int t = l == 14;
                if (R->prefetch) {
                    look(lkp, 0);
                    uint64_t w0 = ns_now();
                    rc = engram_prefill_wait(pf, t, c, &rows[t], NULL, NULL, err);
                    uint64_t w1 = ns_now();
                    in_wait += w1 - w0;
                    wait_lo = w0 < wait_lo ? w0 : wait_lo;
                    /* the waits' parts after the span, known once it ends */
                    if (lk.seen_ns && w1 > lk.seen_ns)
                        acc.outside_ns += w1 - (w0 > lk.seen_ns ? w0 : lk.seen_ns);
                    look(lkp, w0);
                }
                if (rc == 0)
                    rc = apply_layer(R, t, rows[t], ENGRAM_COLUMNS * R->rowb, q->x + first * R->per, k, err);
                if (R->prefetch)
                    engram_prefill_release(pf, t, c);
                look(lkp, 0);
            } else {
                if (l == 2 && R->prefetch && c == 0)
                    engram_prefill_start_table1(pf); /* layer signal: 14's reads start */
                busy(layer_cost, lkp);
            }
        }
    }
    if (pf) {
        look(lkp, 0); /* every chunk was waited for: all read, unless a wait failed */
        int erc = engram_prefill_end(pf, rc == 0 ? err : NULL);
        if (rc == 0)
            rc = erc;
    } else if (rc == 0) {
        rc = engram_session_set_history(q->s, &h, err);
    }
    if (rc == 0 && R->prefetch && !lk.seen_ns) {
        R->inconsistent++; /* every chunk waited for, yet not all ready: cannot happen */
    } else if (rc == 0 && R->prefetch) {
        /* the span: from the begin call to the first look that saw every
         * chunk in; the waits all lie after the begin, so what of them is
         * not outside the span is inside it */
        acc.span_ns = lk.seen_ns - t_begin;
        acc.late_ns = lk.late_ns;
        acc.exposed_ns = in_wait - acc.outside_ns;
        if (wait_lo < t_begin || acc.exposed_ns > acc.span_ns)
            R->inconsistent++; /* cannot happen: reported if it does */
    }
    if (rc == 0) {
        R->pre.span_ns += acc.span_ns;
        R->pre.exposed_ns += acc.exposed_ns;
        R->pre.outside_ns += acc.outside_ns;
        R->pre.late_ns += acc.late_ns;
        R->pre.in_begin_ns += acc.in_begin_ns;
    }
    engram_reader_close(rd);
    free(rows48);
    free(serial[0]);
    free(serial[1]);
    return rc;
}

/* Waits for table t's rows of session s, timing it. */
static int timed_wait(struct run *R, engram_session *s, int t, engram_error *err)
{
    uint64_t w0 = ns_now();
    int rc = engram_step_wait(s, t, err);
    R->waits[R->n_waits++] = (struct wait){w0, ns_now(), t};
    return rc;
}

/* A step's read figures from its sessions' begin and ready times and the
 * engine's waits (called once every wait of the step has returned 0, so
 * every ready time is set). */
static void account_step(struct run *R, engram_session *const *sv)
{
    uint64_t begin = UINT64_MAX, ready[2] = {0, 0};
    for (unsigned b = 0; b < R->B; b++) {
        engram_step_info info;
        engram_step_get_info(sv[b], &info);
        begin = info.begin_ns < begin ? info.begin_ns : begin;
        for (int t = 0; t < 2; t++)
            ready[t] = info.ready_ns[t] > ready[t] ? info.ready_ns[t] : ready[t];
    }
    uint64_t end = ready[0] > ready[1] ? ready[0] : ready[1];
    /* The library's clock is ours (CLOCK_MONOTONIC) and the waits come
     * after the begin returned, so neither can precede the begin; a step
     * that says otherwise is counted and left out, not clamped. */
    int bad = ready[0] < begin || ready[1] < begin;
    bad |= R->begun_ns < begin;
    for (size_t i = 0; i < R->n_waits; i++)
        bad |= R->waits[i].w0 < R->begun_ns;
    if (bad) {
        R->inconsistent++;
        return;
    }
    for (size_t i = 0; i < R->n_waits; i++) {
        const struct wait *w = &R->waits[i];
        /* the waits are calls on one thread, so they do not overlap each
         * other: their parts inside the span add up to at most the span */
        uint64_t in = overlap_ns(w->w0, w->w1, begin, end);
        R->dec.exposed_ns += in;
        R->dec.outside_ns += w->w1 - w->w0 - in;
        R->dec_exposed_t[w->table] += overlap_ns(w->w0, w->w1, begin, ready[w->table]);
    }
    R->dec.span_ns += end - begin;
    /* the engine was inside engram_step_begin_batch from before begin_ns
     * until begun_ns, and waited only after it */
    R->dec.in_begin_ns += (R->begun_ns < end ? R->begun_ns : end) - begin;
    for (int t = 0; t < 2; t++)
        R->dec_read_t[t] += ready[t] - begin;
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
    R->n_waits = 0;
    int rc = engram_step_begin_batch(sv, tok, NULL, B, (engram_dtype)R->rdt, outs, err);
    R->begun_ns = ns_now();
    for (unsigned l = 0; l < R->layers && rc == 0; l++) {
        if (!R->overlap && l == 0) /* every read waited for before any layer */
            for (unsigned b = 0; b < B && rc == 0; b++)
                for (int t = 0; t < 2 && rc == 0; t++)
                    rc = timed_wait(R, sv[b], t, err);
        if (l == 1 || l == 14) {
            int t = l == 14;
            for (unsigned b = 0; b < B && rc == 0 && R->overlap; b++)
                rc = timed_wait(R, sv[b], t, err);
            if (rc == 0 && t == 1)
                account_step(R, sv);
            /* the step's [B][48] rows in place: table t's 24 of each token */
            if (rc == 0)
                rc = apply_layer(R, t, R->outs + (size_t)t * ENGRAM_COLUMNS * R->rowb,
                                 ENGRAM_ROWS_PER_TOKEN * R->rowb, R->xs, B, err);
        } else {
            busy(R->layer_us, NULL);
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

/* ------------------------------------------------------------ the report */

/* What each read figure covers: the JSON's "definitions", the text's legend. */
static const char *const def_dec[][2] = {
    {"decode.read_span_ns", "Sum over decode steps of the latest ready_ns of any table of any session in "
     "the step (engram_step_get_info) minus the step's begin_ns (the earliest of its sessions')."},
    {"decode.exposed_wait_ns", "Sum over decode steps of the engine thread's wall time inside "
     "engram_step_wait calls (both tables, all sessions) that falls inside the step's read span."},
    {"decode.hidden_ns", "read_span_ns - exposed_wait_ns: read time during which the engine thread was not "
     "inside a wait (running layers or applies, or not running at all)."},
    {"decode.hidden_in_begin_ns", "The part of hidden_ns during which the engine thread was still inside "
     "engram_step_begin_batch, after the step's begin_ns (queueing the reads and waking the I/O thread, "
     "which on a busy machine may take the engine's CPU): not hidden behind any layer."},
    {"decode.wait_outside_span_ns", "The rest of the time inside engram_step_wait, after the step's last "
     "row was in (wake-up, waits for rows already in); exposed_wait_ns + this = all time inside the waits."},
    {"decode.per_table.read_span_ns", "Per table t, the sum over steps of the latest ready_ns[t] minus the "
     "step's begin_ns; the two overlap in time and do not add up to read_span_ns."},
    {"decode.per_table.exposed_wait_ns", "Per table t, the time inside engram_step_wait(s, t) calls within "
     "[begin_ns, latest ready_ns[t]] of each step."},
};
static const char *const def_pre[][2] = {
    {"prefill.read_span_ns", "Sum over prompts of the time from the engram_prefill_begin call to the first "
     "moment the engine saw every chunk of both tables read: the return of the wait that got the last "
     "chunk, or a look at engram_prefill_ready (inside the layers' busy loops, around every wait and "
     "apply) that found them all read."},
    {"prefill.read_span_late_max_ns", "Sum over prompts of the most that read_span_ns (and so hidden_ns) "
     "may run past the last chunk's read: from the last look that found a chunk unread to the look that "
     "found all read, or to the entry of the wait that returned with the last chunk (that wait's wake-up "
     "is in both read_span_ns and exposed_wait_ns)."},
    {"prefill.exposed_wait_ns", "Sum over prompts of the engine thread's wall time inside "
     "engram_prefill_wait calls that falls inside the prompt's read span."},
    {"prefill.hidden_ns", "read_span_ns - exposed_wait_ns: read time during which the engine thread was not "
     "inside a wait."},
    {"prefill.hidden_in_begin_ns", "The part of hidden_ns the engine thread spent inside the "
     "engram_prefill_begin call."},
    {"prefill.wait_outside_span_ns", "Time inside engram_prefill_wait after the read span ended."},
};
static const char *const def_pre_serial[][2] = {
    {"prefill.read_span_ns", "Sum over the prompts' chunks of the time inside the serial engram_reader_batch "
     "calls (both tables) on the engine's thread (--no-prefetch)."},
    {"prefill.read_span_late_max_ns", "0: the serial reads are timed directly."},
    {"prefill.exposed_wait_ns", "Equal to read_span_ns: serial reads block the engine thread."},
    {"prefill.hidden_ns", "0: nothing runs beside serial reads."},
    {"prefill.hidden_in_begin_ns", "0: no prefill is begun."},
    {"prefill.wait_outside_span_ns", "0: no waits."},
};
#define NDEFS(a) (sizeof(a) / sizeof *(a))

struct report {
    const char *path, *device;
    uint64_t layer_us, threads;
    engram_layer_info li;
    size_t prompt_tokens;
    engram_pool_stats ps;
    uint64_t p50, p99;
    int64_t growth;
    int count_err;
    uint64_t fnv;
};

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static void print_json(const struct run *R, const struct report *o)
{
    const engram_pool_stats *ps = &o->ps;
    double pre_s = (double)R->prefill_ns / 1e9, dec_s = (double)R->decode_ns / 1e9;
    size_t dec_tokens = R->n_steps * R->B;
    printf("{\"model\":");
    cli_json_string(stdout, o->path);
    printf(",\"device\":");
    cli_json_string(stdout, o->device);
    printf(",\"sessions\":%u,\"layers\":%u,\"layer_us\":%" PRIu64 ",\"threads\":%" PRIu64
           ",\"overlap\":%s,\"prefetch\":%s,\"width\":%u,\"streams\":%u",
           R->B, R->layers, o->layer_us, o->threads, R->overlap ? "true" : "false",
           R->prefetch ? "true" : "false", o->li.width, o->li.streams);
    printf(",\"prefill\":{\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,\"rows_requested\":%" PRIu64
           ",\"rows_read\":%" PRIu64 ",\"chunks\":%" PRIu64 ",\"read_span_ns\":%" PRIu64
           ",\"read_span_late_max_ns\":%" PRIu64 ",\"exposed_wait_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64
           ",\"hidden_in_begin_ns\":%" PRIu64 ",\"wait_outside_span_ns\":%" PRIu64 "}",
           o->prompt_tokens, pre_s, pre_s > 0 ? (double)o->prompt_tokens / pre_s : 0.0,
           ps->prefill_rows_requested, ps->prefill_rows_read, ps->prefill_chunks, R->pre.span_ns,
           R->pre.late_ns, R->pre.exposed_ns, R->pre.span_ns - R->pre.exposed_ns, R->pre.in_begin_ns,
           R->pre.outside_ns);
    printf(",\"decode\":{\"steps\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,"
           "\"step_p50_ns\":%" PRIu64 ",\"step_p99_ns\":%" PRIu64 ",\"rows_requested\":%" PRIu64
           ",\"rows_read\":%" PRIu64 ",\"rounds\":%" PRIu64 ",\"read_span_ns\":%" PRIu64
           ",\"exposed_wait_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64 ",\"hidden_in_begin_ns\":%" PRIu64
           ",\"wait_outside_span_ns\":%" PRIu64 ",\"per_table\":{\"read_span_ns\":[%" PRIu64 ",%" PRIu64 "],\"exposed_wait_ns\":[%" PRIu64
           ",%" PRIu64 "]}}",
           R->n_steps, dec_tokens, dec_s, dec_s > 0 ? (double)dec_tokens / dec_s : 0.0, o->p50, o->p99,
           ps->step_rows_requested, ps->step_rows_read, ps->rounds, R->dec.span_ns, R->dec.exposed_ns,
           R->dec.span_ns - R->dec.exposed_ns, R->dec.in_begin_ns, R->dec.outside_ns, R->dec_read_t[0], R->dec_read_t[1],
           R->dec_exposed_t[0], R->dec_exposed_t[1]);
    printf(",\"inconsistent\":%u,\"definitions\":{", R->inconsistent);
    const char *const(*pre)[2] = R->prefetch ? def_pre : def_pre_serial;
    size_t n_pre = R->prefetch ? NDEFS(def_pre) : NDEFS(def_pre_serial);
    for (size_t i = 0; i < NDEFS(def_dec) + n_pre; i++) {
        const char *const *d = i < NDEFS(def_dec) ? def_dec[i] : pre[i - NDEFS(def_dec)];
        printf("%s", i ? "," : "");
        cli_json_string(stdout, d[0]);
        putchar(':');
        cli_json_string(stdout, d[1]);
    }
    printf(",\"inconsistent\":");
    cli_json_string(stdout, "Steps or prompts whose timestamps contradict the definitions (a ready time or "
                        "a wait before the begin, a prefill never seen complete): left out of every "
                        "figure, never clamped; 0 expected.");
    printf("},\"io\":{\"engine\":");
    cli_json_string(stdout, ps->io.engine);
    printf(",\"direct\":%d,\"note\":", ps->io.direct);
    cli_json_string(stdout, ps->io.note);
    printf(",\"host_registered\":%" PRIu64 "},\"page_cache_growth_pages\":", ps->io.host_registered);
    if (o->count_err) {
        printf("null,\"page_cache_error\":");
        cli_json_string(stdout, strerror(-o->count_err));
    } else {
        printf("%" PRId64, o->growth);
    }
    printf(",\"checksum\":\"%016" PRIx64 "\"}\n", o->fnv);
}

/* The report for people; the legend says what the read figures cover. */
static void print_text(const struct run *R, const struct report *o)
{
    const engram_pool_stats *ps = &o->ps;
    double pre_s = (double)R->prefill_ns / 1e9, dec_s = (double)R->decode_ns / 1e9;
    printf("engram run: %s, W %u, %u streams; %u sessions, %u layers of %" PRIu64
           " us (Engram at 1 and 14 on the %s), %" PRIu64 " apply thread%s%s%s\n",
           o->path, o->li.width, o->li.streams, R->B, R->layers, o->layer_us, o->device, o->threads,
           o->threads > 1 ? "s" : "", R->overlap ? "" : ", reads waited before layer 0",
           R->prefetch ? "" : ", no prefetch");
    printf("prefill: %zu tokens in %.3f s = %.1f tokens/s; %" PRIu64 " rows requested, %" PRIu64
           " distinct read (%" PRIu64 " chunks)%s\n",
           o->prompt_tokens, pre_s, pre_s > 0 ? (double)o->prompt_tokens / pre_s : 0.0,
           ps->prefill_rows_requested, ps->prefill_rows_read, ps->prefill_chunks,
           R->prefetch ? "" : " (the serial readers' rows are not counted here)");
    if (R->prefetch)
        printf("         reads: span %.3f ms (end seen at most %.1f us late), exposed %.3f ms, hidden %.3f ms "
               "(%.1f%%; %.3f ms of it in the begin call); waiting after the span %.3f ms\n",
               (double)R->pre.span_ns / 1e6, (double)R->pre.late_ns / 1e3, (double)R->pre.exposed_ns / 1e6,
               (double)(R->pre.span_ns - R->pre.exposed_ns) / 1e6,
               pct(R->pre.span_ns - R->pre.exposed_ns, R->pre.span_ns), (double)R->pre.in_begin_ns / 1e6,
               (double)R->pre.outside_ns / 1e6);
    else
        printf("         reads: serial, on the engine's thread: %.3f ms, all exposed\n",
               (double)R->pre.span_ns / 1e6);
    printf("decode:  %zu steps x %u sessions in %.3f s = %.1f tokens/s; step p50 %.3f ms, p99 %.3f ms\n",
           R->n_steps, R->B, dec_s, dec_s > 0 ? (double)(R->n_steps * R->B) / dec_s : 0.0,
           (double)o->p50 / 1e6, (double)o->p99 / 1e6);
    printf("         rows: %" PRIu64 " requested, %" PRIu64 " distinct read (%.1f%% saved by merging "
           "sessions' reads), %" PRIu64 " rounds\n", ps->step_rows_requested, ps->step_rows_read,
           ps->step_rows_requested ? 100.0 - pct(ps->step_rows_read, ps->step_rows_requested) : 0.0,
           ps->rounds);
    printf("         reads: span %.3f ms, exposed %.3f ms, hidden %.3f ms (%.1f%%; %.3f ms of it in the "
           "begin call); waiting after the last row %.3f ms\n", (double)R->dec.span_ns / 1e6,
           (double)R->dec.exposed_ns / 1e6, (double)(R->dec.span_ns - R->dec.exposed_ns) / 1e6,
           pct(R->dec.span_ns - R->dec.exposed_ns, R->dec.span_ns), (double)R->dec.in_begin_ns / 1e6,
           (double)R->dec.outside_ns / 1e6);
    printf("         per table (spans overlap, no sum): table 0 span %.3f ms, exposed %.3f ms; "
           "table 1 span %.3f ms, exposed %.3f ms\n", (double)R->dec_read_t[0] / 1e6,
           (double)R->dec_exposed_t[0] / 1e6, (double)R->dec_read_t[1] / 1e6,
           (double)R->dec_exposed_t[1] / 1e6);
    const char *note = ps->io.note && ps->io.note[0] ? ps->io.note : NULL;
    printf("io:      %s%s%s%s%s; page cache of the tables ", ps->io.engine,
           ps->io.direct ? ", O_DIRECT" : ", buffered", note ? " (" : "", note ? note : "", note ? ")" : "");
    if (o->count_err)
        printf("not counted (%s: %s)\n", o->path, strerror(-o->count_err));
    else
        printf("grew by %" PRId64 " pages\n", o->growth);
    if (ps->io.host_registered)
        printf("         the reader's buffers (%" PRIu64 " KiB, where reads land) and the prefill "
               "ring page-locked for the GPU's copies\n", ps->io.host_registered >> 10);
    printf("checksum of the final residuals (FNV-1a 64): %016" PRIx64 "\n", o->fnv);
    printf("legend:  decode span = per step, from its begin to its last row of either table\n"
           "         (engram_step_get_info), summed; prefill span = from engram_prefill_begin to the\n"
           "         engine seeing the last chunk of both tables read; exposed = the engine's time inside\n"
           "         the waits within the span; hidden = span - exposed; --json: \"definitions\"\n");
    if (R->inconsistent)
        printf("warning: %u steps or prompts had timestamps that contradict the definitions; left out\n",
               R->inconsistent);
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
    R.waits = malloc(2 * B * sizeof *R.waits);
    R.outs = malloc(B * ENGRAM_ROWS_PER_TOKEN * 512); /* room for BF16 or raw rows */
    R.xs = malloc(B * (R.per ? R.per : 1) * 4);
    if (rc == 0 && (!R.ss || !R.step_lat || !R.waits || !R.outs || !R.xs))
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
        struct report o = {.path = path, .device = device, .layer_us = X, .threads = threads, .li = li,
                           .prompt_tokens = prompt_tokens, .fnv = fnv};
        engram_pool_get_stats(R.pool, &o.ps);
        o.p50 = quantile(R.step_lat, R.n_steps, 0.5);
        o.p99 = quantile(R.step_lat, R.n_steps, 0.99);
        o.growth = pages0 >= 0 && pages1 >= 0 ? pages1 - pages0 : 0;
        o.count_err = (int)(pages0 < 0 ? pages0 : pages1 < 0 ? pages1 : 0);
        if (json)
            print_json(&R, &o);
        else
            print_text(&R, &o);
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
    free(R.waits);
    free(R.outs);
    free(R.xs);
    free(R.ring);
    free(tokens);
    return st;
}
