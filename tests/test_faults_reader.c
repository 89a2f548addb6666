/*
 * test_faults_reader.c - the reader and its engines under faults (faults.h):
 * the five defects of #8 (a close with a step in flight, a transient reap
 * error, a file renamed over, allocations during batches and steps, the
 * smaller ones), every fault of the table at every position of a batch and
 * of a step, cancels, an engine that dies or refuses for ever, the set-up
 * failures of a reader open, and the engines driven directly at their
 * limits.  TF_ONLY=TEXT runs the scenarios whose names hold TEXT.
 */
#include <time.h>

#include "faults.h"

static struct sweep_totals totals;

/* ------------------------------------------------ helpers */

static engram_reader *open_reader(engram_model *m, int e, unsigned depth)
{
    engram_reader_opts o = {.engine = engines[e], .depth = depth};
    engram_reader *r = NULL;
    engram_error err;
    int rc = engram_reader_open(m, &o, &r, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", engine_names[e], err.msg);
    return r;
}

/* One batch of table t compared with want; returns the call's result. */
static int batch_eq(engram_reader *r, int t, const uint32_t *rows, size_t n, const uint16_t *want,
                    engram_error *err)
{
    size_t bytes = n * 24 * 256 * 2;
    uint16_t *got = malloc(bytes);
    memset(got, 0xee, bytes);
    int rc = engram_reader_batch(r, t, rows, n, ENGRAM_BF16, got, err);
    if (rc == 0)
        CHECK(memcmp(got, want, bytes) == 0);
    free(got);
    return rc;
}

/* One decode step compared with want0/want1 (token i). */
static int step_eq(engram_reader *r, const uint32_t *rows48, const uint16_t *w0, const uint16_t *w1,
                   engram_error *err)
{
    static uint16_t out[48 * 256];
    memset(out, 0xee, sizeof out);
    int rc = engram_reader_step_submit(r, rows48, ENGRAM_BF16, out, err);
    if (rc < 0)
        return rc;
    rc = engram_reader_step_wait(r, err);
    if (rc == 0) {
        CHECK(memcmp(out, w0, 24 * 256 * 2) == 0);
        CHECK(memcmp(out + 24 * 256, w1, 24 * 256 * 2) == 0);
    }
    return rc;
}

/* ------------------------------------------------ the five scenarios */

/* 1. Closing a reader with a step in flight: the engine must not be torn
 * down (nor the buffers freed) while reads are in flight. */
static void close_in_flight(engram_model *m, const uint32_t *rows)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        for (int i = 0; i < 20; i++) {
            engram_reader *r = open_reader(m, e, 64);
            if (!r)
                continue;
            static uint16_t out[48 * 256];
            CHECK_EQ(engram_reader_step_submit(r, rows + (size_t)i * 48, ENGRAM_BF16, out, NULL), 0);
            engram_reader_close(r);
            /* really closed (engine destroyed, memory freed), not kept aside */
            CHECK_EQ(fe.destroyed, i + 1);
        }
        char what[64];
        snprintf(what, sizeof what, "close in flight, %s", engine_names[e]);
        contract_clean(what);
    }
    /* What the contract protects, seen directly: memory allocated right after
     * close must not change under the test's feet (the kernel writing rows
     * into freed buffers).  ASan's quarantine keeps freed memory from being
     * reused, so this half only means something in plain builds. */
    if (SANITIZED)
        return;
    fe_reset();
    fe.wrap = 0;
    int changed = 0;
    for (int i = 0; i < 200; i++) {
        engram_reader *r = open_reader(m, 0, 64);
        if (!r)
            continue;
        static uint16_t out[48 * 256];
        engram_reader_step_submit(r, rows + (size_t)(i % 40) * 48, ENGRAM_BF16, out, NULL);
        engram_reader_close(r);
        unsigned char *p = malloc(128 << 10);
        memset(p, 0x5a, 128 << 10);
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
        for (size_t k = 0; k < (128u << 10); k++)
            if (p[k] != 0x5a) {
                changed++;
                break;
            }
        free(p);
    }
    printf("close with a step in flight: %d of 200 fresh buffers changed after close\n", changed);
    CHECK_EQ(changed, 0);
}

/* 2. One transient engine error (reap -> -EAGAIN) must not break the
 * reader: the call itself retries, and later batches and steps are exact;
 * after a hard error, the next step must be exact too. */
