/* radix.c - in-place MSD radix sort of row requests (see radix.h). */
#include "radix.h"

#define SMALL 32

static void insertion_sort(uint64_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        size_t j = i;
        while (j > 0 && (v[j - 1] >> 32) > (x >> 32)) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static void sort_level(uint64_t *v, size_t n, int level, struct radix_scratch *s)
{
    if (n <= SMALL) {
        insertion_sort(v, n);
        return;
    }
    unsigned shift = 32u + 8u * (unsigned)(3 - level);
    size_t *next = s->next[level], *end = s->end[level];
    size_t count[256] = {0};
    for (size_t i = 0; i < n; i++)
        count[(v[i] >> shift) & 255]++;
    size_t at = 0;
    for (int b = 0; b < 256; b++) {
        next[b] = at;
        at += count[b];
        end[b] = at;
    }
    /* Cycle each element into its bucket (American flag sort). */
    for (int b = 0; b < 256; b++) {
        while (next[b] < end[b]) {
            uint64_t x = v[next[b]];
            unsigned d = (unsigned)(x >> shift) & 255;
            while (d != (unsigned)b) {
                uint64_t y = v[next[d]];
                v[next[d]++] = x;
                x = y;
                d = (unsigned)(x >> shift) & 255;
            }
            v[next[b]++] = x;
        }
    }
    if (level == 3)
        return;
    /* Buckets are [end[b] - count, end[b]); next[b] == end[b] now. */
    size_t lo = 0;
    for (int b = 0; b < 256; b++) {
        size_t hi = end[b];
        if (hi - lo > 1)
            sort_level(v + lo, hi - lo, level + 1, s);
        lo = hi;
    }
}

void radix_sort_rows(uint64_t *v, size_t n, struct radix_scratch *s)
{
    if (n < 2)
        return;
    /* Skip leading digits every row shares (rows of a 384M-row table fit in
     * 29 bits: the top digit is mostly 0). */
    uint64_t or_ = 0, and_ = ~0ull;
    for (size_t i = 0; i < n; i++) {
        or_ |= v[i];
        and_ &= v[i];
    }
    uint32_t differ = (uint32_t)((or_ ^ and_) >> 32);
    if (differ == 0)
        return;
    int level = 0;
    while (level < 3 && ((differ >> (8 * (3 - level))) & 255) == 0)
        level++;
    sort_level(v, n, level, s);
}
