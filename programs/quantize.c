/*
 * quantize.c - engram quantize and dequantize: float rows (raw float32,
 * bf16 bit patterns or .npy) <-> e4m3_e8m0_32_row264 rows, streamed in
 * chunks and written through a temporary name.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---------------------------------------------------------------- .npy */

/* Rows are converted in chunks: memory is ~9 MiB whatever the file size. */
#define Q_CHUNK_ROWS 4096

/* An input of float values: raw little-endian (float32, or bf16 bit
 * patterns) or .npy (v1-3, C order, '<f4' or, for bf16, '<u2'/'<i2'). */
struct fin {
    FILE *f;
    uint64_t count;        /* values          */
    int bf16;              /* 2-byte values   */
};

/* Opens path and positions it at the first value.  0 or an exit code. */
static int open_floats(const char *path, int want_bf16, struct fin *in)
{
    memset(in, 0, sizeof *in);
    in->f = fopen(path, "rb");
    struct stat st;
    if (!in->f || fstat(fileno(in->f), &st) != 0) {
        fprintf(stderr, "%s: cannot read '%s': %s\n", prog, path, strerror(errno));
        if (in->f)
            fclose(in->f);
        return EXIT_SYSTEM;
    }
    int kst = input_regular(path, &st);
    if (kst) {
        fclose(in->f);
        return kst;
    }
    uint64_t size = (uint64_t)st.st_size;
    in->bf16 = want_bf16;
    static uint8_t p[12 + NPY_MAX_HEADER];
    size_t got = fread(p, 1, sizeof p, in->f);
    struct npy_info ni;
    int rc = npy_parse(p, got, size, &ni);
    if (rc == 0) {
        if (fseek(in->f, (long)ni.data_offset, SEEK_SET) != 0) {
            fprintf(stderr, "%s: cannot read '%s': %s\n", prog, path, strerror(errno));
            fclose(in->f);
            return EXIT_SYSTEM;
        }
        in->bf16 = ni.bf16;
        in->count = ni.count;
        return 0;
    }
    if (rc != -ENOENT) {
        if (rc == -ENOTSUP)
            fprintf(stderr, "%s: '%s': .npy input must be '<f4' (float32) or '<u2' (bfloat16 bit "
                            "patterns)\n", prog, path);
        else if (rc == -EDOM)
            fprintf(stderr, "%s: '%s': Fortran-ordered arrays are not supported\n", prog, path);
        else
            fprintf(stderr, "%s: '%s': malformed or truncated .npy file\n", prog, path);
        fclose(in->f);
        return EXIT_DATA;
    }
    uint64_t es = in->bf16 ? 2 : 4;
    if (size % es) {
        fprintf(stderr, "%s: '%s': %" PRIu64 " bytes is not a whole number of %s values\n", prog,
                path, size, in->bf16 ? "bf16" : "float32");
        fclose(in->f);
        return EXIT_DATA;
    }
    rewind(in->f);
    in->count = size / es;
    return 0;
}

/* A v1 .npy header for an array of shape (rows, 256). */
static size_t npy_header(uint8_t *h, uint64_t rows, int bf16)
{
    char dict[128];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ", 256), }",
                     bf16 ? "<u2" : "<f4", rows);
    size_t total = 10 + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    size_t hl = padded - 10;
    h[8] = (uint8_t)hl;
    h[9] = (uint8_t)(hl >> 8);
    memcpy(h + 10, dict, (size_t)n);
    memset(h + 10 + n, ' ', padded - 10 - (size_t)n - 1);
    h[padded - 1] = '\n';
    return padded;
}

/* ---------------------------------------------------------------- quantize */

/* One text for both commands, each opening with its own usage line. */
static const char *quantize_usage =
    "usage: engram quantize IN OUT.rows [--bf16]\n"
    "       engram dequantize IN.rows OUT [--bf16]\n";
static const char *dequantize_usage =
    "usage: engram dequantize IN.rows OUT [--bf16]\n"
    "       engram quantize IN OUT.rows [--bf16]\n";
static const char *quantize_help =
    "quantize: float rows (256 values each) into e4m3_e8m0_32_row264 rows (264 bytes\n"
    "each, SPEC.md section 7): per block of 32 the smallest E8M0 scale that brings\n"
    "max |x| to <= 448, values rounded to nearest-even E4M3.  IN is raw little-endian\n"
    "float32 (bf16 bit patterns with --bf16) or .npy ('<f4', or '<u2' for bf16).\n"
    "Reports the error of the round trip (through the library's decoder): max and\n"
    "mean |x - q| / |x| over nonzero x, and |x - q| / block max.  NaN and Inf are\n"
    "rejected (exit 1, naming row and column, no output); every finite value is\n"
    "accepted; the only saturation is within half a step of FLT_MAX (reported).\n"
    "dequantize: rows back to float32 (bf16 bit patterns with --bf16), raw or .npy\n"
    "when OUT ends in .npy; rows that do not decode are rejected (exit 1).\n"
    "Both stream: memory stays ~9 MiB whatever the file size.\n";

