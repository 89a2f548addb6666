/*
 * test_shard_files.c - row-block shard files (issue #24, docs/shards.md)
 * against the whole file they were cut from, a V4.1 demo at W = 64:
 *  - engram_shard_write for worlds of 1, 2, 3 and 5: each shard opens,
 *    its engram_model_info.shard is the floor formula's block, its tables'
 *    bytes add up to the whole file's;
 *  - engram_model_read_raw of rows at the block's edges and at random in
 *    it equals the whole file's; rows outside the block are -EINVAL naming
 *    it, through engram_model_read_* and the reader's batch and step;
 *  - a sharded pool opened on rank r's shard file (shard_rank r) delivers
 *    the same bytes, RAW and BF16, as a sharded pool of rank r on the whole
 *    file, for steps of 1..4 tokens; a pool of another rank or world, or
 *    unsharded, on a shard file is -EINVAL naming the mismatch;
 *  - engram_shard_set_check: a whole set passes; another model's shard, a
 *    different world, a rank twice, a rank missing, a non-shard, and
 *    (crafted infos) overlapping or gapped blocks refused, naming why;
 *  - refusals of engram_shard_write: rank >= world, world 0, a malformed
 *    model id, a shard as the source (a world larger than a table cannot
 *    be made at this size: 65,536 ranks < 482,648 rows).
 */
#include <string.h>
#include <unistd.h>

#include "engram_tools.h"
#include "testutil.h"

#define STEPS 40

static int build(const char *path, uint64_t seed)
{
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    uint32_t *map = malloc(129280 * sizeof *map);
    for (uint32_t i = 0; i < 129280; i++)
        map[i] = i % 99092;
    o.layout.vocab = 129280;
    o.layout.compressed_vocab = 99092;
    o.layout.pad_id = 2;
    o.layout.token_map = map;
    uint32_t primes[ENGRAM_TABLES * ENGRAM_COLUMNS];
    CHECK_EQ(engram_layout_primes(20000, 2, ENGRAM_NGRAM, ENGRAM_HEADS, primes, 48), 0);
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        uint64_t sum = 0;
        for (int c = 0; c < ENGRAM_COLUMNS; c++)
            sum += o.layout.primes[t][c] = primes[t * ENGRAM_COLUMNS + c];
        o.layout.rows[t] = (uint32_t)sum;
        CHECK_EQ(engram_layout_multipliers(99092, t ? 14 : 1, ENGRAM_NGRAM, o.layout.multipliers[t]), 0);
    }
    o.width = 64;
    o.fill = ENGRAM_FILL_NORMAL;
    o.seed = seed;
    engram_error err;
    int rc = engram_build_model(path, &o, &err);
    if (rc < 0)
        fprintf(stderr, "build: %s\n", err.msg);
    free(map);
    return rc;
}

static engram_model *open_model(const char *path)
{
    engram_model *m = NULL;
    engram_error err;
    int rc = engram_model_open(path, &m, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "open %s: %s\n", path, err.msg);
    return m;
}

/* Rows at the block's edges and at random inside: the shard reads what the
 * whole file holds; the rows just outside are refused. */
static void check_reads(engram_model *whole, engram_model *sh, uint64_t *seed)
{
    engram_model_info in;
    engram_model_get_info(sh, &in);
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        uint32_t lo = (uint32_t)in.shard.first_row[t], hi = lo + (uint32_t)in.shard.rows[t];
        uint32_t ids[8] = {lo, lo + 1, hi - 1, hi - 2};
        for (int i = 4; i < 8; i++)
            ids[i] = lo + (uint32_t)(tu_rand(seed) % (hi - lo));
        uint8_t a[8 * ENGRAM_ROW_BYTES], b[8 * ENGRAM_ROW_BYTES];
        engram_error err;
        CHECK_EQ(engram_model_read_raw(whole, t, ids, 8, a, &err), 0);
        CHECK_EQ(engram_model_read_raw(sh, t, ids, 8, b, &err), 0);
        CHECK(memcmp(a, b, sizeof a) == 0);
        uint16_t v[ENGRAM_ROW_VALUES];
        if (lo > 0) {
            uint32_t out = lo - 1;
            CHECK_ERR(engram_model_read_raw(sh, t, &out, 1, a, &err), err, -EINVAL, "not in this shard's block");
            CHECK_ERR(engram_model_read_bf16(sh, t, &out, 1, v, &err), err, -EINVAL, "not in this shard's block");
        }
        if (hi < in.table[t].rows) {
            uint32_t out = hi;
            CHECK_ERR(engram_model_read_raw(sh, t, &out, 1, a, &err), err, -EINVAL, "not in this shard's block");
        }
        uint32_t far = (uint32_t)in.table[t].rows;
        CHECK_ERR(engram_model_read_raw(sh, t, &far, 1, a, &err), err, -EINVAL, "out of range");
    }
    /* the reader: a batch and a step with a row outside the block */
    if (in.shard.world > 1) {
        engram_reader *r = NULL;
        CHECK_EQ(engram_reader_open(sh, NULL, &r, NULL), 0);
        uint32_t rows[ENGRAM_ROWS_PER_TOKEN];
        for (int k = 0; k < ENGRAM_ROWS_PER_TOKEN; k++) {
            int t = k / ENGRAM_COLUMNS;
            rows[k] = (uint32_t)in.shard.first_row[t];
        }
        rows[5] = in.shard.first_row[0] ? (uint32_t)in.shard.first_row[0] - 1
                                        : (uint32_t)(in.shard.first_row[0] + in.shard.rows[0]);
        uint16_t *out = malloc(ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES * 2);
        engram_error err;
        CHECK_ERR(engram_reader_batch(r, 0, rows, 1, ENGRAM_BF16, out, &err), err, -EINVAL,
                  "not in this shard's block");
        CHECK_ERR(engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err), err, -EINVAL,
                  "not in this shard's block");
        rows[5] = (uint32_t)in.shard.first_row[0];
        CHECK_EQ(engram_reader_batch(r, 0, rows, 1, ENGRAM_BF16, out, &err), 0);
        free(out);
        engram_reader_close(r);
    }
}

