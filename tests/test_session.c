/*
 * test_session.c - sessions on a shared pool (engram.h, "sessions"), on a
 * real file with every engine (under TSan all but the buffered fallback,
 * tsan_dup_engine in testutil.h).  Rows are compared with the exact
 * single-row path (engram_model_read_*), residuals with serial applies:
 *  - decode steps deliver exactly the rows of the hashed tokens, per table;
 *    a step of k draft tokens with commit(j) equals j single steps (rows and
 *    history); abort leaves the history unchanged;
 *  - batched decode of B sessions (one round, shared rows read once) equals
 *    the same sessions stepped one by one;
 *  - prefill through the prefetch ring equals the reader's serial batch, and
 *    prefill of T tokens followed by steps equals T + more steps one by one
 *    (rows, history and applied residuals); table 1 starts on a signal;
 *  - a session restored from a snapshot or from the last tokens continues
 *    exactly as the uninterrupted one;
 *  - 8 threads with interleaved sessions equal the same sessions run one
 *    after another, with a prefill running meanwhile on the same pool;
 *  - cancellation at random points, a file truncated under a running
 *    prefill and a NaN row: errors named, histories unchanged, nothing left
 *    (LeakSanitizer, ThreadSanitizer in the suite);
 *  - every documented refusal (NULL, bad table, busy, mixed pools, a bad
 *    token in a batch) returns its error and changes nothing;
 *  - a session's own memory is within ENGRAM_SESSION_MAX_BYTES.
 */
#include <pthread.h>
#include <time.h>

#include "testutil.h"
#include "../src/serve/serve_int.h"

#define ROWB (256 * 2) /* a BF16 row */
#define TOKB (48 * ROWB)

static engram_model *model;
static char model_path[512];
static const engram_io_engine engines[] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
static const char *const engine_names[] = {"io_uring", "threads", "buffered"};

static uint32_t *random_tokens(size_t n, uint64_t seed, unsigned alphabet)
{
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint32_t)(tu_rand(&seed) % alphabet);
    return t;
}

/* Expected rows [n][48][256] BF16 of a token stream from history h (masked
 * tokens: zeros, never compared). */
static uint16_t *expected_rows(const uint32_t *tok, const uint8_t *mask, size_t n, engram_history h)
{
    uint32_t *rows = malloc(n * 48 * sizeof *rows);
    uint16_t *out = calloc(n * 48, ROWB);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, n, rows, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i])
            continue;
        for (int t = 0; t < 2; t++)
            CHECK_EQ(engram_model_read_bf16(model, t, rows + i * 48 + t * 24, 24,
                                            out + (i * 48 + (size_t)t * 24) * 256, NULL), 0);
    }
    free(rows);
    return out;
}

static engram_pool *pool_open(int e, uint64_t cache)
{
    engram_pool_opts o = {.reader = {.engine = engines[e], .depth = 32, .cache_bytes = cache}};
    engram_pool *p = NULL;
    engram_error err;
    int rc = engram_pool_open(model, &o, &p, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "pool %s: %s\n", engine_names[e], err.msg);
    return p;
}

static int hist_eq(const engram_history *a, const engram_history *b)
{
    return memcmp(a, b, sizeof *a) == 0;
}

/* ------------------------------------------------ steps */

static void steps(int e)
{
    engram_pool *p = pool_open(e, 0);
    if (!p)
        return;
    const size_t n = 40;
    uint32_t *tok = random_tokens(n, 1, 500);
    uint8_t mask[40];
    for (size_t i = 0; i < n; i++)
        mask[i] = i % 9 != 4;
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, mask, n, h0);
    engram_session *s;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    static uint16_t out[ENGRAM_MAX_DRAFT * 48 * 256];
    /* one token at a time, waited table by table, alternating wait/poll */
    int bad = 0;
    for (size_t i = 0; i < 20; i++) {
        memset(out, 0xee, TOKB);
        CHECK_EQ(engram_step_begin(s, tok + i, mask + i, 1, ENGRAM_BF16, out, &err), 0);
        CHECK_EQ(engram_step_begin(s, tok + i, mask + i, 1, ENGRAM_BF16, out, &err), -EBUSY);
        if (i % 2) {
            CHECK_EQ(engram_step_wait(s, 0, &err), 0);
            CHECK_EQ(engram_step_wait(s, 1, &err), 0);
        } else {
            int rc;
            while ((rc = engram_step_poll(s, 1, &err)) == -EAGAIN)
                ;
            CHECK_EQ(rc, 0);
            while ((rc = engram_step_poll(s, 0, &err)) == -EAGAIN)
                ;
            CHECK_EQ(rc, 0);
        }
        engram_step_info info;
        engram_step_get_info(s, &info);
        CHECK(info.ready_ns[0] >= info.begin_ns && info.ready_ns[1] >= info.begin_ns);
        CHECK_EQ(info.rows[0], mask[i] ? 24 : 0);
        CHECK_EQ(engram_step_commit(s, 1, &err), 0);
        if (mask[i])
            bad += memcmp(out, want + i * 48 * 256, TOKB) != 0;
        else
            bad += out[0] != 0xeeee; /* masked: nothing read, nothing written */
    }
    CHECK_EQ(bad, 0);
    /* the history now equals hashing the 20 tokens */
    engram_history h = h0, hs;
    uint32_t rows[20 * 48];
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, 20, rows, NULL), 0);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    /* a k-token step, commit(j) = j single steps */
    for (unsigned k = 1; k <= ENGRAM_MAX_DRAFT; k += 3)
        for (unsigned j = 0; j <= k; j += k > 1 ? k / 2 : 1) {
            engram_history before;
            engram_session_history(s, &before);
            memset(out, 0xee, sizeof out);
            CHECK_EQ(engram_step_begin(s, tok + 20, mask + 20, k, ENGRAM_BF16, out, &err), 0);
            CHECK_EQ(engram_step_commit(s, j, &err), 0);
            uint16_t *w = expected_rows(tok + 20, mask + 20, k, before);
            for (unsigned i = 0; i < k; i++)
                if (mask[20 + i])
                    CHECK(memcmp(out + (size_t)i * 48 * 256, w + (size_t)i * 48 * 256, TOKB) == 0);
            free(w);
            engram_history after = before;
            CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &after, tok + 20, mask + 20, j, rows,
                                        NULL), 0);
            engram_session_history(s, &hs);
            CHECK(hist_eq(&after, &hs));
            CHECK_EQ(engram_session_set_history(s, &before, &err), 0);
        }
    /* abort: history unchanged, and the next step exact */
    engram_session_history(s, &h);
    CHECK_EQ(engram_step_begin(s, tok + 30, NULL, 4, ENGRAM_BF16, out, &err), 0);
    engram_step_abort(s);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    CHECK_EQ(engram_step_commit(s, 1, &err), -EINVAL);
    /* bad input: nothing queued, history unchanged */
    uint32_t badtok = engram_model_layout(model)->vocab;
    CHECK_ERR(engram_step_begin(s, &badtok, NULL, 1, ENGRAM_BF16, out, &err), err, -EINVAL, "token 0");
    CHECK_ERR(engram_step_begin(s, tok, NULL, ENGRAM_MAX_DRAFT + 1, ENGRAM_BF16, out, &err), err, -EINVAL, "k must be");
    engram_history wild = {{5, 1 << 30, -1}};
    CHECK_ERR(engram_session_set_history(s, &wild, &err), err, -EINVAL, "history entry 1");
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    /* F32 and raw delivery */
    static float outf[48 * 256];
    static uint8_t outr[48 * 264];
    CHECK_EQ(engram_step_begin(s, tok + 31, NULL, 1, ENGRAM_F32, outf, &err), 0);
    CHECK_EQ(engram_step_commit(s, 0, &err), 0);
    CHECK_EQ(engram_step_begin(s, tok + 31, NULL, 1, ENGRAM_RAW, outr, &err), 0);
    CHECK_EQ(engram_step_commit(s, 0, &err), 0);
    uint16_t *w = expected_rows(tok + 31, NULL, 1, hs);
    int fbad = 0, rbad = 0;
    for (int i = 0; i < 48 * 256; i++) {
        union { float f; uint32_t u; } v = {outf[i]};
        fbad += (uint16_t)(v.u >> 16) != w[i] || (v.u & 0xffff);
    }
    uint16_t dec[48 * 256];
    CHECK_EQ(engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, outr, 48, dec, NULL), 0);
    rbad = memcmp(dec, w, sizeof dec) != 0;
    CHECK_EQ(fbad, 0);
    CHECK_EQ(rbad, 0);
    free(w);
    engram_session_close(s);
    engram_pool_close(p);
    free(tok);
    free(want);
}

