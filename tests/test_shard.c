/*
 * test_shard.c - row-block shards (engram_pool_opts.shard_rank /
 * shard_world, issue #24) on small generated models of both members (V4.1
 * at W = 64, and Qwen3.8's PLE).  For worlds of 2, 3, 4 and 7 ranks, one
 * pool per rank and one unsharded pool in this process run the same
 * sessions on the same tokens; the oracle is the unsharded pool and the
 * hash (which rank owns a row is computed here from the row id):
 *  - steps (engram_step_begin, _many, _batch; k = 1..8; masks, PLE padding
 *    and image positions; BF16, F32, RAW): each rank's out holds the
 *    unsharded row in the slots of its block's rows and zero bytes in the
 *    others, so the bitwise OR of the world's outs is the unsharded out;
 *    masked slots untouched; engram_step_info.rows the block's count;
 *  - prefills (several chunks, a ring of 2, masks): the same chunk by
 *    chunk, the histories after end equal;
 *  - the pools' counters: requests and distinct rows read, summed over the
 *    ranks, equal the unsharded pool's for the same work;
 *  - a rank whose block holds none of a step's rows (world 65,536): the
 *    step is ready at once, its out zeros, nothing requested;
 *  - refusals, field named: shard_rank >= shard_world, shard_world above
 *    ENGRAM_MAX_SHARDS; engram_step_apply, _apply_batch and
 *    engram_prefill_apply on a sharded pool (the unsharded pool applies).
 */
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define MAXW 8 /* ranks of the largest world + the unsharded pool */
#define NS 3   /* sessions per pool */
#define N 64   /* tokens of each session's step stream */
#define PN 150 /* tokens of a prompt */
#define POISON 0xa5

/* A member under test: its model and numbers. */
struct fam {
    const char *name;
    engram_model *m;
    int ple;
    unsigned tables, cols, rpt, streams, width;
    uint64_t R[ENGRAM_TABLES];
};

static size_t row_out(const struct fam *f, engram_dtype d)
{
    unsigned values = f->ple ? 160 : 256;
    return d == ENGRAM_F32 ? values * 4u : d == ENGRAM_BF16 ? values * 2u : f->ple ? 320u : 264u;
}

/* The rank of a world that owns table t's row (the reference's blocks). */
static unsigned owner(const struct fam *f, unsigned t, uint32_t row, unsigned world)
{
    for (unsigned r = 0; r < world; r++) {
        uint64_t lo = r * f->R[t] / world, hi = (r + 1) * f->R[t] / world;
        if (row >= lo && row < hi)
            return r;
    }
    return world; /* not reached */
}

static int masked(const struct fam *f, const uint8_t *mask, size_t i)
{
    (void)f;
    return mask && mask[i] == 0; /* V4.1: masked; PLE: padding */
}

/* Row ids [n][rpt] of a token stream from a sequence start. */
static uint32_t *hash_stream(const struct fam *f, const uint32_t *tok, const uint8_t *mask, size_t n)
{
    uint32_t *rows = malloc(n * f->rpt * sizeof *rows);
    if (f->ple) {
        static const uint8_t kind[3] = {ENGRAM_PLE_PAD, ENGRAM_PLE_TEXT, ENGRAM_PLE_IMAGE};
        uint8_t *k = malloc(n);
        for (size_t i = 0; i < n; i++)
            k[i] = kind[mask[i]];
        engram_ple_history h;
        engram_ple_history_reset(f->m, &h);
        CHECK_EQ(engram_ple_hash(f->m, &h, tok, k, n, rows, NULL), 0);
        free(k);
    } else {
        engram_history h;
        engram_history_reset(&h);
        CHECK_EQ(engram_hash_tokens(engram_model_hasher(f->m), &h, tok, mask, n, rows, NULL), 0);
    }
    return rows;
}

static void random_stream(const struct fam *f, uint64_t seed, uint32_t *tok, uint8_t *mask, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tok[i] = (uint32_t)(tu_rand(&seed) % 5000);
        unsigned r = (unsigned)(tu_rand(&seed) % 10);
        mask[i] = r == 0 ? 0 : f->ple && r == 1 ? 2 : 1;
    }
}

static int all_zero(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static int all_poison(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != POISON)
            return 0;
    return 1;
}

