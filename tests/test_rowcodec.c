/*
 * test_rowcodec.c - row decoding against an independent oracle.
 *
 * The oracle computes each value in double precision from the E4M3/E8M0
 * definitions (SPEC.md section 7) and rounds it to BF16 with explicit
 * round-half-to-even on the BF16 grid (quantum 2^(E-7) for normal values,
 * 2^-133 below 2^-126).  It shares no code with the library.
 */
#include <math.h>
#include <xmmintrin.h>
#include <pmmintrin.h>

#include "testutil.h"

#define RB ENGRAM_ROW_BYTES
#define RV ENGRAM_ROW_VALUES

/* Returns 1 and the expected BF16 bits, or 0 if the value must be rejected. */
static int oracle(uint8_t code, uint8_t scale, uint16_t *bits)
{
    if ((code & 0x7f) == 0x7f || scale == 255)
        return 0;
    int e = (code >> 3) & 15, m = code & 7;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    v = ldexp(v, (int)scale - 127);               /* exact in double */
    if (v >= ldexp(1.0, 128))
        return 0;                                  /* float32 overflow */
    double r = 0;
    if (v != 0) {
        int ex;
        frexp(v, &ex);                             /* v in [2^(ex-1), 2^ex) */
        double quantum = v >= ldexp(1.0, -126) ? ldexp(1.0, ex - 1 - 7) : ldexp(1.0, -133);
        double q = v / quantum, fl = floor(q);
        double diff = q - fl;
        double n = diff > 0.5 ? fl + 1 : diff < 0.5 ? fl : (fmod(fl, 2.0) == 0 ? fl : fl + 1);
        r = n * quantum;
    }
    float f = (float)r;                            /* r is a BF16 value: exact */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0xffff) != 0 || (double)f != r)
        return -1;                                 /* oracle bug */
    *bits = (uint16_t)((u >> 16) | ((code & 0x80) ? 0x8000 : 0));
    return 1;
}

static const engram_simd impls[] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512,
                                    ENGRAM_SIMD_AUTO};
#define N_IMPLS 4

/* The engram_error of a row that fails (engram.h's row contract): code
 * -EDOM, no offset, row = its index in the call, msg = want exactly. */
static void check_row_error(const engram_error *e, size_t index, const char *want)
{
    CHECK_EQ(e->code, -EDOM);
    CHECK(e->offset == ENGRAM_NO_OFFSET);
    CHECK_EQ(e->row, (uint64_t)index);
    if (strcmp(e->msg, want) != 0) {
        tu_failures++;
        fprintf(stderr, "row error '%s', want '%s'\n", e->msg, want);
    }
}

/* What the message of a row whose first fault is byte `at` (a value 0..255
 * or a scale byte 256..263) must say. */
static void row_message(char *buf, size_t len, size_t index, int at, const char *why)
{
    if (at >= RV)
        snprintf(buf, len, "row %zu, scale %d: %s", index, at - RV, why);
    else
        snprintf(buf, len, "row %zu, value %d: %s", index, at, why);
}

/* Decodes rows with impl in both formats, comparing with expected bits; also
 * checks canaries past the outputs. */
static void check_rows(engram_simd s, const uint8_t *raw, size_t n, const uint16_t *want)
{
    const size_t guard = 64;
    uint16_t *b = malloc((n * RV + guard) * sizeof *b);
    float *f = malloc((n * RV + guard) * sizeof *f);
    for (size_t i = 0; i < n * RV + guard; i++) {
        b[i] = 0xa5a5;
        f[i] = -1234.5f;
    }
    engram_error e, e0; /* not touched on success */
    memset(&e, 0x5c, sizeof e);
    memset(&e0, 0x5c, sizeof e0);
    CHECK_EQ(engram_rows_decode_bf16(s, raw, n, b, &e), 0);
    CHECK_EQ(engram_rows_decode_f32(s, raw, n, f, &e), 0);
    CHECK(memcmp(&e, &e0, sizeof e) == 0);
    size_t wrong = 0;
    for (size_t i = 0; i < n * RV; i++) {
        uint32_t fb;
        memcpy(&fb, &f[i], 4);
        if (b[i] != want[i] || fb != (uint32_t)want[i] << 16) {
            if (wrong++ < 5)
                fprintf(stderr, "%s: value %zu (code 0x%02x scale %u): bf16 %04x f32 %08x want %04x\n",
                        engram_simd_name(s), i, raw[(i / RV) * RB + i % RV],
                        raw[(i / RV) * RB + RV + (i % RV) / 32], b[i], fb, want[i]);
        }
    }
    CHECK_EQ(wrong, 0);
    for (size_t i = n * RV; i < n * RV + guard; i++) {
        CHECK(b[i] == 0xa5a5);
        CHECK(f[i] == -1234.5f);
    }
    free(b);
    free(f);
}

