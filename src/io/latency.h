/*
 * latency.h - a log-linear latency histogram (16 sub-buckets per power of
 * two, ~6% resolution) for the reader's decode-step times: fixed size, no
 * allocation, quantiles read back from the counts.
 */
#ifndef ENGRAM_LATENCY_H
#define ENGRAM_LATENCY_H

#include <stdint.h>

#define LATENCY_SUB 16
#define LATENCY_BUCKETS (64 * LATENCY_SUB)

struct latency_hist {
    uint32_t n[LATENCY_BUCKETS];
};

void latency_add(struct latency_hist *h, uint64_t v);
/* The value at quantile q (0..1) of `total` samples (0 when there are none). */
uint64_t latency_quantile(const struct latency_hist *h, uint64_t total, double q);

#endif
