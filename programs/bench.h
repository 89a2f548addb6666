/*
 * bench.h - what the parts of `engram bench io` share: the run's
 * settings and model (bench_io.c: the command, the machine, fio, sections
 * (a) and (b)) and section (c), prefill against the baseline reader
 * (bench_prefill.c).
 */
#ifndef ENGRAM_BENCH_H
#define ENGRAM_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"

#define MAX_DEPTHS 16
#define MAX_ROUNDS 32
#define MAX_CORPORA 8

struct bench {
    const char *path;
    engram_model *m;
    engram_model_info in;
    const engram_layout *l;   /* V4.1's layout; NULL for PLE            */
    /* The member's numbers (engram_family): the tables, their rows per
     * token (the stride of a token's row ids as the hash writes them is
     * tables x cols: 48 for V4.1, 16 for PLE), a row's bytes and values. */
    int ple;
    unsigned tables, cols, stride, row_bytes, row_values;
    double seconds;
    int rounds;               /* section (a): turns engram and fio take */
    unsigned depths[MAX_DEPTHS];
    int n_depths;
    const char *corpora[MAX_CORPORA];
    int n_corpora;
    int use_fio, use_baseline;
    size_t max_tokens;
    uint64_t cache_bytes;     /* prefill: the +cache reader's row cache    */
    FILE *csv;
    uint32_t align;
    unsigned cross_pct;       /* % of rows whose bytes span two blocks     */
    uint64_t seed;
    const char *sections;     /* letters of the sections to run */
};

/* The next number of the splitmix64 sequence in *s. */
static inline uint64_t bench_rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One row of the CSV (--csv), if one is written. */
static inline void bench_csv_row(struct bench *b, const char *section, const char *what,
                                 double depth, double value, const char *unit)
{
    if (b->csv)
        fprintf(b->csv, "%s,%s,%g,%.6g,%s\n", section, what, depth, value, unit);
}

/* Section (c): prefill of each corpus, engram's readers against the
 * baseline.  0 or an exit code. */
int bench_section_prefill(struct bench *b);

#endif
