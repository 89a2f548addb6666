/* test_mpi_exchange.c - the DP exchange of libengram-mpi under mpirun
 * (tests/test_mpi.sh runs it at -np 2 and 4).  Every rank hashes its own
 * tokens (its own count: rank 1 none, others masked in part) and gets their
 * rows from the owners: from its block of the one whole file, and from
 * shard files (engram_shard_write, one per rank).  The oracle is one
 * process's rows: engram_model_read_* of the hashed ids on the whole file,
 * in this program.  Then: a rank that begins late (timed waits time out,
 * then the rows), an owner whose shard file was cut short after its reader
 * opened it (its peers' waits return its error naming it; no hang; the
 * exchange after it works), cancel, refusals; with --refuse-rows a phase MPI
 * refuses to start (its ops stay MPI's while a request is active).  Each rank prints its count line; a
 * rank that sees wrong rows prints "WRONG ROWS". */
#include <mpi.h>
#include <unistd.h>

#include "../testutil.h"
#include "engram_mpi.h"
#include "engram_tools.h"

#define ALPHABET 4096
static int rank, world;
static engram_model *whole;
static uint64_t table_rows[2];

/* --refuse-rows: MPI refuses to start the rows' MPI_Ialltoallv on rank 0
 * (this program's MPI_Ialltoallv is the one libengram-mpi calls, MPI's
 * own is PMPI_Ialltoallv: the profiling interface), after the statuses'
 * MPI_Ialltoall of that phase started.  The requests' Ialltoallv (of
 * MPI_UINT32_T) goes through. */
static int refuse_rows;
static int refused;
int MPI_Ialltoallv(const void *sb, const int sc[], const int sd[], MPI_Datatype st, void *rb, const int rc[],
                   const int rd[], MPI_Datatype rt, MPI_Comm comm, MPI_Request *req)
{
    if (refuse_rows && st != MPI_UINT32_T) {
        refused++;
        return MPI_ERR_OTHER;
    }
    return PMPI_Ialltoallv(sb, sc, sd, st, rb, rc, rd, rt, comm, req);
}

static size_t rb_of(engram_dtype d)
{
    return d == ENGRAM_F32 ? 1024 : d == ENGRAM_RAW ? 264 : 512;
}

/* One row of the whole file (table t, id) into dst, as one process reads it. */
static void oracle_row(int t, uint32_t id, engram_dtype d, uint8_t *dst)
{
    engram_error err;
    int rc = d == ENGRAM_F32   ? engram_model_read_f32(whole, t, &id, 1, (float *)(void *)dst, &err)
             : d == ENGRAM_RAW ? engram_model_read_raw(whole, t, &id, 1, dst, &err)
                               : engram_model_read_bf16(whole, t, &id, 1, (uint16_t *)(void *)dst, &err);
    CHECK_EQ(rc, 0);
}

/* A rank's tokens for round `round`: n of them (its own count), hashed from
 * an empty history; mask: about one in five masked. */
static size_t tokens_of(int round, int r, uint32_t **ids, uint8_t **mask)
{
    static const size_t sizes[] = {1, 7, 64, 300, 2048};
    size_t n = r == 1 ? 0 : sizes[(size_t)(round + r) % 5];
    uint64_t seed = 1000u * (unsigned)round + (unsigned)r + 1;
    uint32_t *tok = malloc((n ? n : 1) * 4);
    *ids = malloc((n ? n : 1) * 48 * 4);
    *mask = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        tok[i] = (uint32_t)(tu_rand(&seed) % ALPHABET);
        (*mask)[i] = tu_rand(&seed) % 5 != 0;
    }
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(whole), &h, tok, NULL, n, *ids, NULL), 0);
    free(tok);
    return n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Distinct (table, id) of the unmasked positions, counted here. */
