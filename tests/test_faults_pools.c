/*
 * test_faults_pools.c - sessions, prefills and pools under faults
 * (faults.h): every fault at every position of a session's step, faults
 * spread over prefills, a pool whose engine dies for good; the set-up of
 * the output stage and of sessions (layer, applier, pool, session, prefill:
 * every allocation and thread start failed in turn) and of the output
 * stage's team.  TF_ONLY=TEXT runs the scenarios whose names hold TEXT.
 */
#include "../src/output/team.h"
#include "faults.h"

static struct sweep_totals totals;

/* ------------------------------------------------ sessions, prefetch, apply */

/* Decode steps through a pool under every fault at every position of a
 * one-token step (48 reads): the step's result is the documented one (0
 * with exact rows where the fault is retried, else the error with the
 * history unchanged), and the session and pool stay usable: the next step
 * is exact.  fresh = steps of a model whose rows nothing has read yet. */
static engram_pool *fault_pool(engram_model *m, int e)
{
    engram_pool_opts o = {.reader = {.engine = engines[e], .depth = 16}};
    engram_pool *p = NULL;
    engram_error err;
    CHECK_EQ(engram_pool_open(m, &o, &p, &err), 0);
    return p;
}

static int session_step(engram_session *s, uint32_t tok, uint16_t *out, engram_error *err)
{
    memset(out, 0xee, 48 * 256 * 2);
    int rc = engram_step_begin(s, &tok, NULL, 1, ENGRAM_BF16, out, err);
    if (rc < 0)
        return rc;
    int r0 = engram_step_wait(s, 0, err);
    int r1 = r0 == 0 ? engram_step_wait(s, 1, err) : 0;
    int rc2 = engram_step_commit(s, 1, err);
    return r0 < 0 ? r0 : r1 < 0 ? r1 : rc2;
}

static void session_faults(engram_model *m)
{
    const size_t n = 64;
    uint32_t tok[64];
    uint64_t seed = 77;
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 3000);
    static uint16_t out[48 * 256];
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0) {
            CHECK(0);
            continue;
        }
        long injected = 0, survived = 0, bad = 0;
        size_t i = 0; /* next token of the stream */
        for (size_t k = 0; k < N_FAULTS; k++) {
            const struct fault *f = &faults[k];
            long maxpos = f->op == FE_QUEUE || f->op == FE_CQE ? 48 : 4;
            for (long at = 1; at <= maxpos; at += STRIDE) {
                engram_history h0, h1;
                engram_session_history(s, &h0);
                uint32_t ids[48];
                engram_history hx = h0;
                engram_hash_token(engram_model_hasher(m), &hx, tok[i % n], 0, ids);
                uint16_t *w0 = tu_expected(m, 0, ids, 1, ENGRAM_BF16);
                uint16_t *w1 = tu_expected(m, 1, ids, 1, ENGRAM_BF16);
                fe_arm(f->op, at, f->err, 1);
                int rc = session_step(s, tok[i % n], out, &err);
                fe_disarm();
                long fired = fe_fired();
                injected += fired;
                engram_session_history(s, &h1);
                int ok = 1;
                if (rc == 0) {
                    /* retried, or the fault hit a call after this step's reads
                     * were all in (the pool's I/O thread runs on its own):
                     * either way the rows must be exact */
                    ok = memcmp(out, w0, 24 * 512) == 0 && memcmp(out + 24 * 256, w1, 24 * 512) == 0 &&
                         memcmp(&h1, &hx, sizeof h1) == 0;
                    i++;
                } else {
                    ok = fired > 0 && rc == f->want && memcmp(&h1, &h0, sizeof h1) == 0;
                }
                /* usable afterwards: the same token again, exact */
                if (rc < 0) {
                    int rc2 = session_step(s, tok[i % n], out, &err);
                    engram_session_history(s, &h1);
                    ok = ok && rc2 == 0 && memcmp(out, w0, 24 * 512) == 0 &&
                         memcmp(out + 24 * 256, w1, 24 * 512) == 0 && memcmp(&h1, &hx, sizeof h1) == 0;
                    i++;
                }
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  session %s, %s at %ld: rc %d (%s)\n", engine_names[e],
                            fault_name(f), at, rc, err.msg);
                survived += ok && fired;
                free(w0);
                free(w1);
            }
        }
        engram_pool_stats st;
        engram_pool_get_stats(p, &st);
        CHECK_EQ(st.io.in_flight, 0);
        CHECK_EQ(st.io.broken, 0);
        engram_session_close(s);
        engram_pool_close(p);
        contract_clean("session faults");
        CHECK_EQ(bad, 0);
        printf("session steps, %-8s: %ld faults injected, %ld survived with the documented outcome "
               "and an exact next step\n", engine_names[e], injected, survived);
        totals.injected += injected;
        totals.survived += survived;
    }
}

