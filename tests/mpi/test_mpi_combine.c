/* test_mpi_combine.c - libengram-mpi under mpirun (tests/test_mpi.sh runs it
 * at -np 2 and 4).  The oracle is one process's rows: engram_model_read_*
 * of the hashed ids.  Every rank runs a sharded pool (shard_rank = its rank)
 * on a small model rank 0 builds; its steps' and prefill chunks' shares,
 * combined by both methods, must equal the oracle bit for bit.  Then: pieces
 * (counts cut below INT_MAX), a rank that joins late (timeouts, then the
 * right rows), cancel, refusals.
 *   test_mpi_combine            the checks; each rank prints its count line
 *   test_mpi_combine --exit     the last rank exits without joining; the
 *                               others wait with timeouts (bounded) and must
 *                               never report success with wrong rows
 *   test_mpi_combine --bench    times the combine of a step and a chunk, both
 *                               methods, timed and blocking waits
 *   test_mpi_combine --leak     opens a handle and never closes it: under
 *                               ASan, LeakSanitizer must report it (the
 *                               suppressions for Open MPI, lsan_openmpi.supp,
 *                               must not hide a leak of ours)
 * A rank that sees wrong rows prints "WRONG ROWS" (the script greps it). */
#include <mpi.h>

#include "../testutil.h"
#include "engram_mpi.h"

#define ALPHABET 4096
static int rank, world;
static engram_model *model;
static uint64_t table_rows[2];

static size_t row_bytes_of(engram_dtype d)
{
    return d == ENGRAM_F32 ? 1024 : d == ENGRAM_RAW ? 264 : 512;
}

/* The one-process rows of n positions (table-local ids, tables tab[i]) of
 * dtype d into out[n][row]; positions with skip[i] keep what out holds. */
static void oracle(const uint32_t *ids, const int *tab, const uint8_t *skip, size_t n, engram_dtype d,
                   uint8_t *out)
{
    size_t rb = row_bytes_of(d);
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        engram_error err;
        int rc = d == ENGRAM_F32    ? engram_model_read_f32(model, tab[i], ids + i, 1, (float *)(void *)(out + i * rb), &err)
                 : d == ENGRAM_RAW ? engram_model_read_raw(model, tab[i], ids + i, 1, out + i * rb, &err)
                                   : engram_model_read_bf16(model, tab[i], ids + i, 1, (uint16_t *)(void *)(out + i * rb), &err);
        CHECK_EQ(rc, 0);
    }
}

static int same(const void *a, const void *b, size_t n, const char *what)
{
    if (memcmp(a, b, n) == 0)
        return 1;
    printf("rank %d: WRONG ROWS in %s\n", rank, what);
    fflush(stdout);
    tu_failures++;
    return 0;
}

static int wait_ok(engram_mpi_op *op, const char *what)
{
    engram_error err;
    int rc = engram_mpi_combine_wait(op, 30ull * 1000000000ull, &err);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s: wait: %d %s\n", rank, what, rc, err.msg);
    CHECK_EQ(rc, 0);
    return rc;
}

