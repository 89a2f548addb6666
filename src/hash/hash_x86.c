/*
 * hash_x86.c - AVX-512 form of the per-order reduction: the 8 heads of one
 * n-gram order share the hash value and differ only in their prime, so one
 * 8-lane vector computes all 8 row ids (two 4-lane vectors with AVX2).  Same Barrett step as engram_reduce
 * (hash.h): q = mulhi64(h, recip) built from 32-bit products, r = h - q*p,
 * one conditional subtraction (as an unsigned min).
 */
#include "hash.h"
#include "common/cpu.h"

#if ENGRAM_X86_KERNELS
#include <immintrin.h>

#define TGT __attribute__((target("avx512f")))

TGT static inline __m256i reduce8(uint64_t h, __m512i r_lo, __m512i r_hi, __m512i p,
                                  __m512i off)
{
    const __m512i lo32 = _mm512_set1_epi64(0xffffffff);
    __m512i hv = _mm512_set1_epi64((long long)h);
    __m512i h_lo = hv, h_hi = _mm512_srli_epi64(hv, 32); /* mul_epu32 reads the low halves */
    __m512i p0 = _mm512_mul_epu32(h_lo, r_lo);
    __m512i p1 = _mm512_mul_epu32(h_lo, r_hi);
    __m512i p2 = _mm512_mul_epu32(h_hi, r_lo);
    __m512i p3 = _mm512_mul_epu32(h_hi, r_hi);
    __m512i mid = _mm512_add_epi64(p1, _mm512_srli_epi64(p0, 32));
    __m512i mid2 = _mm512_add_epi64(p2, _mm512_and_si512(mid, lo32));
    __m512i q = _mm512_add_epi64(_mm512_add_epi64(p3, _mm512_srli_epi64(mid, 32)),
                                 _mm512_srli_epi64(mid2, 32));
    /* q * p mod 2^64, p < 2^32. */
    __m512i qp = _mm512_add_epi64(_mm512_mul_epu32(q, p),
                                  _mm512_slli_epi64(_mm512_mul_epu32(_mm512_srli_epi64(q, 32), p), 32));
    __m512i r = _mm512_sub_epi64(hv, qp);
    r = _mm512_min_epu64(r, _mm512_sub_epi64(r, p));
    return _mm512_cvtepi64_epi32(_mm512_add_epi64(r, off));
}

TGT void hash_ngram_avx512(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                           uint32_t *out)
{
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const uint64_t *m = h->layout.multipliers[t];
        uint64_t x = ids[0] * m[0];
        for (int j = 1; j < ENGRAM_NGRAM; j++) {
            x ^= ids[j] * m[j];
            int c0 = (j - 1) * ENGRAM_HEADS;
            __m512i rc = _mm512_loadu_si512((const void *)&h->recip[t][c0]);
            __m512i p = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)&h->layout.primes[t][c0]));
            __m512i off = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)&h->offset[t][c0]));
            __m256i rows = reduce8(x, rc, _mm512_srli_epi64(rc, 32), p, off);
            _mm256_storeu_si256((__m256i *)(out + t * ENGRAM_COLUMNS + c0), rows);
        }
    }
}

int hash_avx512_built(void) { return 1; }

/* AVX2: the same step on 4 lanes, two vectors per order.  r < 2p < 2^33, so
 * the signed 64-bit compare is exact for the correction. */
#define TGT2 __attribute__((target("avx2")))

TGT2 static inline __m128i reduce4(__m256i hv, __m256i h_hi, __m256i r_lo, __m256i r_hi,
                                   __m256i p, __m256i off)
{
    const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
    __m256i p0 = _mm256_mul_epu32(hv, r_lo);
    __m256i p1 = _mm256_mul_epu32(hv, r_hi);
    __m256i p2 = _mm256_mul_epu32(h_hi, r_lo);
    __m256i p3 = _mm256_mul_epu32(h_hi, r_hi);
    __m256i mid = _mm256_add_epi64(p1, _mm256_srli_epi64(p0, 32));
    __m256i mid2 = _mm256_add_epi64(p2, _mm256_and_si256(mid, lo32));
    __m256i q = _mm256_add_epi64(_mm256_add_epi64(p3, _mm256_srli_epi64(mid, 32)),
                                 _mm256_srli_epi64(mid2, 32));
    __m256i qp = _mm256_add_epi64(_mm256_mul_epu32(q, p),
                                  _mm256_slli_epi64(_mm256_mul_epu32(_mm256_srli_epi64(q, 32), p), 32));
    __m256i r = _mm256_sub_epi64(hv, qp);
    __m256i lt = _mm256_cmpgt_epi64(p, r); /* r < p: keep r */
    r = _mm256_sub_epi64(r, _mm256_andnot_si256(lt, p));
    r = _mm256_add_epi64(r, off);
    /* Take the low 32 bits of each lane. */
    __m256i packed = _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    return _mm256_castsi256_si128(packed);
}

TGT2 void hash_ngram_avx2(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                          uint32_t *out)
{
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const uint64_t *m = h->layout.multipliers[t];
        uint64_t x = ids[0] * m[0];
        for (int j = 1; j < ENGRAM_NGRAM; j++) {
            x ^= ids[j] * m[j];
            __m256i hv = _mm256_set1_epi64x((long long)x);
            __m256i h_hi = _mm256_srli_epi64(hv, 32);
            for (int half = 0; half < 2; half++) {
                int c0 = (j - 1) * ENGRAM_HEADS + 4 * half;
                __m256i rc = _mm256_loadu_si256((const __m256i *)&h->recip[t][c0]);
                __m256i p = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i *)&h->layout.primes[t][c0]));
                __m256i off = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i *)&h->offset[t][c0]));
                __m128i rows = reduce4(hv, h_hi, rc, _mm256_srli_epi64(rc, 32), p, off);
                _mm_storeu_si128((__m128i *)(out + t * ENGRAM_COLUMNS + c0), rows);
            }
        }
    }
}

#else
void hash_ngram_avx512(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                       uint32_t *out)
{
    (void)h; (void)ids; (void)out;
}
void hash_ngram_avx2(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                     uint32_t *out)
{
    (void)h; (void)ids; (void)out;
}
int hash_avx512_built(void) { return 0; }
#endif