/* Tokens' rows as delivered by the world's pools (bufs[0..world-1] the
 * ranks', bufs[world] the unsharded pool's), token i's row j at
 * (i * rpt + j) * rb, or (cols per token, one table: a prefill chunk) at
 * (i * cols + c) * rb with only table t.  Masked tokens: untouched (when
 * poisoned) or not compared.  Counts the block rows of each rank into own
 * (per table) and the nonzero unsharded rows into *nonzero. */
static int compare(const struct fam *f, unsigned world, uint8_t *const *bufs, size_t rb, const uint32_t *rows,
                   const uint8_t *mask, size_t k, int chunk_table, int poisoned,
                   unsigned own[][ENGRAM_TABLES], size_t *nonzero)
{
    int bad = 0;
    unsigned per = chunk_table >= 0 ? f->cols : f->rpt;
    for (size_t i = 0; i < k; i++) {
        size_t tok = i * per * rb;
        if (masked(f, mask, i)) {
            for (unsigned r = 0; r <= world && poisoned; r++)
                bad |= !all_poison(bufs[r] + tok, per * rb);
            continue;
        }
        for (unsigned j = 0; j < per; j++) {
            unsigned t = chunk_table >= 0 ? (unsigned)chunk_table : j / f->cols;
            uint32_t id = rows[i * f->rpt + (chunk_table >= 0 ? t * f->cols + j : j)];
            unsigned o = owner(f, t, id, world);
            const uint8_t *full = bufs[world] + tok + j * rb;
            *nonzero += !all_zero(full, rb);
            for (unsigned r = 0; r < world; r++) {
                const uint8_t *mine = bufs[r] + tok + j * rb;
                bad |= r == o ? memcmp(mine, full, rb) != 0 : !all_zero(mine, rb);
            }
            own[o][t]++;
            for (size_t b = 0; b < rb; b++) { /* the combine an MPI_BOR allreduce does */
                uint8_t x = 0;
                for (unsigned r = 0; r < world; r++)
                    x |= bufs[r][tok + j * rb + b];
                bad |= x != full[b];
            }
        }
    }
    CHECK(!bad);
    return bad;
}

static engram_pool *open_rank(const struct fam *f, unsigned rank, unsigned world)
{
    engram_pool_opts o = {.reader = {.depth = 32}, .shard_rank = rank, .shard_world = world};
    engram_pool *p = NULL;
    engram_error err;
    int rc = engram_pool_open(f->m, &o, &p, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "pool %u/%u: %s\n", rank, world, err.msg);
    return p;
}

/* The world's counters summed against the unsharded pool's.  A round's
 * distinct reads are counted when the I/O thread retires it, which may be
 * just after its steps were committed: the step counts are polled until
 * they agree (or 5 s passed); prefill chunks count theirs before they are
 * published. */
static void check_counts(engram_pool *const *pools, unsigned world)
{
    engram_pool_stats st, full;
    uint64_t req = 0, rd = 0, preq = 0, prd = 0;
    for (int tries = 0; tries < 5000; tries++) {
        req = rd = preq = prd = 0;
        for (unsigned r = 0; r < world; r++) {
            engram_pool_get_stats(pools[r], &st);
            req += st.step_rows_requested;
            rd += st.step_rows_read;
            preq += st.prefill_rows_requested;
            prd += st.prefill_rows_read;
        }
        engram_pool_get_stats(pools[world], &full);
        if (rd == full.step_rows_read)
            break;
        usleep(1000);
    }
    CHECK_EQ(req, full.step_rows_requested);
    CHECK_EQ(rd, full.step_rows_read);
    CHECK_EQ(preq, full.prefill_rows_requested);
    CHECK_EQ(prd, full.prefill_rows_read);
    if (full.step_rows_requested) /* shared rows were merged */
        CHECK(full.step_rows_read < full.step_rows_requested);
    if (full.prefill_rows_requested) /* repeated rows of a chunk too */
        CHECK(full.prefill_rows_read < full.prefill_rows_requested);
}

/* ------------------------------------------------------------ steps */

struct stream {
    uint32_t tok[N];
    uint8_t mask[N];
    uint32_t *rows;
    size_t pos;
};

