/*
 * test_service.c - the order in which a pool serves its sessions' reads,
 * and sessions whose reads are stuck, decided read by read on a real file.
 *
 * The reader's engine is a gate (fault_engine.h): every read the pool
 * queues is logged and held until the test releases it, then done with a
 * real pread of the model file.  Releasing everything in flight and waiting
 * until the pool's thread blocks again is one "wave": what the pool queues
 * in a wave is its decision for that state, the same on every run and on
 * every machine.  Each logged read is attributed, by the rows it covers,
 * to the step or prompt that asked for it (the test picks tokens whose rows
 * no other owner's rows are near).
 *  - Order: three steps begun while the first still has table-0 reads to
 *    issue: every table-0 read of all three is queued before any table-1
 *    read, and within a table the older step's before the newer's.
 *  - Fairness: two prompts prefilled at once: once the second begins, no
 *    run of more than 64 consecutive prefill reads belongs to one prompt,
 *    and the second prompt's first chunk is issued within about twice its
 *    own reads.
 *  - Stuck reads: a read of session A that never completes: B, which
 *    shared A's round and got all its rows, commits and closes; A's timed
 *    wait returns -ETIMEDOUT (nothing lost: its other table is whole, the
 *    wait can be repeated) and A closes at once; a prefill whose read is
 *    stuck: a timed chunk wait and a timed end return -ETIMEDOUT, the handle
 *    stays valid, and after the read completes end says -ECANCELED (the
 *    history unchanged).  A close that blocks is reported, not hung on.
 * Every step's rows are compared with plain reads (engram_model_read_bf16).
 *
 * Built with -DENGRAM_OLD_API (the calls of 0.1.0 only) it runs against the
 * library before issue #20; the timed parts are then left out.
 */
#include <pthread.h>
#include <time.h>

#include "fault_engine.h"
#include "testutil.h"

static engram_model *model;
static char model_path[512];
static engram_model_info mi;

#define ROWV 256
#define TOKV (48 * ROWV)

/* ------------------------------------------------ owners of reads */

#define MAX_OWNERS 4

struct owner {
    const char *name;
    uint32_t *rows[2];           /* sorted row ids per table */
    size_t n[2];
};

static struct owner owners[MAX_OWNERS];
static int n_owners;

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The rows n tokens ask for from a reset history: [n][48]. */
static uint32_t *rows_of(const uint32_t *tok, size_t n)
{
    uint32_t *ids = malloc(n * 48 * sizeof *ids);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, NULL, n, ids, NULL), 0);
    return ids;
}

static void owner_set(struct owner *o, const char *name, const uint32_t *tok, size_t n)
{
    uint32_t *ids = rows_of(tok, n);
    o->name = name;
    for (int t = 0; t < 2; t++) {
        o->rows[t] = malloc(n * 24 * sizeof *o->rows[t]);
        for (size_t i = 0; i < n; i++)
            memcpy(o->rows[t] + i * 24, ids + i * 48 + t * 24, 24 * sizeof *ids);
        qsort(o->rows[t], n * 24, sizeof *o->rows[t], cmp_u32);
        o->n[t] = n * 24;
    }
    free(ids);
}

static int owns(const struct owner *o, int t, uint32_t row)
{
    return bsearch(&row, o->rows[t], o->n[t], sizeof row, cmp_u32) != NULL;
}

/* 1 if two owners have rows within 2 of each other (a read could cover
 * both): the test then picks other tokens. */
static int owners_near(const struct owner *a, const struct owner *b)
{
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < a->n[t]; i++)
            for (int d = -2; d <= 2; d++)
                if (owns(b, t, (uint32_t)((int64_t)a->rows[t][i] + d)))
                    return 1;
    return 0;
}

static void owners_free(void)
{
    for (int i = 0; i < n_owners; i++)
        for (int t = 0; t < 2; t++)
            free(owners[i].rows[t]);
    n_owners = 0;
}

