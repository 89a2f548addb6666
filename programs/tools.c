/*
 * tools.c - the model tools: tokmap (tokenizer compression), layout
 * (multipliers and primes), build (a complete model: V4.1, or qwen4exp
 * through engram_build_ple_model); quantize and
 * dequantize (float rows <-> e4m3_e8m0_32_row264 rows) are in quantize.c.
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

static void hex32(const uint8_t h[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* ---------------------------------------------------------------- tokmap */

static const char *tokmap_help =
    "usage: engram tokmap TOKENIZER.json [--out MAP.u32] [--stats [N]]\n"
    "Builds the token map of SPEC.md section 4 from a Hugging Face tokenizer.json\n"
    "(byte-level BPE plus added tokens): raw id -> compressed id by the normalized\n"
    "text of each token (NFKC, NFD, no Mn, lowercase, whitespace rules), in\n"
    "first-seen order.  Prints the raw vocabulary size, V' and the SHA-256 of the\n"
    "map as little-endian u32; --out writes that map; --stats lists the N (20)\n"
    "largest groups of tokens sharing one key.\n";

/* Prints a key with control characters and quotes escaped. */
static void print_key(const char *k, uint32_t n)
{
    putchar('\'');
    for (uint32_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)k[i];
        if (c == '\'' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('\'');
}

static int cmp_group_desc(const void *a, const void *b, void *ctx)
{
    const uint32_t *g = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (g[x] != g[y])
        return g[x] > g[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int cmd_tokmap(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(tokmap_help, stdout);
        return 0;
    }
    const char *in = NULL, *out = NULL;
    uint64_t top = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--stats")) {
            top = 20;
            if (i + 1 < argc && argv[i + 1][0] != '-' && parse_u64(argv[i + 1], 1000000, &top) == 0)
                i++;
        } else if (argv[i][0] == '-') {
            return fail_usage("tokmap: unknown option '%s'", argv[i]);
        } else if (!in) {
            in = argv[i];
        } else {
            return fail_usage("tokmap: more than one TOKENIZER.json");
        }
    }
    if (!in)
        return fail_usage("tokmap: TOKENIZER.json is required");
    if (out) {
        const char *paths[2] = {out, in}, *names[2] = {"--out", "TOKENIZER.json"};
        int cst = fout_check(out, 0);
        if (cst || (cst = fout_distinct(paths, names, 2, 1)) != 0)
            return cst;
    }
    engram_tokmap tm;
    engram_error err = {0};
    int rc = engram_tokmap_from_json(in, &tm, &err);
    if (rc < 0)
        return fail_lib(rc, &err, "tokmap");
    char hex[65];
    hex32(tm.sha256, hex);
    printf("tokenizer %s\n", in);
    printf("raw vocabulary  %u ids (%u without a token)\n", tm.vocab, tm.missing);
    printf("V'              %u\n", tm.compressed_vocab);
    printf("raw-string keys %u (text with U+FFFD)\n", tm.raw_keys);
    printf("map sha256      %s\n", hex);
    int status = 0;
    if (out) {
        uint8_t *le = malloc((size_t)tm.vocab * 4);
        if (!le) {
            engram_tokmap_free(&tm);
            return fail_oom("tokmap", (size_t)tm.vocab * 4);
        }
        for (uint32_t i = 0; i < tm.vocab; i++)
            for (int b = 0; b < 4; b++)
                le[4 * i + (uint32_t)b] = (uint8_t)(tm.map[i] >> (8 * b));
        struct fout fo;
        status = fout_open(&fo, out);
        if (status == 0) {
            int ok = fwrite(le, 4, tm.vocab, fo.f) == tm.vocab;
            if (!ok)
                fprintf(stderr, "%s: cannot write '%s': %s\n", prog, out, strerror(errno));
            status = fout_close(&fo, ok);
        }
        free(le);
        if (status == 0)
            printf("wrote %s (%u x u32, little-endian)\n", out, tm.vocab);
    }
    if (top > 0) {
        uint32_t *ids = malloc((size_t)tm.compressed_vocab * sizeof *ids);
        if (ids) {
            for (uint32_t i = 0; i < tm.compressed_vocab; i++)
                ids[i] = i;
            qsort_r(ids, tm.compressed_vocab, sizeof *ids, cmp_group_desc, tm.group);
            printf("largest groups (tokens <- key):\n");
            for (uint32_t i = 0; i < top && i < tm.compressed_vocab; i++) {
                printf("  %6u <- ", tm.group[ids[i]]);
                print_key(tm.key[ids[i]], tm.key_len[ids[i]]);
                printf("   (compressed id %u)\n", ids[i]);
            }
            free(ids);
        }
    }
    engram_tokmap_free(&tm);
    return status;
}