/* ---- steps of k = 1..8 with masks, three dtypes, both methods, the real sharded pool */
static void test_steps(engram_mpi *m, engram_mpi *mp, engram_pool *pool)
{
    engram_session *s = NULL;
    engram_error err;
    CHECK_EQ(engram_session_open(pool, &s, &err), 0);
    engram_history h;
    engram_history_reset(&h);
    const engram_hasher *hs = engram_model_hasher(model);
    uint64_t seed = 77;
    size_t nonzero_foreign = 0;
    for (int round = 0; round < 2; round++)
        for (unsigned k = 1; k <= ENGRAM_MAX_DRAFT; k++)
            for (int di = 0; di < 3; di++)
                for (int method = 0; method < 2; method++) {
                    engram_dtype d = di == 0 ? ENGRAM_BF16 : di == 1 ? ENGRAM_F32 : ENGRAM_RAW;
                    size_t rb = row_bytes_of(d), n = (size_t)k * 48, bytes = n * rb;
                    uint32_t tok[ENGRAM_MAX_DRAFT], ids[ENGRAM_MAX_DRAFT * 48], owner[ENGRAM_MAX_DRAFT * 48];
                    uint8_t mask[ENGRAM_MAX_DRAFT], skip[ENGRAM_MAX_DRAFT * 48];
                    int tab[ENGRAM_MAX_DRAFT * 48];
                    for (unsigned i = 0; i < k; i++) {
                        tok[i] = (uint32_t)(tu_rand(&seed) % ALPHABET);
                        mask[i] = tu_rand(&seed) % 5 != 0;
                    }
                    engram_history h2 = h;
                    CHECK_EQ(engram_hash_tokens(hs, &h2, tok, mask, k, ids, NULL), 0);
                    CHECK_EQ(engram_mpi_owners(table_rows, ids, mask, k, (unsigned)world, owner, &err), 0);
                    for (size_t p = 0; p < n; p++) {
                        tab[p] = (int)(p % 48) / 24;
                        skip[p] = !mask[p / 48];
                    }
                    uint8_t *out = malloc(bytes), *want = malloc(bytes);
                    /* masked rows: the same bytes on every rank (zero), as the header asks */
                    memset(out, 0, bytes);
                    memset(want, 0, bytes);
                    oracle(ids, tab, skip, n, d, want);
                    CHECK_EQ(engram_step_begin(s, tok, mask, k, d, out, &err), 0);
                    CHECK_EQ(engram_step_wait(s, 0, &err), 0);
                    CHECK_EQ(engram_step_wait(s, 1, &err), 0);
                    /* the sharded pool's share: foreign rows are zero, its own rows the oracle's */
                    for (size_t p = 0; p < n; p++) {
                        if (skip[p])
                            continue;
                        const uint8_t *row = out + p * rb;
                        if (owner[p] == (uint32_t)rank) {
                            CHECK(memcmp(row, want + p * rb, rb) == 0);
                        } else {
                            for (size_t b = 0; b < rb; b++)
                                nonzero_foreign += row[b] != 0;
                            if (method == 1)
                                memset(out + p * rb, 0xC0 + rank, rb); /* the gather must not read them */
                        }
                    }
                    engram_mpi_op *op = NULL;
                    engram_mpi *use = k % 2 ? mp : m; /* odd k: pieces of 1,000 bytes */
                    int rc = method == 0 ? engram_mpi_combine_begin(use, out, bytes, &op, &err)
                                         : engram_mpi_gather_begin(use, out, rb, owner, n, &op, &err);
                    CHECK_EQ(rc, 0);
                    if (rc == 0 && wait_ok(op, "step") == 0) {
                        char what[64];
                        snprintf(what, sizeof what, "step k=%u dtype %d method %d", k, (int)d, method);
                        same(out, want, bytes, what);
                    }
                    engram_mpi_combine_free(op);
                    CHECK_EQ(engram_step_commit(s, k, &err), 0);
                    h = h2;
                    free(out);
                    free(want);
                }
    CHECK_EQ(nonzero_foreign, 0);
    engram_session_close(s);
}

