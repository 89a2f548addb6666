/*
 * tiles_x86.h - the register tiles of the x86 projection kernels, shared by
 * V4.1's (kernels_x86.c) and the PLE member's (ple_kernels_x86.c): mr rows
 * (tokens) of 64 (AVX-512: 4 x 16) or 16 (AVX2: 2 x 8) outputs, kept in
 * named accumulators (not an array) so that every compiler keeps them in
 * registers.  Each macro takes the row r; the including kernel defines mr
 * (a constant per instance, so unused rows compile away), a[] (the rows'
 * inputs), c and ld (outputs and their row stride), first (start from 0
 * rather than c), m0..m3 (the column masks), w0..w3 (the weights of input
 * i) and i.  Included inside ENGRAM_X86_KERNELS after <immintrin.h>.
 */
#ifndef ENGRAM_TILES_X86_H
#define ENGRAM_TILES_X86_H

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

#define R512_DECL(r) __m512 c##r##0, c##r##1, c##r##2, c##r##3; const float *a##r = mr > r ? a[r] : a[0];
#define R512_INIT(r)                                                                    \
    if (mr > r) {                                                                       \
        c##r##0 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, c + r * ld);      \
        c##r##1 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, c + r * ld + 16); \
        c##r##2 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m2, c + r * ld + 32); \
        c##r##3 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m3, c + r * ld + 48); \
    } else {                                                                            \
        c##r##0 = c##r##1 = c##r##2 = c##r##3 = _mm512_setzero_ps();                    \
    }
#define R512_STEP(r)                                                                    \
    if (mr > r) {                                                                       \
        __m512 x = _mm512_set1_ps(a##r[i]);                                             \
        c##r##0 = _mm512_fmadd_ps(x, w0, c##r##0);                                      \
        c##r##1 = _mm512_fmadd_ps(x, w1, c##r##1);                                      \
        c##r##2 = _mm512_fmadd_ps(x, w2, c##r##2);                                      \
        c##r##3 = _mm512_fmadd_ps(x, w3, c##r##3);                                      \
    }
#define R512_STORE(r)                                                                   \
    if (mr > r) {                                                                       \
        _mm512_mask_storeu_ps(c + r * ld, m0, c##r##0);                                 \
        _mm512_mask_storeu_ps(c + r * ld + 16, m1, c##r##1);                            \
        _mm512_mask_storeu_ps(c + r * ld + 32, m2, c##r##2);                            \
        _mm512_mask_storeu_ps(c + r * ld + 48, m3, c##r##3);                            \
    }
#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)

#define R256_DECL(r) __m256 c##r##0, c##r##1; const float *a##r = mr > r ? a[r] : a[0];
#define R256_INIT(r)                                                                    \
    if (mr > r) {                                                                       \
        c##r##0 = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + r * ld, m0);        \
        c##r##1 = first ? _mm256_setzero_ps() : _mm256_maskload_ps(c + r * ld + 8, m1);    \
    } else {                                                                            \
        c##r##0 = c##r##1 = _mm256_setzero_ps();                                        \
    }
#define R256_STEP(r)                                                                    \
    if (mr > r) {                                                                       \
        __m256 x = _mm256_broadcast_ss(a##r + i);                                       \
        c##r##0 = _mm256_fmadd_ps(x, w0, c##r##0);                                      \
        c##r##1 = _mm256_fmadd_ps(x, w1, c##r##1);                                      \
    }
#define R256_STORE(r)                                                                   \
    if (mr > r) {                                                                       \
        _mm256_maskstore_ps(c + r * ld, m0, c##r##0);                                   \
        _mm256_maskstore_ps(c + r * ld + 8, m1, c##r##1);                               \
    }

#endif