static void transient_reap(engram_model *m, const uint32_t *rows, const uint16_t *w0,
                           const uint16_t *w1, size_t n)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        fe_arm(FE_REAP, 1, -EAGAIN, 1);
        int rc = batch_eq(r, 0, rows, n, w0, &err);
        CHECK_EQ(fe.fired, 1);
        CHECK_EQ(rc, 0);
        fe_disarm();
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        engram_io_stats st;
        engram_reader_reset_stats(r);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        engram_reader_get_stats(r, &st);
        CHECK(st.rows_read > 0);
        /* A hard engine error fails the batch; the reader stays exact. */
        fe_arm(FE_REAP, 2, -EIO, 1);
        rc = batch_eq(r, 0, rows, n, w0, &err);
        CHECK_EQ(rc, -EIO);
        fe_disarm();
        for (size_t i = 0; i < 4; i++)
            CHECK_EQ(step_eq(r, rows + i * 48, w0 + i * 24 * 256, w1 + i * 24 * 256, &err), 0);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        /* The same during a step. */
        fe_arm(FE_REAP, 1, -EAGAIN, 1);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        fe_disarm();
        CHECK_EQ(step_eq(r, rows + 48, w0 + 24 * 256, w1 + 24 * 256, &err), 0);
        engram_reader_close(r);
        char what[64];
        snprintf(what, sizeof what, "transient reap, %s", engine_names[e]);
        contract_clean(what);
    }
}

/* 3. The model file renamed over between model open and reader open (as
 * `engram build` does): the reader must read the file the model validated. */
static void renamed_over(const engram_layout *l)
{
    char a[512], b[512];
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    o.layout = *l;
    o.fill = ENGRAM_FILL_RANDOM;
    o.seed = 7;
    tu_path(a, sizeof a, "renamed.gguf");
    tu_path(b, sizeof b, "other.gguf");
    CHECK_EQ(engram_build_model(a, &o, NULL), 0);
    o.seed = 8;
    CHECK_EQ(engram_build_model(b, &o, NULL), 0);
    engram_model *m = tu_open_model(a);
    if (!m)
        return;
    uint32_t *rows = tu_hashed(m, 64, 5, 500);
    uint16_t *want = tu_expected(m, 1, rows, 64, ENGRAM_BF16);
    CHECK_EQ(rename(b, a), 0);
    fe_reset();
    for (int e = 0; e < 3; e++) {
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(batch_eq(r, 1, rows, 64, want, &err), 0);
        engram_reader_close(r);
    }
    free(rows);
    free(want);
    engram_model_close(m);
}

/* 4. Batches and steps allocate nothing. */
static void no_allocation(engram_model *m, const uint32_t *rows, size_t n)
{
#if SANITIZED
    (void)m; (void)rows; (void)n;
    printf("allocation count: not taken under sanitizers\n");
#else
    fe_reset();
    fe.wrap = 0;
    uint16_t *out = malloc(n * 24 * 256 * 2);
    for (int e = 0; e < 3; e++) {
        engram_reader *r = open_reader(m, e, 64);
        if (!r)
            continue;
        alloc_counted = 0;
        alloc_counting = 1;
        int rc = engram_reader_batch(r, 0, rows, n, ENGRAM_BF16, out, NULL);
        for (size_t i = 0; i < 8 && rc == 0; i++) {
            rc = engram_reader_step_submit(r, rows + i * 48, ENGRAM_BF16, out, NULL);
            if (rc == 0)
                rc = engram_reader_step_wait(r, NULL);
        }
        alloc_counting = 0;
        CHECK_EQ(rc, 0);
        printf("allocations during a %zu-token batch and 8 steps, %s: %ld\n", n, engine_names[e],
               alloc_counted);
        CHECK_EQ(alloc_counted, 0);
        engram_reader_close(r);
    }
    free(out);
#endif
}

