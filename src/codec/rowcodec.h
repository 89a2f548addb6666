/* rowcodec.h - E4M3FN x E8M0 row decoding (SPEC.md section 7), internals. */
#ifndef ENGRAM_ROWCODEC_H
#define ENGRAM_ROWCODEC_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ROW_BLOCK 32   /* values per E8M0 scale */

/* Scales in [FAST_SCALE_MIN, FAST_SCALE_MAX] cannot produce a subnormal
 * (smallest magnitude 2^-9 * 2^(s-127) >= 2^-126 iff s >= 10) nor an
 * overflow (largest 448 < 2^9, 2^8.8 * 2^(s-127) < 2^128 iff s <= 246):
 * rows whose scales all lie there and that hold no NaN code decode with
 * plain exponent arithmetic, no rounding.  Other rows take the scalar path. */
#define FAST_SCALE_MIN 10
#define FAST_SCALE_MAX 246

static inline int row_scales_fast(const uint8_t *row)
{
    int ok = 1;
    for (int b = 0; b < ENGRAM_ROW_VALUES / ROW_BLOCK; b++) {
        unsigned s = row[ENGRAM_ROW_VALUES + b];
        ok &= (s >= FAST_SCALE_MIN) & (s <= FAST_SCALE_MAX);
    }
    return ok;
}

/* One implementation of the row kernels. */
struct row_kernels {
    /* 1 if the row has no NaN code and all scales are in the fast range. */
    int (*fast_ok)(const uint8_t *row);
    /* Decode a fast_ok row. */
    void (*bf16)(const uint8_t *row, uint16_t *out);
    void (*f32)(const uint8_t *row, float *out);
};

extern const struct row_kernels row_kernels_scalar;
/* NULL members when the build has no such kernels. */
extern const struct row_kernels row_kernels_avx2;
extern const struct row_kernels row_kernels_avx512;

/* Scalar reference for one value; the row must pass row_check_reason. */
uint16_t row_decode_value(uint8_t code, uint8_t scale);

/* The per-row check of the hot paths (the reader's and the pool's
 * deliveries, engram_model_read_*'s message): 0 if the raw row decodes, else
 * -EDOM with *why (if not NULL) one of the short static reasons "NaN code
 * (E4M3 0x7F/0xFF)", "NaN scale (E8M0 0xFF)", "value overflows float32
 * (non-finite)".  Formats nothing; engram_row_check wraps it for the public
 * engram_error. */
int row_check_reason(const uint8_t *raw, const char **why);

/* Bytes of one row as delivered: ENGRAM_F32 and ENGRAM_BF16 decoded (256
 * values), ENGRAM_RAW as stored (264 bytes). */
static inline size_t row_out_bytes(int dtype)
{
    return dtype == ENGRAM_F32    ? ENGRAM_ROW_VALUES * 4
           : dtype == ENGRAM_BF16 ? ENGRAM_ROW_VALUES * 2
                                  : ENGRAM_ROW_BYTES;
}

/* BF16 rows (the PLE member's, stored little-endian): n values copied as
 * BF16 bit patterns, or widened exactly to F32 (out may be unaligned). */
void rows_bf16_copy(const uint8_t *raw, size_t n, uint16_t *out);
void rows_bf16_widen(const uint8_t *raw, size_t n, float *out);

/* The same for any member of the family: row_values decoded values (F32,
 * BF16), row_bytes as stored (RAW).  V4.1: 1024, 512, 264; PLE: 640, 320,
 * 320. */
static inline size_t family_row_out_bytes(const engram_family *f, int dtype)
{
    return dtype == ENGRAM_F32    ? (size_t)f->row_values * 4
           : dtype == ENGRAM_BF16 ? (size_t)f->row_values * 2
                                  : (size_t)f->row_bytes;
}

#endif
