/*
 * test_ple_session.c - sessions of the family's second member, Qwen3.8's
 * PLE (issue #22 item 6), on a small generated qwen4exp model (demo-sized
 * heads, W = 64), with every engine (the loop over engines without the
 * buffered fallback under TSan, tsan_dup_engine in testutil.h; the parts
 * after it run on the buffered one), with a row cache and without.  The
 * oracle is engram_ple_hash + engram_model_read_bf16/_f32 on the same
 * tokens, and engram_apply_seq in one call:
 *  - steps (k = 1..8, masks with padding and image positions, BF16, F32
 *    and RAW) deliver exactly the hashed tokens' rows, padding rows
 *    untouched, nothing past out; table 1 is -EINVAL; random commits j <= k
 *    and aborts leave the history of the committed tokens hashed at once;
 *  - prefills deliver the same rows chunk by chunk, rings sized by the
 *    family (engram_pool_prefill_ring_bytes);
 *  - batched decode of 12 sessions (begin_batch, begin_many) equals each
 *    alone, shared rows read once;
 *  - set_history / restore / mask and token validation, errors named,
 *    nothing changed;
 *  - the convolution state: a sequence decoded with engram_step_apply
 *    (random k, commits, aborts, re-applies) gives residuals and a final
 *    state bit-identical to engram_apply_seq over the committed tokens in
 *    one call; prefill_apply over chunks equals one call; a snapshot loaded
 *    into another session continues bit for bit; corrupted snapshots are
 *    refused field by field, the session unchanged;
 *  - the same on a model whose state holds fewer frames than a step has
 *    tokens (conv_kernel 2: 3 frames; the step applied token by token);
 *  - V4.1: engram_step_apply equals engram_apply_strided; its snapshot
 *    (header + history) round-trips.
 */
#include <math.h>

#include "testutil.h"
#include "../src/format/gguf.h"
#include "../src/tools/ple_gen.h"

#define W 64u
#define S 4u
#define SW (S * W)
#define ROWS 16u
#define RB 320u /* a BF16 / RAW row */

static engram_model *M;
static uint32_t VOCAB, EOS;
static uint64_t SEED = 20261202;
static const engram_io_engine engines[] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
static const char *const engine_names[] = {"io_uring", "threads", "buffered"};

static uint32_t rnd(unsigned n)
{
    return (uint32_t)(tu_rand(&SEED) % n);
}

/* Mostly a small alphabet (rows repeat across sessions), sometimes EOS. */
static uint32_t rtoken(void)
{
    return rnd(10) == 0 ? EOS : rnd(3000);
}

/* NULL (all text) a quarter of the time, else mostly text with padding
 * and image positions. */
static const uint8_t *rmask(uint8_t *m, size_t n)
{
    if (rnd(4) == 0)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned r = rnd(10);
        m[i] = r == 0 ? ENGRAM_MASK_PAD : r == 1 ? ENGRAM_MASK_IMAGE : ENGRAM_MASK_TEXT;
    }
    return m;
}

static uint8_t kind_of(const uint8_t *mask, size_t i)
{
    if (!mask)
        return ENGRAM_PLE_TEXT;
    return mask[i] == 0 ? ENGRAM_PLE_PAD : mask[i] == 2 ? ENGRAM_PLE_IMAGE : ENGRAM_PLE_TEXT;
}

static size_t row_bytes(engram_dtype d)
{
    return d == ENGRAM_F32 ? 640 : 320;
}

/* The oracle: n tokens hashed from *h (advanced), and their rows in
 * exp[n][16] of d; padding positions keep exp's bytes. */
