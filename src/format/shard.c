/* shard.c - whether shard files belong together (issue #24): one model,
 * one world, every rank once, blocks tiling each table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram.h"
#include "common/util.h"

static const char *shard_name(const char *const *names, size_t i, char *buf, size_t cap)
{
    if (names && names[i])
        return names[i];
    snprintf(buf, cap, "shard %zu", i);
    return buf;
}

int engram_shard_set_check(const engram_shard_info *s, size_t n, const char *const *names,
                           engram_error *err)
{
    if (!s || n == 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, !s ? "NULL argument" : "no shard to check");
    char a[32], b[32];
    for (size_t i = 0; i < n; i++)
        if (s[i].world == 0)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%s is not a shard file (no shard keys)",
                           shard_name(names, i, a, sizeof a));
    for (size_t i = 1; i < n; i++) {
        const char *ni = shard_name(names, i, a, sizeof a), *n0 = shard_name(names, 0, b, sizeof b);
        /* infos may come from other ranks: compared within their bounds */
        if (memcmp(s[i].model_id, s[0].model_id, ENGRAM_SHARD_ID_HEX) != 0)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "%s is a shard of another model than %s (model id %.16s... vs %.16s...)", ni, n0,
                           s[i].model_id, s[0].model_id);
        if (s[i].world != s[0].world)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "%s is rank %u of a world of %u, but %s is of a world of %u", ni, s[i].rank,
                           s[i].world, n0, s[0].world);
        for (int t = 0; t < ENGRAM_TABLES; t++)
            if (s[i].total_rows[t] != s[0].total_rows[t])
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                               "%s: table %d has %llu rows in all, but %llu in %s", ni, t,
                               (unsigned long long)s[i].total_rows[t],
                               (unsigned long long)s[0].total_rows[t], n0);
    }
    uint32_t world = s[0].world;
    if (world > ENGRAM_MAX_SHARDS)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%s: a world of %u (at most %u)",
                       shard_name(names, 0, a, sizeof a), world, ENGRAM_MAX_SHARDS);
    /* rank -> index + 1, at most world entries (world <= 65536) */
    size_t *at = calloc(world, sizeof *at);
    if (!at)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (s[i].rank >= world) {
            rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%s: rank %u is not below its world %u",
                         shard_name(names, i, a, sizeof a), s[i].rank, world);
        } else if (at[s[i].rank]) {
            rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%s and %s are both rank %u of %u",
                         shard_name(names, at[s[i].rank] - 1, b, sizeof b),
                         shard_name(names, i, a, sizeof a), s[i].rank, world);
        } else {
            at[s[i].rank] = i + 1;
        }
    }
    /* the blocks in rank order must tile [0, R): any overlap or gap named */
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++) {
        uint64_t next = 0;
        for (uint32_t r = 0; r < world && rc == 0; r++) {
            if (!at[r]) {
                rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                             "rank %u of %u is missing: no shard holds its block (%zu of %u shards given)",
                             r, world, n, world);
                break;
            }
            size_t i = at[r] - 1;
            const engram_shard_info *x = &s[i];
            if (x->first_row[t] != next)
                rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                             "%s (rank %u): table %d's block starts at row %llu, but the blocks before it end "
                             "at %llu: %s",
                             shard_name(names, i, a, sizeof a), r, t, (unsigned long long)x->first_row[t],
                             (unsigned long long)next, x->first_row[t] < next ? "they overlap" : "a gap");
            if (rc == 0 && x->rows[t] > s[0].total_rows[t] - x->first_row[t]) /* first_row <= total here */
                rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%s (rank %u): table %d's block runs past row %llu",
                             shard_name(names, i, a, sizeof a), r, t,
                             (unsigned long long)s[0].total_rows[t]);
            next = x->first_row[t] + x->rows[t];
        }
        if (rc == 0 && next != s[0].total_rows[t])
            rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d: the blocks end at row %llu, not at %llu: %s",
                         t, (unsigned long long)next, (unsigned long long)s[0].total_rows[t],
                         next < s[0].total_rows[t] ? "a gap" : "they overrun");
    }
    free(at);
    return rc;
}