/* NS sessions of every pool step through their streams together: single
 * begins (each step alone), begin_many (k = 1..8 each, one round) and
 * begin_batch (one token each), waited table by table, committed whole. */
static void steps(const struct fam *f, unsigned world, engram_dtype d)
{
    engram_pool *pools[MAXW];
    engram_session *ss[MAXW][NS];
    uint8_t *out[NS][MAXW];
    size_t rb = row_out(f, d), tokb = f->rpt * rb;
    struct stream st[NS];
    for (unsigned j = 0; j < NS; j++) {
        /* sessions 0 and 2 step the same stream by the same k: their rows
         * are merged in the rounds of begin_many and begin_batch */
        random_stream(f, 100 + j % 2 + 10 * world, st[j].tok, st[j].mask, N);
        st[j].rows = hash_stream(f, st[j].tok, st[j].mask, N);
        st[j].pos = 0;
    }
    for (unsigned r = 0; r <= world; r++) {
        pools[r] = r < world ? open_rank(f, r, world) : open_rank(f, 0, 0);
        for (unsigned j = 0; j < NS; j++) {
            CHECK_EQ(engram_session_open(pools[r], &ss[r][j], NULL), 0);
            out[j][r] = malloc(ENGRAM_MAX_DRAFT * tokb);
        }
    }
    engram_error err;
    size_t nonzero = 0, compared = 0;
    for (unsigned it = 0; st[0].pos < N && st[1].pos < N && st[2].pos < N; it++) {
        unsigned kind = it % 3, k[NS];
        for (unsigned j = 0; j < NS; j++) {
            unsigned want = kind == 2 ? 1 : 1 + (it + 3 * (j % 2)) % ENGRAM_MAX_DRAFT;
            k[j] = want < N - st[j].pos ? want : (unsigned)(N - st[j].pos);
            for (unsigned r = 0; r <= world; r++)
                memset(out[j][r], POISON, ENGRAM_MAX_DRAFT * tokb);
        }
        for (unsigned r = 0; r <= world; r++) {
            if (kind == 0) { /* each alone: begun, waited and committed in turn below */
                continue;
            } else if (kind == 1) {
                engram_step_req q[NS];
                for (unsigned j = 0; j < NS; j++)
                    q[j] = (engram_step_req){ss[r][j], st[j].tok + st[j].pos, st[j].mask + st[j].pos, k[j],
                                             out[j][r]};
                CHECK_EQ(engram_step_begin_many(q, NS, d, &err), 0);
            } else {
                uint32_t tok[NS];
                uint8_t mask[NS];
                void *o[NS];
                for (unsigned j = 0; j < NS; j++) {
                    tok[j] = st[j].tok[st[j].pos];
                    mask[j] = st[j].mask[st[j].pos];
                    o[j] = out[j][r];
                }
                CHECK_EQ(engram_step_begin_batch(ss[r], tok, mask, NS, d, o, &err), 0);
            }
        }
        for (unsigned j = 0; j < NS; j++) {
            for (unsigned r = 0; r <= world; r++) {
                if (kind == 0)
                    CHECK_EQ(engram_step_begin(ss[r][j], st[j].tok + st[j].pos, st[j].mask + st[j].pos, k[j],
                                               d, out[j][r], &err), 0);
                for (unsigned t = 0; t < f->tables; t++) {
                    unsigned tt = (it + j) % 2 && f->tables == 2 ? 1 - t : t;
                    CHECK_EQ(engram_step_wait(ss[r][j], (int)tt, &err), 0);
                }
            }
            unsigned own[MAXW][ENGRAM_TABLES];
            memset(own, 0, sizeof own);
            compare(f, world, out[j], rb, st[j].rows + st[j].pos * f->rpt, st[j].mask + st[j].pos, k[j], -1,
                    1, own, &nonzero);
            unsigned sum[ENGRAM_TABLES] = {0, 0};
            engram_step_info info;
            for (unsigned r = 0; r <= world; r++) {
                engram_step_get_info(ss[r][j], &info);
                for (unsigned t = 0; t < f->tables; t++) {
                    if (r < world) {
                        CHECK_EQ(info.rows[t], own[r][t]);
                        sum[t] += info.rows[t];
                    } else {
                        CHECK_EQ(info.rows[t], sum[t]);
                    }
                    CHECK(info.ready_ns[t] >= info.begin_ns);
                }
                CHECK_EQ(engram_step_commit(ss[r][j], k[j], &err), 0);
            }
            compared += k[j];
            st[j].pos += k[j];
        }
    }
    CHECK(compared >= N);
    CHECK(nonzero > compared); /* rows were compared, not zeros with zeros */
    engram_history h, h0;
    for (unsigned j = 0; j < NS; j++) {
        engram_session_history(ss[world][j], &h0);
        for (unsigned r = 0; r < world; r++) {
            engram_session_history(ss[r][j], &h);
            CHECK(memcmp(&h, &h0, sizeof h) == 0);
        }
    }
    check_counts(pools, world);
    for (unsigned r = 0; r <= world; r++) {
        for (unsigned j = 0; j < NS; j++) {
            engram_session_close(ss[r][j]);
            free(out[j][r]);
        }
        engram_pool_close(pools[r]);
    }
    for (unsigned j = 0; j < NS; j++)
        free(st[j].rows);
}