/* Tokens for owner k (n of them); for short steps (apart), rows near no
 * earlier owner's.  A prompt's rows cannot all be apart from another's:
 * reads covering two owners' rows are left out of the counts. */
static void pick_tokens(int k, uint32_t *tok, size_t n, uint32_t base, int apart)
{
    for (uint32_t shift = 0;; shift += 7) {
        for (size_t i = 0; i < n; i++)
            tok[i] = (base + shift + (uint32_t)i * 13u) % 900u;
        owner_set(&owners[k], "?", tok, n);
        int near = 0;
        for (int j = 0; j < k && !near && apart; j++)
            near = owners_near(&owners[j], &owners[k]);
        if (!near)
            return;
        for (int t = 0; t < 2; t++)
            free(owners[k].rows[t]);
    }
}

/* The owner (index) and table of logged read i; -1: nobody's, -2: rows of
 * two owners. */
static int read_owner(unsigned i, int *table)
{
    int found = -1;
    uint64_t off = fg.log_off[i], end = off + fg.log_len[i];
    for (int t = 0; t < 2; t++) {
        uint64_t base = mi.table[t].offset;
        if (end <= base || off >= base + mi.table[t].bytes)
            continue;
        uint64_t lo = off > base ? (off - base) / ENGRAM_ROW_BYTES : 0;
        for (uint64_t r = lo; base + r * ENGRAM_ROW_BYTES < end; r++) {
            uint64_t ro = base + r * ENGRAM_ROW_BYTES;
            if (ro < off || ro + ENGRAM_ROW_BYTES > end)
                continue;
            for (int k = 0; k < n_owners; k++)
                if (owns(&owners[k], t, (uint32_t)r)) {
                    *table = t;
                    found = found < 0 || found == k ? k : -2;
                }
        }
    }
    return found;
}

/* ------------------------------------------------ waves */

static engram_pool *gate_pool(unsigned depth)
{
    engram_pool_opts o = {.reader = {.engine = ENGRAM_IO_AUTO, .depth = depth}};
    engram_pool *p = NULL;
    engram_error err;
    fg_arm(1);
    int rc = engram_pool_open(model, &o, &p, &err);
    fg_arm(0);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "pool: %s\n", err.msg);
    return p;
}

typedef int (*done_fn)(void *ctx);

/* After an action: until the pool's thread blocks in the gate again, or
 * done(ctx) (nothing left to read: the thread idles elsewhere).  20 s at
 * most (a failure, reported). */
static int settle_or(unsigned long since, done_fn done, void *ctx)
{
    for (int i = 0; i < 100000; i++) {
        pthread_mutex_lock(&fe_mu);
        int ok = fg.blocks > since && fg.waiting && !fg.woken;
        pthread_mutex_unlock(&fe_mu);
        if (ok || (done && done(ctx)))
            return 1;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "test_service: the pool's thread did not settle in 20 s\n");
    return 0;
}

/* Waves until done(ctx): release everything in flight, settle. */
static int waves(done_fn done, void *ctx, unsigned max)
{
    for (unsigned w = 0; w < max; w++) {
        if (done(ctx))
            return (int)w;
        unsigned long b = fg_blocks();
        if (fg_release_all() == 0 && done(ctx))
            return (int)w;
        if (!settle_or(b, done, ctx))
            return -1;
    }
    return -1;
}

/* ------------------------------------------------ order */

struct stepset {
    engram_session **s;
    int n;
};

static int steps_done(void *ctx)
{
    struct stepset *ss = ctx;
    for (int i = 0; i < ss->n; i++)
        for (int t = 0; t < 2; t++)
            if (engram_step_poll(ss->s[i], t, NULL) == -EAGAIN)
                return 0;
    return 1;
}

static int rows_exact(const uint16_t *out, const uint32_t *tok, size_t k)
{
    uint32_t *ids = rows_of(tok, k);
    uint16_t *want = malloc(k * TOKV * 2);
    for (size_t i = 0; i < k; i++)
        for (int t = 0; t < 2; t++)
            CHECK_EQ(engram_model_read_bf16(model, t, ids + i * 48 + t * 24, 24,
                                            want + (i * 48 + (size_t)t * 24) * ROWV, NULL), 0);
    int same = memcmp(out, want, k * TOKV * 2) == 0;
    free(ids);
    free(want);
    return same;
}