static void expect(engram_ple_history *h, const uint32_t *tok, const uint8_t *mask, size_t n, engram_dtype d,
                   uint8_t *exp)
{
    uint8_t *kinds = malloc(n ? n : 1);
    uint32_t *rows = malloc((n ? n : 1) * ROWS * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        kinds[i] = kind_of(mask, i);
    engram_error err;
    CHECK_EQ(engram_ple_hash(M, h, tok, kinds, n, rows, &err), 0);
    size_t rb = row_bytes(d);
    for (size_t i = 0; i < n; i++) {
        if (kinds[i] == ENGRAM_PLE_PAD)
            continue;
        if (d == ENGRAM_F32)
            CHECK_EQ(engram_model_read_f32(M, 0, rows + i * ROWS, ROWS, (float *)(exp + i * ROWS * rb), &err), 0);
        else
            CHECK_EQ(engram_model_read_bf16(M, 0, rows + i * ROWS, ROWS, (uint16_t *)(exp + i * ROWS * rb), &err),
                     0);
    }
    free(kinds);
    free(rows);
}

static int same_hist(engram_session *s, const engram_ple_history *h)
{
    engram_history e;
    engram_session_history(s, &e);
    return e.id[0] == (int32_t)h->lag[0] && e.id[1] == (int32_t)h->lag[1] && e.id[2] == -1;
}

static engram_pool *open_pool(int e, int cache)
{
    engram_pool_opts o = {.reader = {.engine = engines[e], .depth = 16, .cache_bytes = cache ? 1u << 20 : 0}};
    engram_pool *p = NULL;
    engram_error err;
    if (engram_pool_open(M, &o, &p, &err) < 0) {
        printf("pool %s: %s (skipped)\n", engine_names[e], err.msg);
        return NULL;
    }
    return p;
}

/* ------------------------------------------------------------ rows */

static void steps(engram_pool *p, const char *what)
{
    enum { NS = 3, STEPS = 90 };
    engram_session *ss[NS];
    engram_ple_history ref[NS];
    for (int i = 0; i < NS; i++) {
        CHECK_EQ(engram_session_open(p, &ss[i], NULL), 0);
        engram_ple_history_reset(M, &ref[i]);
        CHECK(same_hist(ss[i], &ref[i]));
    }
    unsigned commits = 0, aborts = 0, same = 1;
    for (int it = 0; it < STEPS; it++) {
        int w = (int)rnd(NS);
        unsigned k = 1 + rnd(ENGRAM_MAX_DRAFT);
        engram_dtype d = (engram_dtype)rnd(3);
        uint32_t tok[ENGRAM_MAX_DRAFT];
        uint8_t mb[ENGRAM_MAX_DRAFT];
        for (unsigned i = 0; i < k; i++)
            tok[i] = rtoken();
        const uint8_t *mask = rmask(mb, k);
        size_t len = (k * ROWS + 2) * row_bytes(d);
        uint8_t *out = malloc(len), *exp = malloc(len);
        memset(out, 0xa5, len);
        memset(exp, 0xa5, len);
        engram_ple_history h = ref[w];
        expect(&h, tok, mask, k, d, exp);
        engram_error err;
        CHECK_EQ(engram_step_begin(ss[w], tok, mask, k, d, out, &err), 0);
        CHECK_ERR(engram_step_wait(ss[w], 1, &err), err, -EINVAL, "table 1");
        CHECK_EQ(engram_step_wait(ss[w], 0, &err), 0);
        same &= memcmp(out, exp, len) == 0;
        engram_step_info si;
        engram_step_get_info(ss[w], &si);
        unsigned live = 0;
        for (unsigned i = 0; i < k; i++)
            live += kind_of(mask, i) != ENGRAM_PLE_PAD;
        CHECK_EQ(si.rows[0], live * ROWS);
        CHECK_EQ(si.rows[1], 0);
        if (rnd(5) == 0) {
            engram_step_abort(ss[w]);
            aborts++;
        } else {
            unsigned j = rnd(k + 1);
            CHECK_EQ(engram_step_commit(ss[w], j, &err), 0);
            engram_ple_history h2 = ref[w];
            uint8_t *scratch = malloc(len);
            expect(&h2, tok, mask, j, ENGRAM_BF16, scratch); /* the history of the first j */
            free(scratch);
            ref[w] = h2;
            commits++;
        }
        CHECK(same_hist(ss[w], &ref[w]));
        free(out);
        free(exp);
    }
    CHECK(same);
    printf("%s: %d steps (k 1..8, pad/image masks, BF16/F32/RAW) equal the hash + model reads; "
           "%u commits, %u aborts, histories as hashed at once\n", what, STEPS, commits, aborts);
    for (int i = 0; i < NS; i++)
        engram_session_close(ss[i]);
}

static void prefills(engram_pool *p, const char *what)
{
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    engram_ple_history ref;
    engram_ple_history_reset(M, &ref);
    unsigned same = 1;
    size_t total = 0;
    for (int it = 0; it < 5; it++) {
        size_t n = 1 + rnd(300);
        uint32_t *tok = malloc(n * sizeof *tok);
        uint8_t *mb = malloc(n);
        for (size_t i = 0; i < n; i++)
            tok[i] = rtoken();
        const uint8_t *mask = rmask(mb, n);
        engram_prefill_opts o = {.chunk_tokens = 32 + rnd(64), .ring_chunks = 1 + rnd(3),
                                 .dtype = (engram_dtype)rnd(3)};
        size_t rb = row_bytes(o.dtype);
        uint8_t *exp = malloc(n * ROWS * rb);
        memset(exp, 0, n * ROWS * rb);
        engram_ple_history h = ref;
        expect(&h, tok, mask, n, o.dtype, exp);
        engram_prefill *pf;
        engram_error err;
        CHECK_EQ(engram_prefill_begin(s, tok, mask, n, &o, &pf, &err), 0);
        engram_prefill_info info;
        engram_prefill_get_info(pf, &info);
        CHECK_EQ(info.ring_bytes, engram_pool_prefill_ring_bytes(p, &o, n));
        CHECK_EQ(info.ring_bytes, (size_t)info.ring_chunks * info.chunk_tokens * ROWS * rb);
        CHECK(info.ring_bytes < engram_prefill_ring_bytes_for(&o, n));
        CHECK_ERR(engram_prefill_wait(pf, 1, 0, NULL, NULL, NULL, &err), err, -EINVAL, "table 1");
        CHECK_EQ(engram_prefill_ready(pf, 1), 0);
        for (size_t c = 0; c < engram_prefill_chunks(pf); c++) {
            const void *rows;
            size_t first, nt;
            CHECK_EQ(engram_prefill_wait(pf, 0, c, &rows, &first, &nt, &err), 0);
            for (size_t i = 0; i < nt; i++)
                if (kind_of(mask, first + i) != ENGRAM_PLE_PAD)
                    same &= memcmp((const uint8_t *)rows + i * ROWS * rb, exp + (first + i) * ROWS * rb,
                                   ROWS * rb) == 0;
            engram_prefill_release(pf, 0, c);
        }
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        ref = h;
        CHECK(same_hist(s, &ref));
        total += n;
        free(tok);
        free(mb);
        free(exp);
    }
    CHECK(same);
    /* then a step continues from the prompt's history */
    uint32_t t = rtoken();
    uint8_t out[ROWS * RB], exp[ROWS * RB];
    engram_ple_history h = ref;
    expect(&h, &t, NULL, 1, ENGRAM_BF16, exp);
    CHECK_EQ(engram_step_begin(s, &t, NULL, 1, ENGRAM_BF16, out, NULL), 0);
    CHECK_EQ(engram_step_wait(s, 0, NULL), 0);
    CHECK(memcmp(out, exp, sizeof out) == 0);
    CHECK_EQ(engram_step_commit(s, 1, NULL), 0);
    CHECK(same_hist(s, &h));
    printf("%s: 5 prompts (%zu tokens, chunks of 32..95, rings 1..3, BF16/F32/RAW) equal the hash + "
           "model reads; rings sized by the family\n", what, total);
    engram_session_close(s);
}

/* B sessions at random histories: one token each in a batch, then up to 8
 * each through begin_many, equal each session's own rows; a token shared
 * by all (from the same history) is read once. */
static void batched(engram_pool *p)
{
    enum { B = 12 };
    engram_session *ss[B];
    engram_ple_history ref[B];
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_session_open(p, &ss[i], NULL), 0);
        engram_ple_history_reset(M, &ref[i]);
        /* half of them at one history, the rest elsewhere */
        uint32_t at[2] = {i % 2 ? 17 : rtoken(), i % 2 ? 29 : rtoken()};
        CHECK_EQ(engram_session_restore(ss[i], at, NULL, 2, NULL), 0);
        uint8_t scratch[2 * ROWS * RB];
        expect(&ref[i], at, NULL, 2, ENGRAM_BF16, scratch);
        CHECK(same_hist(ss[i], &ref[i]));
    }
    engram_pool_stats st0, st1;
    engram_pool_get_stats(p, &st0);
    uint32_t tok[B];
    uint8_t mask[B];
    void *outs[B];
    uint8_t *exp[B];
    for (int i = 0; i < B; i++) {
        tok[i] = i % 2 ? 4242 : rtoken();
        mask[i] = (uint8_t)(i % 5 == 4 ? ENGRAM_MASK_IMAGE : i == 6 ? ENGRAM_MASK_PAD : ENGRAM_MASK_TEXT);
        outs[i] = malloc(ROWS * 640);
        exp[i] = malloc(ROWS * 640);
        memset(outs[i], 0x5a, ROWS * 640);
        memset(exp[i], 0x5a, ROWS * 640);
        engram_ple_history h = ref[i];
        expect(&h, &tok[i], &mask[i], 1, ENGRAM_F32, exp[i]);
    }
    CHECK_EQ(engram_step_begin_batch(ss, tok, mask, B, ENGRAM_F32, outs, NULL), 0);
    unsigned same = 1;
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_step_wait(ss[i], 0, NULL), 0);
        same &= memcmp(outs[i], exp[i], ROWS * 640) == 0;
        CHECK_EQ(engram_step_commit(ss[i], 1, NULL), 0);
        expect(&ref[i], &tok[i], &mask[i], 1, ENGRAM_F32, exp[i]);
        CHECK(same_hist(ss[i], &ref[i]));
    }
    engram_pool_get_stats(p, &st1);
    CHECK(st1.step_rows_read - st0.step_rows_read < st1.step_rows_requested - st0.step_rows_requested);
    /* begin_many: k up to 8 each */
    engram_step_req req[B];
    uint32_t toks[B][ENGRAM_MAX_DRAFT];
    uint8_t masks[B][ENGRAM_MAX_DRAFT];
    for (int i = 0; i < B; i++) {
        unsigned k = 1 + rnd(ENGRAM_MAX_DRAFT);
        for (unsigned j = 0; j < k; j++)
            toks[i][j] = rtoken();
        free(outs[i]);
        free(exp[i]);
        outs[i] = malloc(k * ROWS * RB);
        exp[i] = malloc(k * ROWS * RB);
        memset(outs[i], 0x33, k * ROWS * RB);
        memset(exp[i], 0x33, k * ROWS * RB);
        req[i] = (engram_step_req){ss[i], toks[i], rmask(masks[i], k), k, outs[i]};
        engram_ple_history h = ref[i];
        expect(&h, toks[i], req[i].mask, k, ENGRAM_RAW, exp[i]);
    }
    CHECK_EQ(engram_step_begin_many(req, B, ENGRAM_RAW, NULL), 0);
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_step_wait(ss[i], 0, NULL), 0);
        same &= memcmp(outs[i], exp[i], req[i].k * ROWS * RB) == 0;
        engram_step_abort(ss[i]);
        CHECK(same_hist(ss[i], &ref[i]));
        free(outs[i]);
        free(exp[i]);
        engram_session_close(ss[i]);
    }
    CHECK(same);
    printf("batched: %d sessions, begin_batch (F32, pad/image) and begin_many (RAW, k 1..8) equal each "
           "alone; %llu of %llu shared rows read\n", B,
           (unsigned long long)(st1.step_rows_read - st0.step_rows_read),
           (unsigned long long)(st1.step_rows_requested - st0.step_rows_requested));
}