static size_t distinct(const uint32_t *ids, const uint8_t *mask, size_t n)
{
    uint64_t *k = malloc((n ? n : 1) * 48 * 8);
    size_t m = 0, d = 0;
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 48 && mask[i]; c++)
            k[m++] = (uint64_t)(c / 24) << 32 | ids[i * 48 + (size_t)c];
    qsort(k, m, 8, cmp_u64);
    for (size_t i = 0; i < m; i++)
        d += i == 0 || k[i] != k[i - 1];
    free(k);
    return d;
}

/* out against the oracle: unmasked rows the whole file's, masked ones
 * still the canary 0xA5. */
static void check_rows(const uint32_t *ids, const uint8_t *mask, size_t n, engram_dtype d, const uint8_t *out,
                       const char *what)
{
    size_t rb = rb_of(d);
    uint8_t want[1024], canary[1024];
    memset(canary, 0xA5, sizeof canary);
    size_t bad = 0;
    for (size_t p = 0; p < n * 48; p++) {
        if (mask[p / 48]) {
            oracle_row((int)(p % 48) / 24, ids[p], d, want);
            bad += memcmp(out + p * rb, want, rb) != 0;
        } else {
            bad += memcmp(out + p * rb, canary, rb) != 0;
        }
    }
    tu_checks++;
    if (bad) {
        printf("rank %d: WRONG ROWS in %s: %zu of %zu positions\n", rank, what, bad, n * 48);
        fflush(stdout);
        tu_failures++;
    }
}

/* Rounds of exchanges with each rank's own n (0 on rank 1), three dtypes,
 * on the reader given (the whole file or this rank's shard). */