static void service_order(void)
{
    engram_pool *p = gate_pool(16);
    if (!p)
        return;
    uint32_t tok[3][2];
    const unsigned k[3] = {2, 1, 1};
    for (int i = 0; i < 3; i++)
        pick_tokens(i, tok[i], k[i], 100u + 100u * (unsigned)i, 1);
    n_owners = 3;
    engram_session *s[3];
    static uint16_t out[3][2 * TOKV];
    for (int i = 0; i < 3; i++)
        CHECK_EQ(engram_session_open(p, &s[i], NULL), 0);
    unsigned first = 0;
    for (int i = 0; i < 3; i++) {
        unsigned long b = fg_blocks();
        if (i == 0) {
            pthread_mutex_lock(&fe_mu);
            first = fg.nlog;
            pthread_mutex_unlock(&fe_mu);
        }
        CHECK_EQ(engram_step_begin(s[i], tok[i], NULL, k[i], ENGRAM_BF16, out[i], NULL), 0);
        CHECK(settle_or(b, NULL, NULL));
    }
    struct stepset ss = {s, 3};
    int nw = waves(steps_done, &ss, 10000);
    CHECK(nw > 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(engram_step_commit(s[i], k[i], NULL), 0);
        CHECK(rows_exact(out[i], tok[i], k[i]));
    }
    /* the log: (owner, table) of every read from A's begin */
    int last_t0 = -1, first_t1 = -1, bad_order = 0, unknown = 0;
    int last[2][3], firstof[2][3];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++)
            last[t][i] = -1, firstof[t][i] = -1;
    pthread_mutex_lock(&fe_mu);
    unsigned nlog = fg.nlog;
    pthread_mutex_unlock(&fe_mu);
    for (unsigned i = first; i < nlog; i++) {
        int t = 0, o = read_owner(i, &t);
        if (o < 0) {
            unknown += o == -1;
            continue;
        }
        if (t == 0)
            last_t0 = (int)i;
        else if (first_t1 < 0)
            first_t1 = (int)i;
        if (firstof[t][o] < 0)
            firstof[t][o] = (int)i;
        last[t][o] = (int)i;
    }
    for (int t = 0; t < 2; t++)
        for (int i = 0; i + 1 < 3; i++)
            bad_order += last[t][i] > firstof[t][i + 1];
    printf("order: %u reads in %d waves; the last table-0 read is #%d, the first table-1 read #%d; "
           "table 0 by step: A %d..%d, B %d..%d, C %d..%d\n", nlog - first, nw, last_t0 - (int)first,
           first_t1 - (int)first, firstof[0][0] - (int)first, last[0][0] - (int)first,
           firstof[0][1] - (int)first, last[0][1] - (int)first, firstof[0][2] - (int)first,
           last[0][2] - (int)first);
    CHECK_EQ(unknown, 0);
    CHECK(last_t0 >= 0 && first_t1 > last_t0); /* every table-0 read before any table-1 read */
    CHECK_EQ(bad_order, 0);                    /* the older step's reads before the newer's */
    for (int i = 0; i < 3; i++)
        engram_session_close(s[i]);
    engram_pool_close(p);
    owners_free();
}

/* ------------------------------------------------ fairness */

struct pfset {
    engram_prefill **pf;
    int n;
    unsigned q_first; /* reads logged when the last prompt's first chunk was published */
};

static int prefills_done(void *ctx)
{
    struct pfset *ps = ctx;
    if (!ps->q_first && engram_prefill_ready(ps->pf[ps->n - 1], 0) >= 1) {
        pthread_mutex_lock(&fe_mu);
        ps->q_first = fg.nlog;
        pthread_mutex_unlock(&fe_mu);
    }
    for (int i = 0; i < ps->n; i++)
        for (int t = 0; t < 2; t++)
            if (engram_prefill_ready(ps->pf[i], t) < engram_prefill_chunks(ps->pf[i]))
                return 0;
    return 1;
}