/* A pool whose engine dies for good (every reap fails): the step that hit
 * it and a prefill in progress fail with -EIO and their histories stay; the pool reports itself broken
 * and refuses every later step, batch and prefill with -EIO, histories
 * unchanged; closing the sessions and the pool neither hangs nor frees what
 * the kernel may still write to. */
static void pool_dies(engram_model *m)
{
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s = NULL, *t = NULL;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0 || engram_session_open(p, &t, &err) < 0) {
            CHECK(0);
            engram_session_close(s);
            engram_pool_close(p);
            continue;
        }
        static uint16_t out[2][48 * 256];
        uint32_t tok[2] = {5, 6};
        CHECK_EQ(session_step(s, tok[0], out[0], &err), 0);
        engram_history hs, ht, h;
        engram_session_history(s, &hs);
        engram_session_history(t, &ht);
        /* t: a prefill of 3 chunks through a ring of 1, so chunks 1 and 2
         * cannot have been read when the engine dies */
        static uint32_t ptok[120];
        for (unsigned i = 0; i < 120; i++)
            ptok[i] = (i * 37 + 11) % 3000;
        engram_prefill_opts po = {.chunk_tokens = 40, .ring_chunks = 1, .dtype = ENGRAM_BF16};
        engram_prefill *tpf = NULL;
        CHECK_EQ(engram_prefill_begin(t, ptok, NULL, 120, &po, &tpf, &err), 0);
        fe_arm(FE_REAP, 1, -EIO, -1);
        CHECK_EQ(session_step(s, tok[1], out[0], &err), -EIO);
        if (tpf) {
            const void *rows;
            int rc0 = engram_prefill_wait(tpf, 0, 0, &rows, NULL, NULL, &err);
            CHECK(rc0 == 0 || rc0 == -EIO);
            if (rc0 == 0) {
                engram_prefill_release(tpf, 0, 0);
                CHECK_EQ(engram_prefill_wait(tpf, 0, 1, &rows, NULL, NULL, &err), -EIO);
            }
            CHECK_EQ(engram_prefill_end(tpf, &err), -EIO);
        }
        engram_pool_stats st;
        engram_pool_get_stats(p, &st);
        CHECK_EQ(st.io.broken, 1);
        int rc = engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out[0], &err);
        CHECK_ERR(rc, err, -EIO, "");
        engram_session *ss[2] = {s, t};
        void *outs[2] = {out[0], out[1]};
        CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EIO);
        engram_prefill *pf = NULL;
        CHECK_EQ(engram_prefill_begin(t, tok, NULL, 2, NULL, &pf, &err), -EIO);
        CHECK(pf == NULL);
        engram_session_history(s, &h);
        CHECK(memcmp(&h, &hs, sizeof h) == 0);
        engram_session_history(t, &h);
        CHECK(memcmp(&h, &ht, sizeof h) == 0);
        engram_session_close(s);
        engram_session_close(t);
        engram_pool_close(p);
        CHECK_EQ(fe.destroyed, 0); /* the dead engine's buffers are kept */
        fe_disarm();
        printf("pool dies, %-8s: the step and the prefill in flight -EIO, then step, batch and prefill refused "
               "with -EIO, histories unchanged\n", engine_names[e]);
    }
}

/* Prefills under faults at positions spread over their reads: either every
 * chunk is exact and the history moves on, or a wait and the end report
 * the error and the history stays; the next prefill is exact. */
static int prefill_run(engram_session *s, const uint32_t *tok, size_t n, const uint16_t *w0,
                       const uint16_t *w1, engram_error *err, int *exact)
{
    engram_prefill_opts o = {.chunk_tokens = 40, .ring_chunks = 2, .dtype = ENGRAM_BF16};
    engram_prefill *pf;
    int rc = engram_prefill_begin(s, tok, NULL, n, &o, &pf, err);
    if (rc < 0)
        return rc;
    *exact = 1;
    int first_err = 0;
    for (size_t c = 0; c < engram_prefill_chunks(pf) && first_err == 0; c++)
        for (int t = 0; t < 2; t++) {
            const void *rows;
            size_t first, nt;
            int r = engram_prefill_wait(pf, t, c, &rows, &first, &nt, err);
            if (r < 0) {
                first_err = r;
                break;
            }
            const uint16_t *w = t ? w1 : w0;
            if (memcmp(rows, w + first * 24 * 256, nt * 24 * 512) != 0)
                *exact = 0;
            engram_prefill_release(pf, t, c);
        }
    engram_error e2;
    int end = engram_prefill_end(pf, first_err ? &e2 : err);
    return first_err ? first_err : end;
}