/* 5. The smaller defects. */
static void smaller(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1,
                    size_t n)
{
    engram_error err;
    engram_model_info info;
    engram_model_get_info(m, &info);
    /* (a) A DIO alignment of 512 KiB and more must not leave the reader
     * without slots. */
    for (uint32_t align = 4096; align <= (1u << 20); align *= 2) {
        fe_reset();
        sys.dio_align = align;
        engram_reader_opts ao = {.engine = ENGRAM_IO_AUTO, .depth = 64};
        engram_reader *r = NULL;
        CHECK_EQ(engram_reader_open(m, &ao, &r, &err), 0);
        /* A forced engine needs O_DIRECT: refused, naming the alignment. */
        engram_reader *forced = NULL;
        ao.engine = ENGRAM_IO_URING;
        int frc = engram_reader_open(m, &ao, &forced, &err);
        sys.dio_align = 0;
        if (align > (32u << 10))
            CHECK(frc == -EINVAL && strstr(err.msg, "alignment") != NULL);
        else
            CHECK_EQ(frc, 0);
        engram_reader_close(forced);
        if (!r)
            continue;
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(st.depth > 0);
        CHECK_EQ(st.direct, align <= (32u << 10));
        CHECK_EQ(st.align, align <= (32u << 10) ? align : 1);
        CHECK(st.reserved_bytes <= ENGRAM_READER_MAX_BYTES);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        if (st.depth > 0)
            CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        engram_reader_close(r);
    }
    /* (b) Short reads are resubmitted for the remainder. */
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        /* cut short of the row: each of the 5 is resubmitted (a half could
         * still hold the row, and whether it does depends on which reads
         * complete 3rd to 7th) */
        fe_arm(FE_CQE, 3, FE_CUT, 5);
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0);
        CHECK_EQ(fe.fired, 5);
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(st.retries >= 5);
        fe_arm(FE_CQE, 2, FE_SHORT, 3);
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        fe_disarm();
        engram_reader_close(r);
        contract_clean("short reads");
    }
    /* (c) A read error names the row and its file offset. */
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        fe_arm(FE_CQE, 1, -EIO, 1);
        memset(&err, 0, sizeof err);
        int rc = batch_eq(r, 0, rows, n, w0, &err);
        fe_disarm();
        CHECK_EQ(rc, -EIO);
        CHECK(err.row != ENGRAM_NO_ROW);
        CHECK_EQ(err.offset, info.table[0].offset + err.row * 264);
        engram_reader_close(r);
        contract_clean("read error");
    }
    /* (e) io_uring forced on a file that refuses O_DIRECT: refused with a
     * reason, not silently replaced by the buffered thread pool. */
    fe_reset();
    sys.direct_errno = EINVAL;
    engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = 16};
    engram_reader *r = NULL;
    int rc = engram_reader_open(m, &o, &r, &err);
    sys.direct_errno = 0;
    CHECK(rc < 0);
    if (rc < 0)
        CHECK(strstr(err.msg, "O_DIRECT") != NULL);
    engram_reader_close(r);
    /* (f) The token map is held once per model. */
    const engram_layout *ml = engram_model_layout(m);
    const engram_layout *hl = engram_hasher_layout(engram_model_hasher(m));
    CHECK(ml->token_map == hl->token_map);
}

/* ------------------------------------------------ every fault at every position */

/* Checks one faulted call's outcome against the documented one. */
static int outcome_ok(const struct fault *f, int rc, const engram_error *err, engram_reader *r,
                      uint64_t table_off)
{
    int ok = 1;
    int want = fe.fired ? f->want : 0;
    if (rc != want) {
        fprintf(stderr, "  %s at %ld: rc %d, want %d (%s)\n", fault_name(f), fe.plan.at, rc, want,
                err->msg);
        ok = 0;
    }
    if (rc < 0 && (f->op == FE_CQE || f->op == FE_QUEUE)) {
        /* a read's error names its row and the row's file offset */
        if (err->row == ENGRAM_NO_ROW || err->offset != table_off + err->row * 264) {
            fprintf(stderr, "  %s at %ld: error does not name row and offset: %s\n",
                    fault_name(f), fe.plan.at, err->msg);
            ok = 0;
        }
    }
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    if (st.in_flight != 0 || st.broken) {
        fprintf(stderr, "  %s at %ld: %u reads in flight after the call, broken %d\n",
                fault_name(f), fe.plan.at, st.in_flight, st.broken);
        ok = 0;
    }
    return ok;
}

/* Batches: every fault of the table at every position of a 4-token batch
 * (96 reads, depth 16), then the same batch without faults must be exact. */