static void prefill_fairness(void)
{
    engram_pool *p = gate_pool(40);
    if (!p)
        return;
    enum { N = 64, CHUNK = 16 };
    static uint32_t tok[2][N];
    pick_tokens(0, tok[0], N, 300, 0);
    pick_tokens(1, tok[1], N, 600, 0);
    n_owners = 2;
    engram_session *s[2];
    engram_prefill *pf[2];
    engram_prefill_opts o = {.chunk_tokens = CHUNK, .ring_chunks = N / CHUNK, .dtype = ENGRAM_BF16};
    unsigned q_at = 0;
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(engram_session_open(p, &s[i], NULL), 0);
        unsigned long b = fg_blocks();
        pthread_mutex_lock(&fe_mu);
        q_at = fg.nlog;
        pthread_mutex_unlock(&fe_mu);
        CHECK_EQ(engram_prefill_begin(s[i], tok[i], NULL, N, &o, &pf[i], NULL), 0);
        CHECK(settle_or(b, NULL, NULL));
    }
    struct pfset ps = {pf, 2, 0};
    int nw = waves(prefills_done, &ps, 100000);
    CHECK(nw > 0);
    /* the rows, chunk by chunk */
    uint32_t *ids[2] = {rows_of(tok[0], N), rows_of(tok[1], N)};
    int bad = 0;
    static uint16_t want[CHUNK * 24 * ROWV];
    for (int i = 0; i < 2; i++) {
        for (size_t c = 0; c < N / CHUNK; c++)
            for (int t = 0; t < 2; t++) {
                const void *rows = NULL;
                CHECK_EQ(engram_prefill_wait(pf[i], t, c, &rows, NULL, NULL, NULL), 0);
                for (size_t j = 0; j < CHUNK; j++)
                    CHECK_EQ(engram_model_read_bf16(model, t, ids[i] + (c * CHUNK + j) * 48 + t * 24, 24,
                                                    want + j * 24 * ROWV, NULL), 0);
                bad += !rows || memcmp(rows, want, sizeof want) != 0;
                engram_prefill_release(pf[i], t, c);
            }
        CHECK_EQ(engram_prefill_end(pf[i], NULL), 0);
    }
    CHECK_EQ(bad, 0);
    /* the log from the second prompt's begin: runs of one prompt's reads
     * while both have reads to issue, and when the second prompt's first
     * table-0 chunk was all issued */
    pthread_mutex_lock(&fe_mu);
    unsigned nlog = fg.nlog;
    pthread_mutex_unlock(&fe_mu);
    int lastof[2] = {-1, -1}, shared = 0;
    for (unsigned i = q_at; i < nlog; i++) {
        int t = 0, w = read_owner(i, &t);
        if (w >= 0)
            lastof[w] = (int)i;
        shared += w == -2;
    }
    unsigned both_until = (unsigned)(lastof[0] < lastof[1] ? lastof[0] : lastof[1]);
    unsigned run = 0, longest = 0, reads[2] = {0, 0}, before_q0[2] = {0, 0};
    int prev = -1, unknown = 0;
    for (unsigned i = q_at; i < nlog; i++) {
        int t = 0, w = read_owner(i, &t);
        if (w < 0) {
            unknown += w == -1;
            continue;
        }
        reads[w]++;
        if (i < ps.q_first)
            before_q0[w]++;
        if (i <= both_until) {
            run = w == prev ? run + 1 : 1;
            prev = w;
            if (run > longest)
                longest = run;
        }
    }
    printf("fairness: from the second prompt's begin %u reads of the first, %u of the second in %d "
           "waves; longest run of one prompt's reads while both read: %u; until the second's first "
           "chunk was published: %u reads of the first, %u of the second (%d reads of rows of both "
           "left out)\n", reads[0], reads[1], nw, longest, before_q0[0], before_q0[1], shared);
    CHECK_EQ(unknown, 0);
    CHECK(longest <= 64);
    /* equal turns: the first prompt got no more than the second (plus a
     * wave's worth: the reads it had in flight, the turns' rounding) */
    CHECK(ps.q_first > 0 && before_q0[0] <= before_q0[1] + 64);
    free(ids[0]);
    free(ids[1]);
    engram_session_close(s[0]);
    engram_session_close(s[1]);
    engram_pool_close(p);
    owners_free();
}

