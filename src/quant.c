/*
 * quant.c - float rows into the e4m3_e8m0_32_row264 encoding (SPEC.md
 * section 7): per block of 32 values the smallest E8M0 exponent that brings
 * the block's max |x| to <= 448, then each value rounded to the nearest
 * E4M3FN value, ties to even.
 *
 * All arithmetic is exact: a float (or bf16) is exact in double, scaling by
 * a power of two is exact in double's range, and the rounding is done by
 * hand on the exactly scaled value (no dependence on the FPU rounding mode).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "engram.h"

#define E4M3_MAX 448.0
#define BLOCK 32

/* |v| of an E4M3FN magnitude code (0..126). */
static double e4m3_value(unsigned code)
{
    unsigned e = code >> 3, m = code & 7;
    return e ? ldexp(8 + m, (int)e - 10) : ldexp(m, -9);
}

/* The E4M3 magnitude code nearest to y (0 <= y <= 448), ties to even. */
static unsigned e4m3_round(double y)
{
    if (y == 0)
        return 0;
    int b = ilogb(y);
    int q = b >= -6 ? b - 3 : -9;          /* spacing of the grid around y */
    double n = ldexp(y, -q), r = floor(n), f = n - r;
    if (f > 0.5 || (f == 0.5 && fmod(r, 2.0) != 0))
        r += 1;
    double v = ldexp(r, q);
    if (v == 0)
        return 0;
    int bv = ilogb(v);
    if (bv < -6)
        return (unsigned)ldexp(v, 9);      /* subnormal: m * 2^-9 */
    return (unsigned)(bv + 7) << 3 | (unsigned)(ldexp(v, 3 - bv) - 8);
}

/* Exponent e (-127..127) of a block whose max |x| is amax. */
static int block_exponent(double amax)
{
    if (amax == 0)
        return 0;
    int e = ilogb(amax) - 8;
    while (amax > ldexp(E4M3_MAX, e))
        e++;
    while (e > -127 && amax <= ldexp(E4M3_MAX, e - 1))
        e--;
    return e < -127 ? -127 : e;
}

static int quantize_rows(const float *f32, const uint16_t *bf16, size_t n_rows, uint8_t *out,
                         size_t *bad, uint64_t *saturated)
{
    size_t total = n_rows * ENGRAM_ROW_VALUES;
    for (size_t i = 0; i < total; i++) {
        float x;
        if (f32) {
            x = f32[i];
        } else {
            uint32_t u = (uint32_t)bf16[i] << 16;
            memcpy(&x, &u, 4);
        }
        if (!isfinite(x)) {
            if (bad)
                *bad = i;
            return -EDOM;
        }
    }
    uint64_t sat = 0;
    for (size_t r = 0; r < n_rows; r++) {
        uint8_t *row = out + r * ENGRAM_ROW_BYTES;
        for (int blk = 0; blk < ENGRAM_ROW_VALUES / BLOCK; blk++) {
            double x[BLOCK], amax = 0;
            for (int j = 0; j < BLOCK; j++) {
                size_t i = r * ENGRAM_ROW_VALUES + (size_t)blk * BLOCK + (size_t)j;
                if (f32) {
                    x[j] = f32[i];
                } else {
                    uint32_t u = (uint32_t)bf16[i] << 16;
                    float fx;
                    memcpy(&fx, &u, 4);
                    x[j] = fx;
                }
                amax = fabs(x[j]) > amax ? fabs(x[j]) : amax;
            }
            int e = block_exponent(amax);
            row[ENGRAM_ROW_VALUES + blk] = (uint8_t)(e + 127);
            for (int j = 0; j < BLOCK; j++) {
                unsigned c = e4m3_round(ldexp(fabs(x[j]), -e));
                /* The one case that must saturate: a value within half a
                 * step of FLT_MAX rounds to 2^128, which a float cannot
                 * hold; it takes the largest finite code instead. */
                while (c > 0 && ldexp(e4m3_value(c), e) > (double)FLT_MAX) {
                    c--;
                    sat++;
                }
                row[blk * BLOCK + j] = (uint8_t)(c | (signbit(x[j]) ? 0x80u : 0));
            }
        }
    }
    if (saturated)
        *saturated += sat;
    return 0;
}

int engram_rows_quantize_f32(const float *in, size_t n_rows, uint8_t *out, size_t *bad,
                             uint64_t *saturated)
{
    if ((n_rows && (!in || !out)) || n_rows > SIZE_MAX / ENGRAM_ROW_BYTES)
        return -EINVAL;
    return quantize_rows(in, NULL, n_rows, out, bad, saturated);
}

int engram_rows_quantize_bf16(const uint16_t *in, size_t n_rows, uint8_t *out, size_t *bad,
                              uint64_t *saturated)
{
    if ((n_rows && (!in || !out)) || n_rows > SIZE_MAX / ENGRAM_ROW_BYTES)
        return -EINVAL;
    return quantize_rows(NULL, in, n_rows, out, bad, saturated);
}