/* Every code x every scale, one value per row so each rejection is alone;
 * the value sits at position code so every lane of every kernel is used. */
static void exhaustive(void)
{
    uint8_t row[RB];
    int agree = 0, rejected = 0;
    for (int s = 0; s < 256; s++)
        for (int c = 0; c < 256; c++) {
            memset(row, 0, RB);
            memset(row + RV, 127, 8);
            row[c] = (uint8_t)c;
            row[RV + c / 32] = (uint8_t)s;
            uint16_t want[RV] = {0};
            int ok = oracle((uint8_t)c, (uint8_t)s, &want[c]);
            CHECK(ok >= 0);
            /* the rejection's message: the scale byte first, then the code */
            char msg[128];
            row_message(msg, sizeof msg, 0, s == 255 ? RV + c / 32 : c,
                        s == 255              ? "NaN scale (E8M0 0xFF)"
                        : (c & 0x7f) == 0x7f ? "NaN code (E4M3 0x7F/0xFF)"
                                             : "value overflows float32 (non-finite)");
            for (int k = 0; k < N_IMPLS; k++) {
                if (!engram_simd_supported(impls[k]))
                    continue;
                if (ok == 1) {
                    uint16_t out[RV];
                    CHECK_EQ(engram_rows_decode_bf16(impls[k], row, 1, out, NULL), 0);
                    agree += memcmp(out, want, sizeof out) == 0;
                    CHECK(memcmp(out, want, sizeof out) == 0);
                } else {
                    uint16_t out[RV];
                    memset(out, 0x5a, sizeof out);
                    engram_error e;
                    CHECK_EQ(engram_rows_decode_bf16(impls[k], row, 1, out, &e), -EDOM);
                    check_row_error(&e, 0, msg);
                    for (int i = 0; i < RV; i++)
                        CHECK(out[i] == 0x5a5a);
                    rejected++;
                }
            }
            CHECK_EQ(engram_row_check(row, NULL), ok == 1 ? 0 : -EDOM);
            if (ok != 1) {
                engram_error e;
                CHECK_EQ(engram_row_check(row, &e), -EDOM);
                check_row_error(&e, 0, msg);
            }
        }
    printf("exhaustive: %d rows agree with the oracle, %d rejections checked\n", agree, rejected);
}

/* Full rows: all 256 codes (NaN codes replaced) under each scale. */
static void full_rows(void)
{
    uint8_t *raw = malloc(256 * RB);
    uint16_t *want = malloc(256 * RV * sizeof *want);
    size_t n = 0;
    for (int s = 0; s < 256; s++) {
        uint8_t *row = raw + n * RB;
        int ok = 1;
        for (int i = 0; i < RV; i++)
            row[i] = (uint8_t)(((i & 0x7f) == 0x7f) ? (i & 0x80) : i);
        for (int b = 0; b < 8; b++)
            row[RV + b] = (uint8_t)(b % 2 ? s : 255 - s);
        for (int i = 0; i < RV && ok; i++)
            ok = oracle(row[i], row[RV + i / 32], &want[n * RV + i]) == 1;
        if (ok)
            n++;
    }
    for (int k = 0; k < N_IMPLS; k++)
        if (engram_simd_supported(impls[k]))
            check_rows(impls[k], raw, n, want);
    printf("full rows: %zu rows of all codes\n", n);
    free(raw);
    free(want);
}