/* ---------------------------------------------------------------- layout */

static const char *layout_help =
    "usage: engram layout --vocab-size V' [--layers 1,14] [--ngram 4] [--heads 8]\n"
    "                     [--base 16000000] [--json]\n"
    "Multipliers and bucket counts by SPEC.md section 5: per layer, ngram odd\n"
    "multipliers drawn from numpy's default_rng(10007 * layer) below\n"
    "(INT64_MAX / V') / 2, and (ngram - 1) * heads primes by the shared-seen\n"
    "allocation from --base.  With V' = 99092 and the defaults: DeepSeek V4.1.\n";

static int parse_list(const char *s, uint32_t *out, int max, int *n)
{
    *n = 0;
    char *copy = strdup(s), *save = NULL;
    if (!copy)
        return -1;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (*n >= max || parse_u64(t, 100000, &v) < 0) {
            free(copy);
            return -1;
        }
        out[(*n)++] = (uint32_t)v;
    }
    free(copy);
    return *n > 0 ? 0 : -1;
}

static int cmd_layout(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(layout_help, stdout);
        return 0;
    }
    uint64_t vocab = 0, ngram = 4, heads = 8, base = 16000000;
    uint32_t layers[16] = {1, 14};
    int n_layers = 2, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!v)
            return fail_usage("layout: %s needs a value", a);
        i++;
        if (!strcmp(a, "--vocab-size")) {
            if (parse_u64(v, 1u << 24, &vocab) < 0 || vocab == 0)
                return fail_usage("layout: --vocab-size takes 1..16777216");
        } else if (!strcmp(a, "--ngram")) {
            if (parse_u64(v, 16, &ngram) < 0 || ngram < 2)
                return fail_usage("layout: --ngram takes 2..16");
        } else if (!strcmp(a, "--heads")) {
            if (parse_u64(v, 64, &heads) < 0 || heads == 0)
                return fail_usage("layout: --heads takes 1..64");
        } else if (!strcmp(a, "--base")) {
            if (parse_u64(v, UINT32_MAX, &base) < 0 || base < 2)
                return fail_usage("layout: --base takes 2..4294967295");
        } else if (!strcmp(a, "--layers")) {
            if (parse_list(v, layers, 16, &n_layers) < 0)
                return fail_usage("layout: --layers takes up to 16 comma-separated layer numbers");
        } else {
            return fail_usage("layout: unknown option '%s'", a);
        }
    }
    if (!vocab)
        return fail_usage("layout: --vocab-size is required");
    int cols = (int)((ngram - 1) * heads);
    uint32_t *primes = malloc((size_t)n_layers * (size_t)cols * sizeof *primes);
    if (!primes)
        return fail_oom("layout", (size_t)n_layers * (size_t)cols * sizeof *primes);
    int rc = engram_layout_primes((uint32_t)base, n_layers, (int)ngram, (int)heads, primes,
                                  (size_t)n_layers * (size_t)cols);
    if (rc < 0) {
        free(primes);
        return fail_lib(rc, NULL, "layout: primes");
    }
    if (json)
        printf("{\"vocab_size\":%" PRIu64 ",\"ngram\":%" PRIu64 ",\"heads\":%" PRIu64
               ",\"base\":%" PRIu64 ",\"layers\":[",
               vocab, ngram, heads, base);
    for (int L = 0; L < n_layers; L++) {
        uint64_t m[16], sum = 0;
        engram_layout_multipliers((uint32_t)vocab, layers[L], (int)ngram, m);
        for (int c = 0; c < cols; c++)
            sum += primes[L * cols + c];
        if (json) {
            printf("%s{\"layer\":%u,\"multipliers\":[", L ? "," : "", layers[L]);
            for (uint64_t j = 0; j < ngram; j++)
                printf("%s%" PRIu64, j ? "," : "", m[j]);
            printf("],\"primes\":[");
            for (int c = 0; c < cols; c++)
                printf("%s%u", c ? "," : "", primes[L * cols + c]);
            printf("],\"rows\":%" PRIu64 "}", sum);
            continue;
        }
        printf("layer %u\n  multipliers:", layers[L]);
        for (uint64_t j = 0; j < ngram; j++)
            printf(" %" PRIu64, m[j]);
        printf("\n  primes (order-major, %" PRIu64 " per order):\n", heads);
        for (uint64_t n = 2; n <= ngram; n++) {
            printf("    n=%" PRIu64 ":", n);
            for (uint64_t h = 0; h < heads; h++)
                printf(" %u", primes[L * cols + (int)((n - 2) * heads + h)]);
            printf("\n");
        }
        printf("  rows (sum of primes): %" PRIu64 "\n", sum);
    }
    if (json)
        printf("]}\n");
    free(primes);
    return 0;
}