static void prefill_faults(engram_model *m)
{
    const size_t n = 120; /* 3 chunks of 40 tokens: 5,760 rows, a few dozen of them read once for two */
    uint32_t *tok = malloc(n * sizeof *tok), *ids = malloc(n * 48 * sizeof *ids);
    uint64_t seed = 78;
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 3000);
    engram_history h0, hend;
    engram_history_reset(&h0);
    hend = h0;
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &hend, tok, NULL, n, ids, NULL), 0);
    uint16_t *w0 = tu_expected(m, 0, ids, n, ENGRAM_BF16), *w1 = tu_expected(m, 1, ids, n, ENGRAM_BF16);
    static const long spots[] = {1, 2, 48, 1000, 5000};
    /* one fault of each kind (the step sweep above takes every one) */
    static const struct fault pf_faults[] = {
        {FE_QUEUE, -EIO, -EIO}, {FE_SUBMIT, -EINTR, 0}, {FE_REAP, -EIO, -EIO},
        {FE_CQE, FE_SHORT, 0},  {FE_CQE, -EIO, -EIO},   {FE_CQE, FE_EOF, -EIO},
    };
    for (int e = 0; e < 3; e++) {
        fe_reset();
        engram_pool *p = fault_pool(m, e);
        engram_session *s;
        engram_error err;
        if (!p || engram_session_open(p, &s, &err) < 0) {
            CHECK(0);
            continue;
        }
        long injected = 0, survived = 0, bad = 0;
        for (size_t k = 0; k < sizeof pf_faults / sizeof pf_faults[0]; k++) {
            const struct fault *f = &pf_faults[k];
            for (size_t q = 0; q < sizeof spots / sizeof spots[0]; q += (size_t)STRIDE > 1 ? 2 : 1) {
                long at = spots[q];
                if ((f->op == FE_SUBMIT || f->op == FE_REAP) && at > 48)
                    continue;
                CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
                if (getenv("TF_VERBOSE"))
                    fprintf(stderr, "prefill %s %s at %ld\n", engine_names[e], fault_name(f), at);
                fe_arm(f->op, at, f->err, 1);
                int exact = 0;
                int rc = prefill_run(s, tok, n, w0, w1, &err, &exact);
                fe_disarm();
                long fired = fe_fired();
                injected += fired;
                engram_history h1;
                engram_session_history(s, &h1);
                int ok = rc == 0 ? exact && !memcmp(&h1, &hend, sizeof h1) /* as for steps */
                                 : fired > 0 && rc == f->want && !memcmp(&h1, &h0, sizeof h1);
                /* usable afterwards */
                int rc2 = 0;
                if (rc < 0) {
                    CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
                    rc2 = prefill_run(s, tok, n, w0, w1, &err, &exact);
                    engram_session_history(s, &h1);
                    ok = ok && rc2 == 0 && exact && !memcmp(&h1, &hend, sizeof h1);
                }
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  prefill %s, %s at %ld: rc %d, then %d (%s)\n", engine_names[e],
                            fault_name(f), at, rc, rc2, err.msg);
                survived += ok && fired;
            }
        }
        engram_session_close(s);
        engram_pool_close(p);
        contract_clean("prefill faults");
        CHECK_EQ(bad, 0);
        printf("prefills,       %-8s: %ld faults injected, %ld survived with the documented outcome "
               "and an exact next prefill\n", engine_names[e], injected, survived);
        totals.injected += injected;
        totals.survived += survived;
    }
    free(tok);
    free(ids);
    free(w0);
    free(w1);
}

/* Set-up of the output stage and of sessions: every allocation and thread
 * start failed in turn: -ENOMEM / -EAGAIN, nothing leaked (LeakSanitizer in
 * the sanitizer build), and the same call then succeeds. */