static int parse_in_out(int argc, char **argv, const char *cmd, const char **in, const char **out,
                        int *bf16)
{
    *in = *out = NULL;
    *bf16 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bf16"))
            *bf16 = 1;
        else if (argv[i][0] == '-' && argv[i][1])
            return fail_usage("%s: unknown option '%s'", cmd, argv[i]);
        else if (!*in)
            *in = argv[i];
        else if (!*out)
            *out = argv[i];
        else
            return fail_usage("%s: IN and OUT only", cmd);
    }
    if (!*in || !*out)
        return fail_usage("%s: IN and OUT are required", cmd);
    /* OUT may be anything fout takes; it must not be IN (before reading) */
    const char *paths[2] = {*out, *in}, *names[2] = {"OUT", "IN"};
    int st = fout_check(*out, 0);
    return st ? st : fout_distinct(paths, names, 2, 1);
}

struct qstats {
    double max_rel, sum_rel, max_blk, sum_blk;
    uint64_t nz, flushed, sat;
};

/* Accumulates the round-trip error of n values x -> y (blocks of 32). */
static void q_errors(struct qstats *s, const float *x, const float *y, size_t n)
{
    for (size_t b = 0; b < n / 32; b++) {
        double amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmax(amax, fabs((double)x[b * 32 + (size_t)j]));
        for (int j = 0; j < 32; j++) {
            size_t i = b * 32 + (size_t)j;
            double d = fabs((double)x[i] - (double)y[i]);
            if (x[i] != 0) {
                double r = d / fabs((double)x[i]);
                s->max_rel = fmax(s->max_rel, r);
                s->sum_rel += r;
                s->nz++;
                s->flushed += y[i] == 0;
            }
            if (amax > 0) {
                s->max_blk = fmax(s->max_blk, d / amax);
                s->sum_blk += d / amax;
            }
        }
    }
}