static void sweep_batches(engram_model *m, const uint32_t *rows, const uint16_t *w0)
{
    engram_model_info info;
    engram_model_get_info(m, &info);
    const size_t n = 4;
    for (int e = 0; e < 3; e++) {
        long bad = 0, runs = 0;
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(batch_eq(r, 0, rows, n, w0, &err), 0); /* a clean run counts the positions */
        long positions[FE_NOPS];
        memcpy(positions, fe.calls, sizeof positions);
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            for (long at = 1; at <= positions[f->op] + 1; at += STRIDE) {
                fe_arm(f->op, at, f->err, 1);
                memset(&err, 0, sizeof err);
                int rc = batch_eq(r, 0, rows, n, w0, &err);
                fe_disarm();
                int ok = outcome_ok(f, rc, &err, r, info.table[0].offset);
                totals.injected += fe.fired;
                /* the next request is exact */
                ok &= batch_eq(r, 0, rows, n, w0, &err) == 0;
                totals.survived += ok && fe.fired;
                bad += !ok;
                runs++;
            }
        }
        engram_reader_close(r);
        contract_clean(engine_names[e]);
        printf("batch faults, %-8s: %ld faulted batches (positions: %ld queue, %ld submit, %ld reap, "
               "%ld completions), %ld wrong\n",
               engine_names[e], runs, positions[FE_QUEUE], positions[FE_SUBMIT], positions[FE_REAP],
               positions[FE_CQE], bad);
        CHECK_EQ(bad, 0);
    }
}

/* Decode steps: the same, waited for and polled, with depth 16 (three
 * rounds of reads per step). */
static void sweep_steps(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    engram_model_info info;
    engram_model_get_info(m, &info);
    for (int e = 0; e < 3; e++) {
        long bad = 0, runs = 0;
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
        long positions[FE_NOPS];
        memcpy(positions, fe.calls, sizeof positions);
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            for (long at = 1; at <= positions[f->op] + 1; at += STRIDE) {
                for (int poll = 0; poll < 2; poll++) {
                    static uint16_t out[48 * 256];
                    memset(out, 0xee, sizeof out);
                    fe_arm(f->op, at, f->err, 1);
                    memset(&err, 0, sizeof err);
                    int rc = engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err);
                    if (rc == 0) {
                        if (poll)
                            while ((rc = engram_reader_step_poll(r, &err)) == -EAGAIN)
                                ;
                        else
                            rc = engram_reader_step_wait(r, &err);
                    }
                    fe_disarm();
                    uint64_t off = err.row != ENGRAM_NO_ROW && err.offset >= info.table[1].offset
                                       ? info.table[1].offset : info.table[0].offset;
                    int ok = outcome_ok(f, rc, &err, r, off);
                    if (rc == 0)
                        ok &= memcmp(out, w0, 24 * 256 * 2) == 0 &&
                              memcmp(out + 24 * 256, w1, 24 * 256 * 2) == 0;
                    totals.injected += fe.fired;
                    ok &= step_eq(r, rows + 48, w0 + 24 * 256, w1 + 24 * 256, &err) == 0;
                    totals.survived += ok && fe.fired;
                    bad += !ok;
                    runs++;
                }
            }
        }
        engram_reader_close(r);
        contract_clean(engine_names[e]);
        printf("step faults,  %-8s: %ld faulted steps (positions: %ld queue, %ld submit, %ld reap, "
               "%ld completions), %ld wrong\n",
               engine_names[e], runs, positions[FE_QUEUE], positions[FE_SUBMIT], positions[FE_REAP],
               positions[FE_CQE], bad);
        CHECK_EQ(bad, 0);
    }
    printf("faults injected %ld, survived with the documented outcome and an exact next request %ld\n",
           totals.injected, totals.survived);
    CHECK_EQ(totals.injected, totals.survived);
}

/* Cancelling a step at every point it can be in, and a cancel the engine
 * refuses: nothing stays in flight, the next step is exact. */
static void cancels(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_reader *r = open_reader(m, e, 16);
        if (!r)
            continue;
        engram_error err;
        static uint16_t out[48 * 256];
        for (int polls = 0; polls < 12; polls++) {
            for (int refuse = 0; refuse < 2; refuse++) {
                CHECK_EQ(engram_reader_step_submit(r, rows + 2 * 48, ENGRAM_BF16, out, &err), 0);
                for (int p = 0; p < polls; p++)
                    if (engram_reader_step_poll(r, &err) != -EAGAIN)
                        break; /* finished before the cancel: then nothing to cancel */
                engram_io_stats st;
                engram_reader_get_stats(r, &st);
                if (refuse)
                    fe_arm(FE_CANCEL, 1, -EIO, 1);
                int rc = engram_reader_step_cancel(r);
                fe_disarm();
                engram_reader_get_stats(r, &st);
                CHECK(rc == 0 || rc == -EINVAL);
                CHECK_EQ(st.in_flight, 0);
                CHECK_EQ(engram_reader_step_wait(r, &err), -EINVAL); /* the step is over */
                CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
            }
        }
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(st.steps_cancelled > 0);
        engram_reader_close(r);
        contract_clean("cancel");
    }
}

