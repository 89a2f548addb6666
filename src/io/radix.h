/*
 * radix.h - in-place sort of a chunk's row requests without allocating.
 *
 * A request is (row << 32) | destination.  The reader needs requests for
 * the same row next to each other (each distinct row is read once) and a
 * deterministic order; it must not allocate during a batch.  An in-place
 * MSD radix sort on the row (American flag sort, 8-bit digits, insertion
 * sort for small buckets) does both with a fixed scratch the caller owns.
 */
#ifndef ENGRAM_RADIX_H
#define ENGRAM_RADIX_H

#include <stddef.h>
#include <stdint.h>

/* Four digit levels of the 32-bit row; 2 arrays of 256 positions each. */
struct radix_scratch {
    size_t next[4][256], end[4][256];
};

/* Sorts v[0..n) by v[i] >> 32 (ascending); requests of one row keep no
 * particular order among themselves, but the result is a function of the
 * input alone.  No heap memory; stack use is constant. */
void radix_sort_rows(uint64_t *v, size_t n, struct radix_scratch *s);

#endif