/* ---- prefill chunks: the ring's rows (const) combined out of place, and gathered */
static void test_prefill(engram_mpi *m, engram_mpi *mp, engram_pool *pool, size_t ntok, unsigned chunk)
{
    engram_session *s = NULL;
    engram_error err;
    CHECK_EQ(engram_session_open(pool, &s, &err), 0);
    uint32_t *tok = malloc(ntok * 4), *ids = malloc(ntok * 48 * 4), *owner = malloc(ntok * 48 * 4);
    uint8_t *mask = malloc(ntok);
    uint64_t seed = 5 + ntok;
    for (size_t i = 0; i < ntok; i++) {
        tok[i] = (uint32_t)(tu_rand(&seed) % ALPHABET);
        mask[i] = tu_rand(&seed) % 7 != 0;
    }
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, ntok, ids, NULL), 0);
    CHECK_EQ(engram_mpi_owners(table_rows, ids, mask, ntok, (unsigned)world, owner, &err), 0);
    engram_prefill_opts po;
    memset(&po, 0, sizeof po);
    po.chunk_tokens = chunk;
    po.dtype = ENGRAM_BF16;
    engram_prefill *pf = NULL;
    CHECK_EQ(engram_prefill_begin(s, tok, mask, ntok, &po, &pf, &err), 0);
    size_t rb = 512, cap = (size_t)chunk * 24;
    uint8_t *share = malloc(cap * rb), *res = malloc(cap * rb), *want = malloc(cap * rb);
    uint32_t *cids = malloc(cap * 4), *cown = malloc(cap * 4);
    uint8_t *skip = malloc(cap);
    int *tab = malloc(cap * sizeof *tab);
    for (size_t c = 0; pf && c < engram_prefill_chunks(pf); c++)
        for (int t = 0; t < 2; t++) {
            const void *rows = NULL;
            size_t first = 0, nt = 0;
            int rc = engram_prefill_wait(pf, t, c, &rows, &first, &nt, &err);
            CHECK_EQ(rc, 0);
            if (rc)
                continue;
            size_t n = nt * 24;
            for (size_t i = 0; i < n; i++) {
                size_t tokn = first + i / 24, col = (size_t)t * 24 + i % 24;
                cids[i] = ids[tokn * 48 + col];
                cown[i] = owner[tokn * 48 + col];
                skip[i] = !mask[tokn];
                tab[i] = t;
            }
            memset(want, 0, n * rb);
            oracle(cids, tab, skip, n, ENGRAM_BF16, want);
            /* combine: masked rows are whatever the ring held (they may
             * differ between ranks): zero them in a copy, compare the rest */
            memcpy(share, rows, n * rb);
            for (size_t i = 0; i < n; i++)
                if (skip[i])
                    memset(share + i * rb, 0, rb);
            engram_mpi_op *op = NULL;
            CHECK_EQ(engram_mpi_combine_begin_into(c % 2 ? mp : m, share, res, n * rb, &op, &err), 0);
            if (op && wait_ok(op, "prefill combine") == 0)
                same(res, want, n * rb, "prefill chunk (combine)");
            engram_mpi_combine_free(op);
            /* gather: from the ring's bytes as they are */
            memcpy(share, rows, n * rb);
            for (size_t i = 0; i < n; i++)
                if (skip[i])
                    memset(share + i * rb, 0, rb);
            op = NULL;
            CHECK_EQ(engram_mpi_gather_begin(m, share, rb, cown, n, &op, &err), 0);
            if (op && wait_ok(op, "prefill gather") == 0)
                same(share, want, n * rb, "prefill chunk (gather)");
            engram_mpi_combine_free(op);
            engram_prefill_release(pf, t, c);
        }
    CHECK_EQ(engram_prefill_end(pf, &err), 0);
    engram_session_close(s);
    free(tok), free(ids), free(owner), free(mask), free(share), free(res), free(want);
    free(cids), free(cown), free(skip), free(tab);
}

/* A synthetic share: n rows of rb bytes, position p owned by p % world,
 * filled from a seed on its owner and zero elsewhere; want: all of them. */
static void synth(uint8_t *share, uint8_t *want, uint32_t *owner, size_t n, size_t rb, uint64_t seed)
{
    for (size_t p = 0; p < n; p++) {
        owner[p] = (uint32_t)((p * 2654435761u >> 7) % (unsigned)world);
        for (size_t b = 0; b < rb; b++) {
            uint8_t v = (uint8_t)tu_rand(&seed);
            want[p * rb + b] = v;
            share[p * rb + b] = owner[p] == (uint32_t)rank ? v : 0;
        }
    }
}