/* ------------------------------------------------------------ history */

static void history(engram_pool *p)
{
    engram_session *s;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    engram_history h = {{5, 7, -1}}, got;
    CHECK_EQ(engram_session_set_history(s, &h, &err), 0);
    engram_session_history(s, &got);
    CHECK(memcmp(&got, &h, sizeof h) == 0);
    /* a step then hashes from it */
    engram_ple_history ph = {{5, 7}};
    uint32_t t = 99;
    uint8_t out[ROWS * RB], exp[ROWS * RB];
    expect(&ph, &t, NULL, 1, ENGRAM_BF16, exp);
    CHECK_EQ(engram_step_begin(s, &t, NULL, 1, ENGRAM_BF16, out, NULL), 0);
    CHECK_EQ(engram_step_wait(s, 0, NULL), 0);
    CHECK(memcmp(out, exp, sizeof out) == 0);
    /* busy */
    CHECK_ERR(engram_session_set_history(s, &h, &err), err, -EBUSY, "in progress");
    CHECK_ERR(engram_session_restore(s, &t, NULL, 1, &err), err, -EBUSY, "in progress");
    engram_step_abort(s);
    /* refused entries, history unchanged */
    engram_history bad[3] = {{{(int32_t)VOCAB, 7, -1}}, {{5, -1, -1}}, {{5, 7, 3}}};
    const char *names[3] = {"entry 0", "entry 1", "entry 2"};
    for (int i = 0; i < 3; i++) {
        CHECK_ERR(engram_session_set_history(s, &bad[i], &err), err, -EINVAL, names[i]);
        engram_session_history(s, &got);
        CHECK(memcmp(&got, &h, sizeof h) == 0);
    }
    /* restore: the last two positions of a sequence, masks as in steps */
    for (int it = 0; it < 40; it++) {
        size_t n = rnd(6);
        uint32_t tok[6];
        uint8_t mb[6];
        for (size_t i = 0; i < n; i++)
            tok[i] = rtoken();
        const uint8_t *mask = rmask(mb, n);
        engram_ple_history r;
        engram_ple_history_reset(M, &r);
        uint8_t scratch[6 * ROWS * RB];
        expect(&r, tok, mask, n, ENGRAM_BF16, scratch);
        CHECK_EQ(engram_session_restore(s, tok, mask, n, &err), 0);
        CHECK(same_hist(s, &r));
    }
    engram_session_history(s, &h);
    uint32_t tk[3] = {1, VOCAB, 2};
    uint8_t mk[3] = {1, 1, 3};
    CHECK_ERR(engram_session_restore(s, tk, NULL, 3, &err), err, -EINVAL, "token 1");
    tk[1] = 5;
    CHECK_ERR(engram_session_restore(s, tk, mk, 3, &err), err, -EINVAL, "mask 2");
    engram_session_history(s, &got);
    CHECK(memcmp(&got, &h, sizeof h) == 0);
    /* steps and prefills refuse a bad mask or token, queue nothing */
    CHECK_ERR(engram_step_begin(s, tk, mk, 3, ENGRAM_BF16, out, &err), err, -EINVAL, "mask 2");
    tk[2] = VOCAB + 3;
    CHECK_ERR(engram_step_begin(s, tk, NULL, 3, ENGRAM_BF16, out, &err), err, -EINVAL, "token 2");
    engram_prefill *pf = NULL;
    CHECK_ERR(engram_prefill_begin(s, tk, mk, 3, NULL, &pf, &err), err, -EINVAL, "token 2");
    tk[2] = 2;
    CHECK_ERR(engram_prefill_begin(s, tk, mk, 3, NULL, &pf, &err), err, -EINVAL, "mask 2");
    CHECK(pf == NULL);
    engram_session *two[2] = {s, NULL};
    CHECK_EQ(engram_session_open(p, &two[1], NULL), 0);
    uint8_t bm[2] = {1, 7};
    void *outs[2] = {out, exp};
    CHECK_ERR(engram_step_begin_batch(two, tk, bm, 2, ENGRAM_BF16, outs, &err), err, -EINVAL, "mask 1");
    CHECK_EQ(engram_step_poll(s, 0, &err), -EINVAL); /* nothing began */
    engram_session_history(s, &got);
    CHECK(memcmp(&got, &h, sizeof h) == 0);
    engram_session_close(two[1]);
    printf("history: set_history (entries named), restore from the last positions with masks, "
           "bad masks and tokens refused by every begin; nothing changed\n");
    engram_session_close(s);
}

/* ------------------------------------------------------------ snapshots */

/* Each field of a snapshot corrupted: -EINVAL naming it, session unchanged. */
static void snapshot_refusals(engram_session *s, const char *member)
{
    size_t n = engram_session_state_bytes(s);
    uint8_t *good = malloc(n), *bad = malloc(n + 8), *after = malloc(n);
    engram_error err;
    CHECK_EQ(engram_session_save(s, good, n, &err), 0);
    CHECK_ERR(engram_session_save(s, bad, n - 1, &err), err, -EINVAL, "bytes");
    struct {
        size_t off;
        uint32_t val;
        const char *needle;
    } cases[] = {{0, 0x12345678, "magic"},  {4, 2, "version"}, {8, 7, "member"},
                 {12, 3, "floats"},         {16, 65, "width"}, {20, 1, "reserved"},
                 {24, 0x7fffffff, "entry 0"}, {28, 0xfffffffe, "entry 1"}, {36, 1, "reserved"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bad, good, n);
        memcpy(bad + cases[i].off, &cases[i].val, 4);
        CHECK_ERR(engram_session_load(s, bad, n, &err), err, -EINVAL, cases[i].needle);
    }
    if (strcmp(member, "ple") == 0) {
        memcpy(bad, good, n);
        uint32_t e2 = 4;
        memcpy(bad + 32, &e2, 4);
        CHECK_ERR(engram_session_load(s, bad, n, &err), err, -EINVAL, "entry 2");
        float nan = NAN, inf = INFINITY;
        memcpy(bad, good, n);
        memcpy(bad + 40 + 4 * 1000, &nan, 4);
        CHECK_ERR(engram_session_load(s, bad, n, &err), err, -EINVAL, "float 1000");
        memcpy(bad, good, n);
        memcpy(bad + n - 4, &inf, 4);
        CHECK_ERR(engram_session_load(s, bad, n, &err), err, -EINVAL, "not finite");
    }
    memcpy(bad, good, n);
    CHECK_ERR(engram_session_load(s, bad, n - 1, &err), err, -EINVAL, "bytes");
    CHECK_ERR(engram_session_load(s, bad, n + 4, &err), err, -EINVAL, "bytes");
    CHECK_EQ(engram_session_save(s, after, n, &err), 0);
    CHECK(memcmp(after, good, n) == 0);
    CHECK_EQ(engram_session_load(s, good, n, &err), 0);
    printf("snapshot (%s, %zu bytes): every field corrupted is refused by name, the session unchanged\n",
           member, n);
    free(good);
    free(bad);
    free(after);
}

