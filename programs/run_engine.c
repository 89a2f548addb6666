/*
 * run_engine.c - the simulated engine of `engram run` (run.c sets it up):
 * layers of busy work, the Engram layers at 1 and 14 applied on the
 * device, a prompt prefilled chunk by chunk through the prefetch ring and
 * decode steps of every session together, and the timing of their reads:
 * what of each read's span the engine spent waiting (exposed) and what ran
 * beside it (hidden).  run_report.c's definitions say what each figure
 * covers.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_plugin.h"
#include "run.h"

uint64_t run_ns_now(void)
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
    unsigned tables;       /* of the model: 2, or 1 (PLE)                    */
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
    uint64_t now = run_ns_now();
    if (engram_prefill_ready(lk->pf, 0) >= lk->chunks &&
        (lk->tables < 2 || engram_prefill_ready(lk->pf, 1) >= lk->chunks)) {
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
    uint64_t end = run_ns_now() + us * 1000;
    double x = 1.0;
    while (run_ns_now() < end) {
        for (int i = 0; i < 200; i++)
            x = x * 1.0000001 + 1e-9;
        look(lk, 0);
    }
    look(lk, 0);
    sink_value = x;
}

/* busy() for --shard's TP prefill: the layer's time in slices of at
 * most PUMP_US, the chunks' combines begun and progressed between them
 * (Open MPI moves a large collective only inside MPI calls). */
#define PUMP_US 50
static int busy_pumping(struct run *R, uint64_t us, struct look *lk, engram_error *err)
{
    int rc = shard_prefill_pump(R, err);
    for (uint64_t done = 0; done < us && rc == 0; done += PUMP_US) {
        busy(us - done < PUMP_US ? us - done : PUMP_US, lk);
        rc = shard_prefill_pump(R, err);
    }
    return rc;
}