/* Random rows, scales over the whole range; invalid ones dropped. */
static void random_rows(void)
{
    enum { N = 4000 };
    uint8_t *raw = malloc((size_t)N * RB);
    uint16_t *want = malloc((size_t)N * RV * sizeof *want);
    uint64_t seed = 7;
    size_t n = 0;
    for (int r = 0; r < N; r++) {
        uint8_t *row = raw + n * RB;
        for (int i = 0; i < RB; i++)
            row[i] = (uint8_t)tu_rand(&seed);
        for (int i = 0; i < RV; i++) /* keep NaN codes out; scales stay wild */
            row[i] = (row[i] & 0x7f) == 0x7f ? (uint8_t)(row[i] ^ 1) : row[i];
        if (r % 2) /* half the rows in the typical range */
            for (int b = 0; b < 8; b++)
                row[RV + b] = (uint8_t)(110 + tu_rand(&seed) % 30);
        int ok = 1;
        for (int i = 0; i < RV && ok; i++)
            ok = oracle(row[i], row[RV + i / 32], &want[n * RV + i]) == 1;
        if (ok)
            n++;
    }
    CHECK(n > N / 4);
    for (int k = 0; k < N_IMPLS; k++)
        if (engram_simd_supported(impls[k]))
            check_rows(impls[k], raw, n, want);
    printf("random rows: %zu valid rows\n", n);
    free(raw);
    free(want);
}

/* A batch with one bad row: -EDOM, its index and reason in err, and nothing
 * written. */
static void batch_rejection(void)
{
    enum { N = 10 };
    uint8_t raw[N * RB];
    uint64_t seed = 11;
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < RV; i++) {
            uint8_t c = (uint8_t)tu_rand(&seed);
            raw[r * RB + i] = (c & 0x7f) == 0x7f ? 0 : c;
        }
        memset(raw + r * RB + RV, 120, 8);
    }
    struct { int row, at; uint8_t v; const char *why; } cases[] = {
        {7, 100, 0x7f, "NaN code"}, {3, 5, 0xff, "NaN code"},
        {9, RV + 2, 255, "NaN scale"}, {5, RV + 7, 254, "overflow"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t bad_raw[N * RB];
        memcpy(bad_raw, raw, sizeof raw);
        bad_raw[cases[k].row * RB + cases[k].at] = cases[k].v;
        if (cases[k].at >= RV) /* make the overflow real: a code with e = 15 */
            bad_raw[cases[k].row * RB + (cases[k].at - RV) * 32] = 0x78;
        /* the first fault: a NaN scale byte itself, else the value (an
         * overflow: the e = 15 code under the large scale) */
        int at = cases[k].at < RV ? cases[k].at
                 : cases[k].v == 255 ? cases[k].at
                                     : (cases[k].at - RV) * 32;
        const char *why = cases[k].v == 255 && cases[k].at >= RV ? "NaN scale (E8M0 0xFF)"
                          : cases[k].at < RV ? "NaN code (E4M3 0x7F/0xFF)"
                                             : "value overflows float32 (non-finite)";
        CHECK(strstr(why, cases[k].why));
        char want1[128], want[128];
        row_message(want1, sizeof want1, 0, at, why);
        row_message(want, sizeof want, (size_t)cases[k].row, at, why);
        engram_error e;
        CHECK_EQ(engram_row_check(bad_raw + cases[k].row * RB, &e), -EDOM);
        check_row_error(&e, 0, want1);
        CHECK(strstr(e.msg, cases[k].why));
        for (int i = 0; i < N_IMPLS; i++) {
            if (!engram_simd_supported(impls[i]))
                continue;
            uint16_t out[N * RV];
            float outf[N * RV];
            memset(out, 0x77, sizeof out);
            memset(outf, 0x77, sizeof outf);
            memset(&e, 0, sizeof e);
            CHECK_EQ(engram_rows_decode_bf16(impls[i], bad_raw, N, out, &e), -EDOM);
            check_row_error(&e, (size_t)cases[k].row, want);
            CHECK(strstr(e.msg, cases[k].why));
            memset(&e, 0, sizeof e);
            CHECK_EQ(engram_rows_decode_f32(impls[i], bad_raw, N, outf, &e), -EDOM);
            check_row_error(&e, (size_t)cases[k].row, want);
            CHECK_EQ(engram_rows_decode_f32(impls[i], bad_raw, N, outf, NULL), -EDOM);
            int untouched = 1;
            for (size_t j = 0; j < sizeof out; j++)
                untouched &= ((uint8_t *)out)[j] == 0x77;
            for (size_t j = 0; j < sizeof outf; j++)
                untouched &= ((uint8_t *)outf)[j] == 0x77;
            CHECK(untouched);
            memset(&e, 0, sizeof e);
            CHECK_EQ(engram_rows_check(bad_raw, N, &e), -EDOM);
            check_row_error(&e, (size_t)cases[k].row, want);
            CHECK_EQ(engram_rows_check(bad_raw, N, NULL), -EDOM);
        }
    }
    CHECK_EQ(engram_rows_check(raw, N, NULL), 0);
    engram_error e, e0;
    memset(&e, 0x5c, sizeof e);
    memset(&e0, 0x5c, sizeof e0);
    CHECK_EQ(engram_rows_check(raw, N, &e), 0);
    CHECK_EQ(engram_rows_check(NULL, 0, &e), 0);       /* nothing to check */
    CHECK(memcmp(&e, &e0, sizeof e) == 0);              /* err untouched on success */
    CHECK_EQ(engram_rows_check(NULL, 1, &e), -EINVAL); /* NULL rows */
    CHECK(e.code == -EINVAL && e.row == ENGRAM_NO_ROW && e.offset == ENGRAM_NO_OFFSET);
}