/* ---- the last rank joins 300 ms late: timeouts first, then the right rows */
static void test_late(engram_mpi *m)
{
    size_t n = 96, rb = 512;
    uint8_t *share = malloc(n * rb), *want = malloc(n * rb);
    uint32_t *owner = malloc(n * 4);
    for (int method = 0; method < 2; method++) {
        synth(share, want, owner, n, rb, 900 + (uint64_t)method);
        engram_error err;
        engram_mpi_op *op = NULL;
        int late = rank == world - 1;
        if (late)
            tu_sleep_ms(300);
        int rc = method == 0 ? engram_mpi_combine_begin(m, share, n * rb, &op, &err)
                             : engram_mpi_gather_begin(m, share, rb, owner, n, &op, &err);
        CHECK_EQ(rc, 0);
        if (!op)
            continue;
        if (!late) {
            CHECK_EQ(engram_mpi_combine_poll(op, &err), -EAGAIN);
            rc = engram_mpi_combine_wait(op, 20 * 1000000ull, &err);
            CHECK_ERR(rc, err, -ETIMEDOUT, "not complete");
            if (method == 1) /* a gather that timed out has not written buf */
                for (size_t p = 0; p < n; p++)
                    if (owner[p] != (uint32_t)rank)
                        CHECK(share[p * rb] == 0 && memcmp(share + p * rb, share + p * rb + 1, rb - 1) == 0);
            uint64_t t0 = tu_now_ns();
            int timeouts = 0;
            while ((rc = engram_mpi_combine_wait(op, 20 * 1000000ull, &err)) == -ETIMEDOUT &&
                   tu_now_ns() - t0 < 30ull * 1000000000ull)
                timeouts++;
            CHECK_EQ(rc, 0);
            CHECK(timeouts >= 1);
        } else {
            rc = engram_mpi_combine_wait(op, ENGRAM_FOREVER, &err);
            CHECK_EQ(rc, 0);
        }
        if (rc == 0)
            same(share, want, n * rb, method ? "late rank (gather)" : "late rank (combine)");
        CHECK_EQ(engram_mpi_combine_wait(op, 0, &err), 0); /* complete: the same result at once */
        engram_mpi_combine_free(op);
    }
    free(share), free(want), free(owner);
}

/* ---- cancel: the others give up on an op the last rank joins later */
static void test_cancel(engram_mpi *m)
{
    size_t bytes = 4096;
    uint8_t *buf = calloc(1, bytes);
    engram_error err;
    engram_mpi_op *op = NULL;
    int late = rank == world - 1;
    if (late) {
        tu_sleep_ms(200);
        CHECK_EQ(engram_mpi_combine_begin(m, buf, bytes, &op, &err), 0);
        CHECK_EQ(engram_mpi_combine_wait(op, ENGRAM_FOREVER, &err), 0);
        engram_mpi_combine_free(op);
    } else {
        CHECK_EQ(engram_mpi_combine_begin(m, buf, bytes, &op, &err), 0);
        engram_mpi_combine_cancel(op);
        CHECK_ERR(engram_mpi_combine_wait(op, 1000000, &err), err, -ECANCELED, "cancelled");
        CHECK_ERR(engram_mpi_combine_poll(op, &err), err, -ECANCELED, "cancelled");
        engram_mpi_combine_free(op); /* parked on m until MPI completes it */
        engram_mpi_info info;
        uint64_t t0 = tu_now_ns();
        do {
            tu_sleep_ms(5);
            engram_mpi_get_info(m, &info);
        } while (info.pending && tu_now_ns() - t0 < 30ull * 1000000000ull);
        CHECK_EQ(info.pending, 0);
    }
    free(buf);
}