/* An engine that stops completing for good: the reader says it is broken,
 * refuses further work, and close() does not free what the kernel may
 * still write to. */
static void engine_dies(engram_model *m, const uint32_t *rows, const uint16_t *w0, const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        for (int in_step = 0; in_step < 2; in_step++) {
            fe_reset();
            engram_reader *r = open_reader(m, e, 16);
            if (!r)
                continue;
            engram_error err;
            fe_arm(FE_REAP, 1, -EIO, -1);
            int rc = in_step ? step_eq(r, rows, w0, w1, &err) : batch_eq(r, 0, rows, 4, w0, &err);
            CHECK_EQ(rc, -EIO);
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            CHECK_EQ(st.broken, 1);
            CHECK(st.in_flight > 0);
            rc = batch_eq(r, 0, rows, 4, w0, &err);
            CHECK_ERR(rc, err, -EIO, "unusable");
            rc = step_eq(r, rows, w0, w1, &err);
            CHECK_ERR(rc, err, -EIO, "unusable");
            engram_reader_close(r);
            CHECK_EQ(fe.destroyed, 0); /* buffers and engine kept */
            fe_disarm();
        }
    }
}

/* An engine that refuses reads transiently for ever (a queue that never
 * drains), from the first read and after some are in flight: the reader
 * gives up after its bound with -EAGAIN ("kept refusing"), nothing left in
 * flight or pending, not broken; the next requests are exact.  Polling
 * such a step says "not yet" and the wait that follows gives up the same
 * way.  Then a queue refusing for good (-EIO on every read from the 5th):
 * the error names the row, nothing stays in flight. */
static void engine_refuses(engram_model *m, const uint32_t *rows, const uint16_t *w0,
                           const uint16_t *w1)
{
    for (int e = 0; e < 3; e++) {
        for (int how = 0; how < 8; how++) {
            int in_step = how & 1, late = how & 2, hard = how & 4;
            fe_reset();
            engram_reader *r = open_reader(m, e, 16);
            if (!r)
                continue;
            engram_error err;
            memset(&err, 0, sizeof err);
            fe_arm(FE_QUEUE, late ? 5 : 1, hard ? -EIO : -EAGAIN, -1);
            int rc;
            if (in_step && !hard) {
                static uint16_t out[48 * 256];
                CHECK_EQ(engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err), 0);
                for (int p = 0; p < 3; p++)
                    CHECK_EQ(engram_reader_step_poll(r, &err), -EAGAIN);
                rc = engram_reader_step_wait(r, &err);
            } else {
                rc = in_step ? step_eq(r, rows, w0, w1, &err) : batch_eq(r, 0, rows, 4, w0, &err);
            }
            fe_disarm();
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            if (hard) {
                CHECK_ERR(rc, err, -EIO, "cannot queue");
                CHECK(err.row != ENGRAM_NO_ROW);
            } else {
                CHECK_ERR(rc, err, -EAGAIN, "kept refusing");
                CHECK(st.retries >= 2000);
            }
            CHECK_EQ(st.in_flight, 0);
            CHECK_EQ(st.broken, 0);
            CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
            CHECK_EQ(step_eq(r, rows, w0, w1, &err), 0);
            engram_reader_close(r);
            contract_clean(engine_names[e]);
        }
        printf("engine refuses, %-8s: for ever (-EAGAIN, from the 1st and the 5th read; batch, "
               "step, polled step): -EAGAIN after the bound; for good (-EIO): the row named; "
               "nothing in flight, next requests exact\n", engine_names[e]);
    }
}

/* ------------------------------------------------ engines at their limits, set-up */

/* Reaps want completions from an engine driven directly (each reap waits
 * for at least one); returns how many arrived before an error. */
static int reap_all(struct io_engine *e, struct io_cqe *cq, int want)
{
    int n = 0;
    while (n < want) {
        int k = e->ops->reap(e, cq + n, (unsigned)(want - n), 1);
        CHECK(k > 0);
        if (k <= 0)
            break;
        n += k;
    }
    return n;
}