/* ------------------------------------------------ batched decode */

static void batched(int e)
{
    engram_pool *p = pool_open(e, 0);
    if (!p)
        return;
    enum { B = 32, STEPS = 6 };
    engram_session *s[B];
    engram_error err;
    for (int b = 0; b < B; b++)
        CHECK_EQ(engram_session_open(p, &s[b], &err), 0);
    /* the sessions read slices of one stream with few distinct tokens, so
     * they share many rows */
    uint32_t *tok = random_tokens((size_t)B * STEPS, 3, 12);
    uint16_t *outs = malloc((size_t)B * TOKB);
    void *ptrs[B];
    for (int b = 0; b < B; b++)
        ptrs[b] = outs + (size_t)b * 48 * 256;
    engram_history h0;
    engram_history_reset(&h0);
    int bad = 0;
    uint32_t stepped[B];
    for (int st = 0; st < STEPS; st++) {
        for (int b = 0; b < B; b++)
            stepped[b] = tok[(size_t)b * STEPS + (size_t)st];
        CHECK_EQ(engram_step_begin_batch(s, stepped, NULL, B, ENGRAM_BF16, ptrs, &err), 0);
        for (int b = 0; b < B; b++) {
            CHECK_EQ(engram_step_wait(s[b], 0, &err), 0);
            CHECK_EQ(engram_step_commit(s[b], 1, &err), 0);
        }
        for (int b = 0; b < B; b++) { /* each session's rows as its own serial stream */
            uint16_t *w = expected_rows(tok + (size_t)b * STEPS, NULL, (size_t)st + 1, h0);
            bad += memcmp(outs + (size_t)b * 48 * 256, w + (size_t)st * 48 * 256, TOKB) != 0;
            free(w);
        }
    }
    CHECK_EQ(bad, 0);
    engram_pool_stats st;
    engram_pool_get_stats(p, &st);
    CHECK_EQ(st.step_rows_requested, (uint64_t)B * STEPS * 48);
    CHECK(st.step_rows_read < st.step_rows_requested); /* shared rows read once */
    CHECK(st.rounds >= STEPS);
    printf("batched %-8s: %d sessions x %d steps: %llu rows requested, %llu read, %llu rounds\n",
           engine_names[e], B, STEPS, (unsigned long long)st.step_rows_requested,
           (unsigned long long)st.step_rows_read, (unsigned long long)st.rounds);
    /* a session twice in a batch, or busy: refused, nothing begun */
    engram_session *twice[2] = {s[0], s[0]};
    CHECK_ERR(engram_step_begin_batch(twice, stepped, NULL, 2, ENGRAM_BF16, ptrs, &err), err, -EINVAL, "twice");
    CHECK_EQ(engram_step_begin(s[1], stepped, NULL, 1, ENGRAM_BF16, ptrs[1], &err), 0);
    CHECK_ERR(engram_step_begin_batch(s, stepped, NULL, 3, ENGRAM_BF16, ptrs, &err), err, -EBUSY, "session 1");
    CHECK_EQ(engram_step_begin(s[0], stepped, NULL, 1, ENGRAM_BF16, ptrs[0], &err), 0); /* s[0] was idle */
    engram_step_abort(s[0]);
    engram_step_abort(s[1]);
    for (int b = 0; b < B; b++)
        engram_session_close(s[b]);
    engram_pool_close(p);
    free(tok);
    free(outs);
}

/* ------------------------------------------------ prefill */

static void prefill(int e)
{
    engram_pool *p = pool_open(e, 0);
    if (!p)
        return;
    const size_t n = 2 * 700 + 123; /* 3 chunks of 700, the last partial */
    uint32_t *tok = random_tokens(n + 10, 5, 300);
    uint8_t *mask = malloc(n + 10);
    for (size_t i = 0; i < n + 10; i++)
        mask[i] = i % 17 != 3;
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, mask, n + 10, h0);
    engram_session *s;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    engram_prefill_opts o = {.chunk_tokens = 700, .ring_chunks = 2, .dtype = ENGRAM_BF16,
                             .table1_delay_ns = ENGRAM_PREFILL_MANUAL};
    engram_prefill *pf;
    CHECK_EQ(engram_prefill_begin(s, tok, mask, n, &o, &pf, &err), 0);
    CHECK_EQ(engram_prefill_chunks(pf), 3);
    CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, want, &err), -EBUSY);
    /* table 0 runs ahead while table 1 waits for its signal */
    const void *rows;
    size_t first, k;
    CHECK_EQ(engram_prefill_wait(pf, 0, 0, &rows, &first, &k, &err), 0);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    CHECK_EQ(engram_prefill_ready(pf, 1), 0);
    engram_prefill_start_table1(pf);
    int bad = 0;
    for (size_t c = 0; c < 3; c++)
        for (int t = 0; t < 2; t++) {
            CHECK_EQ(engram_prefill_wait(pf, t, c, &rows, &first, &k, &err), 0);
            CHECK_EQ(first, c * 700);
            CHECK_EQ(k, c < 2 ? 700 : 123);
            const uint16_t *r = rows;
            for (size_t i = 0; i < k; i++)
                if (mask[first + i])
                    bad += memcmp(r + i * 24 * 256, want + ((first + i) * 48 + (size_t)t * 24) * 256,
                                  24 * ROWB) != 0;
            engram_prefill_release(pf, t, c);
        }
    CHECK_EQ(bad, 0);
    CHECK_EQ(engram_prefill_ready(pf, 0), 3);
    CHECK_EQ(engram_prefill_end(pf, &err), 0);
    /* prefill of n tokens + steps = n + 10 steps one by one */
    engram_history hs, h = h0;
    uint32_t *rws = malloc((n + 10) * 48 * sizeof *rws);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, n, rws, NULL), 0);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    static uint16_t out[48 * 256];
    for (size_t i = n; i < n + 10; i++) {
        CHECK_EQ(engram_step_begin(s, tok + i, mask + i, 1, ENGRAM_BF16, out, &err), 0);
        CHECK_EQ(engram_step_commit(s, 1, &err), 0);
        if (mask[i])
            bad += memcmp(out, want + i * 48 * 256, TOKB) != 0;
    }
    CHECK_EQ(bad, 0);
    /* the same prompt through the serial reader: the same rows */
    engram_reader *rd;
    CHECK_EQ(engram_reader_open(model, NULL, &rd, &err), 0);
    uint16_t *serial = malloc(n * 24 * ROWB);
    engram_history hz = h0;
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &hz, tok, mask, n, rws, NULL), 0);
    CHECK_EQ(engram_reader_batch(rd, 1, rws, n, ENGRAM_BF16, serial, &err), 0);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        if (mask[i])
            same &= memcmp(serial + i * 24 * 256, want + (i * 48 + 24) * 256, 24 * ROWB) == 0;
    CHECK(same);
    engram_reader_close(rd);
    /* cancellation at chunk boundaries and mid-chunk: history unchanged */
    for (int at = 0; at < 4; at++) {
        engram_session_history(s, &h);
        o.table1_delay_ns = (uint64_t)at * 1000000;
        CHECK_EQ(engram_prefill_begin(s, tok, mask, n, &o, &pf, &err), 0);
        if (at >= 2) {
            CHECK_EQ(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), 0);
            engram_prefill_release(pf, 0, 0);
        }
        if (at == 3)
            engram_prefill_cancel(pf);
        else
            CHECK_EQ(engram_prefill_end(pf, &err), -ECANCELED);
        engram_session_history(s, &hs);
        CHECK(hist_eq(&h, &hs));
    }
    /* bad input */
    uint32_t bt[3] = {1, engram_model_layout(model)->vocab, 2};
    CHECK_ERR(engram_prefill_begin(s, bt, NULL, 3, &o, &pf, &err), err, -EINVAL, "token 1");
    o.chunk_tokens = ENGRAM_BATCH_TOKENS + 1;
    CHECK_ERR(engram_prefill_begin(s, tok, NULL, 3, &o, &pf, &err), err, -EINVAL, "chunk");
    engram_session_close(s);
    engram_pool_close(p);
    free(rws);
    free(serial);
    free(tok);
    free(mask);
    free(want);
}

/* ------------------------------------------------ host-memory hooks */

struct hooklog {
    int regs, unregs, refuse;
    void *p[4];
    size_t len[4];
    int bad_unreg; /* unreg of a range not registered, or twice */
};

