/*
 * test_rowcache.c - the reader's bounded row cache on its own: what comes
 * back is always the row that was stored under that key (checked against a
 * generator, over many evictions), the memory stays within what was asked,
 * and the replacement policy keeps rows that are hit again while a stream of
 * rows read once, larger than the cache, passes through.
 */
#include "testutil.h"

#include "io/rowcache.h"

/* The row stored for (table, row): bytes derived from the key alone. */
static void row_bytes(int table, uint32_t row, uint8_t out[ENGRAM_ROW_BYTES])
{
    uint64_t s = ((uint64_t)table << 32 | row) * 0x2545f4914f6cdd1dull + 1;
    for (int i = 0; i < ENGRAM_ROW_BYTES; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out[i] = (uint8_t)s;
    }
}

static void basics(void)
{
    struct rowcache *c = NULL;
    CHECK_EQ(rowcache_new(100, &c), -EINVAL); /* less than one set */
    const uint64_t ask = 1u << 20;
    CHECK_EQ(rowcache_new(ask, &c), 0);
    CHECK(rowcache_bytes(c) <= ask);
    CHECK(rowcache_bytes(c) > ask - (uint64_t)ROWCACHE_WAYS * ROWCACHE_ENTRY_BYTES - 64);
    CHECK(rowcache_rows(c) % ROWCACHE_WAYS == 0);
    CHECK(rowcache_rows(c) * ROWCACHE_ENTRY_BYTES <= rowcache_bytes(c));
    uint8_t want[ENGRAM_ROW_BYTES];
    CHECK(rowcache_get(c, 0, 7) == NULL);
    row_bytes(0, 7, want);
    rowcache_put(c, 0, 7, want);
    const uint8_t *got = rowcache_get(c, 0, 7);
    CHECK(got && memcmp(got, want, sizeof want) == 0);
    CHECK(rowcache_get(c, 1, 7) == NULL); /* the table is part of the key */
    rowcache_put(c, 0, 7, want);          /* already there: no second copy */
    rowcache_free(c);
    rowcache_free(NULL);
}

/* Random puts and gets over 20x the capacity: every hit returns the right
 * bytes; hits happen; nothing is returned that was never stored. */
static void integrity(void)
{
    struct rowcache *c = NULL;
    CHECK_EQ(rowcache_new(256u << 10, &c), 0);
    uint64_t cap = rowcache_rows(c), seed = 5, hits = 0, wrong = 0, phantom = 0;
    uint8_t want[ENGRAM_ROW_BYTES];
    for (int i = 0; i < 200000; i++) {
        int t = (int)(tu_rand(&seed) & 1);
        /* skewed keys: small ids far more often than large ones */
        uint32_t row = (uint32_t)(tu_rand(&seed) % (1 + tu_rand(&seed) % (20 * cap)));
        const uint8_t *got = rowcache_get(c, t, row);
        row_bytes(t, row, want);
        if (got) {
            hits++;
            wrong += memcmp(got, want, sizeof want) != 0;
        } else {
            rowcache_put(c, t, row, want);
        }
        /* keys never stored: rows at or above 2^31 */
        phantom += rowcache_get(c, t, 0x80000000u + row) != NULL;
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(phantom, 0);
    CHECK(hits > 10000);
    printf("integrity: capacity %llu rows, %llu hits in 200000 lookups\n",
           (unsigned long long)cap, (unsigned long long)hits);
    rowcache_free(c);
}

/* A hot set, hit between passes of a one-time stream 1.5x the capacity. */
static void scan_resistance(void)
{
    struct rowcache *c = NULL;
    CHECK_EQ(rowcache_new(1u << 20, &c), 0);
    uint64_t cap = rowcache_rows(c);
    const uint32_t hot = 200;
    uint8_t raw[ENGRAM_ROW_BYTES];
    for (uint32_t h = 0; h < hot; h++) {
        row_bytes(0, h, raw);
        rowcache_put(c, 0, h, raw);
        CHECK(rowcache_get(c, 0, h) != NULL);
    }
    uint32_t next = 1000000;
    uint64_t hot_hits = 0, hot_lookups = 0;
    for (int round = 0; round < 10; round++) {
        for (uint64_t i = 0; i < cap * 3 / 2; i++, next++) {
            CHECK(rowcache_get(c, 1, next) == NULL);
            row_bytes(1, next, raw);
            rowcache_put(c, 1, next, raw);
        }
        for (uint32_t h = 0; h < hot; h++) {
            const uint8_t *got = rowcache_get(c, 0, h);
            hot_lookups++;
            if (got) {
                hot_hits++;
            } else {
                row_bytes(0, h, raw);
                rowcache_put(c, 0, h, raw);
            }
        }
    }
    /* Each stream puts Poisson(12) rows into a set on average.  LRU would
     * lose a hot row whenever 8 or more land in its set (P ~ 0.91, so ~9%
     * hits); under SRRIP a hot row outlives 14 to 21 insertions (it ages one
     * step per 7), so most survive. */
    double rate = (double)hot_hits / (double)hot_lookups;
    printf("scan resistance: hot rows hit %.1f%% after streams of 1.5x capacity\n", 100 * rate);
    CHECK(rate >= 0.5);
    rowcache_free(c);
}

int main(void)
{
    basics();
    integrity();
    scan_resistance();
    return tu_finish("test_rowcache");
}