/* ------------------------------------------------------------ prefills */

static void prefills(const struct fam *f, unsigned world, engram_dtype d)
{
    engram_pool *pools[MAXW];
    engram_session *ss[MAXW];
    engram_prefill *pf[MAXW];
    uint32_t tok[PN];
    uint8_t mask[PN];
    random_stream(f, 7 + world, tok, mask, PN);
    memcpy(tok + 16, tok, 16 * sizeof *tok); /* rows repeated within chunk 0: merged */
    memcpy(mask + 16, mask, 16);
    uint32_t *rows = hash_stream(f, tok, mask, PN);
    engram_prefill_opts po = {.chunk_tokens = 32, .ring_chunks = 2, .dtype = d};
    engram_error err;
    for (unsigned r = 0; r <= world; r++) {
        pools[r] = r < world ? open_rank(f, r, world) : open_rank(f, 0, 0);
        CHECK_EQ(engram_session_open(pools[r], &ss[r], NULL), 0);
        CHECK_EQ(engram_prefill_begin(ss[r], tok, mask, PN, &po, &pf[r], &err), 0);
    }
    size_t chunks = engram_prefill_chunks(pf[world]), nonzero = 0, rb = row_out(f, d);
    CHECK_EQ(chunks, (PN + 31) / 32);
    for (size_t c = 0; c < chunks; c++)
        for (unsigned t = 0; t < f->tables; t++) {
            uint8_t *bufs[MAXW];
            size_t first = 0, n = 0;
            for (unsigned r = 0; r <= world; r++) {
                const void *b = NULL;
                CHECK_EQ(engram_prefill_wait(pf[r], (int)t, c, &b, &first, &n, &err), 0);
                bufs[r] = (uint8_t *)(uintptr_t)b;
            }
            unsigned own[MAXW][ENGRAM_TABLES];
            memset(own, 0, sizeof own);
            compare(f, world, bufs, rb, rows + first * f->rpt, mask + first, n, (int)t, 0, own, &nonzero);
            for (unsigned r = 0; r <= world; r++)
                engram_prefill_release(pf[r], (int)t, c);
        }
    CHECK(nonzero > PN);
    engram_history h, h0;
    for (unsigned r = 0; r <= world; r++)
        CHECK_EQ(engram_prefill_end(pf[r], &err), 0);
    engram_session_history(ss[world], &h0);
    for (unsigned r = 0; r < world; r++) {
        engram_session_history(ss[r], &h);
        CHECK(memcmp(&h, &h0, sizeof h) == 0);
    }
    check_counts(pools, world);
    for (unsigned r = 0; r <= world; r++) {
        engram_session_close(ss[r]);
        engram_pool_close(pools[r]);
    }
    free(rows);
}

/* ------------------------------------------------------------ edges */

/* A block that holds none of a step's rows: ready at once, zeros, nothing
 * read; one that holds some of them reads those. */