static int hook_reg(void *ctx, void *p, size_t len)
{
    struct hooklog *h = ctx;
    if (h->refuse)
        return -1;
    if (h->regs < 4) {
        h->p[h->regs] = p;
        h->len[h->regs] = len;
    }
    h->regs++;
    memset(p, 0xA5, len); /* the whole range is the caller's to touch now */
    return 0;
}

static void hook_unreg(void *ctx, void *p, size_t len)
{
    struct hooklog *h = ctx;
    int found = 0;
    for (int i = 0; i < h->regs && i < 4; i++)
        if (h->p[i] == p && h->len[i] == len) {
            h->p[i] = NULL; /* once only */
            found = 1;
        }
    h->bad_unreg += !found;
    h->unregs++;
}

/* Rows of chunk c of table t compared with want; also checks that they lie
 * inside [lo, lo+len) when lo is not NULL. */
static int ring_chunk_ok(engram_prefill *pf, int t, size_t c, const uint16_t *want,
                         const uint8_t *lo, size_t len)
{
    const void *rows;
    size_t first, k;
    engram_error err;
    if (engram_prefill_wait(pf, t, c, &rows, &first, &k, &err) != 0)
        return 0;
    const uint8_t *r = rows;
    int ok = !lo || (r >= lo && r + k * 24 * ROWB <= lo + len); /* lo NULL: no range */
    for (size_t i = 0; i < k; i++)
        ok &= memcmp(r + i * 24 * ROWB, want + ((first + i) * 48 + (size_t)t * 24) * 256, 24 * ROWB) == 0;
    engram_prefill_release(pf, t, c);
    return ok;
}

static void host_hooks(int e)
{
    /* five chunks (the last partial) through a ring of two: it wraps twice */
    const size_t n = 300;
    uint32_t *tok = random_tokens(n, 17, 400);
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, NULL, n, h0);
    engram_prefill_opts o = {.chunk_tokens = 64, .ring_chunks = 2, .dtype = ENGRAM_BF16};
    /* the size is the header's formula: 2 tables x ring x chunk x 24 rows x 512 B */
    const size_t ring = (size_t)2 * 2 * 64 * 24 * 512;
    CHECK_EQ(engram_prefill_ring_bytes(&o), ring);
    engram_prefill_opts d = {0};
    CHECK_EQ(engram_prefill_ring_bytes(&d), (size_t)2 * 2 * 2048 * 24 * 512);
    d.chunk_tokens = ENGRAM_BATCH_TOKENS + 1;
    CHECK_EQ(engram_prefill_ring_bytes(&d), 0);
    d.chunk_tokens = 0;
    d.dtype = ENGRAM_RAW;
    CHECK_EQ(engram_prefill_ring_bytes(&d), (size_t)2 * 2 * 2048 * 24 * 264);
    for (int refuse = 0; refuse < 2; refuse++) {
        struct hooklog hl = {.refuse = refuse};
        engram_pool_opts po = {.reader = {.engine = engines[e], .depth = 32,
                                          .host = {hook_reg, hook_unreg, &hl}}};
        engram_pool *p = NULL;
        engram_error err;
        CHECK_EQ(engram_pool_open(model, &po, &p, &err), 0);
        if (!p)
            break;
        engram_pool_stats ps;
        engram_pool_get_stats(p, &ps);
        /* the reader's I/O buffers, once, at open: at least `depth` reads' worth */
        CHECK_EQ(hl.regs, refuse ? 0 : 1);
        CHECK_EQ(ps.io.host_registered, refuse ? 0 : hl.len[0]);
        if (!refuse)
            CHECK(hl.len[0] >= (size_t)ps.io.depth * (ps.io.align > 1 ? ps.io.align : 264));
        engram_session *s;
        CHECK_EQ(engram_session_open(p, &s, &err), 0);
        /* a ring the pool allocates: registered at begin, kept by the pool at
         * end (for the next prompt), unregistered when the pool closes */
        engram_prefill *pf;
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
        CHECK_EQ(hl.regs, refuse ? 0 : 2);
        int good = 1;
        for (size_t c = 0; c < engram_prefill_chunks(pf); c++)
            for (int t = 0; t < 2; t++)
                good &= ring_chunk_ok(pf, t, c, want, refuse ? NULL : hl.p[1], refuse ? 0 : hl.len[1]);
        if (!refuse)
            CHECK_EQ(hl.len[1], ring);
        CHECK(good);
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        CHECK_EQ(hl.unregs, 0);
        /* the next prompt of the same size takes the kept ring: no new registration */
        engram_history hk = h0;
        CHECK_EQ(engram_session_set_history(s, &hk, &err), 0);
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
        CHECK_EQ(hl.regs, refuse ? 0 : 2);
        good = 1;
        for (size_t c = 0; c < engram_prefill_chunks(pf); c++)
            for (int t = 0; t < 2; t++)
                good &= ring_chunk_ok(pf, t, c, want, refuse ? NULL : hl.p[1], refuse ? 0 : hl.len[1]);
        CHECK(good);
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        engram_pool_get_stats(p, &ps);
        CHECK_EQ(ps.prefill_rings_allocated, 1);
        CHECK_EQ(ps.prefill_rings_reused, 1);
        CHECK_EQ(ps.prefill_ring_bytes, ring);
        /* the caller's ring: nothing registered or allocated for it, rows inside it */
        engram_history hz = h0;
        CHECK_EQ(engram_session_set_history(s, &hz, &err), 0);
        uint8_t *mine = aligned_alloc(64, ring + 64);
        engram_prefill_opts om = o;
        om.ring_mem = mine;
        om.ring_bytes = ring - 1;
        CHECK_ERR(engram_prefill_begin(s, tok, NULL, n, &om, &pf, &err), err, -EINVAL, "need");
        om.ring_mem = mine + 32;
        om.ring_bytes = ring;
        CHECK_ERR(engram_prefill_begin(s, tok, NULL, n, &om, &pf, &err), err, -EINVAL, "aligned");
        om.ring_mem = mine;
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &om, &pf, &err), 0);
        CHECK_EQ(hl.regs, refuse ? 0 : 2);
        good = 1;
        for (size_t c = 0; c < engram_prefill_chunks(pf); c++)
            for (int t = 0; t < 2; t++)
                good &= ring_chunk_ok(pf, t, c, want, mine, ring);
        CHECK(good);
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        /* cancelled mid-prompt: nothing is written into the caller's ring after */
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &om, &pf, &err), 0);
        CHECK_EQ(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), 0);
        engram_prefill_cancel(pf);
        memset(mine, 0x5A, ring);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        size_t changed = 0;
        for (size_t i = 0; i < ring; i++)
            changed += mine[i] != 0x5A;
        CHECK_EQ(changed, 0);
        free(mine);
        engram_session_close(s);
        engram_pool_close(p);
        CHECK_EQ(hl.unregs, refuse ? 0 : 2);
        CHECK_EQ(hl.bad_unreg, 0);
    }
    free(tok);
    free(want);
}

/* ------------------------------------------------ restore */

static void restore(void)
{
    engram_pool *p = pool_open(0, 0);
    if (!p)
        return;
    const size_t n = 30;
    uint32_t *tok = random_tokens(n, 7, 800);
    uint8_t mask[30];
    for (size_t i = 0; i < n; i++)
        mask[i] = i != 12 && i != 19;
    engram_session *a, *b, *c;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &a, &err), 0);
    CHECK_EQ(engram_session_open(p, &b, &err), 0);
    CHECK_EQ(engram_session_open(p, &c, &err), 0);
    static uint16_t oa[48 * 256], ob[48 * 256], oc[48 * 256];
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(engram_step_begin(a, tok + i, mask + i, 1, ENGRAM_BF16, oa, &err), 0);
        CHECK_EQ(engram_step_commit(a, 1, &err), 0);
        if (i == 19 || i == 20) { /* snapshot into b; rebuild c from the last tokens (masked tail) */
            engram_history h;
            engram_session_history(a, &h);
            CHECK_EQ(engram_session_set_history(b, &h, &err), 0);
            CHECK_EQ(engram_session_restore(c, tok, mask, i + 1, &err), 0);
            engram_history hc;
            engram_session_history(c, &hc);
            CHECK(hist_eq(&h, &hc));
        }
        if (i > 20) {
            CHECK_EQ(engram_step_begin(b, tok + i, mask + i, 1, ENGRAM_BF16, ob, &err), 0);
            CHECK_EQ(engram_step_begin(c, tok + i, mask + i, 1, ENGRAM_BF16, oc, &err), 0);
            CHECK_EQ(engram_step_commit(b, 1, &err), 0);
            CHECK_EQ(engram_step_commit(c, 1, &err), 0);
            if (mask[i])
                bad += memcmp(oa, ob, sizeof oa) != 0 || memcmp(oa, oc, sizeof oa) != 0;
        }
    }
    CHECK_EQ(bad, 0);
    engram_session_close(a);
    engram_session_close(b);
    engram_session_close(c);
    engram_pool_close(p);
    free(tok);
}

