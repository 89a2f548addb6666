/*
 * rowcodec.c - scalar reference decoder, row validation and the run-time
 * choice of SIMD kernels.
 *
 * The scalar path builds the float32 bit pattern with integer arithmetic so
 * the result cannot depend on the caller's floating-point environment
 * (FTZ/DAZ set by an engine would otherwise flush the subnormal values that
 * small scales produce).  Compiled without fast-math, like the whole library.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rowcodec.h"
#include "common/cpu.h"
#include "common/util.h"

static inline uint16_t bf16_rne(uint32_t f32_bits)
{
    return (uint16_t)((f32_bits + 0x7fffu + ((f32_bits >> 16) & 1u)) >> 16);
}

uint16_t row_decode_value(uint8_t code, uint8_t scale)
{
    uint32_t sign = (uint32_t)(code & 0x80) << 24;
    uint32_t mag = code & 0x7fu;
    if (mag == 0)
        return (uint16_t)(sign >> 16);
    uint32_t e = mag >> 3, m = mag & 7u;
    uint32_t M = e ? 8 + m : m;                        /* value = M * 2^E  */
    int E = (e ? (int)e - 10 : -9) + (int)scale - 127;
    int L = 32 - __builtin_clz(M);                     /* bits in M, 1..4  */
    int exp = E + L - 1;                               /* value in [2^exp, 2^(exp+1)) */
    uint32_t bits;
    if (exp >= -126)
        bits = (uint32_t)(exp + 127) << 23 | ((M << (24 - L)) & 0x7fffffu);
    else
        bits = M << (E + 149);                         /* exact f32 subnormal */
    return bf16_rne(bits | sign);
}

/* The first fault of a row in memory order of its blocks: *why and *at (a
 * value 0..255 whose code is NaN or overflows, or 256 + b for the NaN scale
 * byte of block b).  Both written only on failure. */
static inline int row_fault(const uint8_t *raw, const char **why, unsigned *at)
{
    for (int b = 0; b < ENGRAM_ROW_VALUES / ROW_BLOCK; b++) {
        uint8_t s = raw[ENGRAM_ROW_VALUES + b];
        if (s == 255) {
            *why = "NaN scale (E8M0 0xFF)";
            *at = ENGRAM_ROW_VALUES + (unsigned)b;
            return -EDOM;
        }
        for (int i = 0; i < ROW_BLOCK; i++) {
            uint8_t mag = raw[b * ROW_BLOCK + i] & 0x7f;
            if (mag == 0x7f) {
                *why = "NaN code (E4M3 0x7F/0xFF)";
                *at = (unsigned)(b * ROW_BLOCK + i);
                return -EDOM;
            }
            /* |v| < 2^(e-6) for e > 0: the product overflows float32 iff
             * e - 7 + s - 127 >= 128. */
            if ((mag >> 3) + s >= 262) {
                *why = "value overflows float32 (non-finite)";
                *at = (unsigned)(b * ROW_BLOCK + i);
                return -EDOM;
            }
        }
    }
    return 0;
}

int row_check_reason(const uint8_t *raw, const char **why)
{
    const char *w;
    unsigned at;
    int rc = row_fault(raw, &w, &at);
    if (rc < 0 && why)
        *why = w;
    return rc;
}

/* Row `index` of a call does not decode: the public error (cold: the
 * checks themselves never format). */
__attribute__((cold, noinline)) static int row_error(engram_error *err, const uint8_t *row,
                                                     size_t index)
{
    if (!err)
        return -EDOM;
    const char *why = "invalid";
    unsigned at = 0;
    row_fault(row, &why, &at);
    if (at >= ENGRAM_ROW_VALUES)
        return err_set_row(err, -EDOM, index, "row %zu, scale %u: %s", index,
                           at - ENGRAM_ROW_VALUES, why);
    return err_set_row(err, -EDOM, index, "row %zu, value %u: %s", index, at, why);
}

int engram_row_check(const uint8_t raw[ENGRAM_ROW_BYTES], engram_error *err)
{
    if (!raw)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "row to check: NULL");
    if (row_check_reason(raw, NULL) < 0)
        return row_error(err, raw, 0);
    return 0;
}