static void apply_session_setup_faults(void)
{
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 3000), 0);
    char path[512];
    CHECK_EQ(tu_build("faults-w16.gguf", &l, ENGRAM_FILL_NORMAL, 16, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    if (!m)
        return;
    engram_error err;
    const char *names[] = {"engram_layer_open", "engram_applier_new (4 threads)", "engram_pool_open",
                           "engram_session_open", "engram_prefill_begin"};
    for (int what = 0; what < 5; what++) {
        engram_layer *L = NULL;
        engram_applier *A = NULL;
        engram_pool *p = NULL;
        engram_session *s = NULL;
        engram_prefill *pf = NULL;
        if (what >= 1)
            CHECK_EQ(engram_layer_open(m, 0, &L, &err), 0);
        /* rings are not kept (a cache of 1 byte): every begin allocates
         * its own, so its allocation fails in turn too */
        engram_pool_opts nocache = {.ring_cache_bytes = 1};
        if (what >= 3)
            CHECK_EQ(engram_pool_open(m, &nocache, &p, &err), 0);
        if (what >= 4)
            CHECK_EQ(engram_session_open(p, &s, &err), 0);
        uint32_t tok[300];
        for (int i = 0; i < 300; i++)
            tok[i] = (uint32_t)i * 7;
        engram_apply_opts ao = {.threads = 4};
        engram_prefill_opts po = {.chunk_tokens = 100, .dtype = ENGRAM_BF16};
        long total = 0, refused = 0;
        for (long k = 0;; k++) {
            lib_alloc = (struct fail_plan){0, k, 1}; /* k = 0: counts only */
            int rc;
            engram_layer *L2 = NULL;
            engram_session *s2 = NULL;
            engram_pool *p2 = NULL;
            switch (what) {
            case 0: rc = engram_layer_open(m, 0, &L2, &err); break;
            case 1: rc = engram_applier_new(L, &ao, &A, &err); break;
            case 2: rc = engram_pool_open(m, NULL, &p2, &err); break;
            case 3: rc = engram_session_open(p, &s2, &err); break;
            default: rc = engram_prefill_begin(s, tok, NULL, 300, &po, &pf, &err); break;
            }
            lib_alloc.armed = 0;
            if (k == 0)
                total = lib_alloc.calls;
            if (k > 0 && rc < 0) {
                CHECK_EQ(rc, -ENOMEM);
                refused++;
            }
            if (k > 0)
                CHECK(rc == 0 || rc == -ENOMEM);
            engram_layer_close(L2);
            engram_applier_free(A);
            A = NULL;
            engram_pool_close(p2);
            engram_session_close(s2);
            if (pf)
                engram_prefill_cancel(pf);
            pf = NULL;
            if (k >= total)
                break;
        }
        /* threads that cannot be started */
        long tfail = 0;
        if (what == 1 || what == 2)
            for (long k = 1; k <= (what == 1 ? 3 : 1); k++) {
                setup.thread_fail_at = k;
                setup.thread_calls = 0;
                engram_pool *p2 = NULL;
                int rc = what == 1 ? engram_applier_new(L, &ao, &A, &err)
                                   : engram_pool_open(m, NULL, &p2, &err);
                setup.thread_fail_at = 0;
                CHECK(rc == -EAGAIN);
                tfail += rc == -EAGAIN;
                engram_applier_free(A);
                A = NULL;
                engram_pool_close(p2);
            }
        /* the others succeeded through a fallback (io_uring's own set-up:
         * the thread pool takes over): only the pool's open has one */
        CHECK(what == 2 ? refused >= total - 1 : refused == total);
        printf("set-up: %ld allocations of %s failed in turn (%ld refused with ENOMEM, the others "
               "taken by a fallback)%s\n", total, names[what], refused,
               tfail ? "; each thread start failed in turn: -EAGAIN" : "");
        engram_session_close(s);
        engram_pool_close(p);
        engram_layer_close(L);
    }
    engram_model_close(m);
}

/* The output stage's fork-join team: a team of no workers, and threads
 * that cannot even get their attributes. */
static void team_faults(void)
{
    /* a team of no workers */
    struct team *pl = NULL;
    CHECK_EQ(team_new(0, &pl), -EINVAL);
    CHECK(pl == NULL);
    /* threads that cannot even get their attributes: -ENOMEM, nothing left */
    setup.attr_fail = 1;
    CHECK_EQ(team_new(4, &pl), -ENOMEM);
    CHECK(pl == NULL);
    setup.attr_fail = 0;
}

int main(void)
{
    static uint32_t map[3000];
    engram_layout l;
    char path[512];
    faults_model(&l, map, path, sizeof path);
    /* In a static: the scenario children exit with it still open, and
     * LeakSanitizer must see it as reachable. */
    static engram_model *m;
    m = tu_open_model(path);
    if (!m)
        return tu_finish("test_faults_pools");

    SCENARIO("faults in session steps", session_faults(m));
    SCENARIO("faults in prefills", prefill_faults(m));
    SCENARIO("session pool dies", pool_dies(m));
    SCENARIO("set-up: apply and sessions", apply_session_setup_faults());
    SCENARIO("set-up: output team", team_faults());

    engram_model_close(m);
    tu_cleanup();
    return tu_finish("test_faults_pools");
}