static void snapshots(engram_pool *p)
{
    engram_model_info mi;
    engram_model_get_info(M, &mi);
    engram_session *s, *t;
    engram_error err;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    CHECK_EQ(engram_session_open(p, &t, NULL), 0);
    size_t n = engram_session_state_bytes(s);
    CHECK_EQ(n, 40 + 4 * (size_t)mi.family.state_floats);
    CHECK_EQ(mi.family.state_floats, 9u * 4 * W);
    uint8_t *a = malloc(n), *b = malloc(n);
    /* a fresh session: magic, sequence start, a zero state */
    CHECK_EQ(engram_session_save(s, a, n, &err), 0);
    uint32_t head[10];
    memcpy(head, a, sizeof head);
    CHECK_EQ(head[0], 0x53474e45u);
    CHECK_EQ(head[2], ENGRAM_MEMBER_PLE);
    CHECK_EQ(head[4], W);
    CHECK_EQ(head[6], EOS);
    CHECK_EQ(head[7], EOS);
    int zero = 1;
    for (size_t i = 40; i < n; i++)
        zero &= a[i] == 0;
    CHECK(zero);
    /* a history moved, a state written (what load accepts: finite floats) */
    uint32_t tok[3] = {11, 12, 13};
    CHECK_EQ(engram_session_restore(s, tok, NULL, 3, NULL), 0);
    CHECK_EQ(engram_session_save(s, a, n, &err), 0);
    for (size_t i = 40; i < n; i += 4) {
        float v = (float)((int)rnd(2001) - 1000) / 7.0f;
        memcpy(a + i, &v, 4);
    }
    CHECK_EQ(engram_session_load(t, a, n, &err), 0);
    CHECK_EQ(engram_session_save(t, b, n, &err), 0);
    CHECK(memcmp(a, b, n) == 0);
    engram_history hs, ht;
    engram_session_history(s, &hs);
    engram_session_history(t, &ht);
    CHECK(memcmp(&hs, &ht, sizeof hs) == 0);
    /* busy */
    uint8_t out[ROWS * RB];
    CHECK_EQ(engram_step_begin(t, tok, NULL, 1, ENGRAM_BF16, out, NULL), 0);
    CHECK_ERR(engram_session_load(t, a, n, &err), err, -EBUSY, "in progress");
    CHECK_ERR(engram_session_save(t, b, n, &err), err, -EBUSY, "in progress");
    engram_step_abort(t);
    snapshot_refusals(t, "ple");
    free(a);
    free(b);
    engram_session_close(s);
    engram_session_close(t);
}

/* ------------------------------------------------------------ the convolution state */

/* The residual input of position pos of a sequence: a function of it. */
static void resid_at(size_t pos, float *x)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (pos + 1);
    for (unsigned i = 0; i < SW; i++)
        x[i] = (float)((int)(tu_rand(&s) % 2001) - 1000) / 1000.0f;
}

/* The oracle of a sequence: rows of the committed tokens hashed at once,
 * engram_apply_seq over all of them in one call from state0. */
static int apply_once(engram_applier *a, const uint32_t *tok, const uint8_t *mask, size_t n, size_t pos0,
                      const float *state0, float *resid, float *state, size_t nf)
{
    uint16_t *rows = calloc(n * ROWS * 160 + 1, 2);
    uint8_t *m01 = malloc(n + 1);
    engram_ple_history h;
    engram_ple_history_reset(M, &h);
    expect(&h, tok, mask, n, ENGRAM_BF16, (uint8_t *)rows);
    for (size_t i = 0; i < n; i++) {
        m01[i] = kind_of(mask, i) != ENGRAM_PLE_PAD;
        resid_at(pos0 + i, resid + i * SW);
    }
    memcpy(state, state0, nf * sizeof *state);
    engram_error err;
    int rc = engram_apply_seq(a, rows, ENGRAM_BF16, resid, ENGRAM_F32, m01, n, state, &err);
    if (rc < 0)
        fprintf(stderr, "apply_seq: %s\n", err.msg);
    free(rows);
    free(m01);
    return rc;
}

/* A session's decode of random steps up to `target` committed positions,
 * applying each step; records the committed tokens, masks and residuals.
 * Returns the positions committed. */
static size_t decode(engram_session *s, engram_applier *a, size_t pos0, size_t target, uint32_t *ctok,
                     uint8_t *cmask, float *cres, uint64_t seed, unsigned *aborts, unsigned *reapplies)
{
    uint64_t keep = SEED;
    SEED = seed;
    size_t n = 0;
    while (n < target) {
        unsigned k = 1 + rnd(ENGRAM_MAX_DRAFT);
        uint32_t tok[ENGRAM_MAX_DRAFT];
        uint8_t mb[ENGRAM_MAX_DRAFT], m[ENGRAM_MAX_DRAFT];
        for (unsigned i = 0; i < k; i++)
            tok[i] = rtoken();
        const uint8_t *mask = rmask(mb, k);
        for (unsigned i = 0; i < k; i++)
            m[i] = mask ? mask[i] : 1;
        engram_dtype d = rnd(2) ? ENGRAM_BF16 : ENGRAM_RAW;
        uint8_t out[ENGRAM_MAX_DRAFT * ROWS * RB];
        float res[ENGRAM_MAX_DRAFT * SW];
        engram_error err;
        CHECK_EQ(engram_step_begin(s, tok, mask, k, d, out, &err), 0);
        for (unsigned i = 0; i < k; i++)
            resid_at(pos0 + n + i, res + i * SW);
        CHECK_ERR(engram_step_apply(s, a, res, ENGRAM_F32, &err), err, -EINVAL, "waited");
        CHECK_EQ(engram_step_wait(s, 0, &err), 0);
        if (rnd(6) == 0) { /* a first apply on a scratch residual, then again */
            float junk[ENGRAM_MAX_DRAFT * SW];
            memcpy(junk, res, sizeof junk);
            CHECK_EQ(engram_step_apply(s, a, junk, ENGRAM_F32, &err), 0);
            (*reapplies)++;
        }
        CHECK_EQ(engram_step_apply(s, a, res, ENGRAM_F32, &err), 0);
        if (rnd(4) == 0) /* a refused apply leaves the one before in force */
            CHECK_ERR(engram_step_apply(s, a, res, ENGRAM_RAW, &err), err, -EINVAL, "residual type 2");
        if (rnd(5) == 0) {
            engram_step_abort(s);
            (*aborts)++;
            continue;
        }
        unsigned j = rnd(k + 1);
        if (n + j > target)
            j = (unsigned)(target - n);
        CHECK_EQ(engram_step_commit(s, j, &err), 0);
        memcpy(ctok + n, tok, j * sizeof *tok);
        memcpy(cmask + n, m, j);
        memcpy(cres + n * SW, res, j * SW * sizeof *res);
        n += j;
    }
    SEED = keep;
    return n;
}