/* ------------------------------------------------ threads */

#define THREADS 8
#define PER 3          /* sessions per thread */
#define TSTEPS 24

struct tjob {
    engram_pool *p;
    int id;
    uint32_t *tok;     /* [PER][TSTEPS] */
    uint16_t *got;     /* [PER][TSTEPS][48][256] */
    int failed;
};

static void *tworker(void *arg)
{
    struct tjob *j = arg;
    engram_session *s[PER];
    engram_error err;
    for (int q = 0; q < PER; q++)
        if (engram_session_open(j->p, &s[q], &err) < 0)
            j->failed = 1;
    if (j->failed)
        return NULL;
    for (int st = 0; st < TSTEPS; st++)
        for (int q = 0; q < PER; q++) { /* interleaved */
            uint16_t *out = j->got + ((size_t)q * TSTEPS + (size_t)st) * 48 * 256;
            if (engram_step_begin(s[q], j->tok + q * TSTEPS + st, NULL, 1, ENGRAM_BF16, out, &err) < 0 ||
                engram_step_wait(s[q], 1, &err) < 0 || engram_step_commit(s[q], 1, &err) < 0)
                j->failed = 1;
        }
    for (int q = 0; q < PER; q++)
        engram_session_close(s[q]);
    return NULL;
}

static void threads(int e)
{
    engram_pool *p = pool_open(e, e == 0 ? 1u << 20 : 0);
    if (!p)
        return;
    struct tjob jobs[THREADS];
    pthread_t th[THREADS];
    engram_history h0;
    engram_history_reset(&h0);
    /* a prefill on the same pool meanwhile */
    engram_session *ps;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &ps, &err), 0);
    uint32_t *ptok = random_tokens(1200, 99, 1000);
    engram_prefill *pf;
    engram_prefill_opts o = {.chunk_tokens = 400, .dtype = ENGRAM_BF16};
    CHECK_EQ(engram_prefill_begin(ps, ptok, NULL, 1200, &o, &pf, &err), 0);
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (struct tjob){p, i, random_tokens(PER * TSTEPS, 100 + (uint64_t)i, 200),
                                malloc((size_t)PER * TSTEPS * TOKB), 0};
        CHECK_EQ(pthread_create(&th[i], NULL, tworker, &jobs[i]), 0);
    }
    for (size_t c = 0; c < 3; c++)
        for (int t = 0; t < 2; t++) {
            CHECK_EQ(engram_prefill_wait(pf, t, c, NULL, NULL, NULL, &err), 0);
            engram_prefill_release(pf, t, c);
        }
    CHECK_EQ(engram_prefill_end(pf, &err), 0);
    engram_session_close(ps);
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(jobs[i].failed, 0);
        for (int q = 0; q < PER; q++) { /* serially, one session after another */
            uint16_t *w = expected_rows(jobs[i].tok + q * TSTEPS, NULL, TSTEPS, h0);
            bad += memcmp(w, jobs[i].got + (size_t)q * TSTEPS * 48 * 256, (size_t)TSTEPS * TOKB) != 0;
            free(w);
        }
        free(jobs[i].tok);
        free(jobs[i].got);
    }
    CHECK_EQ(bad, 0);
    engram_pool_stats st;
    engram_pool_get_stats(p, &st);
    printf("threads %-8s: %d threads x %d sessions x %d steps + a 1200-token prefill: %llu rounds, "
           "%llu step rows requested, %llu read\n", engine_names[e], THREADS, PER, TSTEPS,
           (unsigned long long)st.rounds, (unsigned long long)st.step_rows_requested,
           (unsigned long long)st.step_rows_read);
    engram_pool_close(p);
    free(ptok);
}

/* ------------------------------------------------ failures */

static void failures(void)
{
    /* a copy of the model, poisoned and then truncated under the pool */
    char bad[600];
    snprintf(bad, sizeof bad, "%s.bad", model_path);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", model_path, bad);
    CHECK_EQ(system(cmd), 0);
    engram_model *m;
    engram_error err;
    CHECK_EQ(engram_model_open(bad, &m, &err), 0);
    engram_model *keep = model;
    model = m;
    engram_model_info in;
    engram_model_get_info(m, &in);
    engram_pool *p = pool_open(0, 0);
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    /* a NaN row: the step names it, the history stays */
    uint32_t tok[1] = {77};
    engram_history h, hs;
    engram_session_history(s, &h);
    uint32_t rows[48];
    engram_history hh = h;
    engram_hash_token(engram_model_hasher(m), &hh, tok[0], 0, rows);
    int fd = open(bad, O_WRONLY | O_CLOEXEC);
    uint8_t ff = 0xff;
    CHECK_EQ(pwrite(fd, &ff, 1, (off_t)(in.table[1].offset + (uint64_t)rows[30] * 264 + 260)), 1);
    close(fd);
    static uint16_t out[48 * 256];
    CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out, &err), 0);
    CHECK_EQ(engram_step_wait(s, 0, &err), 0);
    char want[64];
    snprintf(want, sizeof want, "row %u of table 1", rows[30]);
    CHECK_ERR(engram_step_wait(s, 1, &err), err, -EDOM, want);
    CHECK_ERR(engram_step_commit(s, 1, &err), err, -EDOM, want);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    /* a file truncated under a running prefill: the chunk's read fails,
     * named; the history stays */
    const size_t n = 4000;
    uint32_t *pt = random_tokens(n, 11, 100000);
    engram_prefill_opts o = {.chunk_tokens = 1000, .ring_chunks = 1, .dtype = ENGRAM_BF16};
    engram_prefill *pf;
    CHECK_EQ(engram_prefill_begin(s, pt, NULL, n, &o, &pf, &err), 0);
    CHECK_EQ(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), 0);
    CHECK_EQ(truncate(bad, (off_t)(in.table[0].offset + 1000)), 0);
    engram_prefill_release(pf, 0, 0);
    engram_prefill_release(pf, 1, 0);
    int rc = 0;
    for (size_t c = 1; c < 4 && rc == 0; c++) {
        rc = engram_prefill_wait(pf, 0, c, NULL, NULL, NULL, &err);
        engram_prefill_release(pf, 0, c);
        engram_prefill_release(pf, 1, c);
    }
    CHECK_ERR(rc, err, -EIO, "short read");
    CHECK(engram_prefill_end(pf, &err) == -EIO);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    engram_session_close(s);
    engram_pool_close(p);
    engram_model_close(m);
    model = keep;
    unlink(bad);
    free(pt);
}

/* Cancellation at random points: every way a step or prefill can end
 * early, with other sessions' reads in flight; histories unchanged. */