/* Results must not depend on FTZ/DAZ set by the caller. */
static void fp_environment(void)
{
    uint8_t row[RB];
    uint16_t want[RV], got[RV];
    for (int i = 0; i < RV; i++)
        row[i] = (uint8_t)(((i & 0x7f) == 0x7f) ? 1 : i);
    for (int b = 0; b < 8; b++)
        row[RV + b] = (uint8_t)b; /* tiny scales: subnormal results */
    CHECK_EQ(engram_rows_decode_bf16(ENGRAM_SIMD_SCALAR, row, 1, want, NULL), 0);
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | _MM_FLUSH_ZERO_ON | 0x0040 /* DAZ */);
    for (int k = 0; k < N_IMPLS; k++) {
        if (!engram_simd_supported(impls[k]))
            continue;
        CHECK_EQ(engram_rows_decode_bf16(impls[k], row, 1, got, NULL), 0);
        CHECK(memcmp(got, want, sizeof got) == 0);
    }
    _mm_setcsr(csr);
    int nonzero_subnormal = 0;
    for (int i = 0; i < RV; i++)
        nonzero_subnormal += (want[i] & 0x7f80) == 0 && (want[i] & 0x7f) != 0;
    CHECK(nonzero_subnormal > 0);
}

static void selection(void)
{
    CHECK(engram_simd_supported(ENGRAM_SIMD_SCALAR));
    CHECK(engram_simd_supported(engram_simd_selected()));
    CHECK(engram_simd_selected() != ENGRAM_SIMD_AUTO);
    uint8_t row[RB] = {0};
    uint16_t out[RV];
    CHECK_EQ(engram_rows_decode_bf16((engram_simd)99, row, 1, out, NULL), -EINVAL);
    CHECK_EQ(engram_rows_decode_bf16(ENGRAM_SIMD_SCALAR, NULL, 1, out, NULL), -EINVAL);
    engram_error e;
    CHECK_ERR(engram_rows_decode_bf16((engram_simd)99, row, 1, out, &e), e, -EINVAL,
              "not supported");
    CHECK(e.row == ENGRAM_NO_ROW);
    CHECK_ERR(engram_rows_decode_f32(ENGRAM_SIMD_SCALAR, row, 1, NULL, &e), e, -EINVAL, "NULL");
    CHECK_EQ(engram_rows_decode_bf16(ENGRAM_SIMD_SCALAR, row, 0, NULL, NULL), 0);
    printf("simd: selected %s; avx2 %s, avx512 %s\n", engram_simd_name(engram_simd_selected()),
           engram_simd_supported(ENGRAM_SIMD_AVX2) ? "tested" : "not on this CPU",
           engram_simd_supported(ENGRAM_SIMD_AVX512) ? "tested" : "not on this CPU");
}

int main(void)
{
    selection();
    exhaustive();
    full_rows();
    random_rows();
    batch_rejection();
    fp_environment();
    return tu_finish("test_rowcodec");
}