/* The engines at their limits, driven directly (not through a reader). */
static void engine_limits(void)
{
    /* the thread engine holds as many reads as its queue: one more is
     * refused with -EBUSY (transient), and those it took arrive; here one
     * worker with a queue of two (the second read waits queued, then goes to
     * the same worker), reaped by one reap that asks for both; a queue
     * shorter than the workers, or no worker, is refused */
    char path[512];
    tu_path(path, sizeof path, "eng.bin");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    static unsigned char data[3 * 4096], got[3][4096];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7 + 1);
    CHECK(fd >= 0 && write(fd, data, sizeof data) == (ssize_t)sizeof data);
    struct io_engine *e = NULL;
    CHECK_EQ(__real_io_threads_engine_new(fd, 2, 1, DROP_NONE, &e), -EINVAL);
    CHECK_EQ(__real_io_threads_engine_new(fd, 0, 2, DROP_NONE, &e), -EINVAL);
    CHECK(e == NULL);
    CHECK_EQ(__real_io_threads_engine_new(fd, 1, 2, DROP_NONE, &e), 0);
    if (e) {
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 0), 0);
        CHECK_EQ(e->ops->queue(e, 1, got[1], 4096, 4096), 0);
        CHECK_EQ(e->ops->queue(e, 2, got[2], 4096, 8192), -EBUSY);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[2];
        int n = e->ops->reap(e, cq, 2, 2);
        CHECK_EQ(n, 2);
        for (int i = 0; i < n; i++)
            CHECK(cq[i].slot < 2 && cq[i].res == 4096);
        CHECK(memcmp(got[0], data, 4096) == 0 && memcmp(got[1], data + 4096, 4096) == 0);
        /* a read being read or completed and not reaped still holds its
         * place: with the first of two reaped (the one worker takes the
         * second as it posts the first), one more is taken and a fourth
         * refused, so the completions never outgrow their ring */
        memset(got, 0, sizeof got);
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 0), 0);
        CHECK_EQ(e->ops->queue(e, 1, got[1], 4096, 4096), 0);
        CHECK_EQ(e->ops->submit(e), 0);
        CHECK_EQ(e->ops->reap(e, cq, 1, 1), 1);
        CHECK(cq[0].slot == 0 && cq[0].res == 4096 && memcmp(got[0], data, 4096) == 0);
        CHECK_EQ(e->ops->queue(e, 2, got[2], 4096, 8192), 0);
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 0), -EBUSY);
        n = reap_all(e, cq, 2);
        CHECK_EQ(n, 2);
        for (int i = 0; i < n; i++)
            CHECK(cq[i].slot == (unsigned)i + 1 && cq[i].res == 4096);
        CHECK(memcmp(got[1], data + 4096, 4096) == 0 && memcmp(got[2], data + 8192, 4096) == 0);
        e->ops->destroy(e);
    }
    /* the thread engine's read system call failing: EIO completes the read
     * with -EIO (pread, and preadv2 with RWF_DONTCACHE); EINTR is retried
     * and the read completes exact (pread) */
    const struct { int dontcache, eno; } calls[3] = {{0, EIO}, {1, EIO}, {0, EINTR}};
    for (int k = 0; k < 3; k++) {
        struct fail_plan *pl = calls[k].dontcache ? &preadv2s : &preads;
        e = NULL;
        CHECK_EQ(__real_io_threads_engine_new(fd, 2, 2, calls[k].dontcache ? DROP_DONTCACHE : DROP_NONE, &e),
                 0);
        if (!e)
            continue;
        memset(got, 0, sizeof got);
        pread_errno = calls[k].eno;
        *pl = (struct fail_plan){.fail_at = 1, .armed = 1};
        CHECK_EQ(e->ops->queue(e, 0, got[0], 4096, 4096), 0);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[1];
        int n = reap_all(e, cq, 1);
        pl->armed = 0;
        pread_errno = EIO;
        CHECK(pl->calls >= 1); /* the failure was injected */
        if (n == 1 && calls[k].eno == EIO)
            CHECK_EQ(cq[0].res, -EIO);
        else if (n == 1)
            CHECK(cq[0].res == 4096 && memcmp(got[0], data + 4096, 4096) == 0);
        e->ops->destroy(e);
    }
    /* io_uring with its submission ring full (4 entries, none submitted):
     * a 5th read or a cancel submits early; if the kernel refuses that
     * (-EAGAIN) or takes nothing, the call fails transiently (-EAGAIN /
     * -EBUSY) with nothing queued; then the 5th read goes, all five arrive */
    char note[128];
    static unsigned char ubuf[5][4096] __attribute__((aligned(4096)));
    e = NULL;
    CHECK_EQ(__real_io_uring_engine_new(fd, 4, ubuf, sizeof ubuf, 0, &e, note, sizeof note), 0);
    if (e) {
        memset(ubuf, 0, sizeof ubuf);
        for (unsigned i = 0; i < 4; i++)
            CHECK_EQ(e->ops->queue(e, i, ubuf[i], 4096, (i % 3) * 4096), 0);
        uring_submit_mode = 1;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), -EAGAIN);
        CHECK_EQ(e->ops->cancel(e), -EAGAIN);
        uring_submit_mode = 2;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), -EBUSY);
        CHECK_EQ(e->ops->cancel(e), -EBUSY);
        uring_submit_mode = 0;
        CHECK_EQ(e->ops->queue(e, 4, ubuf[4], 4096, 4096), 0);
        CHECK_EQ(e->ops->submit(e), 0);
        struct io_cqe cq[5];
        int n = reap_all(e, cq, 5);
        unsigned seen = 0;
        for (int i = 0; i < n; i++) {
            CHECK(cq[i].slot < 5 && cq[i].res == 4096);
            seen |= 1u << cq[i].slot;
        }
        CHECK_EQ(seen, 31);
        for (unsigned i = 0; i < 5; i++)
            CHECK(memcmp(ubuf[i], data + (i < 4 ? (i % 3) : 1) * 4096, 4096) == 0);
        e->ops->destroy(e);
    }
    printf("thread engine: a queue shorter than its workers, or no worker, -EINVAL; a read past "
           "its queue of 2 -EBUSY (also with one of the 2 unreaped), the 2 taken by its one "
           "worker and delivered by one reap; its pread and preadv2 failing with EIO: -EIO, with EINTR: retried, exact; io_uring, "
           "its 4-entry ring full: a refused (-EAGAIN) or empty submit fails the 5th read and a "
           "cancel transiently, then all 5 delivered\n");
    close(fd);
    unlink(path);
}