/* The part of [a0, a1] inside [b0, b1]. */
static uint64_t overlap_ns(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1)
{
    uint64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

/* The prefill options of every prompt of a run. */
engram_prefill_opts run_prefill_opts(const struct run *R)
{
    engram_prefill_opts o = {.chunk_tokens = ENGRAM_BATCH_TOKENS, .ring_chunks = 2,
                             .dtype = (engram_dtype)R->rdt, .table1_delay_ns = ENGRAM_PREFILL_MANUAL,
                             .ring_mem = R->ring, .ring_bytes = R->ring_len};
    return o;
}

/* The engine layer l applies table t (0 or 1), or -1 for busy work. */
static int engram_table_at(const struct run *R, unsigned l)
{
    for (unsigned t = 0; t < R->tables; t++)
        if (R->at[t] == l)
            return (int)t;
    return -1;
}

/* Applies table t's layer to n tokens whose rows are `stride` bytes apart. */
static int apply_layer(struct run *R, int t, const void *rows, size_t stride, float *x, size_t n,
                       engram_error *err)
{
    return dev_apply(R->D[t], rows, stride, x, NULL, n, NULL, err);
}

/* A prefilled prompt's read figures, added to R->pre.  acc holds what was
 * timed as it ran (serial reads; the begin call; the waits' parts after
 * the span); with prefetch the rest follows from the looks (lk), the begin
 * call's start (t_begin), the time inside the waits (in_wait) and the
 * earliest wait's entry (wait_lo). */
static void account_prompt(struct run *R, const struct look *lk, struct reads *acc, uint64_t t_begin,
                           uint64_t in_wait, uint64_t wait_lo)
{
    if (R->prefetch && !lk->seen_ns) {
        R->inconsistent++; /* every chunk waited for, yet not all ready: cannot happen */
    } else if (R->prefetch) {
        /* the span: from the begin call to the first look that saw every
         * chunk in; the waits all lie after the begin, so what of them is
         * not outside the span is inside it */
        acc->span_ns = lk->seen_ns - t_begin;
        acc->late_ns = lk->late_ns;
        acc->exposed_ns = in_wait - acc->outside_ns;
        if (wait_lo < t_begin || acc->exposed_ns > acc->span_ns)
            R->inconsistent++; /* cannot happen: reported if it does */
    }
    R->pre.span_ns += acc->span_ns;
    R->pre.exposed_ns += acc->exposed_ns;
    R->pre.outside_ns += acc->outside_ns;
    R->pre.late_ns += acc->late_ns;
    R->pre.in_begin_ns += acc->in_begin_ns;
}

/* Prefill of one session's prompt through the prefetch ring (or, without
 * prefetch, chunk by chunk with serial reads on the engine's thread). */
int run_prefill(struct run *R, struct sess *q, engram_error *err)
{
    size_t n = q->prompt;
    if (n == 0)
        return 0;
    engram_prefill_opts o = run_prefill_opts(R);
    engram_prefill *pf = NULL;
    engram_reader *rd = NULL;
    uint32_t *rows48 = NULL;
    uint8_t *serial[2] = {NULL, NULL};
    engram_history h;
    engram_session_history(q->s, &h);
    int rc = 0;
    size_t chunk = ENGRAM_BATCH_TOKENS, chunks = (n + chunk - 1) / chunk;
    struct look lk = {0}, *lkp = NULL;
    uint64_t in_wait = 0, t_begin = run_ns_now(), wait_lo = UINT64_MAX;
    struct reads acc = {0};
    if (R->prefetch) {
        rc = engram_prefill_begin(q->s, q->tok, NULL, n, &o, &pf, err);
        acc.in_begin_ns = run_ns_now() - t_begin;
        lk = (struct look){.pf = pf, .chunks = chunks, .tables = R->tables, .last_ns = t_begin};
        lkp = pf ? &lk : NULL;
        if (pf && R->sh.tp)
            shard_prefill_start(R, pf, chunks, q->tok, &h);
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
            uint64_t r0 = run_ns_now();
            for (int t = 0; t < 2 && rc == 0; t++)
                rc = engram_reader_batch(rd, t, rows48, k, (engram_dtype)R->rdt, serial[t], err);
            uint64_t dt = run_ns_now() - r0;
            acc.span_ns += dt; /* the reads block the engine: all exposed */
            acc.exposed_ns += dt;
            rows[0] = serial[0];
            rows[1] = serial[1];
        }
        for (unsigned l = 0; l < R->layers && rc == 0; l++) {
            int t = engram_table_at(R, l);
            if (t >= 0) {
                if (R->prefetch) {
                    look(lkp, 0);
                    uint64_t w0 = run_ns_now();
                    rc = engram_prefill_wait(pf, t, c, &rows[t], NULL, NULL, err);
                    uint64_t w1 = run_ns_now();
                    in_wait += w1 - w0;
                    wait_lo = w0 < wait_lo ? w0 : wait_lo;
                    /* the waits' parts after the span, known once it ends */
                    if (lk.seen_ns && w1 > lk.seen_ns)
                        acc.outside_ns += w1 - (w0 > lk.seen_ns ? w0 : lk.seen_ns);
                    look(lkp, w0);
                }
                if (rc == 0 && R->ple) /* the session's convolution state carried */
                    rc = engram_prefill_apply(pf, c, R->ple_a, q->x + first * R->per, ENGRAM_F32, err);
                else if (rc == 0 && R->sh.tp) { /* this rank's share: combined first */
                    const void *all = NULL;
                    rc = shard_prefill_combine(R, t, c, &all, err);
                    if (rc == 0)
                        rc = apply_layer(R, t, all, ENGRAM_COLUMNS * R->rowb, q->x + first * R->per, k, err);
                    shard_prefill_done(R, t);
                } else if (rc == 0)
                    rc = apply_layer(R, t, rows[t], ENGRAM_COLUMNS * R->rowb, q->x + first * R->per, k, err);
                if (R->prefetch)
                    engram_prefill_release(pf, t, c);
                look(lkp, 0);
            } else {
                if (l == 2 && R->prefetch && c == 0 && R->tables == 2)
                    engram_prefill_start_table1(pf); /* layer signal: 14's reads start */
                if (R->sh.tp && pf && rc == 0) /* combines begun as chunks come in, progressed */
                    rc = busy_pumping(R, layer_cost, lkp, err);
                else
                    busy(layer_cost, lkp);
            }
        }
    }
    if (pf && R->sh.tp)
        shard_prefill_stop(R); /* after a failure: its combines given up (the job ends) */
    if (pf) {
        look(lkp, 0); /* every chunk was waited for: all read, unless a wait failed */
        int erc = engram_prefill_end(pf, rc == 0 ? err : NULL);
        if (rc == 0)
            rc = erc;
    } else if (rc == 0) {
        rc = engram_session_set_history(q->s, &h, err);
    }
    if (rc == 0)
        account_prompt(R, &lk, &acc, t_begin, in_wait, wait_lo);
    engram_reader_close(rd);
    free(rows48);
    free(serial[0]);
    free(serial[1]);
    return rc;
}

/* Waits for table t's rows of session s, timing it. */
static int timed_wait(struct run *R, engram_session *s, int t, engram_error *err)
{
    uint64_t w0 = run_ns_now();
    int rc = engram_step_wait(s, t, err);
    R->waits[R->n_waits++] = (struct wait){w0, run_ns_now(), t};
    return rc;
}