static void tiny_block(const struct fam *f)
{
    const unsigned world = ENGRAM_MAX_SHARDS;
    engram_pool *p = open_rank(f, world - 1, world);
    if (!p)
        return;
    engram_session *s;
    CHECK_EQ(engram_session_open(p, &s, NULL), 0);
    uint32_t tok[4] = {11, 12, 13, 14};
    uint8_t mask[4] = {1, 1, 0, 1};
    uint32_t *rows = hash_stream(f, tok, mask, 4);
    size_t rb = row_out(f, ENGRAM_BF16);
    uint8_t *out = malloc(4 * f->rpt * rb);
    memset(out, POISON, 4 * f->rpt * rb);
    engram_error err;
    CHECK_EQ(engram_step_begin(s, tok, mask, 4, ENGRAM_BF16, out, &err), 0);
    unsigned own[ENGRAM_TABLES] = {0, 0};
    for (unsigned i = 0; i < 4; i++)
        for (unsigned j = 0; j < f->rpt && mask[i]; j++)
            own[j / f->cols] += owner(f, j / f->cols, rows[i * f->rpt + j], world) == world - 1;
    engram_step_info info;
    engram_step_get_info(s, &info);
    for (unsigned t = 0; t < f->tables; t++) {
        CHECK_EQ(info.rows[t], own[t]);
        if (own[t] == 0) /* nothing to read: in at begin */
            CHECK_EQ(engram_step_poll(s, (int)t, &err), 0);
        CHECK_EQ(engram_step_wait(s, (int)t, &err), 0);
    }
    CHECK_EQ(engram_step_commit(s, 4, &err), 0);
    CHECK(all_zero(out, 2 * f->rpt * rb));
    CHECK(all_poison(out + 2 * f->rpt * rb, f->rpt * rb));
    CHECK(all_zero(out + 3 * f->rpt * rb, f->rpt * rb));
    engram_pool_stats st;
    engram_pool_get_stats(p, &st);
    CHECK_EQ(st.step_rows_requested, own[0] + own[1]);
    CHECK_EQ(st.steps, 1);
    engram_session_close(s);
    engram_pool_close(p);
    free(out);
    free(rows);
}