static void conv_state(engram_pool *p, const engram_pool *v41_unused)
{
    (void)v41_unused;
    engram_error err;
    engram_layer *L = NULL;
    engram_applier *a = NULL;
    if (engram_layer_open(M, 0, &L, &err) < 0 || engram_applier_new(L, NULL, &a, &err) < 0) {
        printf("conv state: SKIPPED, no PLE layer here (%s): waits for engram_apply_seq on main\n", err.msg);
        engram_layer_close(L);
        return;
    }
    engram_model_info mi;
    engram_model_get_info(M, &mi);
    size_t nf = mi.family.state_floats, N = 70, MAXN = 1000;
    float *zero = calloc(nf, 4), *st = malloc(nf * 4), *ref = malloc(MAXN * SW * 4);
    uint32_t *ctok = malloc(MAXN * 4);
    uint8_t *cmask = malloc(MAXN);
    float *cres = malloc(MAXN * SW * 4);
    size_t sb;
    engram_session *s, *t;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    CHECK_EQ(engram_session_open(p, &t, NULL), 0);
    sb = engram_session_state_bytes(s);
    uint8_t *snap = malloc(sb), *snap2 = malloc(sb);
    unsigned aborts = 0, reapplies = 0;
    size_t n = decode(s, a, 0, N, ctok, cmask, cres, 77, &aborts, &reapplies);
    CHECK_EQ(apply_once(a, ctok, cmask, n, 0, zero, ref, st, nf), 0);
    CHECK(memcmp(ref, cres, n * SW * 4) == 0);
    CHECK_EQ(engram_session_save(s, snap, sb, &err), 0);
    CHECK(memcmp(snap + 40, st, nf * 4) == 0);
    printf("conv state: %zu positions decoded with step_apply (%u aborts, %u re-applies) equal one "
           "engram_apply_seq: residuals and state bit for bit\n", n, aborts, reapplies);

    /* a snapshot loaded into another session continues bit for bit */
    CHECK_EQ(engram_session_load(t, snap, sb, &err), 0);
    uint32_t tok2[2][200];
    uint8_t m2[2][200];
    float *r2[2] = {malloc(200 * SW * 4), malloc(200 * SW * 4)};
    engram_session *both[2] = {s, t};
    for (int i = 0; i < 2; i++)
        CHECK_EQ(decode(both[i], a, n, 40, tok2[i], m2[i], r2[i], 99, &aborts, &reapplies), 40);
    CHECK(memcmp(tok2[0], tok2[1], 40 * 4) == 0);
    CHECK(memcmp(r2[0], r2[1], 40 * SW * 4) == 0);
    CHECK_EQ(engram_session_save(s, snap, sb, &err), 0);
    CHECK_EQ(engram_session_save(t, snap2, sb, &err), 0);
    CHECK(memcmp(snap, snap2, sb) == 0);
    /* the same as one call over all 110 */
    memcpy(ctok + n, tok2[0], 40 * 4);
    memcpy(cmask + n, m2[0], 40);
    CHECK_EQ(apply_once(a, ctok, cmask, n + 40, 0, zero, ref, st, nf), 0);
    CHECK(memcmp(ref + n * SW, r2[0], 40 * SW * 4) == 0);
    CHECK(memcmp(snap + 40, st, nf * 4) == 0);
    n += 40;
    printf("conv state: a snapshot loaded into another session continues bit for bit (40 positions)\n");

    /* prefill_apply over chunks = one call, from the session's state; a
     * prefill applied partly or not at all leaves the state unchanged */
    for (int mode = 0; mode < 3; mode++) {
        size_t np = 150 + rnd(100);
        uint32_t *pt = malloc(np * 4);
        uint8_t *pm = malloc(np);
        for (size_t i = 0; i < np; i++) {
            pt[i] = rtoken();
            pm[i] = rnd(8) == 0 ? 0 : rnd(8) == 0 ? 2 : 1;
        }
        engram_prefill_opts o = {.chunk_tokens = 40, .ring_chunks = 2, .dtype = mode == 1 ? ENGRAM_RAW : ENGRAM_BF16};
        engram_prefill *pf;
        CHECK_EQ(engram_session_save(s, snap, sb, &err), 0);
        CHECK_EQ(engram_prefill_begin(s, pt, pm, np, &o, &pf, &err), 0);
        float *res = malloc(40 * SW * 4), *got = malloc(np * SW * 4);
        size_t chunks = engram_prefill_chunks(pf), upto = mode == 2 ? chunks / 2 : chunks;
        for (size_t c = 0; c < chunks; c++) {
            size_t first, nt;
            CHECK_EQ(engram_prefill_wait(pf, 0, c, NULL, &first, &nt, &err), 0);
            for (size_t i = 0; i < nt; i++)
                resid_at(n + first + i, res + i * SW);
            if (c == 0)
                CHECK_ERR(engram_prefill_apply(pf, 1, a, res, ENGRAM_F32, &err), err, -EINVAL, "in order");
            if (c < upto && c < 2) {
                /* refused or failing applies leave the chunk to be applied again */
                float *bad = malloc(nt * SW * 4);
                for (size_t i = 0; i < nt * SW; i++)
                    bad[i] = NAN;
                CHECK_ERR(engram_prefill_apply(pf, c, a, res, ENGRAM_RAW, &err), err, -EINVAL,
                          "residual type 2");
                CHECK_ERR(engram_prefill_apply(pf, c, a, bad, ENGRAM_F32, &err), err, -EDOM, "NaN");
                free(bad);
            }
            if (c < upto)
                CHECK_EQ(engram_prefill_apply(pf, c, a, res, ENGRAM_F32, &err), 0);
            memcpy(got + first * SW, res, nt * SW * 4);
            engram_prefill_release(pf, 0, c);
            if (c == upto && mode == 2)
                CHECK_ERR(engram_prefill_apply(pf, c, a, res, ENGRAM_F32, &err), err, -EINVAL, "released");
        }
        engram_prefill_info info;
        engram_prefill_get_info(pf, &info);
        CHECK_EQ(info.chunks_applied[0], upto);
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        CHECK_EQ(engram_session_save(s, snap2, sb, &err), 0);
        if (mode < 2) {
            memcpy(ctok + n, pt, np * 4);
            memcpy(cmask + n, pm, np);
            CHECK_EQ(apply_once(a, ctok, cmask, n + np, 0, zero, ref, st, nf), 0);
            CHECK(memcmp(ref + n * SW, got, np * SW * 4) == 0);
            CHECK(memcmp(snap2 + 40, st, nf * 4) == 0);
            n += np;
        } else {
            CHECK(memcmp(snap2 + 40, snap + 40, nf * 4) == 0); /* state unchanged, history moved */
            CHECK(memcmp(snap2 + 24, snap + 24, 8) != 0 || np < 2);
            memcpy(snap2 + 40, snap + 40, nf * 4);
            CHECK_EQ(engram_session_load(s, snap, sb, &err), 0); /* back to before it */
        }
        free(pt);
        free(pm);
        free(res);
        free(got);
    }
    printf("conv state: prefill_apply over 40-token chunks equals one call (BF16 and RAW); applied "
           "partly, the state stays\n");

    /* misuse: F32 steps, a step not waited for; commit without apply keeps the state */
    uint32_t tk = 5;
    float res[SW];
    resid_at(0, res);
    uint8_t out[ROWS * 640];
    CHECK_EQ(engram_step_begin(s, &tk, NULL, 1, ENGRAM_F32, out, &err), 0);
    CHECK_EQ(engram_step_wait(s, 0, &err), 0);
    CHECK_ERR(engram_step_apply(s, a, res, ENGRAM_F32, &err), err, -EINVAL, "F32");
    CHECK_EQ(engram_session_save(s, snap, sb, NULL), -EBUSY);
    CHECK_EQ(engram_step_commit(s, 1, &err), 0);
    CHECK_EQ(engram_session_save(s, snap2, sb, &err), 0);
    CHECK(memcmp(snap2 + 40, st, nf * 4) == 0);
    CHECK_ERR(engram_step_apply(s, a, res, ENGRAM_F32, &err), err, -EINVAL, "no step");
    snapshot_refusals(s, "ple");
    free(zero);
    free(st);
    free(ref);
    free(ctok);
    free(cmask);
    free(cres);
    free(snap);
    free(snap2);
    free(r2[0]);
    free(r2[1]);
    engram_session_close(s);
    engram_session_close(t);
    engram_applier_free(a);
    engram_layer_close(L);
}

/* ------------------------------------------------------------ a short kernel */

/* Tensor fills of a qwen4exp file written here: deterministic values from
 * the element index (BF16 by truncation). */
struct fill {
    int bf16;
    float scale, bias;
};

/* Batched decode applies: n sessions' one-token steps in one pass
 * (engram_step_apply_batch) = each twin session's engram_step_apply alone:
 * residuals every step, committed states at the end (snapshots byte for
 * byte); requests refused before anything is touched. */