/* ---------------------------------------------------------------- build */

static const char *build_help =
    "usage: engram build OUT.gguf [--arch deepseek41]\n"
    "                    [--tokenizer TOKENIZER.json | --tokmap MAP.u32]\n"
    "                    [--base B] [--width W] [--fill zero|random|sparse|pool|normal]\n"
    "                    [--seed S] [--vocab N] [--compressed-vocab N] [--gguf-version 2|3]\n"
    "       engram build OUT.gguf --arch qwen4exp [--base B] [--width W] [--fill zero|normal]\n"
    "                    [--seed S]\n"
    "Writes a complete ds4-dialect V4.1-layout model: layout keys, token map, the\n"
    "projection weights when --width W > 0 (engram_kv F16 [6144, 5W], q_norm and\n"
    "k_norm F32 [W, 4]; V4.1 has W = 5120), and the two tables last, table 0 page\n"
    "aligned.  Token map: from a tokenizer.json (SPEC.md section 4), from a map\n"
    "file (little-endian u32, as engram tokmap --out writes; 1..2^24 of them, a\n"
    "longer file refused after reading 64 MiB and 1 byte), or synthetic (raw id\n"
    "t -> t mod V', with --vocab 129280 and --compressed-vocab 99092 by default).\n"
    "Multipliers: SPEC.md section 5 for V' and layers 1 and 14 (V' = 99092 gives\n"
    "V4.1's published ones).  Primes: shared-seen allocation from --base (default\n"
    "16000000, the full 2 x ~101 GB, written sparse with --fill zero or sparse;\n"
    "--fill pool writes valid rows at disk speed; random draws every row, over\n"
    "every scale; normal quantizes normal-like values, as a trained table holds).\n"
    "--arch qwen4exp writes a Qwen3.8 PLE model instead (SPEC.md section 10):\n"
    "its keys (vocabulary 248320, EOS 248044, Qwen3.8's multipliers), the 16 head\n"
    "sizes the primes after --base (default 19999999: the real 320,001,536 rows,\n"
    "95.37 GiB, a hole with --fill zero; 20011 gives a 103 MB demo), the BF16\n"
    "table [160, rows] first, then layer 1's ple_key and ple_value (BF16), the\n"
    "three norms and ple_conv1d (F32) for --width W (default 2560, the real one).\n"
    "--fill normal draws the table's rows as a trained table holds them\n"
    "(normal-like, sigma 0.05, BF16); the weights are always drawn.  The\n"
    "token-map, --vocab, --compressed-vocab, --gguf-version options and the\n"
    "random, sparse and pool fills are V4.1's only.  Deterministic for a seed.\n"
    "\n"
    "  engram build demo-ple.gguf --arch qwen4exp --base 20011 --fill normal\n";

static void build_progress(void *ctx, uint64_t done, uint64_t total)
{
    double *t0 = ctx;
    progress_bar(0, done, total, *t0);
}