static void refusals(const struct fam *f)
{
    engram_pool *p = NULL;
    engram_error err;
    engram_pool_opts o = {.shard_rank = 2, .shard_world = 2};
    CHECK_ERR(engram_pool_open(f->m, &o, &p, &err), err, -EINVAL, "shard_rank 2");
    CHECK(p == NULL);
    o = (engram_pool_opts){.shard_rank = 1, .shard_world = 0};
    CHECK_ERR(engram_pool_open(f->m, &o, &p, &err), err, -EINVAL, "shard_rank");
    o = (engram_pool_opts){.shard_rank = 1, .shard_world = 1};
    CHECK_ERR(engram_pool_open(f->m, &o, &p, &err), err, -EINVAL, "shard_rank");
    o = (engram_pool_opts){.shard_rank = 0, .shard_world = ENGRAM_MAX_SHARDS + 1};
    CHECK_ERR(engram_pool_open(f->m, &o, &p, &err), err, -EINVAL, "shard_world");
    o = (engram_pool_opts){.shard_rank = 0, .shard_world = 1}; /* the whole table */
    CHECK_EQ(engram_pool_open(f->m, &o, &p, &err), 0);
    engram_pool_close(p);

    /* applies: refused on a rank's pool, done on the unsharded one */
    engram_layer *L = NULL;
    engram_applier *a = NULL;
    if (engram_layer_open(f->m, 0, &L, &err) < 0 || engram_applier_new(L, NULL, &a, &err) < 0) {
        fprintf(stderr, "%s: layer: %s\n", f->name, err.msg);
        CHECK(0);
        engram_layer_close(L);
        return;
    }
    float *res = calloc((size_t)2 * f->streams * f->width, sizeof *res);
    size_t rb = row_out(f, ENGRAM_BF16);
    uint8_t *out = malloc(2 * f->rpt * rb);
    uint32_t tok[2] = {5, 6};
    for (int sharded = 1; sharded >= 0; sharded--) {
        engram_pool *q = sharded ? open_rank(f, 1, 3) : open_rank(f, 0, 0);
        engram_session *s;
        CHECK_EQ(engram_session_open(q, &s, NULL), 0);
        CHECK_EQ(engram_step_begin(s, tok, NULL, 1, ENGRAM_BF16, out, &err), 0);
        for (unsigned t = 0; t < f->tables; t++)
            CHECK_EQ(engram_step_wait(s, (int)t, &err), 0);
        int want = sharded ? -EINVAL : 0;
        int rc = engram_step_apply(s, a, res, ENGRAM_F32, &err);
        CHECK_EQ(rc, want);
        if (sharded)
            CHECK_ERR(rc, err, -EINVAL, "shard_world 3");
        rc = engram_step_apply_batch(&s, 1, a, (void *const *)&res, ENGRAM_F32, &err);
        CHECK_EQ(rc, want);
        if (sharded)
            CHECK_ERR(rc, err, -EINVAL, "combine them first");
        CHECK_EQ(engram_step_commit(s, 1, &err), 0);
        engram_prefill_opts po = {.dtype = ENGRAM_BF16};
        engram_prefill *pf;
        CHECK_EQ(engram_prefill_begin(s, tok, NULL, 2, &po, &pf, &err), 0);
        for (unsigned t = 0; t < f->tables; t++)
            CHECK_EQ(engram_prefill_wait(pf, (int)t, 0, NULL, NULL, NULL, &err), 0);
        rc = engram_prefill_apply(pf, 0, a, res, ENGRAM_F32, &err);
        CHECK_EQ(rc, want);
        if (sharded)
            CHECK_ERR(rc, err, -EINVAL, "engram_prefill_apply on a sharded pool");
        CHECK_EQ(engram_prefill_end(pf, &err), 0);
        engram_session_close(s);
        engram_pool_close(q);
    }
    free(res);
    free(out);
    engram_applier_free(a);
    engram_layer_close(L);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void member(struct fam *f)
{
    engram_model_info mi;
    engram_model_get_info(f->m, &mi);
    f->ple = mi.family.member == ENGRAM_MEMBER_PLE;
    f->tables = mi.family.tables;
    f->cols = mi.family.rows_per_token;
    f->rpt = f->tables * f->cols;
    f->streams = mi.streams;
    f->width = mi.width;
    for (unsigned t = 0; t < f->tables; t++)
        f->R[t] = mi.table[t].rows;
    static const unsigned worlds[] = {2, 3, 4, 7};
    static const engram_dtype dtypes[] = {ENGRAM_BF16, ENGRAM_F32, ENGRAM_RAW};
    for (unsigned w = 0; w < sizeof worlds / sizeof *worlds; w++)
        for (unsigned d = 0; d < 3; d++) {
            /* under the sanitizers one dtype per world (they cycle) */
            if (SANITIZED && d != w % 3)
                continue;
            uint64_t t0 = now_ms();
            steps(f, worlds[w], dtypes[d]);
            uint64_t t1 = now_ms();
            prefills(f, worlds[w], dtypes[d]);
            printf("%s, %u ranks, %s: steps %llu ms, prefills %llu ms: the OR of the ranks' rows is the "
                   "unsharded pool's; their counters add up to its\n", f->name, worlds[w],
                   d == 0 ? "BF16" : d == 1 ? "F32" : "RAW", (unsigned long long)(t1 - t0),
                   (unsigned long long)(now_ms() - t1));
        }
    tiny_block(f);
    refusals(f);
}

int main(void)
{
    alarm(300); /* a wait that never returns fails the test */
    static uint32_t map[100000];
    engram_layout l;
    char path[512], ple_path[512];
    CHECK_EQ(tu_layout(&l, map, 100000, 60000, 3000), 0); /* small: about 75,000 rows a table */
    if (tu_build("shard.gguf", &l, ENGRAM_FILL_NORMAL, 64, path, sizeof path) < 0)
        return 1;
    tu_path(ple_path, sizeof ple_path, "shard_ple.gguf");
    engram_ple_build_opts po = {.base = 1500, .width = 64, .fill = ENGRAM_FILL_NORMAL, .seed = 5};
    engram_error err;
    if (engram_build_ple_model(ple_path, &po, &err) < 0) {
        fprintf(stderr, "build: %s\n", err.msg);
        return 1;
    }
    struct fam v41 = {.name = "v4.1", .m = tu_open_model(path)};
    struct fam ple = {.name = "ple", .m = tu_open_model(ple_path)};
    if (!v41.m || !ple.m)
        return 1;
    member(&v41);
    member(&ple);
    engram_model_close(v41.m);
    engram_model_close(ple.m);
    tu_cleanup();
    return tu_finish("test_shard");
}