static void test_rows(engram_mpi *m, engram_model *mine, engram_reader *rd, const char *label)
{
    for (int round = 0; round < 6; round++) {
        engram_dtype d = round % 3 == 0 ? ENGRAM_BF16 : round % 3 == 1 ? ENGRAM_F32 : ENGRAM_RAW;
        uint32_t *ids;
        uint8_t *mask;
        size_t n = tokens_of(round, rank, &ids, &mask), rb = rb_of(d);
        uint8_t *out = malloc((n ? n : 1) * 48 * rb);
        memset(out, 0xA5, (n ? n : 1) * 48 * rb);
        engram_error err;
        engram_mpi_op *op = NULL;
        int rc = engram_mpi_exchange_begin(m, mine, rd, ids, mask, n, d, out, &op, &err);
        CHECK_EQ(rc, 0);
        if (rc) {
            fprintf(stderr, "rank %d: %s: %s\n", rank, label, err.msg);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        if (round == 0) { /* no other collective may start meanwhile */
            engram_mpi_op *o2 = NULL;
            uint8_t b[8] = {0};
            CHECK_ERR(engram_mpi_combine_begin(m, b, 8, &o2, &err), err, -EBUSY, "exchange");
            CHECK_ERR(engram_mpi_exchange_begin(m, mine, rd, ids, mask, n, d, out, &o2, &err), err, -EBUSY,
                      "exchange");
        }
        rc = engram_mpi_combine_wait(op, round % 2 ? ENGRAM_FOREVER : 30ull * 1000000000ull, &err);
        if (rc)
            fprintf(stderr, "rank %d: %s: wait: %s\n", rank, label, err.msg);
        CHECK_EQ(rc, 0);
        char what[96];
        snprintf(what, sizeof what, "%s round %d (n %zu, dtype %d)", label, round, n, (int)d);
        if (rc == 0)
            check_rows(ids, mask, n, d, out, what);
        engram_mpi_exchange_info xi;
        engram_mpi_exchange_get_info(op, &xi);
        CHECK_EQ(xi.rows_asked, distinct(ids, mask, n));
        CHECK(xi.rows_remote <= xi.rows_asked);
        CHECK_EQ(xi.row_bytes, rb);
        /* what the world asked is what the world served */
        unsigned long long mine_c[2] = {xi.rows_asked, xi.rows_served}, sum[2];
        MPI_Allreduce(mine_c, sum, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        CHECK_EQ(sum[0], sum[1]);
        if (n == 0)
            CHECK_EQ(xi.rows_asked, 0);
        engram_mpi_combine_free(op);
        /* m can begin again */
        engram_mpi_op *o3 = NULL;
        uint8_t b[8] = {0};
        CHECK_EQ(engram_mpi_combine_begin(m, b, 8, &o3, &err), 0);
        CHECK_EQ(engram_mpi_combine_wait(o3, 30ull * 1000000000ull, &err), 0);
        engram_mpi_combine_free(o3);
        free(ids), free(mask), free(out);
    }
}

/* The last rank begins 300 ms late: the others' timed waits time out
 * (nothing lost), then every rank gets its rows. */
static void test_late(engram_mpi *m, engram_model *mine, engram_reader *rd)
{
    uint32_t *ids;
    uint8_t *mask;
    size_t n = tokens_of(40, rank, &ids, &mask);
    uint8_t *out = malloc((n ? n : 1) * 48 * 512);
    memset(out, 0xA5, (n ? n : 1) * 48 * 512);
    engram_error err;
    engram_mpi_op *op = NULL;
    int late = rank == world - 1;
    if (late)
        tu_sleep_ms(300);
    CHECK_EQ(engram_mpi_exchange_begin(m, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), 0);
    int rc = -1;
    if (op && !late) {
        rc = engram_mpi_combine_wait(op, 20 * 1000000ull, &err);
        CHECK_ERR(rc, err, -ETIMEDOUT, "not complete");
        uint64_t t0 = tu_now_ns();
        int timeouts = 1;
        while ((rc = engram_mpi_combine_wait(op, 20 * 1000000ull, &err)) == -ETIMEDOUT &&
               tu_now_ns() - t0 < 30ull * 1000000000ull)
            timeouts++;
        CHECK_EQ(rc, 0);
        CHECK(timeouts >= 2);
    } else if (op) {
        rc = engram_mpi_combine_wait(op, ENGRAM_FOREVER, &err);
        CHECK_EQ(rc, 0);
    }
    if (rc == 0)
        check_rows(ids, mask, n, ENGRAM_BF16, out, "late rank");
    CHECK_EQ(engram_mpi_combine_wait(op, 0, &err), 0); /* complete: the same at once */
    engram_mpi_combine_free(op);
    free(ids), free(mask), free(out);
}

/* Rank F = world - 1 serves from a copy of its shard cut short at table
 * 1's rows after its reader opened it: whoever asked F for a table-1 row
 * gets F's error naming F; the others their rows; then a good exchange. */
static void test_owner_fault(engram_mpi *m, engram_model *mine, engram_reader *rd, const char *shard_path)
{
    int F = world - 1;
    engram_error err;
    engram_model *cut = NULL;
    engram_reader *crd = NULL;
    char cpath[700];
    if (rank == F) {
        snprintf(cpath, sizeof cpath, "%s.cut", shard_path);
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", shard_path, cpath);
        CHECK_EQ(system(cmd), 0);
        cut = tu_open_model(cpath);
        CHECK(cut != NULL);
        CHECK_EQ(engram_reader_open(cut, NULL, &crd, &err), 0);
        engram_model_info mi;
        engram_model_get_info(cut, &mi);
        CHECK_EQ(truncate(cpath, (off_t)mi.table[1].offset), 0);
    }
    uint32_t *ids;
    uint8_t *mask;
    size_t n = tokens_of(53, rank, &ids, &mask);
    /* the outcome, from the owners computed here */
    int asked_t1 = 0;
    for (size_t p = 0; p < n * 48; p++)
        if (mask[p / 48] && p % 48 >= 24 && engram_mpi_owner(table_rows[1], ids[p], (unsigned)world) == (uint32_t)F)
            asked_t1 = 1;
    uint8_t *out = malloc((n ? n : 1) * 48 * 512);
    memset(out, 0xA5, (n ? n : 1) * 48 * 512);
    engram_mpi_op *op = NULL;
    CHECK_EQ(engram_mpi_exchange_begin(m, rank == F ? cut : mine, rank == F ? crd : rd, ids, mask, n,
                                       ENGRAM_BF16, out, &op, &err), 0);
    int rc = engram_mpi_combine_wait(op, 30ull * 1000000000ull, &err);
    char name[32];
    snprintf(name, sizeof name, "rank %d", F);
    if (rank == F) {
        CHECK(rc < 0 && rc != -ETIMEDOUT);
        CHECK(strstr(err.msg, "could not read") != NULL);
    } else if (asked_t1) {
        CHECK(rc < 0 && rc != -ETIMEDOUT);
        CHECK(strstr(err.msg, name) != NULL);
        CHECK(strstr(err.msg, "could not read") != NULL);
    } else {
        CHECK_EQ(rc, 0);
    }
    printf("rank %d: owner fault (rank %d cut short): %s%d %s\n", rank, F, asked_t1 ? "asked it, " : "", rc,
           rc ? err.msg : "rows");
    /* a failed exchange leaves out as it was */
    uint8_t canary[512];
    memset(canary, 0xA5, sizeof canary);
    size_t changed = 0;
    for (size_t p = 0; rc != 0 && p < n * 48; p++)
        changed += memcmp(out + p * 512, canary, 512) != 0;
    CHECK_EQ(changed, 0);
    if (rc == 0)
        check_rows(ids, mask, n, ENGRAM_BF16, out, "owner fault, rows not from it");
    engram_mpi_combine_free(op);
    /* the ranks' collectives still agree: the next exchange (good readers) works */
    memset(out, 0xA5, (n ? n : 1) * 48 * 512);
    CHECK_EQ(engram_mpi_exchange_begin(m, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), 0);
    rc = engram_mpi_combine_wait(op, 30ull * 1000000000ull, &err);
    CHECK_EQ(rc, 0);
    if (rc == 0)
        check_rows(ids, mask, n, ENGRAM_BF16, out, "after the owner fault");
    engram_mpi_combine_free(op);
    engram_reader_close(crd);
    engram_model_close(cut);
    if (rank == F)
        unlink(cpath);
    free(ids), free(mask), free(out);
}

/* Cancel: every rank gives up on an exchange at once (its counts phase, which
 * every rank joined, so MPI completes it: parked, then reaped); the handle
 * then refuses every begin (the phases after it never started anywhere); a
 * second handle still exchanges. */
static void test_cancel(engram_mpi *m, engram_model *mine, engram_reader *rd)
{
    engram_mpi *m2 = NULL;
    engram_error err;
    CHECK_EQ(engram_mpi_open(MPI_COMM_WORLD, NULL, &m2, &err), 0);
    uint32_t *ids;
    uint8_t *mask;
    size_t n = tokens_of(60, rank, &ids, &mask);
    uint8_t *out = malloc((n ? n : 1) * 48 * 512);
    memset(out, 0xA5, (n ? n : 1) * 48 * 512);
    engram_mpi_op *op = NULL;
    CHECK_EQ(engram_mpi_exchange_begin(m2, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), 0);
    engram_mpi_combine_cancel(op);
    CHECK_ERR(engram_mpi_combine_wait(op, 1000000, &err), err, -ECANCELED, "cancelled");
    CHECK_ERR(engram_mpi_combine_poll(op, &err), err, -ECANCELED, "cancelled");
    engram_mpi_combine_free(op);
    engram_mpi_info info;
    uint64_t t0 = tu_now_ns();
    do {
        engram_mpi_get_info(m2, &info);
        tu_sleep_ms(1);
    } while (info.pending && tu_now_ns() - t0 < 30ull * 1000000000ull);
    CHECK_EQ(info.pending, 0);
    uint8_t canary[512];
    memset(canary, 0xA5, sizeof canary);
    size_t changed = 0;
    for (size_t p = 0; p < n * 48; p++)
        changed += memcmp(out + p * 512, canary, 512) != 0;
    CHECK_EQ(changed, 0);
    uint8_t b[8] = {0};
    CHECK_ERR(engram_mpi_combine_begin(m2, b, 8, &op, &err), err, -EBUSY, "exchange");
    CHECK_ERR(engram_mpi_exchange_begin(m2, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), err, -EBUSY,
              "exchange");
    engram_mpi_close(m2);
    CHECK_EQ(engram_mpi_exchange_begin(m, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), 0);
    int rc = engram_mpi_combine_wait(op, 30ull * 1000000000ull, &err);
    CHECK_EQ(rc, 0);
    if (rc == 0)
        check_rows(ids, mask, n, ENGRAM_BF16, out, "after a cancelled exchange (another handle)");
    engram_mpi_combine_free(op);
    free(ids), free(mask), free(out);
}

/* A phase that MPI refuses to start on rank 0 while the phase's other
 * collective is in flight: rank 0's wait fails naming the call, the peers'
 * (whose rows collective rank 0 never joins) time out; the ops freed stay
 * MPI's (parked) while any of their requests is active, so no buffer of
 * theirs is freed under MPI (before the fix the statuses' buffers were,
 * and ASan saw MPI write into them at the next collective).  The handle
 * is left to the process (its peers' collectives never complete): the
 * mode ends the job with MPI_Abort after the checks. */
static engram_mpi *refused_handle;
static void test_rows_refused(engram_model *mine, engram_reader *rd)
{
    engram_error err;
    CHECK_EQ(engram_mpi_open(MPI_COMM_WORLD, NULL, &refused_handle, &err), 0);
    uint32_t *ids;
    uint8_t *mask;
    size_t n = tokens_of(73, rank == 1 ? 0 : rank, &ids, &mask); /* ranks 0, 1: 300 tokens */
    uint8_t *out = malloc(n * 48 * 512);
    engram_mpi_op *op = NULL;
    refuse_rows = rank == 0;
    CHECK_EQ(engram_mpi_exchange_begin(refused_handle, mine, rd, ids, mask, n, ENGRAM_BF16, out, &op, &err), 0);
    int rc = engram_mpi_combine_wait(op, 3ull * 1000000000ull, &err);
    if (rank == 0) {
        CHECK_ERR(rc, err, -EIO, "MPI_Ialltoallv (rows)");
        CHECK(refused >= 1);
    } else {
        CHECK_ERR(rc, err, -ETIMEDOUT, "not complete");
    }
    refuse_rows = 0;
    engram_mpi_combine_free(op);
    engram_mpi_info info;
    engram_mpi_get_info(refused_handle, &info);
    printf("rank %d: after the refused phase: wait %d, %zu op(s) still MPI's\n", rank, rc, info.pending);
    /* collectives on another communicator progress what is in flight:
     * with the op's buffers freed, MPI wrote into freed memory here */
    for (int i = 0; i < 3; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        tu_sleep_ms(100);
    }
    engram_mpi_get_info(refused_handle, &info);
    if (rank != 0)
        CHECK(info.pending >= 1); /* its rows collective never completes: still MPI's */
    printf("rank %d: after the barriers: %zu op(s) still MPI's\n", rank, info.pending);
    free(ids), free(mask);
    /* out stays allocated: a peer's parked op still names it */
}

/* Refusals: local, nothing started (every rank refuses alike). */
static void test_refusals(engram_mpi *m, engram_model *mine, engram_reader *rd, engram_model *other)
{
    engram_error err;
    engram_mpi_op *op = NULL;
    uint32_t ids[48] = {0};
    uint8_t out[48 * 512];
    CHECK_ERR(engram_mpi_exchange_begin(NULL, mine, rd, ids, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "m is NULL");
    CHECK_ERR(engram_mpi_exchange_begin(m, NULL, rd, ids, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "model is NULL");
    CHECK_ERR(engram_mpi_exchange_begin(m, mine, NULL, ids, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "r is NULL");
    CHECK_ERR(engram_mpi_exchange_begin(m, mine, rd, NULL, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "ids is NULL");
    CHECK_ERR(engram_mpi_exchange_begin(m, mine, rd, ids, NULL, 1, (engram_dtype)7, out, &op, &err), err,
              -EINVAL, "dtype");
    ids[30] = (uint32_t)table_rows[1];
    CHECK_ERR(engram_mpi_exchange_begin(m, mine, rd, ids, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "column 30");
    ids[30] = 0x80000000u;
    CHECK_ERR(engram_mpi_exchange_begin(m, mine, rd, ids, NULL, 1, ENGRAM_BF16, out, &op, &err), err, -EINVAL,
              "2^31");
    uint8_t none = 0; /* a masked token's ids are not looked at */
    ids[30] = 0;
    if (other)
        CHECK_ERR(engram_mpi_exchange_begin(m, other, rd, ids, &none, 1, ENGRAM_BF16, out, &op, &err), err,
                  -EINVAL, "this rank is");
    engram_mpi_exchange_info xi;
    memset(&xi, 0xff, sizeof xi);
    engram_mpi_exchange_get_info(NULL, &xi);
    CHECK_EQ(xi.rows_asked, 0);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    engram_error err;
    engram_mpi *m = NULL;
    if (engram_mpi_open(MPI_COMM_WORLD, NULL, &m, &err) < 0) {
        fprintf(stderr, "rank %d: engram_mpi_open: %s\n", rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* rank 0 builds the model and cuts it into world shard files */
    char path[512] = {0};
    static uint32_t map[ALPHABET];
    engram_layout l;
    int ok = 1;
    if (rank == 0) {
        ok = tu_layout(&l, map, ALPHABET, 2000, 3000) == 0 &&
             tu_build("xchg.gguf", &l, ENGRAM_FILL_NORMAL, 64, path, sizeof path) == 0;
        for (int r = 0; ok && r < world; r++) {
            char sp[600];
            snprintf(sp, sizeof sp, "%s.shard%d", path, r);
            ok = engram_shard_write(path, NULL, (unsigned)r, (unsigned)world, sp, NULL, &err) == 0;
            if (!ok)
                fprintf(stderr, "shard %d: %s\n", r, err.msg);
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    char sp[600], sp_other[600];
    snprintf(sp, sizeof sp, "%s.shard%d", path, rank);
    snprintf(sp_other, sizeof sp_other, "%s.shard%d", path, (rank + 1) % world);
    engram_model *shard = NULL, *other = NULL;
    engram_reader *rw = NULL, *rs = NULL;
    if (!ok || !(whole = tu_open_model(path)) || !(shard = tu_open_model(sp)) || !(other = tu_open_model(sp_other)) ||
        engram_reader_open(whole, NULL, &rw, &err) < 0 || engram_reader_open(shard, NULL, &rs, &err) < 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    engram_model_info mi;
    engram_model_get_info(whole, &mi);
    table_rows[0] = mi.table[0].rows;
    table_rows[1] = mi.table[1].rows;

    if (argc > 1 && !strcmp(argv[1], "--refuse-rows")) {
        test_rows_refused(shard, rs);
        char name[64];
        snprintf(name, sizeof name, "test_mpi_exchange --refuse-rows rank %d/%d", rank, world);
        int frc = tu_finish(name);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            tu_cleanup();
        /* the peers' exchanges can never complete: end the job (every
         * rank's exit status the same: 0 if every check passed) */
        int all = 0;
        MPI_Allreduce(&frc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MPI_Abort(MPI_COMM_WORLD, all);
    }
    test_refusals(m, shard, rs, world > 1 ? other : NULL);
    test_rows(m, whole, rw, "whole file");
    test_rows(m, shard, rs, "shard files");
    engram_io_stats st;
    engram_reader_get_stats(rs, &st);
    printf("rank %d: shard reader: %llu rows read for the exchanges\n", rank, (unsigned long long)st.rows_read);
    test_late(m, shard, rs);
    test_owner_fault(m, shard, rs, sp);
    test_cancel(m, shard, rs);

    engram_reader_close(rw);
    engram_reader_close(rs);
    engram_model_close(whole);
    engram_model_close(shard);
    engram_model_close(other);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        tu_cleanup();
    engram_mpi_close(m);
    char name[64];
    snprintf(name, sizeof name, "test_mpi_exchange rank %d/%d", rank, world);
    int rc = tu_finish(name);
    MPI_Finalize();
    return rc;
}