static void cancels(void)
{
    engram_pool *p = pool_open(0, 0);
    if (!p)
        return;
    engram_session *s[4];
    engram_error err;
    for (int i = 0; i < 4; i++)
        CHECK_EQ(engram_session_open(p, &s[i], &err), 0);
    uint32_t *tok = random_tokens(5000, 13, 30000);
    static uint16_t out[4][ENGRAM_MAX_DRAFT * 48 * 256];
    uint64_t seed = 17;
    int moved = 0;
    for (int round = 0; round < (SANITIZED ? 60 : 300); round++) {
        int who = (int)(tu_rand(&seed) % 4), how = (int)(tu_rand(&seed) % 5);
        engram_history h, hs;
        engram_session_history(s[who], &h);
        unsigned k = 1 + (unsigned)(tu_rand(&seed) % ENGRAM_MAX_DRAFT);
        const uint32_t *t0 = tok + tu_rand(&seed) % 4000;
        if (how < 3) {
            CHECK_EQ(engram_step_begin(s[who], t0, NULL, k, ENGRAM_BF16, out[who], &err), 0);
            if (how == 1)
                engram_step_wait(s[who], 0, &err);
            if (how == 2) {
                struct timespec ts = {0, (long)(tu_rand(&seed) % 300000)};
                nanosleep(&ts, NULL);
            }
            engram_step_abort(s[who]);
        } else {
            engram_prefill_opts o = {.chunk_tokens = 256, .dtype = ENGRAM_BF16,
                                     .table1_delay_ns = tu_rand(&seed) % 2000000};
            engram_prefill *pf;
            CHECK_EQ(engram_prefill_begin(s[who], t0, NULL, 1000, &o, &pf, &err), 0);
            if (how == 4) {
                CHECK_EQ(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), 0);
                engram_prefill_release(pf, 0, 0);
            }
            engram_prefill_cancel(pf);
        }
        engram_session_history(s[who], &hs);
        moved += !hist_eq(&h, &hs);
        /* and another session steps to completion meanwhile */
        int other = (who + 1) % 4;
        CHECK_EQ(engram_step_begin(s[other], t0 + 1, NULL, 1, ENGRAM_BF16, out[other], &err), 0);
        CHECK_EQ(engram_step_commit(s[other], 1, &err), 0);
    }
    CHECK_EQ(moved, 0);
    /* closing sessions with a step or a prefill in flight */
    CHECK_EQ(engram_step_begin(s[0], tok, NULL, 8, ENGRAM_BF16, out[0], &err), 0);
    engram_prefill *pf;
    engram_prefill_opts o = {.chunk_tokens = 512, .dtype = ENGRAM_BF16};
    CHECK_EQ(engram_prefill_begin(s[1], tok, NULL, 3000, &o, &pf, &err), 0);
    for (int i = 0; i < 4; i++)
        engram_session_close(s[i]);
    /* the prefill's handle outlives its session: end says what happened */
    CHECK_ERR(engram_prefill_end(pf, &err), err, -ECANCELED, "session was closed");
    engram_pool_close(p);
    free(tok);
}

/* ------------------------------------------------ misuse */

/* Every documented refusal of the session API: the error code, and nothing
 * changed (history, state: a refused begin leaves the session idle, a
 * refused set_history/restore during a step leaves the history). */
static void misuse(void)
{
    engram_pool *p = pool_open(0, 0), *q = pool_open(1, 0);
    if (!p || !q) {
        engram_pool_close(p);
        engram_pool_close(q);
        return;
    }
    engram_error err;
    engram_pool *np = NULL;
    engram_session *s = NULL, *t = NULL, *u = NULL, *ns = NULL;
    CHECK_EQ(engram_pool_open(NULL, NULL, &np, &err), -EINVAL);
    CHECK_EQ(engram_pool_open(model, NULL, NULL, &err), -EINVAL);
    CHECK(np == NULL);
    CHECK_EQ(engram_session_open(NULL, &ns, &err), -EINVAL);
    CHECK_EQ(engram_session_open(p, NULL, &err), -EINVAL);
    CHECK(ns == NULL);
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    CHECK_EQ(engram_session_open(p, &t, &err), 0);
    CHECK_EQ(engram_session_open(q, &u, &err), 0);
    if (!s || !t || !u)
        goto out;

    uint32_t tok[2] = {7, 8}, badtok[2] = {7, engram_model_layout(model)->vocab};
    static uint16_t o1[TOKB / 2], o2[TOKB / 2], o3[TOKB / 2];
    engram_history h0, h1 = {{3, 2, 1}}, h;
    CHECK_EQ(engram_session_restore(s, tok, NULL, 2, &err), 0);
    engram_session_history(s, &h0);
    CHECK_EQ(engram_session_set_history(NULL, &h1, &err), -EINVAL);
    CHECK_EQ(engram_session_set_history(s, NULL, &err), -EINVAL);
    CHECK_EQ(engram_session_restore(NULL, tok, NULL, 2, &err), -EINVAL);
    CHECK_EQ(engram_session_restore(s, NULL, NULL, 2, &err), -EINVAL);
    engram_session_history(s, &h);
    CHECK(hist_eq(&h, &h0));

    /* no step in progress: wait, poll and commit refuse */
    for (int tb = -1; tb <= 2; tb++) {
        CHECK_EQ(engram_step_wait(s, tb, &err), -EINVAL);
        CHECK_EQ(engram_step_poll(s, tb, &err), -EINVAL);
    }
    CHECK_EQ(engram_step_wait(NULL, 0, &err), -EINVAL);
    CHECK_EQ(engram_step_poll(NULL, 0, &err), -EINVAL);
    CHECK_EQ(engram_step_commit(s, 0, &err), -EINVAL);
    CHECK_EQ(engram_step_commit(NULL, 0, &err), -EINVAL);

    /* batch: refused as a whole, nothing begun */
    engram_session *ss[3] = {s, t, u};
    void *outs[3] = {o1, o2, o3};
    CHECK_EQ(engram_step_begin_batch(NULL, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EINVAL);
    CHECK_EQ(engram_step_begin_batch(ss, NULL, NULL, 2, ENGRAM_BF16, outs, &err), -EINVAL);
    CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, NULL, &err), -EINVAL);
    CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, (engram_dtype)99, outs, &err), -EINVAL);
    uint32_t tok3[3] = {7, 8, 9};
    CHECK_EQ(engram_step_begin_batch(ss, tok3, NULL, 3, ENGRAM_BF16, outs, &err), -EINVAL); /* u: another pool */
    CHECK(strstr(err.msg, "session 2") != NULL);
    engram_session *sn[2] = {s, NULL}, *sd[2] = {s, s};
    CHECK_EQ(engram_step_begin_batch(sn, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EINVAL);
    CHECK(strstr(err.msg, "session 1") != NULL);
    CHECK_EQ(engram_step_begin_batch(sd, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EINVAL);
    void *outn[2] = {o1, NULL};
    CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outn, &err), -EINVAL);
    CHECK_EQ(engram_step_begin_batch(ss, badtok, NULL, 2, ENGRAM_BF16, outs, &err), -EINVAL);
    CHECK(strstr(err.msg, "token 1") != NULL);
    for (int i = 0; i < 2; i++) /* still idle: nothing to wait for */
        CHECK_EQ(engram_step_wait(ss[i], 0, &err), -EINVAL);
    engram_session_history(s, &h);
    CHECK(hist_eq(&h, &h0));

    /* during a step: every state change refused, history kept */
    CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, o1, &err), 0);
    CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, o1, &err), -EBUSY);
    CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outs, &err), -EBUSY);
    CHECK_EQ(engram_step_wait(t, 0, &err), -EINVAL); /* t was not begun by it */
    CHECK_EQ(engram_session_set_history(s, &h1, &err), -EBUSY);
    CHECK_EQ(engram_session_restore(s, tok3, NULL, 3, &err), -EBUSY);
    CHECK_EQ(engram_step_commit(s, 2, &err), -EINVAL); /* j > k */
    CHECK_EQ(engram_step_wait(s, 0, &err), 0);
    CHECK_EQ(engram_step_wait(s, 1, &err), 0);
    engram_step_abort(s);
    engram_session_history(s, &h);
    CHECK(hist_eq(&h, &h0));
    CHECK_EQ(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outs, &err), 0); /* usable */

    /* prefill: refused arguments, and refused while a step is in progress */
    engram_prefill *pf = NULL;
    engram_prefill_opts po = {.chunk_tokens = 2, .ring_chunks = 1, .dtype = ENGRAM_BF16};
    CHECK_EQ(engram_prefill_begin(s, tok3, NULL, 3, &po, &pf, &err), -EBUSY); /* s: in a step */
    CHECK_EQ(engram_step_commit(s, 1, &err), 0);
    CHECK_EQ(engram_step_commit(t, 1, &err), 0);
    engram_session_history(s, &h0);
    CHECK_EQ(engram_prefill_begin(NULL, tok3, NULL, 3, &po, &pf, &err), -EINVAL);
    CHECK_EQ(engram_prefill_begin(s, tok3, NULL, 3, &po, NULL, &err), -EINVAL);
    CHECK_EQ(engram_prefill_begin(s, NULL, NULL, 3, &po, &pf, &err), -EINVAL);
    CHECK_EQ(engram_prefill_begin(s, badtok, NULL, 2, &po, &pf, &err), -EINVAL);
    CHECK(pf == NULL);
    CHECK_EQ(engram_prefill_end(NULL, &err), -EINVAL);
    CHECK_EQ(engram_prefill_wait(NULL, 0, 0, NULL, NULL, NULL, &err), -EINVAL);
    CHECK_EQ(engram_prefill_begin(s, tok3, NULL, 3, &po, &pf, &err), 0);
    if (pf) {
        /* while it runs: the session refuses steps, restores and a second prefill */
        engram_prefill *pf2 = NULL;
        CHECK_EQ(engram_prefill_begin(s, tok3, NULL, 3, &po, &pf2, &err), -EBUSY);
        CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, o1, &err), -EBUSY);
        CHECK_EQ(engram_session_restore(s, tok3, NULL, 3, &err), -EBUSY);
        const void *rows = NULL;
        CHECK_EQ(engram_prefill_chunks(pf), 2);
        CHECK_EQ(engram_prefill_wait(pf, -1, 0, &rows, NULL, NULL, &err), -EINVAL);
        CHECK_EQ(engram_prefill_wait(pf, 2, 0, &rows, NULL, NULL, &err), -EINVAL);
        CHECK_EQ(engram_prefill_wait(pf, 0, 2, &rows, NULL, NULL, &err), -EINVAL);
        CHECK(rows == NULL);
        engram_session_history(s, &h);
        CHECK(hist_eq(&h, &h0));
        for (size_t c = 0; c < 2; c++)
            for (int tb = 0; tb < 2; tb++) {
                CHECK_EQ(engram_prefill_wait(pf, tb, c, &rows, NULL, NULL, &err), 0);
                engram_prefill_release(pf, tb, c);
            }
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
    }