/* ---- refusals (local: every rank refuses alike, nothing started) and bytes 0 */
static void test_refusals(engram_mpi *m)
{
    engram_error err;
    engram_mpi_op *op = NULL;
    uint8_t b[64] = {0};
    uint32_t owner[2] = {0, (uint32_t)world};
    CHECK_ERR(engram_mpi_combine_begin(NULL, b, 64, &op, &err), err, -EINVAL, "m is NULL");
    CHECK_ERR(engram_mpi_combine_begin(m, NULL, 64, &op, &err), err, -EINVAL, "buf is NULL");
    CHECK_ERR(engram_mpi_combine_begin(m, b, 64, NULL, &err), err, -EINVAL, "out is NULL");
    CHECK_ERR(engram_mpi_combine_begin_into(m, b, b + 8, 32, &op, &err), err, -EINVAL, "overlap");
    CHECK_ERR(engram_mpi_gather_begin(m, b, 32, owner, 2, &op, &err), err, -EINVAL, "position 1");
    CHECK_ERR(engram_mpi_gather_begin(m, b, 0, owner, 1, &op, &err), err, -EINVAL, "row_bytes");
    CHECK(op == NULL);
    CHECK_ERR(engram_mpi_combine_wait(NULL, 0, &err), err, -EINVAL, "op is NULL");
    engram_mpi_opts o = {(size_t)1 << 31};
    engram_mpi *bad = NULL;
    CHECK_ERR(engram_mpi_open(MPI_COMM_WORLD, &o, &bad, &err), err, -EINVAL, "INT_MAX");
    CHECK_ERR(engram_mpi_open(MPI_COMM_NULL, NULL, &bad, &err), err, -EINVAL, "MPI_COMM_NULL");
    CHECK_EQ(engram_mpi_combine_begin(m, NULL, 0, &op, &err), 0);
    CHECK_EQ(engram_mpi_combine_wait(op, 0, &err), 0);
    engram_mpi_combine_free(op);
    engram_mpi_combine_free(NULL);
    engram_mpi_combine_cancel(NULL);
    engram_mpi_close(NULL);
    /* owners: the sharded pool's blocks */
    CHECK_EQ(engram_mpi_owner(10, 0, 4), 0);
    CHECK_EQ(engram_mpi_owner(10, 1, 4), 0);  /* [0,2) [2,5) [5,7) [7,10) */
    CHECK_EQ(engram_mpi_owner(10, 2, 4), 1);
    CHECK_EQ(engram_mpi_owner(10, 4, 4), 1);
    CHECK_EQ(engram_mpi_owner(10, 5, 4), 2);
    CHECK_EQ(engram_mpi_owner(10, 7, 4), 3);
    CHECK_EQ(engram_mpi_owner(10, 9, 4), 3);
    CHECK_EQ(engram_mpi_owner(10, 10, 4), ENGRAM_MPI_NOBODY);
    CHECK_EQ(engram_mpi_owner(10, 0, 0), ENGRAM_MPI_NOBODY);
    for (uint64_t R = 1; R < 300; R += 7)
        for (unsigned W = 1; W <= 9; W++)
            for (uint32_t id = 0; id < R; id++) {
                uint32_t r = engram_mpi_owner(R, id, W);
                CHECK(r < W && r * R / W <= id && id < (r + 1) * R / W);
            }
}

/* ---- rows read per rank: the sharded pools' reads add up to one unsharded pool's */
static void test_reads(engram_pool *sharded, engram_pool *full)
{
    engram_pool_stats a, b;
    engram_pool_get_stats(sharded, &a);
    engram_pool_get_stats(full, &b);
    unsigned long long mine = a.step_rows_read + a.prefill_rows_read, sum = 0;
    unsigned long long one = b.step_rows_read + b.prefill_rows_read;
    MPI_Allreduce(&mine, &sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d: rows read %llu of one process's %llu (%.3f; world %d); world sum %llu\n", rank, mine, one,
           one ? (double)mine / (double)one : 0.0, world, sum);
    /* about 1/N each (the blocks are equal and the ids uniform), about one
     * process's in all (measured: the sum a few % above it, see the report) */
    CHECK(mine * (unsigned long long)world * 4 < one * 5 && mine * (unsigned long long)world * 4 > one * 3);
    CHECK(sum * 10 < one * 11 && sum * 10 > one * 9);
}