static engram_pool *pool(engram_model *m, unsigned rank, unsigned world)
{
    engram_pool_opts o = {.reader = {.depth = 32}, .shard_rank = rank, .shard_world = world};
    engram_pool *p = NULL;
    engram_error err;
    int rc = engram_pool_open(m, &o, &p, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        fprintf(stderr, "pool %u/%u: %s\n", rank, world, err.msg);
    return p;
}

/* A sharded pool on the shard file and one of the same rank on the whole
 * file: the same steps deliver the same bytes. */
static void check_pools(engram_model *whole, engram_model *sh, uint64_t *seed)
{
    engram_model_info in;
    engram_model_get_info(sh, &in);
    engram_pool *p[2] = {pool(whole, in.shard.rank, in.shard.world), pool(sh, in.shard.rank, in.shard.world)};
    if (!p[0] || !p[1]) {
        engram_pool_close(p[0]);
        engram_pool_close(p[1]);
        return;
    }
    engram_session *s[2];
    for (int i = 0; i < 2; i++)
        CHECK_EQ(engram_session_open(p[i], &s[i], NULL), 0);
    size_t cap = 4 * ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES * 2; /* BF16: the larger */
    uint8_t *out[2] = {malloc(cap), malloc(cap)};
    for (int step = 0; step < STEPS; step++) {
        unsigned k = 1 + (unsigned)(tu_rand(seed) % 4);
        engram_dtype d = step % 2 ? ENGRAM_RAW : ENGRAM_BF16;
        uint32_t tok[4];
        for (unsigned i = 0; i < k; i++)
            tok[i] = (uint32_t)(tu_rand(seed) % 129280);
        size_t bytes = (size_t)k * ENGRAM_ROWS_PER_TOKEN * (d == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2);
        for (int i = 0; i < 2; i++) {
            engram_error err;
            memset(out[i], 0xa5, cap);
            CHECK_EQ(engram_step_begin(s[i], tok, NULL, k, d, out[i], &err), 0);
            CHECK_EQ(engram_step_wait(s[i], 0, &err), 0);
            CHECK_EQ(engram_step_wait(s[i], 1, &err), 0);
            CHECK_EQ(engram_step_commit(s[i], k, &err), 0);
        }
        CHECK(memcmp(out[0], out[1], bytes) == 0);
    }
    for (int i = 0; i < 2; i++) {
        engram_session_close(s[i]);
        engram_pool_close(p[i]);
        free(out[i]);
    }
    /* a pool of another rank or world, or unsharded, is refused */
    engram_pool *q = NULL;
    engram_error err;
    engram_pool_opts o = {.shard_rank = (in.shard.rank + 1) % in.shard.world, .shard_world = in.shard.world};
    CHECK_ERR(engram_pool_open(sh, &o, &q, &err), err, -EINVAL, "do not match the shard file");
    o = (engram_pool_opts){.shard_rank = 0, .shard_world = 0};
    CHECK_ERR(engram_pool_open(sh, &o, &q, &err), err, -EINVAL, "do not match the shard file");
    o = (engram_pool_opts){.shard_rank = in.shard.rank, .shard_world = in.shard.world + 1};
    CHECK_ERR(engram_pool_open(sh, &o, &q, &err), err, -EINVAL, "do not match the shard file");
    CHECK(q == NULL);
}

static void check_sets(const engram_shard_info *good, unsigned n, const engram_shard_info *other)
{
    engram_error err;
    engram_shard_info set[8];
    memcpy(set, good, n * sizeof *set);
    CHECK_EQ(engram_shard_set_check(set, n, NULL, &err), 0);
    set[1] = other[1];
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "another model");
    memcpy(set, good, n * sizeof *set);
    CHECK_ERR(engram_shard_set_check(set, n - 1, NULL, &err), err, -EINVAL, "is missing");
    set[n - 1] = set[0];
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "both rank 0");
    memcpy(set, good, n * sizeof *set);
    set[1].world = n + 1;
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "world");
    memcpy(set, good, n * sizeof *set);
    set[1].first_row[0] -= 3; /* crafted: files with such keys do not open */
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "overlap");
    memcpy(set, good, n * sizeof *set);
    set[1].first_row[1] += 3;
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "a gap");
    memcpy(set, good, n * sizeof *set);
    set[n - 1].rows[0] -= 1;
    CHECK_ERR(engram_shard_set_check(set, n, NULL, &err), err, -EINVAL, "a gap");
    memcpy(set, good, n * sizeof *set);
    memset(&set[0], 0, sizeof set[0]);
    const char *names[8] = {"whole.gguf"};
    CHECK_ERR(engram_shard_set_check(set, n, names, &err), err, -EINVAL, "whole.gguf is not a shard file");
}