out:
    engram_session_close(s);
    engram_session_close(t);
    engram_session_close(u);
    engram_pool_close(p);
    engram_pool_close(q);
}

/* ------------------------------------------------ prefill misuse (#20, defect 6) */

/* Waits that could only return a reused buffer or never return: each says
 * so at once, and the prefill goes on as before. */
static void prefill_misuse(void)
{
    engram_pool *p = pool_open(0, 0);
    if (!p)
        return;
    const size_t n = 200;
    uint32_t *tok = random_tokens(n, 41, 500);
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, NULL, n, h0);
    engram_session *s;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    engram_prefill_opts o = {.chunk_tokens = 64, .ring_chunks = 1, .dtype = ENGRAM_BF16,
                             .table1_delay_ns = ENGRAM_PREFILL_MANUAL};
    engram_prefill *pf;
    CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
    CHECK_EQ(engram_prefill_chunks(pf), 4);
    /* table 1 before its signal, in manual mode: it would never come */
    CHECK_ERR(engram_prefill_wait(pf, 1, 0, NULL, NULL, NULL, &err), err, -EDEADLK, "start_table1");
    CHECK_ERR(engram_prefill_wait_timed(pf, 1, 0, 1000000, NULL, NULL, NULL, &err), err, -EDEADLK,
              "start_table1");
    CHECK(ring_chunk_ok(pf, 0, 0, want, NULL, 0) == 1); /* waits for chunk 0 and releases it */
    /* chunk 0 released: waiting for it again would return chunk 1's buffer */
    CHECK_ERR(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), err, -EINVAL, "was released");
    /* a ring of one chunk: chunk 2 cannot come before chunk 1 is released */
    CHECK_ERR(engram_prefill_wait(pf, 0, 2, NULL, NULL, NULL, &err), err, -EDEADLK, "released");
    CHECK_ERR(engram_prefill_wait(pf, 0, 4, NULL, NULL, NULL, &err), err, -EINVAL, "no chunk 4");
    /* and it goes on: chunk 1, then table 1 after its signal */
    CHECK(ring_chunk_ok(pf, 0, 1, want, NULL, 0) == 1);
    engram_prefill_start_table1(pf);
    CHECK(ring_chunk_ok(pf, 1, 0, want, NULL, 0) == 1);
    CHECK_ERR(engram_prefill_wait(pf, 1, 2, NULL, NULL, NULL, &err), err, -EDEADLK, "released");
    for (size_t c = 2; c < 4; c++)
        CHECK(ring_chunk_ok(pf, 0, c, want, NULL, 0) == 1);
    for (size_t c = 1; c < 4; c++)
        CHECK(ring_chunk_ok(pf, 1, c, want, NULL, 0) == 1);
    CHECK_EQ(engram_prefill_end(pf, &err), 0);
    engram_history h = h0, hs;
    uint32_t *rws = malloc(n * 48 * sizeof *rws);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, NULL, n, rws, NULL), 0);
    engram_session_history(s, &hs);
    CHECK(hist_eq(&h, &hs));
    free(rws);
    engram_session_close(s);
    engram_pool_close(p);
    free(tok);
    free(want);
    printf("prefill misuse: table 1 before its signal -EDEADLK, past the ring -EDEADLK, a released "
           "chunk -EINVAL; the prefill then read every chunk exactly\n");
}

/* ------------------------------------------------ rings (#20, defect 7) */

static void ring_sizing(void)
{
    const size_t n = 16, big = 3000;
    uint32_t *tok = random_tokens(big, 43, 500);
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, NULL, n, h0);
    struct hooklog hl = {0};
    engram_pool_opts po = {.reader = {.engine = ENGRAM_IO_URING, .depth = 32,
                                      .host = {hook_reg, hook_unreg, &hl}}};
    engram_pool *p = NULL;
    engram_error err;
    CHECK_EQ(engram_pool_open(model, &po, &p, &err), 0);
    if (!p) {
        free(tok);
        free(want);
        return;
    }
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    engram_prefill_opts o = {.dtype = ENGRAM_BF16}; /* chunk 2048, ring 2 */
    /* a 16-token prompt: one chunk of 16 tokens, a ring of one chunk */
    const size_t small = (size_t)2 * 1 * 16 * 24 * 512;
    CHECK_EQ(engram_prefill_ring_bytes_for(&o, n), small);
    CHECK_EQ(small, 393216);
    CHECK_EQ(engram_prefill_ring_bytes(&o), (size_t)2 * 2 * 2048 * 24 * 512);
    CHECK_EQ(engram_prefill_ring_bytes_for(&o, big), (size_t)2 * 2 * 2048 * 24 * 512);
    CHECK_EQ(engram_prefill_ring_bytes_for(&o, 2048), (size_t)2 * 1 * 2048 * 24 * 512);
    int sizes_ok = 1, rows_ok = 1;
    for (int i = 0; i < 200; i++) {
        engram_prefill *pf;
        CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
        engram_prefill_info info;
        engram_prefill_get_info(pf, &info);
        sizes_ok &= info.ring_bytes == small && info.chunks == 1 && info.chunk_tokens == 16 &&
                    info.ring_chunks == 1;
        for (int t = 0; t < 2; t++)
            rows_ok &= ring_chunk_ok(pf, t, 0, want, NULL, 0);
        engram_prefill_get_info(pf, &info);
        sizes_ok &= info.ready[0] == 1 && info.ready[1] == 1 && info.first_ready_ns[0] >= info.begin_ns &&
                    info.last_ready_ns[1] >= info.first_ready_ns[1];
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
    }
    CHECK(sizes_ok);
    CHECK(rows_ok);
    engram_pool_stats ps;
    engram_pool_get_stats(p, &ps);
    /* the reader's buffers and one ring registered, for 200 prompts */
    CHECK_EQ(hl.regs, 2);
    CHECK_EQ(hl.unregs, 0);
    CHECK_EQ(ps.prefill_rings_allocated, 1);
    CHECK_EQ(ps.prefill_rings_reused, 199);
    CHECK_EQ(ps.prefill_ring_bytes, small);
    printf("rings: 200 prompts of 16 tokens, a ring of %zu bytes each, %d host registrations in all "
           "(the reader's and one ring), %" PRIu64 " ring allocated, %" PRIu64 " reused\n", small, hl.regs,
           ps.prefill_rings_allocated, ps.prefill_rings_reused);
    /* a long prompt takes a ring of its own; the small one stays kept */
    engram_prefill *pf;
    CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
    CHECK_EQ(engram_prefill_begin(s, tok, NULL, big, &o, &pf, &err), 0);
    engram_prefill_info info;
    engram_prefill_get_info(pf, &info);
    CHECK_EQ(info.ring_bytes, (size_t)2 * 2 * 2048 * 24 * 512);
    engram_prefill_cancel(pf);
    engram_pool_get_stats(p, &ps);
    CHECK_EQ(ps.prefill_rings_allocated, 2);
    CHECK_EQ(ps.prefill_ring_bytes, small + info.ring_bytes);
    CHECK_EQ(hl.regs, 3);
    engram_session_close(s);
    engram_pool_close(p);
    CHECK_EQ(hl.unregs, 3);
    CHECK_EQ(hl.bad_unreg, 0);
    /* a cache too small for a ring keeps none: each prompt allocates and frees */
    struct hooklog h2 = {0};
    po.reader.host.ctx = &h2;
    po.ring_cache_bytes = small - 1;
    CHECK_EQ(engram_pool_open(model, &po, &p, &err), 0);
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(engram_session_set_history(s, &h0, &err), 0);
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
        for (int t = 0; t < 2; t++)
            CHECK(ring_chunk_ok(pf, t, 0, want, NULL, 0));
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        CHECK_EQ(h2.unregs, i + 1);
    }
    engram_pool_get_stats(p, &ps);
    CHECK_EQ(ps.prefill_rings_allocated, 3);
    CHECK_EQ(ps.prefill_ring_bytes, 0);
    engram_session_close(s);
    engram_pool_close(p);
    CHECK_EQ(h2.regs, 4); /* the reader's buffers and 3 rings, each unregistered */
    CHECK_EQ(h2.unregs, 4);
    CHECK_EQ(h2.bad_unreg, 0);
    free(tok);
    free(want);
}