/* the workload of test_steps / test_prefill on an unsharded pool, no combine, for test_reads */
static void baseline(engram_pool *full)
{
    engram_session *s = NULL;
    CHECK_EQ(engram_session_open(full, &s, NULL), 0);
    uint64_t seed = 77;
    for (int round = 0; round < 2; round++)
        for (unsigned k = 1; k <= ENGRAM_MAX_DRAFT; k++)
            for (int di = 0; di < 3; di++)
                for (int method = 0; method < 2; method++) {
                    engram_dtype d = di == 0 ? ENGRAM_BF16 : di == 1 ? ENGRAM_F32 : ENGRAM_RAW;
                    uint32_t tok[ENGRAM_MAX_DRAFT];
                    uint8_t mask[ENGRAM_MAX_DRAFT];
                    for (unsigned i = 0; i < k; i++) {
                        tok[i] = (uint32_t)(tu_rand(&seed) % ALPHABET);
                        mask[i] = tu_rand(&seed) % 5 != 0;
                    }
                    uint8_t *out = calloc(k * 48, row_bytes_of(d));
                    CHECK_EQ(engram_step_begin(s, tok, mask, k, d, out, NULL), 0);
                    CHECK_EQ(engram_step_commit(s, k, NULL), 0);
                    free(out);
                }
    engram_session_close(s);
}

static int exit_case(engram_mpi *m)
{
    size_t n = 96, rb = 512;
    uint8_t *share = malloc(n * rb), *want = malloc(n * rb);
    uint32_t *owner = malloc(n * 4);
    synth(share, want, owner, n, rb, 4242);
    if (rank == world - 1) {
        printf("rank %d: exiting without joining\n", rank);
        fflush(stdout);
        _exit(0);
    }
    engram_error err;
    engram_mpi_op *op = NULL;
    int rc = engram_mpi_combine_begin(m, share, n * rb, &op, &err);
    uint64_t t0 = tu_now_ns();
    int timeouts = 0;
    if (rc == 0)
        while ((rc = engram_mpi_combine_wait(op, 100 * 1000000ull, &err)) == -ETIMEDOUT &&
               tu_now_ns() - t0 < 20ull * 1000000000ull)
            timeouts++;
    if (rc == 0) {
        same(share, want, n * rb, "a combine a dead rank never joined"); /* must not happen */
        printf("rank %d: the combine completed without the exited rank\n", rank);
    } else {
        printf("rank %d: %d timeouts, then %d (%s): giving up\n", rank, timeouts, rc, err.msg);
    }
    fflush(stdout);
    engram_mpi_combine_free(op);
    MPI_Abort(MPI_COMM_WORLD, 3); /* the job is over: a peer is gone */
    return 3;
}

/* A rank that stalls (alive, never joining while its peers wait): every
 * peer's timed wait returns -ETIMEDOUT again and again and gives up
 * within its bound (no hang); rank 0 then ends the job (the
 * collective can never complete without the stalled rank). */