/* A reader open: where an allocation fails, either -ENOMEM or (io_uring's
 * own allocation under the automatic choice) the thread pool, exact. */
struct reader_ctx {
    engram_model *m;
    engram_reader_opts o;
    engram_reader *r;
    const uint32_t *rows;
    const uint16_t *w0;
};

static int reader_run(void *vc, engram_error *err)
{
    struct reader_ctx *c = vc;
    c->r = NULL;
    int rc = engram_reader_open(c->m, &c->o, &c->r, err);
    if (rc < 0)
        CHECK(c->r == NULL);
    return rc;
}

static void reader_done(void *vc, int faulted)
{
    struct reader_ctx *c = vc;
    if (faulted) {
        engram_io_stats st;
        engram_error err;
        engram_reader_get_stats(c->r, &st);
        CHECK(c->o.engine == ENGRAM_IO_AUTO && strcmp(st.engine, "threads") == 0);
        CHECK_EQ(batch_eq(c->r, 0, c->rows, 4, c->w0, &err), 0);
    }
    engram_reader_close(c->r);
}

/* Set-up failures: allocation, descriptors, io_uring, threads.  Forced
 * engines fail with the error; the automatic choice falls back where a
 * fallback exists; nothing is left allocated or open. */
static void setup_faults(engram_model *m, const uint32_t *rows, const uint16_t *w0)
{
    engram_error err;
    int fds0 = open_fds();
    /* Every allocation of an open, failed in turn, for every engine with and
     * without a row cache. */
    for (int e = 0; e < 4; e++) {
        struct reader_ctx c = {m, {.engine = e < 3 ? engines[e] : ENGRAM_IO_AUTO, .depth = 16,
                                   .cache_bytes = e == 3 ? 1u << 20 : 0}, NULL, rows, w0};
        struct op op = {reader_run, reader_done, &c};
        long failed_ok;
        long total = fails_in_turn(&op, &lib_alloc, -ENOMEM, "", &failed_ok);
        CHECK(failed_ok > 0);
        printf("set-up: %ld allocations of a %s%s open failed in turn (%ld refused with ENOMEM)\n",
               total, e < 3 ? engine_names[e] : "automatic", e == 3 ? " + cache" : "", failed_ok);
    }
    /* Descriptors. */
    sys.open_errno = EMFILE;
    engram_reader *r = NULL;
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), -EMFILE);
    sys.open_errno = 0;
    /* io_uring refused at set-up: forced fails, automatic takes threads. */
    int codes[2] = {-ENOMEM, -EPERM};
    for (int c = 0; c < 2; c++) {
        setup.queue_init = codes[c];
        engram_reader_opts o = {.engine = ENGRAM_IO_URING, .depth = 16};
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), codes[c]);
        o.engine = ENGRAM_IO_AUTO;
        CHECK_EQ(engram_reader_open(m, &o, &r, &err), 0);
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(strcmp(st.engine, "threads") == 0 && strstr(st.note, "io_uring refused") != NULL);
        CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
        engram_reader_close(r);
        setup.queue_init = 0;
    }
    /* No fixed file / no fixed buffers: io_uring still reads, and says so. */
    setup.register_files = -EMFILE;
    setup.register_buffers = -ENOMEM;
    engram_reader_opts ou = {.engine = ENGRAM_IO_URING, .depth = 16};
    CHECK_EQ(engram_reader_open(m, &ou, &r, &err), 0);
    setup.register_files = setup.register_buffers = 0;
    if (r) {
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        CHECK(strstr(st.note, "no fixed file") && strstr(st.note, "no fixed buffers"));
        CHECK_EQ(batch_eq(r, 0, rows, 4, w0, &err), 0);
        engram_reader_close(r);
    }
    /* A thread that cannot be started, at every position of the pool
     * (ENGRAM_READER_THREADS(16) = 8 threads: a 9th start is never asked
     * for, and the open succeeds). */
    for (int e = 1; e < 3; e++) {
        for (long k = 1; k <= 9; k++) {
            setup.thread_fail_at = k;
            setup.thread_calls = 0;
            engram_reader_opts o = {.engine = engines[e], .depth = 16};
            int rc = engram_reader_open(m, &o, &r, &err);
            setup.thread_fail_at = 0;
            if (k <= (long)ENGRAM_READER_THREADS(16u)) {
                CHECK_ERR(rc, err, -EAGAIN, "threads");
                continue;
            }
            CHECK_EQ(rc, 0);
            CHECK_EQ(setup.thread_calls, 8);
            if (rc == 0)
                engram_reader_close(r);
        }
    }
    CHECK_EQ(open_fds(), fds0);
}