/* ------------------------------------------------ close with work in progress */

static void close_semantics(void)
{
    const size_t n = 3000;
    uint32_t *tok = random_tokens(n, 47, 500);
    engram_history h0;
    engram_history_reset(&h0);
    engram_error err;
    /* a session closed under its prefill: the prefill's handle stays valid */
    engram_pool *p = pool_open(0, 0);
    if (!p) {
        free(tok);
        return;
    }
    engram_session *s, *t;
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    engram_prefill_opts o = {.chunk_tokens = 256, .ring_chunks = 2, .dtype = ENGRAM_BF16};
    engram_prefill *pf;
    CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
    CHECK_EQ(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, &err), 0);
    engram_session_close(s);
    int rc = engram_prefill_wait(pf, 0, 1, NULL, NULL, NULL, &err); /* within the ring */
    CHECK(rc == -ECANCELED || rc == 0);
    if (rc < 0)
        CHECK(strstr(err.msg, "session was closed") != NULL);
    CHECK_ERR(engram_prefill_end(pf, &err), err, -ECANCELED, "session was closed");

    /* the pool closed with sessions open: steps in flight end, every later
     * begin is refused, the handles stay valid until closed */
    CHECK_EQ(engram_session_open(p, &s, &err), 0);
    CHECK_EQ(engram_session_open(p, &t, &err), 0);
    static uint16_t out[48 * 256];
    CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out, &err), 0);
    CHECK_EQ(engram_prefill_begin(t, tok, NULL, n, &o, &pf, &err), 0);
    engram_pool_close(p);
    for (int tb = 0; tb < 2; tb++) {
        rc = engram_step_wait(s, tb, &err);
        CHECK(rc == 0 || rc == -ESHUTDOWN);
    }
    rc = engram_step_commit(s, 1, &err);
    CHECK(rc == 0 || rc == -ESHUTDOWN);
    engram_history h;
    engram_session_history(s, &h);
    engram_history ha = h0;
    uint32_t r48[48];
    engram_hash_token(engram_model_hasher(model), &ha, tok[0], 0, r48);
    CHECK(rc == 0 ? hist_eq(&h, &ha) : hist_eq(&h, &h0));
    CHECK_ERR(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out, &err), err, -ESHUTDOWN, "pool was closed");
    CHECK_ERR(engram_step_wait(s, 0, &err), err, -EINVAL, "no step");
    engram_session *u = NULL;
    CHECK_ERR(engram_session_open(p, &u, &err), err, -ESHUTDOWN, "pool was closed");
    CHECK(u == NULL);
    rc = engram_prefill_wait(pf, 0, 1, NULL, NULL, NULL, &err); /* within the ring */
    CHECK(rc == -ESHUTDOWN || rc == 0);
    rc = engram_prefill_wait(pf, 0, 5, NULL, NULL, NULL, &err); /* beyond it: why it ended first */
    CHECK_ERR(rc, err, -ESHUTDOWN, "pool was closed");
    /* 12 chunks and a ring of 2 never released: it cannot have completed */
    CHECK_ERR(engram_prefill_end(pf, &err), err, -ESHUTDOWN, "pool was closed");
    CHECK_ERR(engram_prefill_begin(t, tok, NULL, n, &o, &pf, &err), err, -ESHUTDOWN, "pool was closed");
    CHECK_EQ(engram_session_set_history(s, &h0, &err), 0); /* an idle session's own state */
    engram_session_close(s);
    engram_session_close(t); /* the last handle: the pool's memory goes (LeakSanitizer) */
    free(tok);
    printf("close: a session closed under its prefill (end -ECANCELED), a pool closed with 2 sessions "
           "and a prefill open (-ESHUTDOWN, handles valid until closed)\n");
}

/* A reader of small depth: prompts still read (the slots they keep, and a
 * step reserve of at most a quarter of the depth), steps alongside. */
static void small_depth(void)
{
    const size_t n = 700;
    uint32_t *tok = random_tokens(n, 61, 500);
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, NULL, n, h0);
    static const unsigned depths[] = {8, 2, 1};
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
        engram_pool_opts po = {.reader = {.engine = ENGRAM_IO_URING, .depth = depths[d]}};
        engram_pool *p = NULL;
        engram_error err;
        CHECK_EQ(engram_pool_open(model, &po, &p, &err), 0);
        if (!p)
            continue;
        engram_session *s, *t;
        CHECK_EQ(engram_session_open(p, &s, &err), 0);
        CHECK_EQ(engram_session_open(p, &t, &err), 0);
        engram_prefill_opts o = {.chunk_tokens = 256, .ring_chunks = 2, .dtype = ENGRAM_BF16};
        engram_prefill *pf;
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, n, &o, &pf, &err), 0);
        int ok = 1;
        static uint16_t out[48 * 256];
        for (size_t c = 0; c < engram_prefill_chunks(pf) && ok; c++) {
            for (int tb = 0; tb < 2 && ok; tb++) {
                /* a limit instead of a hang: 20 s is far beyond any read here */
                const void *rows;
                size_t first, k;
                ok = engram_prefill_wait_timed(pf, tb, c, 20000000000ull, &rows, &first, &k, &err) == 0;
                for (size_t i = 0; i < k && ok; i++)
                    ok = memcmp((const uint16_t *)rows + i * 24 * 256,
                                want + ((first + i) * 48 + (size_t)tb * 24) * 256, 24 * ROWB) == 0;
                engram_prefill_release(pf, tb, c);
            }
            /* a step of another session meanwhile */
            CHECK_EQ(engram_step_begin(t, tok + c, NULL, 1, ENGRAM_BF16, out, &err), 0);
            CHECK_EQ(engram_step_commit(t, 1, &err), 0);
        }
        CHECK(ok);
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        engram_session_close(s);
        engram_session_close(t);
        engram_pool_close(p);
    }
    free(tok);
    free(want);
}

/* The pool closed on one thread while its last session closes on another,
 * the session's close landing while the pool unregisters its first kept
 * ring (the hook signals and lingers): neither may touch what the other
 * freed (ASan in the suite; before the fix the pool's hooks were read after
 * the session's close had freed the pool). */
struct race_hooks {
    struct hooklog log;
    size_t reader_len;           /* the reader's buffers: not a ring        */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_unreg;
};

static int race_reg(void *ctx, void *p, size_t len)
{
    return hook_reg(&((struct race_hooks *)ctx)->log, p, len);
}

static void race_unreg(void *ctx, void *p, size_t len)
{
    struct race_hooks *h = ctx;
    hook_unreg(&h->log, p, len);
    if (len == h->reader_len)
        return;
    pthread_mutex_lock(&h->mu);
    h->in_unreg++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
}

struct closer_arg {
    engram_session *s;
    struct race_hooks *h;
};

static void *close_session_thread(void *arg)
{
    struct closer_arg *a = arg;
    pthread_mutex_lock(&a->h->mu);
    while (a->h->in_unreg == 0)
        pthread_cond_wait(&a->h->cv, &a->h->mu);
    pthread_mutex_unlock(&a->h->mu);
    engram_session_close(a->s);
    return NULL;
}