static void apply_batch(engram_pool *p)
{
    engram_error err;
    engram_layer *L = NULL;
    engram_applier *a = NULL;
    if (engram_layer_open(M, 0, &L, &err) < 0 || engram_applier_new(L, NULL, &a, &err) < 0) {
        CHECK(0);
        engram_layer_close(L);
        return;
    }
    enum { B = 9, STEPS = 25 };
    engram_session *sa[B], *sb[B];
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_session_open(p, &sa[i], NULL), 0);
        CHECK_EQ(engram_session_open(p, &sb[i], NULL), 0);
    }
    static uint8_t outa[B][ROWS * RB], outb[B][ROWS * RB];
    float xa[B][SW], xb[B][SW];
    void *xv[B];
    unsigned masked = 0, commits = 0;
    for (int step = 0; step < STEPS; step++) {
        uint32_t tok[B];
        uint8_t mask[B];
        void *outs[B];
        for (int i = 0; i < B; i++) {
            tok[i] = rtoken();
            mask[i] = rnd(7) == 0 ? ENGRAM_MASK_PAD : rnd(9) == 0 ? ENGRAM_MASK_IMAGE : ENGRAM_MASK_TEXT;
            masked += mask[i] == ENGRAM_MASK_PAD;
            outs[i] = outa[i];
            resid_at((size_t)step * B + (size_t)i, xa[i]);
            memcpy(xb[i], xa[i], sizeof xb[i]);
            xv[i] = xa[i];
        }
        engram_dtype d = step % 2 ? ENGRAM_RAW : ENGRAM_BF16;
        CHECK_EQ(engram_step_begin_batch(sa, tok, mask, B, d, outs, &err), 0);
        for (int i = 0; i < B; i++)
            CHECK_EQ(engram_step_begin(sb[i], tok + i, mask + i, 1, d, outb[i], &err), 0);
        if (step == 0) /* not waited for: refused, naming the request */
            CHECK_ERR(engram_step_apply_batch(sa, B, a, xv, ENGRAM_F32, &err), err, -EINVAL, "request 0");
        for (int i = 0; i < B; i++) {
            CHECK_EQ(engram_step_wait(sa[i], 0, &err), 0);
            CHECK_EQ(engram_step_wait(sb[i], 0, &err), 0);
        }
        if (step == 1) {
            engram_session *twice[2] = {sa[0], sa[0]};
            CHECK_ERR(engram_step_apply_batch(twice, 2, a, xv, ENGRAM_F32, &err), err, -EINVAL, "same session");
            CHECK_ERR(engram_step_apply_batch(sa, B, a, xv, ENGRAM_RAW, &err), err, -EINVAL, "residual type");
        }
        CHECK_EQ(engram_step_apply_batch(sa, B, a, xv, ENGRAM_F32, &err), 0);
        for (int i = 0; i < B; i++)
            CHECK_EQ(engram_step_apply(sb[i], a, xb[i], ENGRAM_F32, &err), 0);
        CHECK(memcmp(xa, xb, sizeof xa) == 0);
        for (int i = 0; i < B; i++) {
            unsigned j = rnd(5) != 0;
            commits += j;
            CHECK_EQ(engram_step_commit(sa[i], j, &err), 0);
            CHECK_EQ(engram_step_commit(sb[i], j, &err), 0);
        }
    }
    /* a step of two tokens is refused: drafts take engram_step_apply */
    uint32_t two[2] = {5, 6};
    uint8_t o2[2 * ROWS * RB];
    CHECK_EQ(engram_step_begin(sa[0], two, NULL, 2, ENGRAM_BF16, o2, &err), 0);
    CHECK_EQ(engram_step_wait(sa[0], 0, &err), 0);
    CHECK_ERR(engram_step_apply_batch(sa, 1, a, xv, ENGRAM_F32, &err), err, -EINVAL, "2 tokens");
    engram_step_abort(sa[0]);
    size_t sb_bytes = engram_session_state_bytes(sa[0]);
    uint8_t *ka = malloc(sb_bytes), *kb = malloc(sb_bytes);
    int same = 1, moved = 0;
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_session_save(sa[i], ka, sb_bytes, &err), 0);
        CHECK_EQ(engram_session_save(sb[i], kb, sb_bytes, &err), 0);
        same &= memcmp(ka, kb, sb_bytes) == 0;
        for (size_t k = 40; k < sb_bytes; k++)
            moved |= ka[k] != 0;
    }
    CHECK(same);
    CHECK(moved);
    printf("apply batch: %d sessions x %d steps (%u padding, %u commits) in one pass each = each alone: "
           "residuals and committed states bit for bit\n", B, STEPS, masked, commits);
    free(ka);
    free(kb);
    for (int i = 0; i < B; i++) {
        engram_session_close(sa[i]);
        engram_session_close(sb[i]);
    }
    engram_applier_free(a);
    engram_layer_close(L);
}

/* More requests than one group (64): a NaN residual at request 66 refuses
 * the batch as a whole (nothing written), then the batch = twins for all
 * 70 (request 0 applied alone first, on a copy: the same bits). */
static void big_batch(engram_pool *p)
{
    engram_error err;
    engram_layer *L = NULL;
    engram_applier *a = NULL;
    CHECK_EQ(engram_layer_open(M, 0, &L, &err), 0);
    CHECK_EQ(engram_applier_new(L, NULL, &a, &err), 0);
    enum { B = 70 };
    engram_session *sa[B], *sb[B];
    static uint8_t outa[B][ROWS * RB], outb[B][ROWS * RB];
    static float xa[B][SW], xb[B][SW], x0[SW];
    void *xv[B], *outs[B];
    uint32_t tok[B];
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_session_open(p, &sa[i], NULL), 0);
        CHECK_EQ(engram_session_open(p, &sb[i], NULL), 0);
        tok[i] = rtoken();
        outs[i] = outa[i];
        resid_at(1000 + (size_t)i, xa[i]);
        memcpy(xb[i], xa[i], sizeof xb[i]);
        xv[i] = xa[i];
    }
    CHECK_EQ(engram_step_begin_batch(sa, tok, NULL, B, ENGRAM_BF16, outs, &err), 0);
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_step_begin(sb[i], tok + i, NULL, 1, ENGRAM_BF16, outb[i], &err), 0);
        CHECK_EQ(engram_step_wait(sa[i], 0, &err), 0);
        CHECK_EQ(engram_step_wait(sb[i], 0, &err), 0);
    }
    /* request 0 applied alone first, on a copy */
    memcpy(x0, xa[0], sizeof x0);
    CHECK_EQ(engram_step_apply(sa[0], a, x0, ENGRAM_F32, &err), 0);
    float keep = xa[66][7];
    xa[66][7] = NAN;
    static float before[B][SW];
    memcpy(before, xa, sizeof xa);
    CHECK_ERR(engram_step_apply_batch(sa, B, a, xv, ENGRAM_F32, &err), err, -EDOM, "request 66 (nothing applied)");
    CHECK(memcmp(before, xa, sizeof xa) == 0);
    xa[66][7] = keep;
    size_t nb = engram_session_state_bytes(sa[0]);
    uint8_t *k0 = malloc(nb), *k1 = malloc(nb);
    /* the batch proper, then each twin alone */
    CHECK_EQ(engram_step_apply_batch(sa, B, a, xv, ENGRAM_F32, &err), 0);
    for (int i = 0; i < B; i++)
        CHECK_EQ(engram_step_apply(sb[i], a, xb[i], ENGRAM_F32, &err), 0);
    CHECK(memcmp(xa, xb, sizeof xa) == 0);
    CHECK(memcmp(x0, xa[0], sizeof x0) == 0);
    int same = 1;
    for (int i = 0; i < B; i++) {
        CHECK_EQ(engram_step_commit(sa[i], 1, &err), 0);
        CHECK_EQ(engram_step_commit(sb[i], 1, &err), 0);
        CHECK_EQ(engram_session_save(sa[i], k0, nb, &err), 0);
        CHECK_EQ(engram_session_save(sb[i], k1, nb, &err), 0);
        same &= memcmp(k0, k1, nb) == 0;
    }
    CHECK(same);
    printf("apply batch: %d requests (two groups) = each alone; a NaN at request 66 refused the whole "
           "batch with nothing written\n", B);
    free(k0);
    free(k1);
    for (int i = 0; i < B; i++) {
        engram_session_close(sa[i]);
        engram_session_close(sb[i]);
    }
    engram_applier_free(a);
    engram_layer_close(L);
}