int main(void)
{
    static uint32_t map[3000];
    engram_layout l;
    char path[512];
    faults_model(&l, map, path, sizeof path);
    static engram_model *m;
    m = tu_open_model(path);
    if (!m)
        return tu_finish("test_faults_reader");
    /* Fixtures live in statics: the scenario children exit with them still
     * allocated, and LeakSanitizer must see them as reachable. */
    const size_t n = 40;
    static uint32_t *rows, *big;
    static uint16_t *w0, *w1;
    rows = tu_hashed(m, n, 11, 300);
    w0 = tu_expected(m, 0, rows, n, ENGRAM_BF16);
    w1 = tu_expected(m, 1, rows, n, ENGRAM_BF16);
    big = tu_hashed(m, ENGRAM_BATCH_TOKENS, 12, 3000);

    SCENARIO("1 close in flight", close_in_flight(m, rows));
    SCENARIO("2 transient reap error", transient_reap(m, rows, w0, w1, n));
    SCENARIO("3 renamed over", renamed_over(&l));
    SCENARIO("4 no allocation", no_allocation(m, big, ENGRAM_BATCH_TOKENS));
    SCENARIO("5 smaller defects", smaller(m, rows, w0, w1, n));
    SCENARIO("faults in batches", sweep_batches(m, rows, w0));
    SCENARIO("faults in steps", sweep_steps(m, rows, w0, w1));
    SCENARIO("step cancel", cancels(m, rows, w0, w1));
    SCENARIO("engine dies", engine_dies(m, rows, w0, w1));
    SCENARIO("engine refuses for ever", engine_refuses(m, rows, w0, w1));
    SCENARIO("set-up faults", setup_faults(m, rows, w0));
    SCENARIO("engines at their limits", engine_limits());

    free(big);
    free(rows);
    free(w0);
    free(w1);
    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_faults_reader");
}
