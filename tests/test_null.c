/*
 * test_null.c - the NULL rule of engram.h ("Conventions"), function by
 * function: every public function of engram.h and engram_tools.h is called
 * with NULL in each of its pointer arguments in turn, the others valid (a
 * real small model, reader, pool, session, prefill, layer and applier).
 * For each call:
 *  - it does not crash (a SIGSEGV or SIGBUS inside the call is caught and
 *    counted as a failed check naming the call, so one run lists them all);
 *  - a function that can fail returns -EINVAL and fills err (code, offset,
 *    a message) when err is given, and returns -EINVAL with err NULL too;
 *  - nothing is written: every output of the call points into a sentinel
 *    buffer that is checked byte for byte afterwards, and the state a call
 *    could change (a history, a session, the pool's step count) is
 *    compared with a snapshot;
 *  - a function that cannot fail does nothing, and an accessor returns
 *    NULL or 0;
 *  - the documented exceptions hold: err may be NULL, an array whose count
 *    is 0 may be NULL, opts NULL means the defaults, and an argument the
 *    header calls optional (mask, saturated, export's w and wq, a prefill
 *    wait's outputs) may be NULL.
 * Besides NULL, the refusals of a step's and a prefill's begin each name
 * their own cause (issue #26: a NULL session, tokens or out used to be
 * reported as "bad argument (k must be 1..8)", and every bad prefill
 * option as the same list of all of them).
 * The deprecated inline wrappers (engram_reader_stats, engram_pool_stats_get)
 * only forward to the getters tested here.
 */
#include <limits.h>
#include <setjmp.h>
#include <signal.h>

#include "testutil.h"

#define SENT_BYTES (1u << 21) /* the largest output: a layer's exported weights */
#define SENT 0xA5
#define CRASHED INT_MIN

/* Every output of a call under test points here. */
static uint8_t *sent;

static void sent_fill(void)
{
    memset(sent, SENT, SENT_BYTES);
}

static int sent_intact(void)
{
    for (size_t i = 0; i < SENT_BYTES; i++)
        if (sent[i] != SENT)
            return 0;
    return 1;
}

/* A crash inside a call comes back to its RUN, which counts it. */
static sigjmp_buf crash_at;

static void on_crash(int sig)
{
    siglongjmp(crash_at, sig);
}

/* The value of the call in progress (CRASHED after a crash).  Globals
 * rather than locals: they live across sigsetjmp. */
static volatile int got;
static int crashes; /* after one, the pool is left open: a lock may be held */
static engram_error err, *ep; /* ep: the err of the call, &err or NULL */

