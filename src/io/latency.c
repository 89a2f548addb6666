/* latency.c - the log-linear latency histogram (see latency.h). */
#include "latency.h"

static unsigned bucket_of(uint64_t v)
{
    if (v < LATENCY_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)(v >> (e - 4)) & (LATENCY_SUB - 1);
    unsigned idx = (e - 3) * LATENCY_SUB + sub;
    return idx < LATENCY_BUCKETS ? idx : LATENCY_BUCKETS - 1;
}

static uint64_t bucket_value(unsigned idx)
{
    if (idx < LATENCY_SUB)
        return idx;
    unsigned e = idx / LATENCY_SUB + 3, sub = idx % LATENCY_SUB;
    return ((uint64_t)(LATENCY_SUB + sub)) << (e - 4);
}

void latency_add(struct latency_hist *h, uint64_t v)
{
    h->n[bucket_of(v)]++;
}

uint64_t latency_quantile(const struct latency_hist *h, uint64_t total, double q)
{
    if (total == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)total), seen = 0;
    if (want >= total)
        want = total - 1;
    for (unsigned i = 0; i < LATENCY_BUCKETS; i++) {
        seen += h->n[i];
        if (seen > want)
            return bucket_value(i);
    }
    return bucket_value(LATENCY_BUCKETS - 1);
}
