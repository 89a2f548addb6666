/*
 * bench_core - one-core speed of the exact core: hashing (tokens/s, 48 rows
 * each) and row decoding (row bytes/s), each implementation side by side,
 * with memcpy bandwidth measured in the same run as the physical reference.
 *
 * usage: bench_core [--tokens FILE] [--seconds S] [--csv FILE]
 * Timing is best-of-N over fixed work; nothing here asserts a speed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"
#include "hash/hash.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static volatile uint64_t sink;

/* Runs body until `seconds` pass (at least 3 times); best time into out. */
#define BEST_OF(out, seconds, body)                                              \
    do {                                                                         \
        double best_ = 1e30, start_ = now_s();                                   \
        for (int rep_ = 0; rep_ < 3 || now_s() - start_ < (seconds); rep_++) {   \
            double t0_ = now_s();                                                \
            body;                                                                \
            double dt_ = now_s() - t0_;                                          \
            if (dt_ < best_)                                                     \
                best_ = dt_;                                                     \
            if (rep_ > 1000)                                                     \
                break;                                                           \
        }                                                                        \
        (out) = best_;                                                           \
    } while (0)

static void cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(out, n, "%s", p);
            }
            break;
        }
    if (f)
        fclose(f);
}

static FILE *csv;
static engram_output csv_file;

/* An exit before the end leaves no CSV and no temporary (atexit). */
static void csv_abandon(void)
{
    if (csv)
        engram_output_fclose(&csv_file, csv, 0, NULL);
    csv = NULL;
}

static void row_out(const char *what, const char *impl, double value, const char *unit,
                    double ratio, const char *ratio_of)
{
    printf("  %-34s %-8s %12.2f %-12s", what, impl, value, unit);
    if (ratio > 0)
        printf(" %7.2fx %s", ratio, ratio_of);
    printf("\n");
    if (csv)
        fprintf(csv, "%s,%s,%.4f,%s,%.4f,%s\n", what, impl, value, unit, ratio, ratio_of);
}

/* --csv before anything runs: a kind of path the writer takes, and not the
 * input (engram_tools.h); 0, or 2 after saying why. */