/* ------------------------------------------------ stuck reads */

struct closer {
    engram_session *s;
    int done;
    pthread_mutex_t mu;
};

static void *close_thread(void *arg)
{
    struct closer *c = arg;
    engram_session_close(c->s);
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Closes s on another thread; 1 if the close returned within 20 s (else
 * the read is released to let it finish, and 0). */
static int close_returns(engram_session *s, uint64_t stuck_lo, uint64_t stuck_hi)
{
    struct closer c = {s, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, close_thread, &c);
    int done = 0;
    for (int i = 0; i < 20000 && !done; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c.mu);
        done = c.done;
        pthread_mutex_unlock(&c.mu);
    }
    if (!done) { /* let it finish: the stuck read completes */
        fg_stick(stuck_lo, stuck_hi, 0);
        fg_release_all();
    }
    pthread_join(th, NULL);
    return done;
}

static int table_done(void *ctx)
{
    struct stepset *ss = ctx; /* s[0], table stored in n */
    return engram_step_poll(ss->s[0], ss->n, NULL) != -EAGAIN;
}

static int b_done(void *ctx)
{
    engram_session **s = ctx;
    return engram_step_poll(s[1], 0, NULL) != -EAGAIN && engram_step_poll(s[1], 1, NULL) != -EAGAIN &&
           (engram_step_poll(s[0], 0, NULL) != -EAGAIN || engram_step_poll(s[0], 1, NULL) != -EAGAIN);
}

