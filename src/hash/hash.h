/* hash.h - internals of the multiply-xor n-gram hash (SPEC.md section 6). */
#ifndef ENGRAM_HASH_H
#define ENGRAM_HASH_H

#include <stdint.h>

#include "engram.h"

struct engram_hasher;
typedef void (*hash_ngram_fn)(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                              uint32_t *out);

struct engram_hasher {
    hash_ngram_fn ngram;          /* chosen at creation (ENGRAM_SIMD)       */
    engram_layout layout;         /* token_map points at map below          */
    uint32_t *map;                /* owned copy of the token map            */
    /* Barrett reciprocals floor((2^64 - 1) / p) per column.                */
    uint64_t recip[ENGRAM_TABLES][ENGRAM_COLUMNS];
    uint32_t offset[ENGRAM_TABLES][ENGRAM_COLUMNS]; /* running sums of primes */
};

/*
 * h mod p for every 64-bit h, without a division.  With r = floor((2^64-1)/p)
 * we have r >= 2^64/p - 1, so q = floor(h*r / 2^64) > h/p - h/2^64 - 1 and
 * q <= h/p: q is floor(h/p) or one less, and one conditional subtraction
 * finishes the job.  tests/test_hash.c checks the claim at the edges of
 * every quotient step and against 128-bit division.
 */
static inline uint32_t engram_reduce(uint64_t h, uint64_t recip, uint32_t p)
{
    __extension__ typedef unsigned __int128 u128;
    uint64_t q = (uint64_t)(((u128)h * recip) >> 64);
    uint64_t r = h - q * p;
    return (uint32_t)(r >= p ? r - p : r);
}

static inline uint64_t engram_recip(uint32_t p)
{
    return UINT64_MAX / p;
}

/* Row ids of one n-gram: ids = [current, history...] with pad already
 * substituted; writes 48 row ids. */
void hash_ngram_scalar(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                       uint32_t *out);
void hash_ngram_avx512(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                       uint32_t *out);
void hash_ngram_avx2(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                     uint32_t *out);
int hash_avx512_built(void); /* 1 where the x86 kernels (AVX2, AVX-512) are built */

/* engram_hash_tokens with an explicit implementation (tests, benchmarks):
 * ENGRAM_SIMD_SCALAR, _AVX2 or _AVX512 (-EINVAL where unsupported). */
int hash_tokens_with(const engram_hasher *h, engram_simd s, engram_history *hist,
                     const uint32_t *tokens, const uint8_t *mask, size_t n, uint32_t *rows,
                     engram_error *err);

#endif