/* ------------------------------------------------------------ scalar */

static int scalar_fast_ok(const uint8_t *row)
{
    (void)row;
    return 0; /* the scalar kernel handles every row through the reference */
}

static void scalar_bf16(const uint8_t *row, uint16_t *out)
{
    for (int i = 0; i < ENGRAM_ROW_VALUES; i++)
        out[i] = row_decode_value(row[i], row[ENGRAM_ROW_VALUES + i / ROW_BLOCK]);
}

static void scalar_f32(const uint8_t *row, float *out)
{
    for (int i = 0; i < ENGRAM_ROW_VALUES; i++) {
        uint32_t bits = (uint32_t)row_decode_value(row[i], row[ENGRAM_ROW_VALUES + i / ROW_BLOCK])
                        << 16;
        memcpy(&out[i], &bits, 4);
    }
}

const struct row_kernels row_kernels_scalar = {scalar_fast_ok, scalar_bf16, scalar_f32};

/* ------------------------------------------------------------ dispatch */

static const struct row_kernels *kernels_for(engram_simd s)
{
    switch (s) {
    case ENGRAM_SIMD_SCALAR: return &row_kernels_scalar;
    case ENGRAM_SIMD_AVX2: return row_kernels_avx2.bf16 ? &row_kernels_avx2 : NULL;
    case ENGRAM_SIMD_AVX512: return row_kernels_avx512.bf16 ? &row_kernels_avx512 : NULL;
    default: return NULL;
    }
}

static const struct row_kernels *resolve(engram_simd s)
{
    if (s == ENGRAM_SIMD_AUTO)
        s = engram_simd_selected();
    else if (!engram_simd_supported(s))
        return NULL;
    return kernels_for(s);
}

/* Every row is checked before anything is written (validate, then mutate). */
static int check_rows(const struct row_kernels *k, const uint8_t *raw, size_t n, engram_error *err)
{
    for (size_t r = 0; r < n; r++) {
        const uint8_t *row = raw + r * ENGRAM_ROW_BYTES;
        if (!k->fast_ok(row) && row_check_reason(row, NULL) < 0)
            return row_error(err, row, r);
    }
    return 0;
}

int engram_rows_check(const uint8_t *raw, size_t n, engram_error *err)
{
    if (n > 0 && !raw)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "rows to check: NULL");
    return check_rows(resolve(ENGRAM_SIMD_AUTO), raw, n, err);
}

/* Both output formats: check every row first, then decode each with the
 * chosen kernels where their fast path applies, else with the reference. */
static int decode_rows(engram_simd s, const uint8_t *raw, size_t n, void *out, int f32,
                       engram_error *err)
{
    const struct row_kernels *k = resolve(s);
    if (!k)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "row kernels '%s' not supported here",
                       engram_simd_name(s));
    if (n > 0 && (!raw || !out))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "rows to decode or output: NULL");
    int rc = check_rows(k, raw, n, err);
    if (rc < 0)
        return rc;
    for (size_t r = 0; r < n; r++) {
        const uint8_t *row = raw + r * ENGRAM_ROW_BYTES;
        const struct row_kernels *use = k->fast_ok(row) ? k : &row_kernels_scalar;
        if (f32)
            use->f32(row, (float *)out + r * ENGRAM_ROW_VALUES);
        else
            use->bf16(row, (uint16_t *)out + r * ENGRAM_ROW_VALUES);
    }
    return 0;
}

int engram_rows_decode_bf16(engram_simd s, const uint8_t *raw, size_t n, uint16_t *out,
                            engram_error *err)
{
    return decode_rows(s, raw, n, out, 0, err);
}

int engram_rows_decode_f32(engram_simd s, const uint8_t *raw, size_t n, float *out,
                           engram_error *err)
{
    return decode_rows(s, raw, n, out, 1, err);
}

void rows_bf16_copy(const uint8_t *raw, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
}

void rows_bf16_widen(const uint8_t *raw, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(raw[2 * i] | raw[2 * i + 1] << 8) << 16;
        memcpy(out + i, &u, 4);
    }
}