/* A step's read figures from its sessions' begin and ready times and the
 * engine's waits (called once every wait of the step has returned 0, so
 * every ready time is set). */
static void account_step(struct run *R, engram_session *const *sv)
{
    uint64_t begin = UINT64_MAX, ready[2] = {0, 0};
    const unsigned T = R->tables;
    for (unsigned b = 0; b < R->B; b++) {
        engram_step_info info;
        engram_step_get_info(sv[b], &info);
        begin = info.begin_ns < begin ? info.begin_ns : begin;
        for (unsigned t = 0; t < T; t++)
            ready[t] = info.ready_ns[t] > ready[t] ? info.ready_ns[t] : ready[t];
    }
    if (T == 1)
        ready[1] = ready[0]; /* one table: its span is the step's */
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
    for (unsigned t = 0; t < T; t++)
        R->dec_read_t[t] += ready[t] - begin;
}

/* One decode step of every session together. */
int run_decode_step(struct run *R, size_t step, engram_error *err)
{
    if (R->sh.xdp) /* --dp on shard files: rows through the exchange */
        return shard_dp_step(R, step, err);
    unsigned B = R->B;
    engram_session *sv[1024];
    uint32_t tok[1024];
    void *outs[1024];
    for (unsigned b = 0; b < B; b++) {
        struct sess *q = &R->ss[b];
        sv[b] = q->s;
        tok[b] = q->tok[q->prompt + step];
        outs[b] = R->outs + (size_t)b * R->rpt * R->rowb;
        memcpy(R->xs + (size_t)b * R->per, q->x + (q->prompt + step) * R->per, R->per * 4);
    }
    uint64_t t0 = run_ns_now();
    R->n_waits = 0;
    R->sh.began[0] = R->sh.began[1] = 0;
    int rc = engram_step_begin_batch(sv, tok, NULL, B, (engram_dtype)R->rdt, outs, err);
    R->begun_ns = run_ns_now();
    for (unsigned l = 0; l < R->layers && rc == 0; l++) {
        if (!R->overlap && l == 0) /* every read waited for before any layer */
            for (unsigned b = 0; b < B && rc == 0; b++)
                for (int t = 0; t < (int)R->tables && rc == 0; t++)
                    rc = timed_wait(R, sv[b], t, err);
        int t = engram_table_at(R, l);
        if (t >= 0) {
            for (unsigned b = 0; b < B && rc == 0 && R->overlap; b++)
                rc = timed_wait(R, sv[b], t, err);
            const uint8_t *all = NULL;
            if (rc == 0 && R->sh.tp) /* the ranks' shares of t's rows, combined */
                rc = shard_step_wait(R, t, &all, err);
            if (rc == 0 && t == (int)R->tables - 1)
                account_step(R, sv);
            if (rc == 0 && all) {
                /* [B][24] rows of table t, as the one-process run reads them
                 * from its [B][48]: the same applier, another stride */
                rc = apply_layer(R, t, all, ENGRAM_COLUMNS * R->rowb, R->xs, B, err);
            } else if (R->ple && rc == 0) {
                /* the sessions' tokens in one pass over the weights, each
                 * from its own convolution state, committed with its token */
                void *xs[1024];
                for (unsigned b = 0; b < B; b++)
                    xs[b] = R->xs + (size_t)b * R->per;
                rc = engram_step_apply_batch(sv, B, R->ple_a, xs, ENGRAM_F32, err);
            } else if (rc == 0) {
                /* the step's [B][48] rows in place: table t's 24 of each token */
                rc = apply_layer(R, t, R->outs + (size_t)t * ENGRAM_COLUMNS * R->rowb,
                                 ENGRAM_ROWS_PER_TOKEN * R->rowb, R->xs, B, err);
            }
        } else {
            if (R->sh.tp && rc == 0) /* combines begun as reads come in, progressed */
                rc = shard_step_poll(R, err);
            busy(R->layer_us, NULL);
        }
    }
    if (R->sh.tp) /* a failed step's combines: given up */
        shard_step_drop(R);
    for (unsigned b = 0; b < B; b++) {
        int crc = rc == 0 ? engram_step_commit(sv[b], 1, err) : (engram_step_abort(sv[b]), 0);
        if (rc == 0)
            rc = crc;
        struct sess *q = &R->ss[b];
        memcpy(q->x + (q->prompt + step) * R->per, R->xs + (size_t)b * R->per, R->per * 4);
    }
    R->step_lat[R->n_steps++] = run_ns_now() - t0;
    return rc;
}