static void pool_close_race(void)
{
    uint32_t *tok = random_tokens(600, 67, 500);
    for (int round = 0; round < 3; round++) {
        struct race_hooks h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        engram_pool_opts po = {.reader = {.engine = ENGRAM_IO_URING, .depth = 16,
                                          .host = {race_reg, race_unreg, &h}}};
        engram_pool *p = NULL;
        engram_error err;
        CHECK_EQ(engram_pool_open(model, &po, &p, &err), 0);
        if (!p)
            break;
        h.reader_len = h.log.len[0];
        engram_session *s;
        CHECK_EQ(engram_session_open(p, &s, &err), 0);
        /* two rings of different sizes kept by the pool */
        engram_prefill_opts o = {.chunk_tokens = 256, .dtype = ENGRAM_BF16};
        engram_prefill *a1, *a2;
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, 32, &o, &a1, &err), 0);
        engram_prefill_cancel(a1);
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, 600, &o, &a2, &err), 0);
        engram_prefill_cancel(a2);
        struct closer_arg ca = {s, &h};
        pthread_t th;
        pthread_create(&th, NULL, close_session_thread, &ca);
        engram_pool_close(p); /* the session closes during its first ring's unreg */
        pthread_join(th, NULL);
        CHECK_EQ(h.log.regs, 3);
        CHECK_EQ(h.log.unregs, 3);
        CHECK_EQ(h.in_unreg, 2);
    }
    free(tok);
}

/* ------------------------------------------------ steps of several sessions, k tokens each */

static void begin_many(int e)
{
    engram_pool *p = pool_open(e, 0);
    if (!p)
        return;
    enum { NS = 4 };
    const unsigned k[NS] = {1, 3, 8, 2};
    uint32_t *tok = random_tokens(64, 53, 500);
    uint8_t mask[64];
    for (int i = 0; i < 64; i++)
        mask[i] = i % 5 != 2;
    engram_session *s[NS];
    engram_error err;
    static uint16_t out[NS][ENGRAM_MAX_DRAFT * 48 * 256];
    engram_step_req q[NS];
    size_t at = 0;
    for (int i = 0; i < NS; i++) {
        CHECK_EQ(engram_session_open(p, &s[i], &err), 0);
        q[i] = (engram_step_req){s[i], tok + at, mask + at, k[i], out[i]};
        at += k[i];
    }
    for (int round = 0; round < 3; round++) {
        engram_history before[NS];
        for (int i = 0; i < NS; i++) {
            engram_session_history(s[i], &before[i]);
            memset(out[i], 0xee, sizeof out[i]);
        }
        CHECK_EQ(engram_step_begin_many(q, NS, ENGRAM_BF16, &err), 0);
        for (int i = 0; i < NS; i++) {
            unsigned j = (unsigned)(round + i) % (k[i] + 1);
            CHECK_EQ(engram_step_commit(s[i], j, &err), 0);
            uint16_t *w = expected_rows(q[i].tokens, q[i].mask, k[i], before[i]);
            int bad = 0;
            for (unsigned x = 0; x < k[i]; x++)
                bad += q[i].mask[x] ? memcmp(out[i] + (size_t)x * 48 * 256, w + (size_t)x * 48 * 256, TOKB) != 0
                                    : out[i][(size_t)x * 48 * 256] != 0xeeee;
            CHECK_EQ(bad, 0);
            free(w);
            engram_history h = before[i], hs;
            uint32_t rows[8 * 48];
            CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, q[i].tokens, q[i].mask, j, rows, NULL), 0);
            engram_session_history(s[i], &hs);
            CHECK(hist_eq(&h, &hs));
        }
    }
    /* refusals, nothing begun */
    engram_step_req bad[NS];
    memcpy(bad, q, sizeof bad);
    bad[2].k = 0;
    CHECK_ERR(engram_step_begin_many(bad, NS, ENGRAM_BF16, &err), err, -EINVAL, "k must be");
    memcpy(bad, q, sizeof bad);
    bad[3].s = s[1];
    CHECK_ERR(engram_step_begin_many(bad, NS, ENGRAM_BF16, &err), err, -EINVAL, "twice");
    uint32_t badtok[3] = {1, 2, engram_model_layout(model)->vocab};
    memcpy(bad, q, sizeof bad);
    bad[1].tokens = badtok; /* the requests' tokens in order: 1 of s[0], then s[1]'s 3 */
    CHECK_ERR(engram_step_begin_many(bad, NS, ENGRAM_BF16, &err), err, -EINVAL, "token 3");
    for (int i = 0; i < NS; i++)
        CHECK_EQ(engram_step_poll(s[i], 0, &err), -EINVAL); /* idle */
    CHECK_EQ(engram_step_begin_many(NULL, 2, ENGRAM_BF16, &err), -EINVAL);
    CHECK_EQ(engram_step_begin_many(q, 0, ENGRAM_BF16, &err), 0);
    for (int i = 0; i < NS; i++)
        engram_session_close(s[i]);
    engram_pool_close(p);
    free(tok);
}

/* ------------------------------------------------ two pipeline stages on two threads */

struct stages {
    engram_session *s;
    const uint32_t *tok;
    size_t n;
    uint16_t *out;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t begun, done; /* steps begun by stage 0, committed by stage 1 */
    int bad;
};

static void *stage1(void *arg)
{
    struct stages *g = arg;
    for (size_t i = 0; i < g->n; i++) {
        pthread_mutex_lock(&g->mu);
        while (g->begun <= i)
            pthread_cond_wait(&g->cv, &g->mu);
        pthread_mutex_unlock(&g->mu);
        g->bad += engram_step_wait(g->s, 1, NULL) != 0;
        pthread_mutex_lock(&g->mu);
        g->done = i + 1; /* table 1 in: stage 0 may commit */
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

static void pipeline(int e)
{
    engram_pool *p = pool_open(e, 0);
    if (!p)
        return;
    struct stages g = {.n = 60, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    uint32_t *tok = random_tokens(g.n, 59, 500);
    engram_history h0;
    engram_history_reset(&h0);
    uint16_t *want = expected_rows(tok, NULL, g.n, h0);
    static uint16_t out[48 * 256];
    g.tok = tok;
    g.out = out;
    CHECK_EQ(engram_session_open(p, &g.s, NULL), 0);
    pthread_t th;
    pthread_create(&th, NULL, stage1, &g);
    int bad = 0;
    for (size_t i = 0; i < g.n; i++) {
        memset(out, 0xee, sizeof out);
        CHECK_EQ(engram_step_begin(g.s, tok + i, NULL, 1, ENGRAM_BF16, out, NULL), 0);
        pthread_mutex_lock(&g.mu);
        g.begun = i + 1;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
        bad += engram_step_wait(g.s, 0, NULL) != 0; /* concurrently with stage 1's wait for table 1 */
        pthread_mutex_lock(&g.mu);
        while (g.done <= i)
            pthread_cond_wait(&g.cv, &g.mu);
        pthread_mutex_unlock(&g.mu);
        CHECK_EQ(engram_step_commit(g.s, 1, NULL), 0);
        bad += memcmp(out, want + i * 48 * 256, TOKB) != 0;
    }
    pthread_join(th, NULL);
    CHECK_EQ(bad + g.bad, 0);
    engram_history h = h0, hs;
    uint32_t *rws = malloc(g.n * 48 * sizeof *rws);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, NULL, g.n, rws, NULL), 0);
    engram_session_history(g.s, &hs);
    CHECK(hist_eq(&h, &hs));
    free(rws);
    engram_session_close(g.s);
    engram_pool_close(p);
    free(tok);
    free(want);
}

static void memory(void)
{
    printf("a session holds %zu bytes (limit %u)\n", sizeof(struct engram_session),
           ENGRAM_SESSION_MAX_BYTES);
    CHECK(sizeof(struct engram_session) <= ENGRAM_SESSION_MAX_BYTES);
}

int main(void)
{
    /* a hang (a wait for reads that never complete) fails the test instead of
     * stalling the suite: SIGALRM kills it (its slowest run, under TSan, is
     * ~69 s on a 2-core VM) */
    alarm(400);
    static uint32_t map[100000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 100000, 60000, 40000), 0);
    CHECK_EQ(tu_build("session.gguf", &l, ENGRAM_FILL_RANDOM, 0, model_path, sizeof model_path), 0);
    engram_error err;
    if (engram_model_open(model_path, &model, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    memory();
    for (int e = 0; e < 3; e++) {
        if (tsan_dup_engine(engines[e]))
            continue; /* under TSan: the thread pool's run covers it (testutil.h) */
        steps(e);
        batched(e);
        begin_many(e);
        pipeline(e);
        prefill(e);
        host_hooks(e);
        threads(e);
    }
    prefill_misuse();
    ring_sizing();
    close_semantics();
    small_depth();
    pool_close_race();
    restore();
    misuse();
    cancels();
    failures();
    engram_model_close(model);
    tu_cleanup();
    return tu_finish("test_session");
}