int main(void)
{
    char whole_path[512], other_path[512], p[512];
    tu_path(whole_path, sizeof whole_path, "m.gguf");
    tu_path(other_path, sizeof other_path, "other.gguf");
    if (build(whole_path, 5) < 0 || build(other_path, 6) < 0)
        return tu_finish("test_shard_files");
    engram_model *whole = open_model(whole_path);
    engram_model_info wi;
    engram_model_get_info(whole, &wi);
    CHECK_EQ(wi.shard.world, 0u);
    CHECK_EQ(wi.shard.rows[0], wi.table[0].rows);
    char id[ENGRAM_SHARD_ID_HEX + 1], id2[ENGRAM_SHARD_ID_HEX + 1];
    engram_error err;
    CHECK_EQ(engram_model_identity(whole_path, id, &err), 0);
    CHECK_EQ(engram_model_identity(other_path, id2, &err), 0);
    CHECK(strcmp(id, id2) != 0);
    uint64_t seed = 77;
    static const unsigned worlds[] = {1, 2, 3, 5};
    engram_shard_info good[5], other[5];
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        unsigned n = worlds[w];
        uint64_t sum[ENGRAM_TABLES] = {0, 0};
        for (unsigned r = 0; r < n; r++) {
            snprintf(p, sizeof p, "%s/m.%u-of-%u.gguf", tu_tmpdir(), r, n);
            int rc = engram_shard_write(whole_path, r % 2 ? id : NULL, r, n, p, NULL, &err);
            CHECK_EQ(rc, 0);
            if (rc < 0) {
                fprintf(stderr, "shard %u of %u: %s\n", r, n, err.msg);
                continue;
            }
            engram_model *sh = open_model(p);
            if (!sh)
                continue;
            engram_model_info in;
            engram_model_get_info(sh, &in);
            CHECK_EQ(in.shard.rank, r);
            CHECK_EQ(in.shard.world, n);
            CHECK(strcmp(in.shard.model_id, id) == 0);
            for (int t = 0; t < ENGRAM_TABLES; t++) {
                uint64_t R = wi.table[t].rows;
                CHECK_EQ(in.table[t].rows, R);
                CHECK_EQ(in.shard.total_rows[t], R);
                CHECK_EQ(in.shard.first_row[t], r * R / n);
                CHECK_EQ(in.shard.rows[t], (r + 1) * R / n - r * R / n);
                CHECK_EQ(in.table[t].bytes, in.shard.rows[t] * ENGRAM_ROW_BYTES);
                sum[t] += in.table[t].bytes;
            }
            CHECK(in.tables_last && in.table0_page_aligned);
            CHECK(in.has_projection);
            check_reads(whole, sh, &seed);
            if (n > 1)
                check_pools(whole, sh, &seed);
            if (n == 3) {
                good[r] = in.shard;
                char q[512];
                snprintf(q, sizeof q, "%s/o.%u-of-3.gguf", tu_tmpdir(), r);
                CHECK_EQ(engram_shard_write(other_path, NULL, r, 3, q, NULL, &err), 0);
                engram_model *om = open_model(q);
                if (om) {
                    engram_model_info oi;
                    engram_model_get_info(om, &oi);
                    other[r] = oi.shard;
                    engram_model_close(om);
                }
                /* a shard is not a source */
                CHECK_ERR(engram_shard_write(p, NULL, 0, 2, q, NULL, &err), err, -EINVAL, "already a shard");
            }
            engram_model_close(sh);
        }
        for (int t = 0; t < ENGRAM_TABLES; t++)
            CHECK_EQ(sum[t], wi.table[t].bytes);
    }
    check_sets(good, 3, other);
    tu_path(p, sizeof p, "never.gguf");
    CHECK_ERR(engram_shard_write(whole_path, NULL, 3, 3, p, NULL, &err), err, -EINVAL, "rank 3");
    CHECK_ERR(engram_shard_write(whole_path, NULL, 0, 0, p, NULL, &err), err, -EINVAL, "world");
    CHECK_ERR(engram_shard_write(whole_path, "xyz", 0, 2, p, NULL, &err), err, -EINVAL, "model id");
    CHECK(access(p, F_OK) != 0);
    engram_model_close(whole);
    tu_cleanup();
    return tu_finish("test_shard_files");
}