static void stuck_reads(void)
{
    engram_pool *p = gate_pool(64);
    if (!p)
        return;
    uint32_t tok[2][1];
    pick_tokens(0, tok[0], 1, 700, 1);
    pick_tokens(1, tok[1], 1, 800, 1);
    n_owners = 2;
    engram_session *s[2];
    static uint16_t out[2][TOKV];
    for (int i = 0; i < 2; i++)
        CHECK_EQ(engram_session_open(p, &s[i], NULL), 0);
    unsigned long b = fg_blocks();
    pthread_mutex_lock(&fe_mu);
    unsigned first = fg.nlog;
    pthread_mutex_unlock(&fe_mu);
    const uint32_t both[2] = {tok[0][0], tok[1][0]};
    void *outs[2] = {out[0], out[1]};
    CHECK_EQ(engram_step_begin_batch(s, both, NULL, 2, ENGRAM_BF16, outs, NULL), 0); /* one round */
    CHECK(settle_or(b, NULL, NULL));
    /* A's first table-0 read never completes */
    uint64_t lo = 0, hi = 0;
    pthread_mutex_lock(&fe_mu);
    unsigned nlog = fg.nlog;
    pthread_mutex_unlock(&fe_mu);
    for (unsigned i = first; i < nlog && !hi; i++) {
        int t = 0;
        if (read_owner(i, &t) == 0 && t == 0) {
            lo = fg.log_off[i];
            hi = lo + fg.log_len[i];
        }
    }
    CHECK(hi > 0);
    CHECK_EQ(fg_stick(lo, hi, 1), 1);
    CHECK(waves(b_done, s, 10000) >= 0);
    /* B has all its rows: it commits, and closes while A's read is stuck */
    CHECK_EQ(engram_step_commit(s[1], 1, NULL), 0);
    CHECK(rows_exact(out[1], tok[1], 1));
    int b_closed = close_returns(s[1], lo, hi);
    printf("stuck read: session B (same round as A, all its rows in) closed %s\n",
           b_closed ? "at once" : "ONLY AFTER A's stuck read was released (20 s)");
    CHECK(b_closed);
    if (b_closed) {
        /* A: table 1 whole, table 0 waits for the stuck read */
        struct stepset one = {s, 1};
        CHECK(waves(table_done, &one, 10000) >= 0);
        CHECK_EQ(engram_step_wait(s[0], 1, NULL), 0);
        CHECK_EQ(engram_step_poll(s[0], 0, NULL), -EAGAIN);
#ifndef ENGRAM_OLD_API
        engram_error err;
        CHECK_ERR(engram_step_wait_timed(s[0], 0, 50000000, &err), err, -ETIMEDOUT, "still to come");
        CHECK_ERR(engram_step_wait_timed(s[0], 0, 0, &err), err, -ETIMEDOUT, "still to come");
#endif
        int a_closed = close_returns(s[0], lo, hi);
        printf("stuck read: session A (its read stuck) closed %s\n", a_closed ? "at once" : "ONLY AFTER the read");
        CHECK(a_closed);
    }
    /* the stuck read completes now (the closed sessions' memory is then freed) */
    fg_stick(lo, hi, 0);
    fg_release_all();
#ifndef ENGRAM_OLD_API
    /* a prefill whose first read is stuck */
    engram_session *c;
    CHECK_EQ(engram_session_open(p, &c, NULL), 0);
    owners_free();
    uint32_t ptok[32];
    pick_tokens(0, ptok, 32, 50, 0);
    n_owners = 1;
    engram_prefill_opts o = {.chunk_tokens = 16, .ring_chunks = 2, .dtype = ENGRAM_BF16};
    engram_prefill *pf = NULL;
    b = fg_blocks();
    pthread_mutex_lock(&fe_mu);
    first = fg.nlog;
    pthread_mutex_unlock(&fe_mu);
    CHECK_EQ(engram_prefill_begin(c, ptok, NULL, 32, &o, &pf, NULL), 0);
    CHECK(settle_or(b, NULL, NULL));
    pthread_mutex_lock(&fe_mu);
    lo = fg.log_off[first];
    hi = lo + fg.log_len[first];
    pthread_mutex_unlock(&fe_mu);
    CHECK_EQ(fg_stick(lo, hi, 1), 1);
    for (int w = 0; w < 200; w++) { /* everything but the stuck read */
        unsigned long bb = fg_blocks();
        if (fg_release_all() == 0)
            break;
        CHECK(settle_or(bb, NULL, NULL));
    }
    engram_error err;
    CHECK_ERR(engram_prefill_wait_timed(pf, 0, 0, 50000000, NULL, NULL, NULL, &err), err, -ETIMEDOUT,
              "still being read");
    engram_history h0, h1;
    engram_session_history(c, &h0);
    CHECK_ERR(engram_prefill_end_timed(pf, 50000000, &err), err, -ETIMEDOUT, "call end or cancel again");
    CHECK_EQ(engram_prefill_ready(pf, 0), 0); /* still valid */
    fg_stick(lo, hi, 0);
    fg_release_all();
    CHECK_ERR(engram_prefill_end(pf, &err), err, -ECANCELED, "before all its chunks");
    engram_session_history(c, &h1);
    CHECK(memcmp(&h0, &h1, sizeof h0) == 0);
    engram_session_close(c);
#endif
    engram_pool_close(p);
    CHECK_EQ(fe.destroy_inflight, 0);
    owners_free();
}

int main(void)
{
    alarm(600);
    static uint32_t map[1000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 1000, 900, 10000), 0);
    CHECK_EQ(tu_build("service.gguf", &l, ENGRAM_FILL_RANDOM, 0, model_path, sizeof model_path), 0);
    engram_error err;
    if (engram_model_open(model_path, &model, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    engram_model_get_info(model, &mi);
    fe_reset();
    fe.wrap = 0;
    service_order();
    prefill_fairness();
    stuck_reads();
    engram_model_close(model);
    tu_cleanup();
    return tu_finish("test_service");
}