int cmd_quantize(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(quantize_usage, stdout);
        fputs(quantize_help, stdout);
        return 0;
    }
    const char *inp, *outp;
    int bf16;
    int rc = parse_in_out(argc, argv, "quantize", &inp, &outp, &bf16);
    if (rc)
        return rc;
    struct fin in;
    if ((rc = open_floats(inp, bf16, &in)) != 0)
        return rc;
    if (in.count % ENGRAM_ROW_VALUES) {
        fclose(in.f);
        fprintf(stderr, "%s: '%s': %" PRIu64 " values is not a whole number of 256-value rows\n",
                prog, inp, in.count);
        return EXIT_DATA;
    }
    uint64_t rows = in.count / ENGRAM_ROW_VALUES;
    size_t chunk_vals = (size_t)Q_CHUNK_ROWS * ENGRAM_ROW_VALUES;
    uint8_t *raw = malloc(chunk_vals * 4), *q = malloc((size_t)Q_CHUNK_ROWS * ENGRAM_ROW_BYTES);
    float *x = malloc(chunk_vals * sizeof *x), *y = malloc(chunk_vals * sizeof *y);
    struct fout out = {0};
    int status = !raw || !q || !x || !y ? fail_oom("quantize: the chunk buffers", 0)
                                        : fout_open(&out, outp);
    struct qstats st = {0};
    for (uint64_t r0 = 0; r0 < rows && status == 0; r0 += Q_CHUNK_ROWS) {
        size_t k = rows - r0 < Q_CHUNK_ROWS ? (size_t)(rows - r0) : Q_CHUNK_ROWS;
        size_t nv = k * ENGRAM_ROW_VALUES, es = in.bf16 ? 2 : 4;
        if (fread(raw, es, nv, in.f) != nv) {
            fprintf(stderr, "%s: '%s': read failed or file shrank\n", prog, inp);
            status = EXIT_SYSTEM;
            break;
        }
        for (size_t i = 0; i < nv; i++) {
            uint32_t u = in.bf16 ? ((uint32_t)raw[2 * i] | (uint32_t)raw[2 * i + 1] << 8) << 16
                                 : (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                                       (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
            memcpy(&x[i], &u, 4);
        }
        engram_error e;
        rc = engram_rows_quantize_f32(x, k, q, &st.sat, &e);
        if (rc == -EDOM) {
            /* err names the row; its first non-finite value is the column */
            size_t bad = (size_t)e.row * 256, end = bad + 255;
            while (bad < end && isfinite(x[bad]))
                bad++;
            fprintf(stderr, "%s: %s: row %" PRIu64 " column %zu is %s; NaN and Inf cannot be quantized\n",
                    prog, inp, r0 + bad / 256, bad % 256, isnan(x[bad]) ? "NaN" : "infinite");
            status = EXIT_DATA;
        } else if (rc < 0) {
            status = fail_lib(rc, &e, "quantize");
        } else if (engram_rows_decode_f32(ENGRAM_SIMD_AUTO, q, k, y, &e) < 0) {
            fprintf(stderr, "%s: internal error: quantized row %" PRIu64 " does not decode\n", prog,
                    r0 + e.row);
            status = EXIT_SYSTEM;
        } else if (fwrite(q, ENGRAM_ROW_BYTES, k, out.f) != k) {
            fprintf(stderr, "%s: cannot write '%s': %s\n", prog, outp, strerror(errno));
            status = EXIT_SYSTEM;
        } else {
            q_errors(&st, x, y, nv);
        }
    }
    if (out.f) {
        int c = fout_close(&out, status == 0);
        status = status ? status : c;
    }
    fclose(in.f);
    free(raw);
    free(q);
    free(x);
    free(y);
    if (status == 0) {
        printf("quantized %" PRIu64 " rows (%" PRIu64 " values) -> %s (%" PRIu64 " bytes)\n", rows,
               in.count, outp, rows * ENGRAM_ROW_BYTES);
        printf("relative error |x-q|/|x| over %" PRIu64 " nonzero values: max %.4g, mean %.4g"
               " (%" PRIu64 " flushed to zero)\n",
               st.nz, st.max_rel, st.nz ? st.sum_rel / (double)st.nz : 0.0, st.flushed);
        printf("error relative to the block max: max %.4g, mean %.4g\n", st.max_blk,
               in.count ? st.sum_blk / (double)in.count : 0.0);
        printf("saturated near FLT_MAX: %" PRIu64 "\n", st.sat);
    }
    return status;
}

int cmd_dequantize(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(dequantize_usage, stdout);
        fputs(quantize_help, stdout);
        return 0;
    }
    const char *inp, *outp;
    int bf16;
    int rc = parse_in_out(argc, argv, "dequantize", &inp, &outp, &bf16);
    if (rc)
        return rc;
    FILE *f = fopen(inp, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "%s: cannot read '%s': %s\n", prog, inp, strerror(errno));
        if (f)
            fclose(f);
        return EXIT_SYSTEM;
    }
    if ((rc = input_regular(inp, &sb)) != 0) {
        fclose(f);
        return rc;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size % ENGRAM_ROW_BYTES) {
        fclose(f);
        fprintf(stderr, "%s: '%s': %" PRIu64 " bytes is not a whole number of 264-byte rows\n", prog,
                inp, size);
        return EXIT_DATA;
    }
    uint64_t rows = size / ENGRAM_ROW_BYTES;
    size_t es = bf16 ? 2 : 4;
    uint8_t *raw = malloc((size_t)Q_CHUNK_ROWS * ENGRAM_ROW_BYTES);
    uint8_t *vals = malloc((size_t)Q_CHUNK_ROWS * ENGRAM_ROW_VALUES * es);
    struct fout out = {0};
    int status = !raw || !vals ? fail_oom("dequantize: the chunk buffers", 0)
                                : fout_open(&out, outp);
    if (status == 0 && ends_with(outp, ".npy")) {
        uint8_t h[128];
        size_t hn = npy_header(h, rows, bf16);
        if (fwrite(h, 1, hn, out.f) != hn) {
            fprintf(stderr, "%s: cannot write '%s': %s\n", prog, outp, strerror(errno));
            status = EXIT_SYSTEM;
        }
    }
    for (uint64_t r0 = 0; r0 < rows && status == 0; r0 += Q_CHUNK_ROWS) {
        size_t k = rows - r0 < Q_CHUNK_ROWS ? (size_t)(rows - r0) : Q_CHUNK_ROWS;
        engram_error e;
        if (fread(raw, ENGRAM_ROW_BYTES, k, f) != k) {
            fprintf(stderr, "%s: '%s': read failed or file shrank\n", prog, inp);
            status = EXIT_SYSTEM;
            break;
        }
        rc = bf16 ? engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, k, (uint16_t *)vals, &e)
                  : engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, k, (float *)vals, &e);
        if (rc == -EDOM) {
            fprintf(stderr, "%s: %s: row %" PRIu64 " does not decode: %s\n", prog, inp, r0 + e.row,
                    row_reason(&e));
            status = EXIT_DATA;
        } else if (rc < 0) {
            status = fail_lib(rc, &e, "dequantize");
        } else if (fwrite(vals, es * ENGRAM_ROW_VALUES, k, out.f) != k) {
            fprintf(stderr, "%s: cannot write '%s': %s\n", prog, outp, strerror(errno));
            status = EXIT_SYSTEM;
        }
    }
    if (out.f) {
        int c = fout_close(&out, status == 0);
        status = status ? status : c;
    }
    fclose(f);
    free(raw);
    free(vals);
    if (status == 0)
        printf("dequantized %" PRIu64 " rows -> %s (%s%s)\n", rows, outp, bf16 ? "bf16" : "float32",
               ends_with(outp, ".npy") ? ", .npy" : ", raw little-endian");
    return status;
}