/* A little-endian u32 map file: V' = its largest entry + 1. */
static int read_map_file(const char *path, uint32_t **map, uint64_t *vocab, uint64_t *cvocab)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = slurp(path, (size_t)4 << 24, &buf, &len); /* 2^24 entries at most */
    if (rc < 0 && rc != -EFBIG) {
        fprintf(stderr, "%s: cannot read '%s': %s\n", prog, path, strerror(-rc));
        return EXIT_SYSTEM;
    }
    if (rc == -EFBIG || len == 0 || len % 4) {
        free(buf);
        fprintf(stderr, "%s: '%s': a map is 1..2^24 little-endian u32 values\n", prog, path);
        return EXIT_DATA;
    }
    uint32_t *m = malloc(len);
    uint64_t mx = 0;
    if (!m) {
        free(buf);
        return fail_oom("build: the token map", len);
    }
    const uint8_t *p = (const uint8_t *)buf;
    for (size_t i = 0; i < len / 4; i++) {
        m[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
               (uint32_t)p[4 * i + 3] << 24;
        mx = m[i] > mx ? m[i] : mx;
    }
    free(buf);
    if (mx >= (1u << 24)) {
        free(m);
        fprintf(stderr, "%s: '%s': entries must be below 2^24\n", prog, path);
        return EXIT_DATA;
    }
    *map = m;
    *vocab = len / 4;
    *cvocab = mx + 1;
    return 0;
}

/* The token map into l (vocab, V', map, pad id): from a tokenizer.json, a
 * map file, or synthetic (t mod cvocab over vocab ids); *map: the map, for
 * the caller to free; *from: where it came from.  0 or an exit code. */
static int build_token_map(const char *tokenizer, const char *mapfile, uint64_t vocab, uint64_t cvocab,
                           engram_layout *l, uint32_t **map, const char **from)
{
    *from = "synthetic (t mod V')";
    if (tokenizer) {
        engram_tokmap tm;
        engram_error err = {0};
        int rc = engram_tokmap_from_json(tokenizer, &tm, &err);
        if (rc < 0)
            return fail_lib(rc, &err, "build: tokenizer");
        *map = tm.map;
        tm.map = NULL;
        vocab = tm.vocab;
        cvocab = tm.compressed_vocab;
        engram_tokmap_free(&tm);
        *from = tokenizer;
    } else if (mapfile) {
        int rc = read_map_file(mapfile, map, &vocab, &cvocab);
        if (rc)
            return rc;
        *from = mapfile;
    } else {
        *map = malloc(vocab * sizeof **map);
        if (!*map)
            return fail_oom("build: the token map", vocab * sizeof **map);
        for (uint64_t t = 0; t < vocab; t++)
            (*map)[t] = (uint32_t)(t % cvocab);
    }
    l->vocab = (uint32_t)vocab;
    l->compressed_vocab = (uint32_t)cvocab;
    l->token_map = *map;
    l->pad_id = (*map)[2 % vocab]; /* raw pad token 2 */
    return 0;
}

/* l's multipliers (for its V', layers 1 and 14), primes (from base) and
 * the rows per table they give.  0 or an exit code. */
static int build_tables(engram_layout *l, uint64_t base)
{
    for (int t = 0; t < ENGRAM_TABLES; t++)
        engram_layout_multipliers(l->compressed_vocab, t ? 14 : 1, ENGRAM_NGRAM, l->multipliers[t]);
    uint32_t primes[ENGRAM_TABLES * ENGRAM_COLUMNS];
    int rc = engram_layout_primes((uint32_t)base, ENGRAM_TABLES, ENGRAM_NGRAM, ENGRAM_HEADS, primes,
                                  ENGRAM_TABLES * ENGRAM_COLUMNS);
    if (rc < 0)
        return fail_lib(rc, NULL, "build: primes");
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        uint64_t sum = 0;
        for (int c = 0; c < ENGRAM_COLUMNS; c++) {
            l->primes[t][c] = primes[t * ENGRAM_COLUMNS + c];
            sum += l->primes[t][c];
        }
        if (sum > UINT32_MAX)
            return fail_usage("build: --base too large: a table would exceed 2^32 rows");
        l->rows[t] = (uint32_t)sum;
    }
    return 0;
}