static int csv_refused(const char *prog_name, const char *csv_path, const char *input)
{
    engram_error ce;
    if (engram_output_check(csv_path, 0, &ce) < 0) {
        fprintf(stderr, "%s: %s\n", prog_name, ce.msg);
        return 2;
    }
    if (input && engram_output_same(csv_path, input)) {
        fprintf(stderr, "%s: --csv '%s' and the input '%s' are the same file\n", prog_name,
                csv_path, input);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *tok_path = "data/gpl3.tok", *csv_path = NULL;
    double secs = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tok_path = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_core [--tokens FILE] [--seconds S] [--csv FILE]\n");
            return 2;
        }
    }
    if (csv_path && csv_refused("bench_core", csv_path, tok_path))
        return 2;
    engram_error err;
    if (csv_path && engram_output_fopen(&csv_file, csv_path, 0, &csv, &err) < 0) {
        fprintf(stderr, "bench_core: %s\n", err.msg);
        return 3;
    }
    atexit(csv_abandon);
    if (csv)
        fprintf(csv, "what,impl,value,unit,ratio,ratio_of\n");

    char cpu[256], date[64];
    cpu_name(cpu, sizeof cpu);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    struct utsname u;
    uname(&u);
    printf("bench_core  %s  |  %s, %ld cores, kernel %s  |  one thread\n", date, cpu,
           sysconf(_SC_NPROCESSORS_ONLN), u.release);

    /* ---- physical reference: memcpy bandwidth on a buffer far above cache */
    size_t big = 256u << 20;
    char *a = malloc(big), *b = malloc(big);
    if (!a || !b)
        return 3;
    memset(a, 1, big);
    memset(b, 2, big);
    double mt;
    BEST_OF(mt, secs, memcpy(b, a, big); sink += (uint64_t)b[big / 2]);
    double memcpy_bw = 2.0 * (double)big / mt; /* bytes read + bytes written */
    printf("\nmemory\n");
    row_out("memcpy 256 MiB, read+written", "libc", memcpy_bw / 1e9, "GB/s", 0, "");

    /* ---- hashing: V4.1 layout, the bundled real text repeated to 1M tokens */
    enum { VOCAB = 129280, CVOCAB = 99092 };
    static uint32_t map[VOCAB];
    for (uint32_t i = 0; i < VOCAB; i++)
        map[i] = (uint32_t)(((uint64_t)i * 2654435761u) % CVOCAB);
    engram_layout l;
    memset(&l, 0, sizeof l);
    l.vocab = VOCAB;
    l.compressed_vocab = CVOCAB;
    l.token_map = map;
    l.pad_id = map[2];
    static const uint64_t mult[2][4] = {
        {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull},
        {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull}};
    memcpy(l.multipliers, mult, sizeof mult);
    uint32_t primes[48];
    engram_layout_primes(16000000, 2, 4, 8, primes, 48);
    for (int tt = 0; tt < 2; tt++) {
        uint64_t s = 0;
        for (int c = 0; c < 24; c++) {
            l.primes[tt][c] = primes[tt * 24 + c];
            s += primes[tt * 24 + c];
        }
        l.rows[tt] = (uint32_t)s;
    }
    engram_hasher *h;
    if (engram_hasher_new(&l, &h, NULL) < 0)
        return 3;
    size_t n = 1u << 20, have = 0;
    uint32_t *tokens = malloc(n * sizeof *tokens);
    uint32_t *rows = malloc(n * 48 * sizeof *rows);
    FILE *f = fopen(tok_path, "r");
    unsigned v;
    while (f && have < n && fscanf(f, "%u", &v) == 1)
        tokens[have++] = v % VOCAB;
    if (f)
        fclose(f);
    if (have == 0) {
        fprintf(stderr, "no tokens in %s\n", tok_path);
        return 3;
    }
    for (size_t i = have; i < n; i++)
        tokens[i] = tokens[i % have];
    printf("\nhash (V4.1 layout, %zu tokens of %s repeated, 48 rows per token)\n", n, tok_path);
    const engram_simd himpl[] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512};
    double scalar_tps = 0;
    for (int k = 0; k < 3; k++) {
        if (!engram_simd_supported(himpl[k]))
            continue;
        double dt;
        BEST_OF(dt, secs, {
            engram_history hist;
            engram_history_reset(&hist);
            hash_tokens_with(h, himpl[k], &hist, tokens, NULL, n, rows, NULL);
            sink += rows[n * 48 - 1];
        });
        double tps = (double)n / dt;
        if (k == 0)
            scalar_tps = tps;
        row_out("tokens/s (one call, 1M tokens)", engram_simd_name(himpl[k]), tps / 1e6, "M tok/s",
                tps / 20e6, "of the 20M target");
        if (k > 0)
            row_out("  vs scalar", engram_simd_name(himpl[k]), tps / scalar_tps, "x", 0, "");
    }
    /* Decode-step shape: one token per call. */
    {
        size_t steps = 1u << 18;
        double dt;
        BEST_OF(dt, secs, {
            engram_history hist;
            engram_history_reset(&hist);
            for (size_t i = 0; i < steps; i++)
                engram_hash_token(h, &hist, tokens[i], 0, rows);
            sink += rows[0];
        });
        row_out("tokens/s (one token per call)", engram_simd_name(engram_simd_selected()),
                (double)steps / dt / 1e6, "M tok/s", 0, "");
    }

    /* ---- decoding: rows in the typical scale range */
    printf("\nrow decode (264-byte rows; input bytes/s; typical scales)\n");
    struct { const char *name; size_t rows; } sets[] = {
        {"L2-resident (4096 rows, 1.1 MB)", 4096},
        {"memory (262144 rows, 69 MB)", 262144},
    };
    for (size_t si = 0; si < 2; si++) {
        size_t nr = sets[si].rows;
        uint8_t *raw = malloc(nr * ENGRAM_ROW_BYTES);
        float *of = malloc(nr * 256 * sizeof *of);
        uint16_t *ob = malloc(nr * 256 * sizeof *ob);
        uint64_t seed = 1;
        for (size_t r = 0; r < nr; r++) {
            uint8_t *row = raw + r * ENGRAM_ROW_BYTES;
            for (int i = 0; i < 256; i++) {
                uint8_t c = (uint8_t)rnd(&seed);
                row[i] = (c & 0x7f) == 0x7f ? 0 : c;
            }
            for (int i = 256; i < 264; i++)
                row[i] = (uint8_t)(110 + rnd(&seed) % 30);
        }
        printf(" %s\n", sets[si].name);
        const engram_simd impl[] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512};
        for (int fmt = 0; fmt < 2; fmt++) {
            double base = 0;
            for (int k = 0; k < 3; k++) {
                if (!engram_simd_supported(impl[k]))
                    continue;
                double dt;
                BEST_OF(dt, secs, {
                    if (fmt == 0)
                        engram_rows_decode_bf16(impl[k], raw, nr, ob, NULL);
                    else
                        engram_rows_decode_f32(impl[k], raw, nr, of, NULL);
                    sink += ob[7] + (uint64_t)of[9];
                });
                double bps = (double)(nr * ENGRAM_ROW_BYTES) / dt;
                if (k == 0)
                    base = bps;
                char what[64];
                snprintf(what, sizeof what, "  -> %s", fmt == 0 ? "bf16" : "f32");
                row_out(what, engram_simd_name(impl[k]), bps / 1e9, "GB/s in",
                        k == 0 ? 0 : bps / base, "of scalar");
                if (si == 1 && k > 0) {
                    /* Output+input traffic vs what memcpy moves in the same time. */
                    double traffic = (double)nr * (ENGRAM_ROW_BYTES + 256.0 * (fmt == 0 ? 2 : 4)) / dt;
                    row_out("     read+written vs memcpy", engram_simd_name(impl[k]), traffic / 1e9,
                            "GB/s", traffic / memcpy_bw, "of memcpy");
                }
            }
        }
        free(raw);
        free(of);
        free(ob);
    }
    engram_hasher_free(h);
    free(tokens);
    free(rows);
    free(a);
    free(b);
    FILE *done = csv;
    csv = NULL;
    if (done && engram_output_fclose(&csv_file, done, 1, &err) < 0) {
        fprintf(stderr, "bench_core: %s\n", err.msg);
        return 3;
    }
    return 0;
}