#define RUN(call)                                                                        \
    do {                                                                                 \
        if (sigsetjmp(crash_at, 1) == 0) {                                               \
            got = (call);                                                                \
        } else {                                                                         \
            got = CRASHED;                                                               \
            crashes++;                                                                   \
            tu_checks++;                                                                 \
            tu_failures++;                                                               \
            fprintf(stderr, "%s:%d: crashed: %s\n", __FILE__, __LINE__, #call);          \
        }                                                                                \
    } while (0)

static void err_fill(void)
{
    memset(&err, 0x5a, sizeof err);
    err.msg[0] = 0;
}

/* After a refused call: -EINVAL, err filled if it was given, nothing written. */
static void check_refused(int line, const char *call, int with_err)
{
    if (got == CRASHED)
        return;
    tu_checks++;
    if (got != -EINVAL) {
        tu_failures++;
        fprintf(stderr, "%s:%d: %s returned %d, not -EINVAL%s\n", __FILE__, line, call, got,
                with_err ? "" : " (err NULL)");
    }
    if (with_err) {
        tu_checks++;
        if (err.code != -EINVAL || err.offset != ENGRAM_NO_OFFSET || !err.msg[0]) {
            tu_failures++;
            fprintf(stderr, "%s:%d: %s: err not filled (code %d, msg '%s')\n", __FILE__, line, call,
                    err.code, err.msg);
        }
    }
    tu_checks++;
    if (!sent_intact()) {
        tu_failures++;
        fprintf(stderr, "%s:%d: %s wrote an output%s\n", __FILE__, line, call,
                with_err ? "" : " (err NULL)");
    }
}

/* call passes ep as its engram_error *: run with err given, then NULL. */
#define REFUSED(call)                                                                    \
    do {                                                                                 \
        ep = &err;                                                                       \
        err_fill();                                                                      \
        sent_fill();                                                                     \
        RUN(call);                                                                       \
        check_refused(__LINE__, #call, 1);                                               \
        ep = NULL;                                                                       \
        sent_fill();                                                                     \
        RUN(call);                                                                       \
        check_refused(__LINE__, #call, 0);                                               \
    } while (0)

/* The same for a function without an engram_error *. */
#define REFUSED_NO_ERR(call)                                                             \
    do {                                                                                 \
        sent_fill();                                                                     \
        RUN(call);                                                                       \
        check_refused(__LINE__, #call, 0);                                               \
    } while (0)

/* A function that returns nothing: no crash, nothing written. */
#define NOTHING(call)                                                                    \
    do {                                                                                 \
        sent_fill();                                                                     \
        RUN(((call), 0));                                                                \
        if (got != CRASHED)                                                              \
            CHECK(sent_intact());                                                        \
    } while (0)

/* An accessor: cond (about its result) holds, nothing written. */
#define GIVES(cond)                                                                      \
    do {                                                                                 \
        sent_fill();                                                                     \
        RUN((cond) ? 1 : 0);                                                             \
        if (got != CRASHED) {                                                            \
            CHECK_EQ(got, 1);                                                            \
            CHECK(sent_intact());                                                        \
        }                                                                                \
    } while (0)

/* A call with a documented NULL (count 0, optional, defaults): succeeds. */
#define ACCEPTED(call)                                                                   \
    do {                                                                                 \
        ep = &err;                                                                       \
        RUN(call);                                                                       \
        if (got != CRASHED)                                                              \
            CHECK_EQ(got, 0);                                                            \
    } while (0)

/* ------------------------------------------------ the fixture */

static uint32_t map[1000];
static engram_layout layout;
static char model_path[512];
static engram_model *model;
static const engram_hasher *hasher;
static engram_layer *layer;
static engram_applier *applier;
static engram_layer_info li;
static uint32_t tok[4] = {5, 17, 250, 999};
static uint32_t rows48[4 * ENGRAM_ROWS_PER_TOKEN]; /* tok hashed */
static uint32_t ids[2];                            /* two row ids of table 0 */
static uint8_t raw[2 * ENGRAM_ROW_BYTES];           /* those rows */
static uint16_t rows_bf16[ENGRAM_K];               /* one token's rows, decoded */
static engram_history hist, hist0;

static int fixture_open(void)
{
    engram_error e;
    if (tu_layout(&layout, map, 1000, 800, 300) < 0 ||
        tu_build("null.gguf", &layout, ENGRAM_FILL_RANDOM, 16, model_path, sizeof model_path) < 0 ||
        !(model = tu_open_model(model_path)))
        return -1;
    hasher = engram_model_hasher(model);
    if (engram_layer_open(model, 0, &layer, &e) < 0 || engram_applier_new(layer, NULL, &applier, &e) < 0) {
        fprintf(stderr, "layer: %s\n", e.msg);
        return -1;
    }
    engram_layer_get_info(layer, &li);
    engram_history_reset(&hist);
    if (engram_hash_tokens(hasher, &hist, tok, NULL, 4, rows48, &e) < 0)
        return -1;
    ids[0] = rows48[0];
    ids[1] = rows48[1];
    if (engram_model_read_raw(model, 0, ids, 2, raw, &e) < 0 ||
        engram_model_read_bf16(model, 0, rows48, 24, rows_bf16, &e) < 0) {
        fprintf(stderr, "read: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static void fixture_close(void)
{
    engram_applier_free(applier);
    engram_layer_close(layer);
    engram_model_close(model);
}

/* ------------------------------------------------ layout, hash, rows */

static void hash_calls(void)
{
    REFUSED(engram_layout_validate(NULL, ep));
    NOTHING(engram_history_reset(NULL));

    REFUSED(engram_hasher_new(NULL, (engram_hasher **)sent, ep));
    REFUSED(engram_hasher_new(&layout, NULL, ep));
    NOTHING(engram_hasher_free(NULL));
    GIVES(engram_hasher_layout(NULL) == NULL);

    /* a live history, left as it was by every refusal */
    hist0 = hist;
    uint32_t *out = (uint32_t *)sent;
    REFUSED(engram_hash_tokens(NULL, &hist, tok, NULL, 4, out, ep));
    REFUSED(engram_hash_tokens(hasher, NULL, tok, NULL, 4, out, ep));
    REFUSED(engram_hash_tokens(hasher, &hist, NULL, NULL, 4, out, ep));
    REFUSED(engram_hash_tokens(hasher, &hist, tok, NULL, 4, NULL, ep));
    REFUSED_NO_ERR(engram_hash_token(NULL, &hist, tok[0], 0, out));
    REFUSED_NO_ERR(engram_hash_token(hasher, NULL, tok[0], 0, out));
    REFUSED_NO_ERR(engram_hash_token(hasher, &hist, tok[0], 0, NULL));
    REFUSED_NO_ERR(engram_history_from_tokens(NULL, &hist, tok, 4));
    REFUSED_NO_ERR(engram_history_from_tokens(hasher, NULL, tok, 4));
    REFUSED_NO_ERR(engram_history_from_tokens(hasher, &hist, NULL, 4));
    CHECK(memcmp(&hist, &hist0, sizeof hist) == 0);
    /* count 0: the arrays may be NULL (and the history is unchanged) */
    ACCEPTED(engram_hash_tokens(hasher, &hist, NULL, NULL, 0, NULL, ep));
    CHECK(memcmp(&hist, &hist0, sizeof hist) == 0);

    uint16_t *o16 = (uint16_t *)sent;
    float *o32 = (float *)sent;
    REFUSED(engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, NULL, 2, o16, ep));
    REFUSED(engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, 2, NULL, ep));
    REFUSED(engram_rows_decode_f32(ENGRAM_SIMD_AUTO, NULL, 2, o32, ep));
    REFUSED(engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, 2, NULL, ep));
    REFUSED(engram_rows_check(NULL, 2, ep));
    REFUSED(engram_row_check(NULL, ep));
    ACCEPTED(engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, NULL, 0, NULL, ep));
    ACCEPTED(engram_rows_check(NULL, 0, ep));
    /* the row codec's -EINVAL names no row */
    ep = &err;
    RUN(engram_row_check(NULL, ep));
    CHECK(err.row == ENGRAM_NO_ROW);
}

/* ------------------------------------------------ model */

static void model_calls(void)
{
    REFUSED(engram_model_open(NULL, (engram_model **)sent, ep));
    REFUSED(engram_model_open(model_path, NULL, ep));
    NOTHING(engram_model_close(NULL));
    GIVES(engram_model_layout(NULL) == NULL);
    GIVES(engram_model_hasher(NULL) == NULL);
    NOTHING(engram_model_get_info(NULL, (engram_model_info *)sent));
    NOTHING(engram_model_get_info(model, NULL));
    REFUSED_NO_ERR(engram_model_dup_fd(NULL));

    REFUSED(engram_model_read_raw(NULL, 0, ids, 2, sent, ep));
    REFUSED(engram_model_read_raw(model, 0, NULL, 2, sent, ep));
    REFUSED(engram_model_read_raw(model, 0, ids, 2, NULL, ep));
    REFUSED(engram_model_read_f32(NULL, 0, ids, 2, (float *)sent, ep));
    REFUSED(engram_model_read_f32(model, 0, NULL, 2, (float *)sent, ep));
    REFUSED(engram_model_read_f32(model, 0, ids, 2, NULL, ep));
    REFUSED(engram_model_read_bf16(NULL, 0, ids, 2, (uint16_t *)sent, ep));
    REFUSED(engram_model_read_bf16(model, 0, NULL, 2, (uint16_t *)sent, ep));
    REFUSED(engram_model_read_bf16(model, 0, ids, 2, NULL, ep));
    ACCEPTED(engram_model_read_raw(model, 0, NULL, 0, NULL, ep));
    ACCEPTED(engram_model_read_f32(model, 0, NULL, 0, NULL, ep));
    /* the PLE hash: NULLs refused before the member is asked about */
    engram_ple_history ph = {{1, 2}};
    REFUSED(engram_ple_hash(NULL, &ph, tok, NULL, 1, (uint32_t *)sent, ep));
    REFUSED(engram_ple_hash(model, NULL, tok, NULL, 1, (uint32_t *)sent, ep));
    REFUSED(engram_ple_hash(model, &ph, NULL, NULL, 1, (uint32_t *)sent, ep));
    REFUSED(engram_ple_hash(model, &ph, tok, NULL, 1, NULL, ep));
    NOTHING(engram_ple_history_reset(NULL, (engram_ple_history *)sent));
    NOTHING(engram_ple_history_reset(model, NULL));
}

/* ------------------------------------------------ apply */

static void apply_calls(void)
{
    REFUSED(engram_layer_open(NULL, 0, (engram_layer **)sent, ep));
    REFUSED(engram_layer_open(model, 0, NULL, ep));
    NOTHING(engram_layer_close(NULL));
    NOTHING(engram_layer_get_info(NULL, (engram_layer_info *)sent));
    NOTHING(engram_layer_get_info(layer, NULL));
    size_t wbytes = (size_t)(li.streams + 1) * li.width * ENGRAM_K * 2;
    CHECK(wbytes + (size_t)li.streams * li.width * 4 <= SENT_BYTES);
    NOTHING(engram_layer_export(NULL, (uint16_t *)sent, (float *)(sent + wbytes)));
    NOTHING(engram_layer_export(layer, NULL, NULL)); /* both optional: nothing to do */

    REFUSED(engram_applier_new(NULL, NULL, (engram_applier **)sent, ep));
    REFUSED(engram_applier_new(layer, NULL, NULL, ep));
    NOTHING(engram_applier_free(NULL));
    GIVES(engram_applier_bytes(NULL) == 0);

    /* residual, kv: outputs in the sentinel (0xA5A5 is a finite BF16) */
    size_t rs = (size_t)ENGRAM_K * 2, xs = (size_t)li.streams * li.width * 2;
    REFUSED(engram_apply(NULL, rows_bf16, ENGRAM_BF16, sent, ENGRAM_BF16, NULL, 1, ep));
    REFUSED(engram_apply(applier, NULL, ENGRAM_BF16, sent, ENGRAM_BF16, NULL, 1, ep));
    REFUSED(engram_apply(applier, rows_bf16, ENGRAM_BF16, NULL, ENGRAM_BF16, NULL, 1, ep));
    REFUSED(engram_apply_strided(NULL, rows_bf16, ENGRAM_BF16, rs, sent, ENGRAM_BF16, xs, NULL, 1, ep));
    {
        const void *rv[1] = {rows_bf16};
        void *xv[1] = {sent};
        float *sv[1] = {(float *)sent};
        REFUSED(engram_apply_seqs(NULL, 1, rv, ENGRAM_BF16, xv, ENGRAM_BF16, NULL, sv, ep));
        REFUSED(engram_apply_seqs(applier, 1, NULL, ENGRAM_BF16, xv, ENGRAM_BF16, NULL, sv, ep));
        REFUSED(engram_apply_seqs(applier, 1, rv, ENGRAM_BF16, NULL, ENGRAM_BF16, NULL, sv, ep));
    }
    REFUSED(engram_apply_strided(applier, NULL, ENGRAM_BF16, rs, sent, ENGRAM_BF16, xs, NULL, 1, ep));
    REFUSED(engram_apply_strided(applier, rows_bf16, ENGRAM_BF16, rs, NULL, ENGRAM_BF16, xs, NULL, 1,
                                 ep));
    REFUSED(engram_project(NULL, rows_bf16, ENGRAM_BF16, 1, (float *)sent, ep));
    REFUSED(engram_project(applier, NULL, ENGRAM_BF16, 1, (float *)sent, ep));
    REFUSED(engram_project(applier, rows_bf16, ENGRAM_BF16, 1, NULL, ep));
    ACCEPTED(engram_apply(applier, NULL, ENGRAM_BF16, NULL, ENGRAM_BF16, NULL, 0, ep));
    ACCEPTED(engram_project(applier, NULL, ENGRAM_BF16, 0, NULL, ep));
}

/* ------------------------------------------------ reader */

static int sink_none(void *ctx, size_t first, size_t n, const void *window)
{
    (void)ctx;
    (void)first;
    (void)n;
    (void)window;
    return 0;
}

static void reader_calls(void)
{
    engram_error e;
    engram_reader *r = NULL;
    REFUSED(engram_reader_open(NULL, NULL, (engram_reader **)sent, ep));
    REFUSED(engram_reader_open(model, NULL, NULL, ep));
    NOTHING(engram_reader_close(NULL));
    CHECK_EQ(engram_reader_open(model, NULL, &r, &e), 0); /* opts NULL: the defaults */
    if (!r)
        return;

    REFUSED(engram_reader_batch(NULL, 0, rows48, 1, ENGRAM_BF16, sent, ep));
    REFUSED(engram_reader_batch(r, 0, NULL, 1, ENGRAM_BF16, sent, ep));
    REFUSED(engram_reader_batch(r, 0, rows48, 1, ENGRAM_BF16, NULL, ep));
    REFUSED(engram_reader_batch_stream(NULL, 0, rows48, 1, ENGRAM_BF16, sent, 1, sink_none, NULL, ep));
    REFUSED(engram_reader_batch_stream(r, 0, NULL, 1, ENGRAM_BF16, sent, 1, sink_none, NULL, ep));
    REFUSED(engram_reader_batch_stream(r, 0, rows48, 1, ENGRAM_BF16, NULL, 1, sink_none, NULL, ep));
    REFUSED(engram_reader_batch_stream(r, 0, rows48, 1, ENGRAM_BF16, sent, 1, NULL, NULL, ep));
    ACCEPTED(engram_reader_batch(r, 0, NULL, 0, ENGRAM_BF16, NULL, ep));

    REFUSED(engram_reader_step_submit(NULL, rows48, ENGRAM_BF16, sent, ep));
    REFUSED(engram_reader_step_submit(r, NULL, ENGRAM_BF16, sent, ep));
    REFUSED(engram_reader_step_submit(r, rows48, ENGRAM_BF16, NULL, ep));
    REFUSED(engram_reader_step_wait(NULL, ep));
    REFUSED(engram_reader_step_poll(NULL, ep));
    REFUSED_NO_ERR(engram_reader_step_cancel(NULL));

    NOTHING(engram_reader_get_stats(NULL, (engram_io_stats *)sent));
    NOTHING(engram_reader_get_stats(r, NULL));
    NOTHING(engram_reader_reset_stats(NULL));
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    CHECK_EQ(st.steps + st.in_flight, 0); /* no refused submit left a step */
    CHECK_EQ(st.batches, 1);              /* the empty one */
    engram_reader_close(r);
}

/* ------------------------------------------------ pool, sessions, steps */

static engram_pool *pool;
static engram_session *sess, *other;
static uint16_t out_ok[ENGRAM_MAX_DRAFT * ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];

static uint64_t steps_begun(void)
{
    engram_pool_stats st;
    engram_pool_get_stats(pool, &st);
    return st.steps;
}

static int hist_same(void)
{
    engram_history h;
    engram_session_history(sess, &h);
    return memcmp(&h, &hist0, sizeof h) == 0;
}

static void pool_calls(void)
{
    REFUSED(engram_pool_open(NULL, NULL, (engram_pool **)sent, ep));
    REFUSED(engram_pool_open(model, NULL, NULL, ep));
    NOTHING(engram_pool_close(NULL));
    NOTHING(engram_pool_get_stats(NULL, (engram_pool_stats *)sent));
    NOTHING(engram_pool_get_stats(pool, NULL));

    REFUSED(engram_session_open(NULL, (engram_session **)sent, ep));
    REFUSED(engram_session_open(pool, NULL, ep));
    NOTHING(engram_session_close(NULL));

    /* a history of real tokens, kept through every refusal below */
    engram_error e;
    CHECK_EQ(engram_session_restore(sess, tok, NULL, 4, &e), 0);
    engram_session_history(sess, &hist0);
    NOTHING(engram_session_history(NULL, (engram_history *)sent));
    REFUSED(engram_session_set_history(NULL, &hist0, ep));
    REFUSED(engram_session_set_history(sess, NULL, ep));
    REFUSED(engram_session_restore(NULL, tok, NULL, 4, ep));
    REFUSED(engram_session_restore(sess, NULL, NULL, 4, ep));
    CHECK(hist_same());

    uint64_t steps = steps_begun();
    REFUSED(engram_step_begin(NULL, tok, NULL, 1, ENGRAM_BF16, sent, ep));
    REFUSED(engram_step_begin(sess, NULL, NULL, 1, ENGRAM_BF16, sent, ep));
    REFUSED(engram_step_begin(sess, tok, NULL, 1, ENGRAM_BF16, NULL, ep));

    engram_step_req q = {sess, tok, NULL, 1, sent};
    REFUSED(engram_step_begin_many(NULL, 1, ENGRAM_BF16, ep));
    q.s = NULL;
    REFUSED(engram_step_begin_many(&q, 1, ENGRAM_BF16, ep));
    q.s = sess;
    q.tokens = NULL;
    REFUSED(engram_step_begin_many(&q, 1, ENGRAM_BF16, ep));
    q.tokens = tok;
    q.out = NULL;
    REFUSED(engram_step_begin_many(&q, 1, ENGRAM_BF16, ep));
    /* the second request NULL: the first is not begun either */
    engram_step_req two[2] = {{other, tok, NULL, 1, sent}, {sess, tok, NULL, 1, NULL}};
    REFUSED(engram_step_begin_many(two, 2, ENGRAM_BF16, ep));

    engram_session *ss[2] = {other, sess}, *ss_null[2] = {other, NULL};
    void *outs[2] = {sent, sent + sizeof out_ok}, *outs_null[2] = {sent, NULL};
    REFUSED(engram_step_begin_batch(NULL, tok, NULL, 2, ENGRAM_BF16, outs, ep));
    REFUSED(engram_step_begin_batch(ss, NULL, NULL, 2, ENGRAM_BF16, outs, ep));
    REFUSED(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, NULL, ep));
    REFUSED(engram_step_begin_batch(ss_null, tok, NULL, 2, ENGRAM_BF16, outs, ep));
    REFUSED(engram_step_begin_batch(ss, tok, NULL, 2, ENGRAM_BF16, outs_null, ep));
    ACCEPTED(engram_step_begin_many(NULL, 0, ENGRAM_BF16, ep));
    ACCEPTED(engram_step_begin_batch(NULL, NULL, NULL, 0, ENGRAM_BF16, NULL, ep));
    CHECK_EQ(steps_begun(), steps); /* nothing was begun */

    REFUSED(engram_step_wait(NULL, 0, ep));
    REFUSED(engram_step_wait_timed(NULL, 0, 0, ep));
    REFUSED(engram_step_poll(NULL, 0, ep));
    REFUSED(engram_step_commit(NULL, 0, ep));
    NOTHING(engram_step_abort(NULL));
    NOTHING(engram_step_get_info(NULL, (engram_step_info *)sent));
    REFUSED(engram_step_apply(NULL, applier, sent, ENGRAM_F32, ep));
    REFUSED(engram_step_apply(sess, NULL, sent, ENGRAM_F32, ep));
    REFUSED(engram_step_apply(sess, applier, NULL, ENGRAM_F32, ep));
    {
        engram_session *one[1] = {sess}, *none[1] = {NULL};
        void *xv[1] = {sent}, *nx[1] = {NULL};
        REFUSED(engram_step_apply_batch(NULL, 1, applier, xv, ENGRAM_F32, ep));
        REFUSED(engram_step_apply_batch(one, 1, NULL, xv, ENGRAM_F32, ep));
        REFUSED(engram_step_apply_batch(one, 1, applier, NULL, ENGRAM_F32, ep));
        REFUSED(engram_step_apply_batch(none, 1, applier, xv, ENGRAM_F32, ep));
        REFUSED(engram_step_apply_batch(one, 1, applier, nx, ENGRAM_F32, ep));
    }
    GIVES(engram_session_state_bytes(NULL) == 0);
    REFUSED(engram_session_save(NULL, sent, 64, ep));
    REFUSED(engram_session_save(sess, NULL, 64, ep));
    REFUSED(engram_session_load(NULL, sent, 64, ep));
    REFUSED(engram_session_load(sess, NULL, 64, ep));
    CHECK(hist_same());

    /* and the sessions were left idle: a step begins and commits */
    CHECK_EQ(engram_step_begin(sess, tok, NULL, 1, ENGRAM_BF16, out_ok, &e), 0);
    CHECK_EQ(engram_step_wait(sess, 0, &e), 0);
    CHECK_EQ(engram_step_wait(sess, 1, &e), 0);
    CHECK_EQ(engram_step_commit(sess, 1, &e), 0);
    CHECK_EQ(steps_begun(), steps + 1);
    engram_session_history(sess, &hist0);
}

static void prefill_calls(void)
{
    engram_prefill_opts o0;
    memset(&o0, 0, sizeof o0);
    size_t ring = engram_prefill_ring_bytes_for(&o0, 4);
    GIVES(engram_prefill_ring_bytes_for(NULL, 4) == ring); /* opts NULL: the defaults */
    GIVES(engram_prefill_ring_bytes(NULL) == engram_prefill_ring_bytes(&o0));
    GIVES(engram_pool_prefill_ring_bytes(NULL, &o0, 4) == 0);
    GIVES(engram_pool_prefill_ring_bytes(pool, NULL, 4) == ring); /* V4.1's numbers */
    REFUSED(engram_prefill_apply(NULL, 0, applier, sent, ENGRAM_F32, ep));

    REFUSED(engram_prefill_begin(NULL, tok, NULL, 4, NULL, (engram_prefill **)sent, ep));
    REFUSED(engram_prefill_begin(sess, NULL, NULL, 4, NULL, (engram_prefill **)sent, ep));
    REFUSED(engram_prefill_begin(sess, tok, NULL, 4, NULL, NULL, ep));
    CHECK(hist_same());
    GIVES(engram_prefill_chunks(NULL) == 0);
    GIVES(engram_prefill_ready(NULL, 0) == 0);
    NOTHING(engram_prefill_get_info(NULL, (engram_prefill_info *)sent));
    REFUSED(engram_prefill_wait(NULL, 0, 0, (const void **)sent, (size_t *)(sent + 64),
                                (size_t *)(sent + 128), ep));
    REFUSED(engram_prefill_wait_timed(NULL, 0, 0, 0, (const void **)sent, (size_t *)(sent + 64),
                                      (size_t *)(sent + 128), ep));
    NOTHING(engram_prefill_release(NULL, 0, 0));
    NOTHING(engram_prefill_start_table1(NULL));
    REFUSED(engram_prefill_end(NULL, ep));
    REFUSED(engram_prefill_end_timed(NULL, 0, ep));
    NOTHING(engram_prefill_cancel(NULL));

    /* a live prefill (opts NULL: the defaults), its getter into NULL, its
     * waits with every output optional */
    engram_error e;
    engram_prefill *pf = NULL;
    CHECK_EQ(engram_prefill_begin(sess, tok, NULL, 4, NULL, &pf, &e), 0);
    if (!pf)
        return;
    NOTHING(engram_prefill_get_info(pf, NULL));
    REFUSED(engram_prefill_apply(pf, 0, NULL, sent, ENGRAM_F32, ep));
    REFUSED(engram_prefill_apply(pf, 0, applier, NULL, ENGRAM_F32, ep));
    ACCEPTED(engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, ep));
    ACCEPTED(engram_prefill_wait(pf, 1, 0, NULL, NULL, NULL, ep));
    engram_prefill_release(pf, 0, 0);
    engram_prefill_release(pf, 1, 0);
    CHECK_EQ(engram_prefill_end(pf, &e), 0);
    engram_session_history(sess, &hist0);
}

/* Each refusal of a begin names its own cause. */
static void begin_messages(void)
{
    engram_error e;
    uint8_t *o = (uint8_t *)out_ok;
    CHECK_ERR(engram_step_begin(sess, tok, NULL, 1, (engram_dtype)7, o, &e), e, -EINVAL, "dtype 7");
    CHECK(strstr(e.msg, "k must") == NULL);
    CHECK_ERR(engram_step_begin(sess, tok, NULL, 0, ENGRAM_BF16, o, &e), e, -EINVAL, "k = 0");
    CHECK_ERR(engram_step_begin(sess, tok, NULL, ENGRAM_MAX_DRAFT + 1, ENGRAM_BF16, o, &e), e, -EINVAL,
              "k = 9");
    CHECK_ERR(engram_step_begin(NULL, tok, NULL, 1, ENGRAM_BF16, o, &e), e, -EINVAL, "session");
    CHECK(strstr(e.msg, "k must") == NULL);
    CHECK_ERR(engram_step_begin(sess, NULL, NULL, 1, ENGRAM_BF16, o, &e), e, -EINVAL, "tokens");
    CHECK_ERR(engram_step_begin(sess, tok, NULL, 1, ENGRAM_BF16, NULL, &e), e, -EINVAL, "out");
    uint32_t bad = 1000;
    CHECK_ERR(engram_step_begin(sess, &bad, NULL, 1, ENGRAM_BF16, o, &e), e, -EINVAL, "token 0 (1000)");
    engram_step_req q[2] = {{sess, tok, NULL, 1, o}, {sess, tok, NULL, 1, o}};
    CHECK_ERR(engram_step_begin_many(q, 1, (engram_dtype)-1, &e), e, -EINVAL, "dtype -1");
    CHECK_ERR(engram_step_begin_many(q, 2, ENGRAM_BF16, &e), e, -EINVAL, "appears twice");
    q[1].s = other;
    q[1].k = 0;
    CHECK_ERR(engram_step_begin_many(q, 2, ENGRAM_BF16, &e), e, -EINVAL, "session 1: k = 0");

    engram_prefill *pf = NULL;
    engram_prefill_opts po;
    memset(&po, 0, sizeof po);
    po.dtype = (engram_dtype)9;
    CHECK_ERR(engram_prefill_begin(sess, tok, NULL, 4, &po, &pf, &e), e, -EINVAL, "dtype 9");
    po.dtype = ENGRAM_F32;
    po.chunk_tokens = ENGRAM_BATCH_TOKENS + 1;
    CHECK_ERR(engram_prefill_begin(sess, tok, NULL, 4, &po, &pf, &e), e, -EINVAL, "chunk_tokens 2049");
    po.chunk_tokens = 0;
    po.ring_chunks = 65;
    CHECK_ERR(engram_prefill_begin(sess, tok, NULL, 4, &po, &pf, &e), e, -EINVAL, "ring_chunks 65");
    CHECK_ERR(engram_prefill_begin(sess, &bad, NULL, 1, NULL, &pf, &e), e, -EINVAL, "token 0 (1000)");
    CHECK(pf == NULL);
    CHECK(hist_same());
}

static void session_calls(void)
{
    engram_error e;
    if (engram_pool_open(model, NULL, &pool, &e) < 0) { /* opts NULL: the defaults */
        fprintf(stderr, "pool: %s\n", e.msg);
        CHECK(0);
        return;
    }
    CHECK_EQ(engram_session_open(pool, &sess, &e), 0);
    CHECK_EQ(engram_session_open(pool, &other, &e), 0);
    if (sess && other) {
        pool_calls();
        prefill_calls();
        begin_messages();
        /* last, one session each: a crash inside these would leave the
         * session locked */
        NOTHING(engram_session_history(sess, NULL));
        NOTHING(engram_step_get_info(other, NULL));
    }
    if (crashes)
        return;
    engram_session_close(other);
    engram_session_close(sess);
    engram_pool_close(pool);
}

/* ------------------------------------------------ engram_tools.h */

static void tools_calls(void)
{
    REFUSED_NO_ERR(engram_layout_primes(300, 2, 4, 8, NULL, 48));
    REFUSED_NO_ERR(engram_layout_multipliers(800, 1, 4, NULL));

    float in32[ENGRAM_ROW_VALUES] = {0};
    uint16_t in16[ENGRAM_ROW_VALUES] = {0};
    REFUSED(engram_rows_quantize_f32(NULL, 1, sent, NULL, ep));
    REFUSED(engram_rows_quantize_f32(in32, 1, NULL, NULL, ep));
    REFUSED(engram_rows_quantize_bf16(NULL, 1, sent, NULL, ep));
    REFUSED(engram_rows_quantize_bf16(in16, 1, NULL, NULL, ep));
    uint8_t q[ENGRAM_ROW_BYTES];
    ACCEPTED(engram_rows_quantize_f32(in32, 1, q, NULL, ep)); /* saturated: optional */
    ACCEPTED(engram_rows_quantize_bf16(NULL, 0, NULL, NULL, ep));

    char json_path[600];
    tu_path(json_path, sizeof json_path, "tok.json");
    FILE *f = fopen(json_path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"added_tokens\":[],\"decoder\":{\"type\":\"ByteLevel\"},"
              "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"B\":1},\"merges\":[]}}",
              f);
        fclose(f);
    }
    REFUSED(engram_tokmap_from_json(NULL, (engram_tokmap *)sent, ep));
    REFUSED(engram_tokmap_from_json(json_path, NULL, ep));
    NOTHING(engram_tokmap_free(NULL));
    engram_tokmap tm;
    engram_error e;
    CHECK_EQ(engram_tokmap_from_json(json_path, &tm, &e), 0); /* the path was a valid one */
    engram_tokmap_free(&tm);

    REFUSED_NO_ERR(engram_text_normalize(NULL, 3, (char **)sent, (size_t *)(sent + 64)));
    REFUSED_NO_ERR(engram_text_normalize("Abc", 3, NULL, (size_t *)(sent + 64)));
    REFUSED_NO_ERR(engram_text_normalize("Abc", 3, (char **)sent, NULL));

    char path[600];
    tu_path(path, sizeof path, "built.gguf");
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    o.layout = layout;
    REFUSED(engram_build_model(NULL, &o, ep));
    REFUSED(engram_build_model(path, NULL, ep));
    o.layout.token_map = NULL;
    REFUSED(engram_build_model(path, &o, ep));
    engram_ple_build_opts po;
    memset(&po, 0, sizeof po);
    po.base = 100;
    po.width = 4;
    REFUSED(engram_build_ple_model(NULL, &po, ep));
    REFUSED(engram_build_ple_model(path, NULL, ep));
    /* shards (issue #24): the identity, the writer, the set check */
    REFUSED(engram_model_identity(NULL, (char *)sent, ep));
    REFUSED(engram_model_identity(model_path, NULL, ep));
    REFUSED(engram_shard_write(NULL, NULL, 0, 2, path, NULL, ep));
    REFUSED(engram_shard_write(model_path, NULL, 0, 2, NULL, NULL, ep));
    REFUSED(engram_shard_set_check(NULL, 2, NULL, ep));
    CHECK(access(path, F_OK) != 0); /* nothing written */
    NOTHING(engram_sync_dir_of(NULL));

    /* the one writer: refused before anything is created */
    char out_path[600];
    tu_path(out_path, sizeof out_path, "out.bin");
    REFUSED(engram_output_check(NULL, 0, ep));
    REFUSED(engram_output_open(NULL, out_path, 0, ep));
    REFUSED(engram_output_open((engram_output *)sent, NULL, 0, ep));
    REFUSED(engram_output_close(NULL, 1, ep));
    REFUSED(engram_output_fopen(NULL, out_path, 0, (FILE **)(sent + 64), ep));
    REFUSED(engram_output_fopen((engram_output *)sent, NULL, 0, (FILE **)(sent + 64), ep));
    REFUSED(engram_output_fopen((engram_output *)sent, out_path, 0, NULL, ep));
    CHECK(access(out_path, F_OK) != 0);
    GIVES(engram_output_same(NULL, out_path) == 0);
    GIVES(engram_output_same(out_path, NULL) == 0);
    /* fclose with a NULL stream: refused, and the output it names is
     * still whole (closed by the next call) */
    engram_output w;
    FILE *fw;
    CHECK_EQ(engram_output_fopen(&w, out_path, 0, &fw, NULL), 0);
    engram_output before = w;
    REFUSED(engram_output_fclose(NULL, fw, 1, ep));
    REFUSED(engram_output_fclose(&w, NULL, 1, ep));
    CHECK(memcmp(&before, &w, sizeof w) == 0);
    CHECK_EQ(engram_output_fclose(&w, fw, 0, NULL), 0);
    CHECK(access(out_path, F_OK) != 0); /* ok = 0: nothing put in place */
}

int main(void)
{
    sent = aligned_alloc(64, SENT_BYTES);
    if (!sent)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    if (fixture_open() < 0) {
        fprintf(stderr, "cannot set up the model\n");
        CHECK(0);
    } else {
        hash_calls();
        model_calls();
        apply_calls();
        reader_calls();
        session_calls();
        tools_calls();
    }
    fixture_close();
    free(sent);
    tu_cleanup();
    return tu_finish("test_null");
}