static int fill_tensor(void *ctx, int fd, uint64_t off, uint64_t bytes)
{
    const struct fill *f = ctx;
    static uint8_t buf[1 << 16];
    unsigned es = f->bf16 ? 2 : 4;
    for (uint64_t done = 0; done < bytes;) {
        uint64_t n = bytes - done < sizeof buf ? bytes - done : sizeof buf;
        for (uint64_t i = 0; i < n / es; i++) {
            uint64_t r = 0x9e3779b97f4a7c15ull * (done / es + i + 1);
            r ^= r >> 29;
            r *= 0xbf58476d1ce4e5b9ull;
            float v = f->bias + f->scale * ((float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
            uint32_t u;
            memcpy(&u, &v, 4);
            if (f->bf16) {
                uint16_t b = (uint16_t)(u >> 16);
                memcpy(buf + i * 2, &b, 2);
            } else {
                memcpy(buf + i * 4, &u, 4);
            }
        }
        if (pwrite(fd, buf, n, (off_t)(off + done)) != (ssize_t)n)
            return -EIO;
        done += n;
    }
    return 0;
}

/* A qwen4exp model with conv_kernel 2 (a state of 3 frames). */
static int write_kernel2(const char *path)
{
    struct ple_layout l;
    if (ple_layout_generate(0, 1500, VOCAB, EOS, PLE_NO_IMAGE, &l, NULL) < 0)
        return -1;
    static struct fill table = {1, 0.05f, 0}, wk = {1, 0.02f, 0}, norm = {0, 0.05f, 1}, taps = {0, 0.3f, 0};
    gguf_writer *w = gguf_writer_new(3, 32);
    gguf_w_str(w, "general.architecture", "qwen4exp");
    uint32_t layers[1] = {1};
    gguf_w_array(w, "qwen4exp.ple.layers", GGUF_U32, layers, 1);
    gguf_w_u32(w, "qwen4exp.ple.ngram_size", 3);
    gguf_w_u32(w, "qwen4exp.ple.heads_per_ngram", 8);
    gguf_w_u32(w, "qwen4exp.ple.conv_kernel", 2);
    gguf_w_u32(w, "qwen4exp.vocab_size", l.vocab);
    gguf_w_u32(w, "qwen4exp.ple.eos_token_id", l.eos);
    uint64_t m[3], off[16], sz[16];
    for (int j = 0; j < 3; j++)
        m[j] = l.multipliers[j];
    for (int h = 0; h < 16; h++) {
        off[h] = l.offsets[h];
        sz[h] = l.sizes[h];
    }
    gguf_w_array(w, "qwen4exp.ple.layer_multipliers", GGUF_U64, m, 3);
    gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_U64, off, 16);
    gguf_w_array(w, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, sz, 16);
    gguf_w_u32(w, "qwen4exp.embedding_length_per_layer_input", 160);
    float eps = 1e-6f;
    gguf_w_scalar(w, "qwen4exp.attention.layer_norm_rms_epsilon", GGUF_F32, &eps);
    uint64_t dk[2] = {2560, 4 * W}, dv[2] = {2560, W}, dn[1] = {4 * W}, dc[2] = {2, 4 * W};
    gguf_w_tensor(w, "blk.1.ple_key.weight", GGML_BF16, 2, dk, 0, fill_tensor, &wk);
    gguf_w_tensor(w, "blk.1.ple_value.weight", GGML_BF16, 2, dv, 0, fill_tensor, &wk);
    gguf_w_tensor(w, "blk.1.ple_norm_key.weight", GGML_F32, 1, dn, 0, fill_tensor, &norm);
    gguf_w_tensor(w, "blk.1.ple_norm_query.weight", GGML_F32, 1, dn, 0, fill_tensor, &norm);
    gguf_w_tensor(w, "blk.1.ple_norm_conv.weight", GGML_F32, 1, dn, 0, fill_tensor, &norm);
    gguf_w_tensor(w, "blk.1.ple_conv1d.weight", GGML_F32, 2, dc, 0, fill_tensor, &taps);
    uint64_t dt[2] = {160, l.rows};
    gguf_w_tensor(w, "per_layer_token_embd.weight", GGML_BF16, 2, dt, 4096, fill_tensor, &table);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    engram_error err;
    int rc = fd < 0 ? -errno : gguf_w_write_fd(w, fd, &err);
    if (fd >= 0)
        close(fd);
    gguf_writer_free(w);
    return rc;
}

/* Steps of up to 8 tokens against a state of 3 frames: the session applies
 * them token by token and keeps each one's frame; the result is still one
 * engram_apply_seq over the committed tokens. */
static void short_kernel(void)
{
    char path[512];
    tu_path(path, sizeof path, "ple_k2.gguf");
    CHECK_EQ(write_kernel2(path), 0);
    engram_model *m = tu_open_model(path), *keep = M;
    CHECK(m != NULL);
    if (!m)
        return;
    engram_model_info mi;
    engram_model_get_info(m, &mi);
    size_t nf = mi.family.state_floats;
    CHECK_EQ(nf, 3u * 4 * W);
    M = m;
    engram_pool *p = NULL;
    engram_layer *L = NULL;
    engram_applier *a = NULL;
    engram_error err;
    CHECK_EQ(engram_pool_open(m, NULL, &p, &err), 0);
    CHECK_EQ(engram_layer_open(m, 0, &L, &err), 0);
    CHECK_EQ(engram_applier_new(L, NULL, &a, &err), 0);
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    enum { N = 80 };
    uint32_t ctok[N];
    uint8_t cmask[N];
    float *cres = malloc(N * SW * 4), *ref = malloc(N * SW * 4), *st = malloc(nf * 4), *zero = calloc(nf, 4);
    unsigned aborts = 0, reapplies = 0;
    size_t n = decode(s, a, 0, N, ctok, cmask, cres, 1234, &aborts, &reapplies);
    CHECK_EQ(apply_once(a, ctok, cmask, n, 0, zero, ref, st, nf), 0);
    CHECK(memcmp(ref, cres, n * SW * 4) == 0);
    size_t sb = engram_session_state_bytes(s);
    uint8_t *snap = malloc(sb);
    CHECK_EQ(engram_session_save(s, snap, sb, &err), 0);
    CHECK(memcmp(snap + 40, st, nf * 4) == 0);
    int moved = 0;
    for (size_t i = 0; i < nf; i++)
        moved |= st[i] != 0;
    CHECK(moved);
    printf("short kernel: a 3-frame state, steps of up to 8 tokens (applied token by token): %zu positions "
           "(%u aborts, %u re-applies) equal one engram_apply_seq bit for bit\n", n, aborts, reapplies);
    /* a failure inside the token-by-token path names the step's token */
    {
        uint32_t tok[5] = {11, 12, 13, 14, 15};
        uint16_t out[5 * ROWS * 160];
        float res[5 * SW];
        for (unsigned i = 0; i < 5; i++)
            resid_at(i, res + i * SW);
        res[4 * SW + 3] = NAN;
        CHECK_EQ(engram_step_begin(s, tok, NULL, 5, ENGRAM_BF16, out, &err), 0);
        CHECK_EQ(engram_step_wait(s, 0, &err), 0);
        CHECK_ERR(engram_step_apply(s, a, res, ENGRAM_F32, &err), err, -EDOM, "token 4 of the step");
        engram_step_abort(s);
    }
    free(snap);
    free(cres);
    free(ref);
    free(st);
    free(zero);
    engram_session_close(s);
    engram_applier_free(a);
    engram_layer_close(L);
    engram_pool_close(p);
    engram_model_close(m);
    M = keep;
}

/* ------------------------------------------------------------ V4.1 */

static void v41(void)
{
    static uint32_t map[3000];
    engram_layout l;
    char path[512];
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 2000), 0);
    CHECK_EQ(tu_build("v41_sess.gguf", &l, ENGRAM_FILL_NORMAL, 64, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    engram_pool *p = NULL;
    engram_layer *L[2] = {NULL, NULL};
    engram_applier *a[2] = {NULL, NULL};
    engram_error err;
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK_EQ(engram_pool_open(m, NULL, &p, &err), 0);
    for (int t = 0; t < 2; t++) {
        CHECK_EQ(engram_layer_open(m, t, &L[t], &err), 0);
        CHECK_EQ(engram_applier_new(L[t], NULL, &a[t], &err), 0);
    }
    engram_layer_info li;
    engram_layer_get_info(L[0], &li);
    size_t sw = (size_t)li.streams * li.width;
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    unsigned same = 1;
    for (int it = 0; it < 12; it++) {
        unsigned k = 1 + rnd(ENGRAM_MAX_DRAFT);
        engram_dtype d = rnd(2) ? ENGRAM_BF16 : ENGRAM_F32;
        size_t es = d == ENGRAM_F32 ? 4 : 2;
        uint32_t tok[ENGRAM_MAX_DRAFT];
        uint8_t mb[ENGRAM_MAX_DRAFT];
        for (unsigned i = 0; i < k; i++) {
            tok[i] = rnd(3000);
            mb[i] = rnd(4) != 0;
        }
        uint8_t *out = malloc(k * 48 * 256 * es);
        float *x = malloc(k * sw * 4), *y = malloc(k * sw * 4);
        for (size_t i = 0; i < k * sw; i++)
            x[i] = y[i] = (float)((int)rnd(2001) - 1000) / 1000.0f;
        CHECK_EQ(engram_step_begin(s, tok, mb, k, d, out, &err), 0);
        CHECK_ERR(engram_step_apply(s, a[1], x, ENGRAM_F32, &err), err, -EINVAL, "table 1");
        for (int t = 0; t < 2; t++) {
            CHECK_EQ(engram_step_wait(s, t, &err), 0);
            if (it % 2) { /* the batch call, V4.1: engram_step_apply per session */
                void *xv[1] = {x};
                CHECK_EQ(engram_step_apply_batch(&s, 1, a[t], xv, ENGRAM_F32, &err), 0);
            } else {
                CHECK_EQ(engram_step_apply(s, a[t], x, ENGRAM_F32, &err), 0);
            }
            if (it % 3 == 0) { /* engram_apply_seqs, V4.1: one engram_apply per token */
                const void *rv[ENGRAM_MAX_DRAFT];
                void *yv[ENGRAM_MAX_DRAFT];
                for (unsigned i = 0; i < k; i++) {
                    rv[i] = out + ((size_t)i * 48 + (size_t)t * 24) * 256 * es;
                    yv[i] = y + i * sw;
                }
                CHECK_EQ(engram_apply_seqs(a[t], k, rv, d, yv, ENGRAM_F32, mb, NULL, &err), 0);
            } else {
                CHECK_EQ(engram_apply_strided(a[t], out + (size_t)t * 24 * 256 * es, d, 48 * 256 * es, y,
                                              ENGRAM_F32, sw * 4, mb, k, &err), 0);
            }
        }
        same &= memcmp(x, y, k * sw * 4) == 0;
        CHECK_EQ(engram_step_commit(s, rnd(k + 1), &err), 0);
        free(out);
        free(x);
        free(y);
    }
    CHECK(same);
    uint8_t raw[48 * 264];
    float x[16];
    uint32_t tk = 1;
    CHECK_EQ(engram_step_begin(s, &tk, NULL, 1, ENGRAM_RAW, raw, &err), 0);
    CHECK_EQ(engram_step_wait(s, 0, &err), 0);
    CHECK_ERR(engram_step_apply(s, a[0], x, ENGRAM_F32, &err), err, -EINVAL, "RAW");
    engram_step_abort(s);
    /* the snapshot: header + history */
    CHECK_EQ(engram_session_state_bytes(s), 40);
    uint8_t snap[40], snap2[40];
    CHECK_EQ(engram_session_save(s, snap, sizeof snap, &err), 0);
    engram_session *t;
    CHECK_EQ(engram_session_open(p, &t, NULL), 0);
    CHECK_EQ(engram_session_load(t, snap, sizeof snap, &err), 0);
    engram_history h1, h2;
    engram_session_history(s, &h1);
    engram_session_history(t, &h2);
    CHECK(memcmp(&h1, &h2, sizeof h1) == 0);
    CHECK_EQ(engram_session_save(t, snap2, sizeof snap2, &err), 0);
    CHECK(memcmp(snap, snap2, sizeof snap) == 0);
    snapshot_refusals(t, "v41");
    /* a PLE snapshot is not V4.1's */
    engram_pool *pp = open_pool(2, 0);
    if (pp) {
        engram_session *u;
        CHECK_EQ(engram_session_open(pp, &u, NULL), 0);
        size_t n = engram_session_state_bytes(u);
        uint8_t *b = malloc(n);
        CHECK_EQ(engram_session_save(u, b, n, &err), 0);
        memcpy(snap2, b, 40);
        CHECK_ERR(engram_session_load(t, snap2, 40, &err), err, -EINVAL, "member");
        CHECK_ERR(engram_session_load(u, snap, 40, &err), err, -EINVAL, "bytes");
        /* a V4.1 applier on a PLE step */
        uint32_t one = 7;
        uint8_t o16[ROWS * RB];
        float xr[SW];
        CHECK_EQ(engram_step_begin(u, &one, NULL, 1, ENGRAM_BF16, o16, &err), 0);
        CHECK_EQ(engram_step_wait(u, 0, &err), 0);
        CHECK_ERR(engram_step_apply(u, a[0], xr, ENGRAM_F32, &err), err, -EINVAL, "not of the pool's model");
        engram_step_abort(u);
        free(b);
        engram_session_close(u);
        engram_pool_close(pp);
    }
    printf("v41: engram_step_apply equals engram_apply_strided on both tables (BF16 and F32 steps, masks); "
           "RAW refused; snapshot of header + history round-trips; a PLE snapshot refused\n");
    engram_session_close(s);
    engram_session_close(t);
    for (int i = 0; i < 2; i++) {
        engram_applier_free(a[i]);
        engram_layer_close(L[i]);
    }
    engram_pool_close(p);
    engram_model_close(m);
}

int main(void)
{
    char path[512];
    tu_path(path, sizeof path, "ple_sess.gguf");
    engram_ple_build_opts o = {.base = 1500, .width = W, .fill = ENGRAM_FILL_NORMAL, .seed = 5};
    engram_error err;
    if (engram_build_ple_model(path, &o, &err) < 0) {
        fprintf(stderr, "build: %s\n", err.msg);
        return 1;
    }
    M = tu_open_model(path);
    if (!M)
        return 1;
    engram_model_info mi;
    engram_model_get_info(M, &mi);
    VOCAB = mi.family.vocab;
    EOS = mi.family.eos;
    CHECK_EQ(mi.family.member, ENGRAM_MEMBER_PLE);
    int ran = 0; /* engines that opened (one refusing O_DIRECT is skipped) */
    for (int e = 0; e < 3; e++)
        for (int cache = 0; cache < 2 && !tsan_dup_engine(engines[e]); cache++) {
            engram_pool *p = open_pool(e, cache);
            if (!p)
                continue;
            ran++;
            char what[64];
            snprintf(what, sizeof what, "%s%s", engine_names[e], cache ? " + row cache" : "");
            steps(p, what);
            prefills(p, what);
            if (e == 0 || SANITIZED == 0)
                batched(p);
            engram_pool_close(p);
        }
    CHECK(ran > 0);
    engram_pool *p = open_pool(2, 0);
    if (p) {
        history(p);
        snapshots(p);
        conv_state(p, NULL);
        apply_batch(p);
        big_batch(p);
        engram_pool_close(p);
    }
    short_kernel();
    v41();
    engram_model_close(M);
    tu_cleanup();
    return tu_finish("test_ple_session");
}
