/*
 * rowcodec_x86.c - AVX2 and AVX-512 row kernels, compiled with target
 * attributes so the binary runs on any x86-64 and picks them at run time.
 *
 * They only see rows that passed fast_ok (no NaN code, every scale in
 * [FAST_SCALE_MIN, FAST_SCALE_MAX]), where every decoded value is a normal
 * float32 with at most 3 fraction bits: its bf16 is exactly its top 16 bits
 * and the scale is an integer add to the exponent field.
 */
#include <string.h>

#include "rowcodec.h"
#include "common/cpu.h"

#if ENGRAM_X86_KERNELS
#include <immintrin.h>

#define TGT_AVX2 __attribute__((target("avx2")))
#define TGT_AVX512 __attribute__((target("avx512f,avx512bw")))

/* ------------------------------------------------------------ AVX2 */

TGT_AVX2 static int avx2_fast_ok(const uint8_t *row)
{
    if (!row_scales_fast(row))
        return 0;
    const __m256i m7f = _mm256_set1_epi8(0x7f);
    __m256i nan = _mm256_setzero_si256();
    for (int i = 0; i < ENGRAM_ROW_VALUES; i += 32) {
        __m256i c = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + i)), m7f);
        nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(c, m7f));
    }
    return _mm256_testz_si256(nan, nan);
}

/* 8 codes -> 8 float32 bit patterns, scale adjustment adj = (s-127) << 23. */
TGT_AVX2 static inline __m256i avx2_decode8(const uint8_t *codes, __m256i adj)
{
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes));
    __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    /* e > 0: (mag << 20) puts e and m in place; the bias moves by 127 - 7. */
    __m256i norm = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    /* e == 0: m * 2^-9, from the exact int -> float conversion of m. */
    __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(mag)),
                                   _mm256_set1_epi32(9 << 23));
    __m256i is_norm = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(7));
    __m256i b = _mm256_add_epi32(_mm256_blendv_epi8(sub, norm, is_norm), adj);
    __m256i zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
    return _mm256_or_si256(_mm256_andnot_si256(zero, b), sign);
}

TGT_AVX2 static void avx2_f32(const uint8_t *row, float *out)
{
    for (int blk = 0; blk < ENGRAM_ROW_VALUES / ROW_BLOCK; blk++) {
        __m256i adj = _mm256_set1_epi32(((int)row[ENGRAM_ROW_VALUES + blk] - 127) * (1 << 23));
        for (int i = 0; i < ROW_BLOCK; i += 8) {
            int at = blk * ROW_BLOCK + i;
            _mm256_storeu_si256((__m256i *)(out + at), avx2_decode8(row + at, adj));
        }
    }
}

TGT_AVX2 static void avx2_bf16(const uint8_t *row, uint16_t *out)
{
    for (int blk = 0; blk < ENGRAM_ROW_VALUES / ROW_BLOCK; blk++) {
        __m256i adj = _mm256_set1_epi32(((int)row[ENGRAM_ROW_VALUES + blk] - 127) * (1 << 23));
        for (int i = 0; i < ROW_BLOCK; i += 16) {
            int at = blk * ROW_BLOCK + i;
            __m256i lo = _mm256_srli_epi32(avx2_decode8(row + at, adj), 16);
            __m256i hi = _mm256_srli_epi32(avx2_decode8(row + at + 8, adj), 16);
            /* packus works per 128-bit lane; fix the order afterwards. */
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
            _mm256_storeu_si256((__m256i *)(out + at), p);
        }
    }
}

const struct row_kernels row_kernels_avx2 = {avx2_fast_ok, avx2_bf16, avx2_f32};

/* ------------------------------------------------------------ AVX-512 */

TGT_AVX512 static int avx512_fast_ok(const uint8_t *row)
{
    if (!row_scales_fast(row))
        return 0;
    const __m512i m7f = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (int i = 0; i < ENGRAM_ROW_VALUES; i += 64) {
        __m512i c = _mm512_loadu_si512((const void *)(row + i));
        nan |= _mm512_cmpeq_epi8_mask(_mm512_and_si512(c, m7f), m7f);
    }
    return nan == 0;
}

/* 32 codes (one scale block) -> 32 bf16 values in 16-bit lanes. */
TGT_AVX512 static inline __m512i avx512_decode32(const uint8_t *codes, int scale)
{
    /* bf16 of the E4M3 subnormals m * 2^-9, m = 0..7 (index = m). */
    const __m512i sub_tab = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        (120 << 7) | 0x60, (120 << 7) | 0x40, (120 << 7) | 0x20, 120 << 7,
        (119 << 7) | 0x40, 119 << 7, 118 << 7, 0);
    __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)codes));
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi16(0x7f));
    __m512i sign = _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x80)), 8);
    __m512i norm = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    __mmask32 is_norm = _mm512_cmpgt_epu16_mask(mag, _mm512_set1_epi16(7));
    __m512i v = _mm512_mask_blend_epi16(is_norm, _mm512_permutexvar_epi16(mag, sub_tab), norm);
    __mmask32 nonzero = _mm512_test_epi16_mask(mag, mag);
    v = _mm512_maskz_add_epi16(nonzero, v, _mm512_set1_epi16((short)((scale - 127) * (1 << 7))));
    return _mm512_or_si512(v, sign);
}

TGT_AVX512 static void avx512_bf16(const uint8_t *row, uint16_t *out)
{
    for (int blk = 0; blk < ENGRAM_ROW_VALUES / ROW_BLOCK; blk++)
        _mm512_storeu_si512((void *)(out + blk * ROW_BLOCK),
                            avx512_decode32(row + blk * ROW_BLOCK, row[ENGRAM_ROW_VALUES + blk]));
}

TGT_AVX512 static void avx512_f32(const uint8_t *row, float *out)
{
    for (int blk = 0; blk < ENGRAM_ROW_VALUES / ROW_BLOCK; blk++) {
        __m512i v = avx512_decode32(row + blk * ROW_BLOCK, row[ENGRAM_ROW_VALUES + blk]);
        __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16);
        __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16);
        _mm512_storeu_si512((void *)(out + blk * ROW_BLOCK), lo);
        _mm512_storeu_si512((void *)(out + blk * ROW_BLOCK + 16), hi);
    }
}

const struct row_kernels row_kernels_avx512 = {avx512_fast_ok, avx512_bf16, avx512_f32};

#else

const struct row_kernels row_kernels_avx2 = {0, 0, 0};
const struct row_kernels row_kernels_avx512 = {0, 0, 0};

#endif
