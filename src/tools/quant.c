/*
 * quant.c - float rows into the e4m3_e8m0_32_row264 encoding (SPEC.md
 * section 7): per block of 32 values the smallest E8M0 exponent that brings
 * the block's max |x| to <= 448, then each value rounded to the nearest
 * E4M3FN value, ties to even.
 *
 * Integer arithmetic on the float's bits throughout: exact, and independent
 * of the FPU rounding mode.
 */
#include <errno.h>
#include <string.h>

#include "engram_tools.h"
#include "common/util.h"

#define BLOCK 32

/* |x| of a float's bits as sig * 2^(b - 23), sig in [2^23, 2^24) (float32
 * subnormals normalized too); 0 if x is zero. */
static int decompose(uint32_t bits, uint32_t *sig, int *b)
{
    uint32_t e = (bits >> 23) & 0xFF, m = bits & 0x7FFFFF;
    if (e) {
        *sig = m | 0x800000;
        *b = (int)e - 127;
        return 1;
    }
    if (!m)
        return 0;
    int lz = __builtin_clz(m) - 8;
    *sig = m << lz;
    *b = -126 - lz;
    return 1;
}

/* Exponent e (-127..127) of a block whose max |x| has the bits amax:
 * the smallest e with max |x| <= 448 * 2^e = 1.75 * 2^(8 + e). */
static int block_exponent(uint32_t amax)
{
    uint32_t sig;
    int b;
    if (!decompose(amax, &sig, &b))
        return 0;
    int e = b - 8 + (sig > 0xE00000u);
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* The E4M3 magnitude code nearest to |x| * 2^-e, ties to even; bumps *sat
 * for the one case that must saturate (see engram.h). */
static unsigned e4m3_code(uint32_t bits, int e, uint64_t *sat)
{
    uint32_t sig;
    int b;
    if (!decompose(bits, &sig, &b))
        return 0;
    int by = b - e;                           /* exponent of y = |x| 2^-e   */
    int q = by >= -6 ? by - 3 : -9;           /* exponent of y's grid step  */
    int shift = q - by + 23;                  /* >= 20: bits of sig dropped */
    if (shift >= 25)
        return 0;                             /* below half a step          */
    uint32_t n = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (n & 1)))
        n++;
    /* Subnormal steps: the code is n (n = 8 is 2^-6, code 0x08).  Normal:
     * n in [8, 16] over exponent by (n = 16 carries into the next one). */
    unsigned code = by >= -6 ? (unsigned)((by + 7) << 3) + n - 8 : n;
    /* The decoded value (8 + m) * 2^(E - 10 + e) reaches 2^128 (not a
     * float) only when E + e >= 135: saturate to the largest finite. */
    if ((int)(code >> 3) + e >= 135) {
        code = (unsigned)((134 - e) << 3) | 7;
        (*sat)++;
    }
    return code;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static int quantize_rows(const float *f32, const uint16_t *bf16, size_t n_rows, uint8_t *out,
                         uint64_t *saturated, engram_error *err)
{
    size_t total = n_rows * ENGRAM_ROW_VALUES;
    for (size_t i = 0; i < total; i++) {
        uint32_t u = f32 ? f32_bits(f32[i]) : (uint32_t)bf16[i] << 16;
        if ((u & 0x7F800000u) == 0x7F800000u) /* NaN or Inf */
            return err_set_row(err, -EDOM, i / ENGRAM_ROW_VALUES, "row %zu, value %zu: %s",
                               i / ENGRAM_ROW_VALUES, i % ENGRAM_ROW_VALUES,
                               (u & 0x007FFFFFu) ? "NaN cannot be quantized"
                                                 : "infinity cannot be quantized");
    }
    uint64_t sat = 0;
    for (size_t r = 0; r < n_rows; r++) {
        uint8_t *row = out + r * ENGRAM_ROW_BYTES;
        for (int blk = 0; blk < ENGRAM_ROW_VALUES / BLOCK; blk++) {
            uint32_t u[BLOCK], amax = 0;
            for (int j = 0; j < BLOCK; j++) {
                size_t i = r * ENGRAM_ROW_VALUES + (size_t)blk * BLOCK + (size_t)j;
                u[j] = f32 ? f32_bits(f32[i]) : (uint32_t)bf16[i] << 16;
                uint32_t a = u[j] & 0x7FFFFFFFu; /* |x|: integer order = float order */
                amax = a > amax ? a : amax;
            }
            int e = block_exponent(amax);
            row[ENGRAM_ROW_VALUES + blk] = (uint8_t)(e + 127);
            for (int j = 0; j < BLOCK; j++)
                row[blk * BLOCK + j] =
                    (uint8_t)(e4m3_code(u[j] & 0x7FFFFFFFu, e, &sat) | ((u[j] >> 24) & 0x80u));
        }
    }
    if (saturated)
        *saturated += sat;
    return 0;
}

static int check_args(const void *in, size_t n_rows, const uint8_t *out, engram_error *err)
{
    if (n_rows && (!in || !out))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "rows to quantize or output: NULL");
    if (n_rows > SIZE_MAX / ENGRAM_ROW_BYTES)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "%zu rows: the output size overflows",
                       n_rows);
    return 0;
}

int engram_rows_quantize_f32(const float *in, size_t n_rows, uint8_t *out, uint64_t *saturated,
                             engram_error *err)
{
    int rc = check_args(in, n_rows, out, err);
    return rc < 0 ? rc : quantize_rows(in, NULL, n_rows, out, saturated, err);
}

int engram_rows_quantize_bf16(const uint16_t *in, size_t n_rows, uint8_t *out,
                              uint64_t *saturated, engram_error *err)
{
    int rc = check_args(in, n_rows, out, err);
    return rc < 0 ? rc : quantize_rows(NULL, in, n_rows, out, saturated, err);
}