/* The qwen4exp build of cmd_build: options already parsed and checked
 * against the architecture.  0 or an exit code. */
static int build_ple(const char *out, uint64_t base, uint64_t width, engram_fill fill, uint64_t seed)
{
    engram_ple_build_opts o;
    memset(&o, 0, sizeof o);
    o.base = (uint32_t)base;
    o.width = (uint32_t)width;
    o.fill = fill;
    o.seed = seed;
    double t0 = now_s();
    if (isatty(2)) {
        o.progress = build_progress;
        o.progress_ctx = &t0;
    }
    engram_error err = {0};
    int rc = engram_build_ple_model(out, &o, &err);
    if (o.progress)
        fputc('\n', stderr);
    if (rc == -EINVAL) /* the options (a base whose heads pass int32) */
        return fail_usage("build: %s", err.msg);
    if (rc < 0)
        return fail_lib(rc, &err, out);
    double dt = now_s() - t0;
    struct stat st;
    uint64_t bytes = 0, used = 0;
    if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
        bytes = (uint64_t)st.st_size;
        used = (uint64_t)st.st_blocks * 512;
    }
    printf("wrote %s: qwen4exp, vocab 248320, 16 heads from base %" PRIu64 ", width %" PRIu64
           ", fill %s, seed %" PRIu64 ", %" PRIu64 " bytes (%" PRIu64 " on disk) (%.2f s)\n",
           out, base, width, fill == ENGRAM_FILL_ZERO ? "zero" : "normal", seed, bytes, used, dt);
    return 0;
}