static int stall_case(engram_mpi *m)
{
    size_t n = 96, rb = 512;
    uint8_t *share = malloc(n * rb), *want = malloc(n * rb);
    uint32_t *owner = malloc(n * 4);
    synth(share, want, owner, n, rb, 4343);
    if (rank == world - 1) {
        printf("rank %d: stalling\n", rank);
        fflush(stdout);
        sleep(60); /* rank 0 ends the job long before */
        return 0;
    }
    engram_error err;
    engram_mpi_op *op = NULL;
    int rc = engram_mpi_combine_begin(m, share, n * rb, &op, &err);
    int timeouts = 0;
    while (rc == 0 && timeouts < 10 && (rc = engram_mpi_combine_wait(op, 100 * 1000000ull, &err)) == -ETIMEDOUT) {
        timeouts++;
        rc = 0;
    }
    if (rc == 0 && timeouts == 10)
        rc = -ETIMEDOUT;
    /* the buffer stays MPI's (engram_mpi.h: undefined until the op
     * completes; partial ORs of the ranks that joined may be in it): not
     * read here; what is checked is that the waits come back */
    printf("rank %d: stalled peer: %d timeouts, then %d\n", rank, timeouts, rc);
    fflush(stdout);
    if (rank == 0) {
        sleep(1); /* the other peers print theirs */
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    sleep(60);
    return 3;
}

/* Close with a parked op (review, issue #24): rank 0 begins a combine,
 * gives up on it (cancel, free: parked) and closes its handle while the
 * last rank has not joined; then the late rank joins and everyone meets in
 * a barrier, whose progress completes the parked collective.  Freeing the
 * handle's communicator at that close made Open MPI read freed memory in
 * the barrier (a crash); the handle is kept instead.  Run on a handle of
 * its own, opened here. */
static int park_case(void)
{
    engram_mpi *m = NULL;
    engram_error err;
    if (engram_mpi_open(MPI_COMM_WORLD, NULL, &m, &err) < 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    size_t n = 96, rb = 512;
    uint8_t *share = malloc(n * rb), *want = malloc(n * rb);
    uint32_t *owner = malloc(n * 4);
    synth(share, want, owner, n, rb, 4444);
    if (rank == world - 1)
        usleep(800 * 1000); /* joins late */
    engram_mpi_op *op = NULL;
    CHECK_EQ(engram_mpi_combine_begin(m, share, n * rb, &op, &err), 0);
    if (rank == 0) {
        CHECK_EQ(engram_mpi_combine_poll(op, &err), -EAGAIN); /* the late rank is not there */
        engram_mpi_combine_cancel(op);
        CHECK_EQ(engram_mpi_combine_wait(op, 0, &err), -ECANCELED);
        engram_mpi_combine_free(op); /* parked */
        engram_mpi_info in;
        engram_mpi_get_info(m, &in);
        CHECK_EQ(in.pending, 1);
        engram_mpi_close(m); /* MPI still holds the op: kept, not freed */
        printf("rank 0: closed with a parked op\n");
    } else {
        CHECK_EQ(engram_mpi_combine_wait(op, 20ull * 1000000000ull, &err), 0);
        same(share, want, n * rb, "a combine whose peer gave up but stayed in MPI");
        engram_mpi_combine_free(op);
        engram_mpi_close(m);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* progresses rank 0's parked collective */
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d: after the barrier\n", rank);
    free(share), free(want), free(owner);
    char name[64];
    snprintf(name, sizeof name, "test_mpi_combine --park rank %d/%d", rank, world);
    int rc = tu_finish(name);
    MPI_Finalize();
    return rc;
}

static void bench(engram_mpi *m, uint64_t timeout)
{
    static const struct { const char *name; size_t rows; } shapes[] = {
        {"step k=1 (48 x 512 B)", 48}, {"prefill chunk (2048 x 24 x 512 B)", 2048 * 24}};
    if (rank == 0)
        printf("bench: %d ranks on %ld cores (%s), wait %s\n%-36s %-8s %10s %10s %10s %8s\n", world,
               sysconf(_SC_NPROCESSORS_ONLN), world > sysconf(_SC_NPROCESSORS_ONLN) ? "oversubscribed" : "",
               timeout == ENGRAM_FOREVER ? "ENGRAM_FOREVER (MPI_Waitall)" : "timed (MPI_Testall polling)",
               "buffer", "method", "bytes", "p50 us", "mean us", "GB/s");
    for (size_t si = 0; si < 2; si++) {
        size_t n = shapes[si].rows, rb = 512, bytes = n * rb;
        int iters = si == 0 ? 400 : 12;
        uint8_t *share = malloc(bytes), *want = malloc(bytes);
        uint32_t *owner = malloc(n * 4);
        synth(share, want, owner, n, rb, 1);
        uint64_t *t = malloc((size_t)iters * sizeof *t);
        for (int method = 0; method < 2; method++) {
            for (int it = -3; it < iters; it++) {
                /* the OR of a combined buffer with the others' is itself: no refill */
                MPI_Barrier(MPI_COMM_WORLD);
                engram_mpi_op *op = NULL;
                uint64_t t0 = tu_now_ns();
                int rc = method == 0 ? engram_mpi_combine_begin(m, share, bytes, &op, NULL)
                                     : engram_mpi_gather_begin(m, share, rb, owner, n, &op, NULL);
                if (rc == 0)
                    rc = engram_mpi_combine_wait(op, timeout, NULL);
                uint64_t dt = tu_now_ns() - t0;
                CHECK_EQ(rc, 0);
                engram_mpi_combine_free(op);
                if (it >= 0)
                    t[it] = dt;
            }
            CHECK(memcmp(share, want, bytes) == 0);
            synth(share, want, owner, n, rb, 1);
            /* rank 0's times, and the slowest rank's mean */
            uint64_t sum = 0;
            for (int i = 0; i < iters; i++)
                sum += t[i];
            for (int i = 1; i < iters; i++)
                for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
                    uint64_t x = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = x;
                }
            double mean = (double)sum / iters / 1e3, worst = 0;
            MPI_Reduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (rank == 0)
                printf("%-36s %-8s %10zu %10.1f %10.1f %8.2f\n", shapes[si].name, method ? "gather" : "combine",
                       bytes, (double)t[iters / 2] / 1e3, worst, (double)bytes / (worst * 1e3));
        }
        free(share), free(want), free(owner), free(t);
    }
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int mode = argc > 1 && !strcmp(argv[1], "--bench") ? 1 : argc > 1 && !strcmp(argv[1], "--exit") ? 2
             : argc > 1 && !strcmp(argv[1], "--stall") ? 3 : argc > 1 && !strcmp(argv[1], "--park") ? 4
             : argc > 1 && !strcmp(argv[1], "--leak") ? 5 : 0;
    if (mode == 4)
        return park_case();
    engram_error err;
    engram_mpi *m = NULL, *mp = NULL;
    engram_mpi_opts small = {1000};
    if (engram_mpi_open(MPI_COMM_WORLD, NULL, &m, &err) < 0 ||
        engram_mpi_open(MPI_COMM_WORLD, &small, &mp, &err) < 0) {
        fprintf(stderr, "rank %d: engram_mpi_open: %s\n", rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mode == 5) {
        engram_mpi_close(mp); /* m is left open: the leak to be reported */
        MPI_Finalize();
        return 0;
    }
    if (mode == 1) {
        bench(m, 60ull * 1000000000ull);
        bench(m, ENGRAM_FOREVER);
    } else if (mode == 2) {
        return exit_case(m);
    } else if (mode == 3) {
        return stall_case(m);
    } else {
        char path[512] = {0};
        static uint32_t map[ALPHABET];
        engram_layout l;
        int ok = 1;
        if (rank == 0)
            ok = tu_layout(&l, map, ALPHABET, 2000, 3000) == 0 &&
                 tu_build("mpi.gguf", &l, ENGRAM_FILL_NORMAL, 64, path, sizeof path) == 0;
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (!ok || !(model = tu_open_model(path)))
            MPI_Abort(MPI_COMM_WORLD, 2);
        engram_model_info mi;
        engram_model_get_info(model, &mi);
        table_rows[0] = mi.table[0].rows;
        table_rows[1] = mi.table[1].rows;
        engram_pool_opts po;
        memset(&po, 0, sizeof po);
        po.shard_rank = (unsigned)rank;
        po.shard_world = (unsigned)world;
        engram_pool *pool = NULL, *full = NULL;
        if (engram_pool_open(model, &po, &pool, &err) < 0 || engram_pool_open(model, NULL, &full, &err) < 0) {
            fprintf(stderr, "rank %d: pool: %s\n", rank, err.msg);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        test_refusals(m);
        test_steps(m, mp, pool);
        baseline(full);
        test_reads(pool, full);
        test_prefill(m, mp, pool, 300, 64);
        test_prefill(m, mp, pool, 2100, 2048);
        test_late(m);
        test_cancel(m);
        engram_pool_close(pool);
        engram_pool_close(full);
        engram_model_close(model);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            tu_cleanup();
    }
    engram_mpi_close(mp);
    engram_mpi_close(m);
    char name[64];
    snprintf(name, sizeof name, "test_mpi_combine rank %d/%d", rank, world);
    int rc = tu_finish(name);
    MPI_Finalize();
    return rc;
}
