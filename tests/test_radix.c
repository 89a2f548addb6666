/*
 * test_radix.c - the reader's allocation-free request sort against qsort on
 * the row key: random, all-equal, sorted, reversed, one shared high digit,
 * rows at 2^32 - 1, every length 0..300 and chunk-sized inputs.  Checks that
 * the output is a permutation of the input (same multiset) and is ordered.
 */
#include "testutil.h"
#include "../src/io/radix.h"

static int cmp_full(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void check_one(const uint64_t *in, size_t n, struct radix_scratch *s)
{
    if (n == 0) {
        radix_sort_rows(NULL, 0, s);
        return;
    }
    uint64_t *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    memcpy(a, in, n * sizeof *a);
    a[n] = 0xfeedfacecafebeefull; /* canary */
    radix_sort_rows(a, n, s);
    CHECK_EQ(a[n], 0xfeedfacecafebeefull);
    int ordered = 1;
    for (size_t i = 1; i < n; i++)
        ordered &= (a[i - 1] >> 32) <= (a[i] >> 32);
    CHECK(ordered);
    /* Same multiset: compare fully sorted copies. */
    memcpy(b, in, n * sizeof *b);
    qsort(a, n, sizeof *a, cmp_full);
    qsort(b, n, sizeof *b, cmp_full);
    CHECK(n == 0 || memcmp(a, b, n * sizeof *a) == 0);
    free(a);
    free(b);
}

int main(void)
{
    static struct radix_scratch s;
    uint64_t seed = 1;
    const size_t big = ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS;
    uint64_t *v = calloc(big, sizeof *v);
    for (size_t n = 0; n <= 300; n++) {
        for (size_t i = 0; i < n; i++)
            v[i] = (tu_rand(&seed) % (n / 3 + 1)) << 32 | i;
        check_one(v, n, &s);
    }
    uint32_t ranges[] = {2, 300, 70000, 384006168u, 0xffffffffu};
    for (int k = 0; k < 5; k++) {
        for (size_t i = 0; i < big; i++)
            v[i] = (tu_rand(&seed) % ranges[k]) << 32 | i;
        check_one(v, big, &s);
        if (ranges[k] == 0xffffffffu) { /* the top of the range */
            for (size_t i = 0; i < big; i += 7)
                v[i] = 0xffffffffull << 32 | i;
            check_one(v, big, &s);
        }
    }
    for (size_t i = 0; i < big; i++) /* all equal */
        v[i] = 12345ull << 32 | (big - i);
    check_one(v, big, &s);
    for (size_t i = 0; i < big; i++) /* sorted, reversed */
        v[i] = (uint64_t)i << 32 | i;
    check_one(v, big, &s);
    for (size_t i = 0; i < big; i++)
        v[i] = (uint64_t)(big - i) << 32 | i;
    check_one(v, big, &s);
    for (size_t i = 0; i < big; i++) /* one shared high digit, varied low ones */
        v[i] = (0x5a000000ull | (tu_rand(&seed) & 0xff)) << 32 | i;
    check_one(v, big, &s);
    free(v);
    return tu_finish("test_radix");
}