int cmd_build(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(build_help, stdout);
        return 0;
    }
    const char *out = NULL, *tokenizer = NULL, *mapfile = NULL;
    uint64_t base = 16000000, width = 0, seed = 1, vocab = 129280, cvocab = 99092, ver = 3;
    int ple = 0, base_set = 0, width_set = 0;
    const char *v41_only = NULL; /* the first option given that only V4.1 has */
    engram_fill fill = ENGRAM_FILL_ZERO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        struct { const char *name; uint64_t *dst; uint64_t max; int v41; int *set; } num[] = {
            {"--base", &base, UINT32_MAX, 0, &base_set}, {"--width", &width, 1u << 20, 0, &width_set},
            {"--seed", &seed, UINT64_MAX, 0, NULL}, {"--vocab", &vocab, 1u << 24, 1, NULL},
            {"--compressed-vocab", &cvocab, 1u << 24, 1, NULL}, {"--gguf-version", &ver, 3, 1, NULL},
        };
        int matched = 0;
        for (size_t k = 0; k < sizeof num / sizeof num[0] && !matched; k++) {
            if (strcmp(a, num[k].name))
                continue;
            matched = 1;
            if (i + 1 >= argc || parse_u64(argv[i + 1], num[k].max, num[k].dst) < 0)
                return fail_usage("build: %s needs a number <= %" PRIu64, a, num[k].max);
            i++;
            if (num[k].v41 && !v41_only)
                v41_only = a;
            if (num[k].set)
                *num[k].set = 1;
        }
        if (matched)
            continue;
        if (!strcmp(a, "--fill")) {
            const char *f = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(f, "zero"))
                fill = ENGRAM_FILL_ZERO;
            else if (!strcmp(f, "random"))
                fill = ENGRAM_FILL_RANDOM;
            else if (!strcmp(f, "sparse"))
                fill = ENGRAM_FILL_SPARSE;
            else if (!strcmp(f, "pool"))
                fill = ENGRAM_FILL_POOL;
            else if (!strcmp(f, "normal"))
                fill = ENGRAM_FILL_NORMAL;
            else
                return fail_usage("build: --fill takes zero, random, sparse, pool or normal");
        } else if (!strcmp(a, "--arch")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "qwen4exp"))
                ple = 1;
            else if (!strcmp(v, "deepseek41"))
                ple = 0;
            else
                return fail_usage("build: --arch takes deepseek41 (V4.1, the default) or qwen4exp");
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            tokenizer = argv[++i];
            v41_only = v41_only ? v41_only : "--tokenizer";
        } else if (!strcmp(a, "--tokmap") && i + 1 < argc) {
            mapfile = argv[++i];
            v41_only = v41_only ? v41_only : "--tokmap";
        } else if (a[0] == '-' && a[1]) {
            return fail_usage("build: unknown option '%s'", a);
        } else if (!out) {
            out = a;
        } else {
            return fail_usage("build: more than one OUT");
        }
    }
    if (!out)
        return fail_usage("build: OUT.gguf is required");
    if (!v41_only && fill != ENGRAM_FILL_ZERO && fill != ENGRAM_FILL_NORMAL)
        v41_only = fill == ENGRAM_FILL_RANDOM ? "--fill random"
                   : fill == ENGRAM_FILL_SPARSE ? "--fill sparse" : "--fill pool";
    if (ple && v41_only)
        return fail_usage("build: %s is an option of --arch deepseek41 (V4.1), not of qwen4exp", v41_only);
    if (ple) {
        base = base_set ? base : 19999999;
        width = width_set ? width : 2560;
        if (base < 2 || base > UINT32_MAX)
            return fail_usage("build: bad --base");
        if (width == 0 || width > ENGRAM_MAX_WIDTH)
            return fail_usage("build: --width of a qwen4exp model takes 1..%u", ENGRAM_MAX_WIDTH);
        int cst = fout_check(out, ENGRAM_OUTPUT_SEEKABLE);
        return cst ? cst : build_ple(out, base, width, fill, seed);
    }
    if (tokenizer && mapfile)
        return fail_usage("build: --tokenizer and --tokmap exclude each other");
    /* a model is written at offsets: OUT is a regular file or a new name,
     * not an input */
    const char *paths[3] = {out, tokenizer, mapfile};
    const char *names[3] = {"OUT", "--tokenizer", "--tokmap"};
    int cst = fout_check(out, ENGRAM_OUTPUT_SEEKABLE);
    if (cst || (cst = fout_distinct(paths, names, 3, 1)) != 0)
        return cst;
    if (ver < 2 || cvocab == 0 || vocab == 0 || base < 2)
        return fail_usage("build: bad --gguf-version, --vocab, --compressed-vocab or --base");

    engram_build_opts o;
    memset(&o, 0, sizeof o);
    engram_layout *l = &o.layout;
    uint32_t *map = NULL;
    const char *map_from = NULL;
    int rc = build_token_map(tokenizer, mapfile, vocab, cvocab, l, &map, &map_from);
    if (rc)
        return rc;
    rc = build_tables(l, base);
    if (rc) {
        free(map);
        return rc;
    }
    o.width = (uint32_t)width;
    o.fill = fill;
    o.seed = seed;
    o.gguf_version = (int)ver;
    double t0 = now_s();
    if (isatty(2)) {
        o.progress = build_progress;
        o.progress_ctx = &t0;
    }
    engram_error err = {0};
    rc = engram_build_model(out, &o, &err);
    if (o.progress)
        fputc('\n', stderr);
    free(map);
    if (rc < 0)
        return fail_lib(rc, &err, out);
    printf("wrote %s: vocab %u -> V' %u (map: %s), rows %u + %u, width %u, fill %s, seed %" PRIu64
           " (%.2f s)\n",
           out, l->vocab, l->compressed_vocab, map_from, l->rows[0], l->rows[1], o.width,
           fill == ENGRAM_FILL_ZERO ? "zero" : fill == ENGRAM_FILL_RANDOM ? "random"
                                     : fill == ENGRAM_FILL_SPARSE ? "sparse"
                                     : fill == ENGRAM_FILL_POOL ? "pool" : "normal", seed,
           now_s() - t0);
    return 0;
}

int cmd_tools(const char *name, int argc, char **argv)
{
    if (!strcmp(name, "tokmap"))
        return cmd_tokmap(argc, argv);
    if (!strcmp(name, "layout"))
        return cmd_layout(argc, argv);
    if (!strcmp(name, "quantize"))
        return cmd_quantize(argc, argv);
    if (!strcmp(name, "dequantize"))
        return cmd_dequantize(argc, argv);
    if (!strcmp(name, "shard"))
        return cmd_shard(argc, argv);
    return -1;
}
