/*
 * engram - command-line tool over libengram's public API.
 *
 * Exit codes (all commands):
 *   0  success
 *   1  the data is invalid: a malformed model, an invalid row, a bad token
 *      (verify: at least one invalid row was found)
 *   2  usage error
 *   3  system error (open, read, memory)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Fast decimal output for large hash dumps. */
struct outbuf {
    char buf[1 << 16];
    size_t n;
};

static void out_flush(struct outbuf *o)
{
    fwrite(o->buf, 1, o->n, stdout);
    o->n = 0;
}

static void out_u32(struct outbuf *o, uint32_t v, char sep)
{
    if (o->n + 12 > sizeof o->buf)
        out_flush(o);
    char tmp[10];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k)
        o->buf[o->n++] = tmp[--k];
    o->buf[o->n++] = sep;
}

/* ---------------------------------------------------------------- info */

static const char *info_help =
    "usage: engram info MODEL [--json]\n"
    "Prints the model's GGUF header summary, Engram layout (vocab, V', pad, per-table\n"
    "rows, bytes, offsets, primes, multipliers) and whether the file meets the\n"
    "reference engine's placement rule (tables last, table 0 page-aligned).\n";

static void primes_summary(const uint32_t *p, uint32_t *mn, uint32_t *mx, uint64_t *sum)
{
    *mn = UINT32_MAX;
    *mx = 0;
    *sum = 0;
    for (int c = 0; c < ENGRAM_COLUMNS; c++) {
        *mn = p[c] < *mn ? p[c] : *mn;
        *mx = p[c] > *mx ? p[c] : *mx;
        *sum += p[c];
    }
}

static void json_str(const char *s)
{
    cli_json_string(stdout, s);
}

/* The model's summary as one JSON object (io: how table reads will be
 * done here). */
static void info_json(const engram_model_info *in, const engram_layout *l, const engram_io_stats *io)
{
    int placement = in->tables_last && in->table0_page_aligned;
    printf("{\"path\":");
    json_str(in->path);
    printf(",\"architecture\":");
    json_str(in->architecture);
    printf(",\"gguf_version\":%u,\"file_bytes\":%" PRIu64 ",\"tensors\":%" PRIu64
           ",\"keys\":%" PRIu64 ",\"alignment\":%u",
           in->gguf_version, in->file_bytes, in->n_tensors, in->n_kv, in->alignment);
    printf(",\"vocab\":%u,\"compressed_vocab\":%u,\"pad_id\":%u", l->vocab,
           l->compressed_vocab, l->pad_id);
    printf(",\"tables\":[");
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const engram_table_info *ti = &in->table[t];
        uint32_t mn, mx;
        uint64_t sum;
        primes_summary(l->primes[t], &mn, &mx, &sum);
        printf("%s{\"index\":%d,\"layer\":%d,\"tensor\":", t ? "," : "", t, ti->layer);
        json_str(ti->name);
        printf(",\"rows\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"offset\":%" PRIu64,
               ti->rows, ti->bytes, ti->offset);
        printf(",\"primes\":[");
        for (int c = 0; c < ENGRAM_COLUMNS; c++)
            printf("%s%u", c ? "," : "", l->primes[t][c]);
        printf("],\"primes_min\":%u,\"primes_max\":%u,\"primes_sum\":%" PRIu64, mn, mx, sum);
        printf(",\"multipliers\":[");
        for (int j = 0; j < ENGRAM_NGRAM; j++)
            printf("%s%" PRIu64, j ? "," : "", l->multipliers[t][j]);
        printf("]}");
    }
    printf("],\"projection\":%s,\"projection_layers\":[%s%s%s],\"width\":%u,\"streams\":%u",
           in->has_projection ? "true" : "false", in->table[0].has_projection ? "1" : "",
           in->table[0].has_projection && in->table[1].has_projection ? "," : "",
           in->table[1].has_projection ? "14" : "", in->width, in->streams);
    printf(",\"placement\":{\"tables_last\":%s,\"table0_page_aligned\":%s,\"reference_ok\":%s}",
           in->tables_last ? "true" : "false", in->table0_page_aligned ? "true" : "false",
           placement ? "true" : "false");
    const engram_shard_info *sh = &in->shard;
    if (sh->world)
        printf(",\"shard\":{\"rank\":%u,\"world\":%u,\"model_id\":\"%s\",\"first_row\":[%" PRIu64 ",%" PRIu64
               "],\"rows\":[%" PRIu64 ",%" PRIu64 "],\"total_rows\":[%" PRIu64 ",%" PRIu64 "]}",
               sh->rank, sh->world, sh->model_id, sh->first_row[0], sh->first_row[1], sh->rows[0], sh->rows[1],
               sh->total_rows[0], sh->total_rows[1]);
    else
        printf(",\"shard\":null");
    printf(",\"simd\":");
    json_str(engram_simd_name(engram_simd_selected()));
    printf(",\"io\":{\"engine\":");
    json_str(io->engine);
    printf(",\"direct\":%s,\"align\":%u,\"depth\":%u,\"drop\":", io->direct ? "true" : "false",
           io->align, io->depth);
    json_str(io->drop);
    printf(",\"note\":");
    json_str(io->note);
    printf("}}\n");
}

/* The reader's engine, as `engram info` reports it (a thread pool's
 * threads: ENGRAM_READER_THREADS of its depth). */
static void print_reads(const engram_io_stats *io)
{
    char threads[32] = "";
    if (!strcmp(io->engine, "threads") || !strcmp(io->engine, "buffered"))
        snprintf(threads, sizeof threads, " (%u threads)", ENGRAM_READER_THREADS(io->depth));
    printf("table reads:     %s, %s, alignment %u, depth %u%s%s%s%s%s\n", io->engine,
           io->direct ? "O_DIRECT (no page cache)" : "buffered", io->align, io->depth, threads,
           io->drop[0] ? ", drop-behind " : "", io->drop, io->note[0] ? "; " : "", io->note);
}

/* A PLE model's summary (text or one JSON object): the family's numbers,
 * the table and its placement, and (text) how table reads will be done
 * here. */
static void info_ple(const engram_model_info *in, const engram_io_stats *io, int json)
{
    const engram_family *f = &in->family;
    const engram_table_info *ti = &in->table[0];
    if (json) {
        printf("{\"path\": ");
        cli_json_string(stdout, in->path);
        printf(", \"architecture\": ");
        cli_json_string(stdout, in->architecture);
        printf(", \"member\": \"%s\", \"file_bytes\": %" PRIu64 ", \"vocab\": %u, \"eos\": %u, "
               "\"ngram\": %u, \"heads\": %u, \"rows_per_token\": %u, \"row_bytes\": %u, "
               "\"row_values\": %u, \"encoding\": \"bf16\", \"layer\": %u, \"rows\": %" PRIu64
               ", \"table_offset\": %" PRIu64 ", \"width\": %u, \"streams\": %u, "
               "\"state_floats\": %u, \"tables_last\": %s}\n",
               f->name, in->file_bytes, f->vocab, f->eos, f->ngram, f->heads, f->rows_per_token,
               f->row_bytes, f->row_values, f->layers[0], ti->rows, ti->offset, in->width,
               in->streams, f->state_floats, in->tables_last ? "true" : "false");
        return;
    }
    printf("file:            %s (%" PRIu64 " bytes)\n", in->path, in->file_bytes);
    printf("gguf:            v%u, %" PRIu64 " tensors, %" PRIu64 " keys, alignment %u\n",
           in->gguf_version, in->n_tensors, in->n_kv, in->alignment);
    printf("architecture:    %s: the %s member (SPEC.md section 10)\n", in->architecture, f->name);
    printf("vocab:           %u raw ids (no compression), eos %u\n", f->vocab, f->eos);
    printf("hash:            %u-grams, %u heads per order, %u rows per token\n", f->ngram,
           f->heads, f->rows_per_token);
    printf("table:           layer %u, %s\n", f->layers[0], ti->name);
    printf("  rows:          %" PRIu64 " of %u BF16 values (%" PRIu64 " bytes, %.2f GiB) at offset %"
           PRIu64 "\n", ti->rows, f->row_values, ti->bytes,
           (double)ti->bytes / (1024.0 * 1024 * 1024), ti->offset);
    printf("layer:           width %u, %u streams; state %u floats per sequence\n", in->width,
           in->streams, f->state_floats);
    printf("placement:       table last: %s; page-aligned: %s\n", in->tables_last ? "yes" : "no",
           in->table0_page_aligned ? "yes" : "no");
    print_reads(io);
}

/* The model's summary for people. */
static void info_text(const engram_model_info *in, const engram_layout *l, const engram_io_stats *io)
{
    int placement = in->tables_last && in->table0_page_aligned;
    printf("file:            %s (%" PRIu64 " bytes)\n", in->path, in->file_bytes);
    printf("gguf:            v%u, %" PRIu64 " tensors, %" PRIu64 " keys, alignment %u\n",
           in->gguf_version, in->n_tensors, in->n_kv, in->alignment);
    printf("architecture:    %s (encoding e4m3_e8m0_32_row264)\n", in->architecture);
    printf("vocab:           %u raw ids -> %u compressed ids, pad_id %u\n", l->vocab,
           l->compressed_vocab, l->pad_id);
    const engram_shard_info *sh = &in->shard;
    if (sh->world)
        printf("shard:           rank %u of %u of model %s: table 0 rows [%" PRIu64 ", %" PRIu64
               ") of %" PRIu64 ", table 1 rows [%" PRIu64 ", %" PRIu64 ") of %" PRIu64 "\n",
               sh->rank, sh->world, sh->model_id, sh->first_row[0], sh->first_row[0] + sh->rows[0],
               sh->total_rows[0], sh->first_row[1], sh->first_row[1] + sh->rows[1], sh->total_rows[1]);
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const engram_table_info *ti = &in->table[t];
        uint32_t mn, mx;
        uint64_t sum;
        primes_summary(l->primes[t], &mn, &mx, &sum);
        printf("table %d:         layer %d, %s\n", t, ti->layer, ti->name);
        if (sh->world)
            printf("  rows:          %" PRIu64 " of %" PRIu64 " held (%" PRIu64 " bytes, %.2f GiB) at offset %"
                   PRIu64 "\n", sh->rows[t], ti->rows, ti->bytes, (double)ti->bytes / (1024.0 * 1024 * 1024),
                   ti->offset);
        else
            printf("  rows:          %" PRIu64 " (%" PRIu64 " bytes, %.2f GiB) at offset %" PRIu64 "\n",
                   ti->rows, ti->bytes, (double)ti->bytes / (1024.0 * 1024 * 1024), ti->offset);
        printf("  primes:        24 columns, %u .. %u, first %u %u %u, sum %" PRIu64 "\n", mn, mx,
               l->primes[t][0], l->primes[t][1], l->primes[t][2], sum);
        printf("  multipliers:   %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
               l->multipliers[t][0], l->multipliers[t][1], l->multipliers[t][2],
               l->multipliers[t][3]);
    }
    if (in->width)
        printf("projection:      engram_kv F16 [6144, %u], q_norm/k_norm F32 [%u, %u]: width %u, "
               "%u streams, layers %s\n",
               (in->streams + 1) * in->width, in->width, in->streams, in->width, in->streams,
               in->has_projection ? "1 and 14"
                                  : in->table[0].has_projection ? "1 only (14 has none)"
                                                                : "14 only (1 has none)");
    else
        printf("projection:      absent (layout and tables only)\n");
    printf("placement:       tables last: %s; table 0 page-aligned: %s -> %s\n",
           in->tables_last ? "yes" : "no", in->table0_page_aligned ? "yes" : "no",
           placement ? "meets the reference engine's rule"
                     : "does NOT meet the reference engine's rule");
    printf("row decoder:     %s\n", engram_simd_name(engram_simd_selected()));
    print_reads(io);
}

static int cmd_info(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(info_help, stdout);
        return 0;
    }
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (argv[i][0] == '-')
            return fail_usage("info: unknown option '%s'", argv[i]);
        else if (!path)
            path = argv[i];
        else
            return fail_usage("info: more than one MODEL");
    }
    if (!path)
        return fail_usage("info: MODEL is required");
    engram_model *m;
    int st = open_model_any(path, &m);
    if (st)
        return st;
    engram_model_info in;
    engram_model_get_info(m, &in);
    engram_reader *rd = NULL;
    engram_io_stats io;
    memset(&io, 0, sizeof io);
    io.engine = "unavailable";
    io.note = io.drop = "";
    engram_error rerr;
    if (engram_reader_open(m, NULL, &rd, &rerr) == 0)
        engram_reader_get_stats(rd, &io);
    else
        io.note = rerr.msg;
    if (in.family.member == ENGRAM_MEMBER_PLE)
        info_ple(&in, &io, json);
    else if (json)
        info_json(&in, engram_model_layout(m), &io);
    else
        info_text(&in, engram_model_layout(m), &io);
    engram_reader_close(rd);
    engram_model_close(m);
    return 0;
}

/* ---------------------------------------------------------------- hash */

#define HASH_CHUNK 4096u /* tokens read, hashed and printed at a time */

static const char *hash_help =
    "usage: engram hash MODEL --tokens FILE [--mask FILE] [--history A,B,C] [--summary]\n"
    "FILE holds whitespace-separated decimal token ids ('-' = stdin).  The mask file\n"
    "holds one 0/1 per token (0 = masked: hashed as all pad, no history).  --history\n"
    "sets the starting hash state: 3 compressed ids, newest first, -1 for dead\n"
    "(default -1,-1,-1).  Prints one line per token: 48 row ids (table 0's 24\n"
    "columns, then table 1's; table-local, as `engram rows` takes them).\n"
    "--summary prints statistics instead: tokens, hashing speed, distinct rows.\n"
    "The files are read, hashed and printed 4096 tokens at a time, the mask in step\n"
    "with the tokens, so memory does not grow with their length (about 1 MiB;\n"
    "--summary adds a bit per row of each table to count distinct rows: 96 MiB for\n"
    "V4.1's tables) and time is linear in it.  An invalid item, a token >= vocab or\n"
    "a mask of another length ends the command with exit 1 where it is found: the\n"
    "lines printed before it (whole chunks of 4096 tokens) are valid.\n";

/* The streams, one chunk's buffers and, for --summary, the counts. */
struct hash_run {
    struct numfile tok, mask;
    int with_mask;
    size_t done;                                /* tokens hashed so far          */
    uint32_t tokens[HASH_CHUNK], maskv[HASH_CHUNK];
    uint8_t mask8[HASH_CHUNK];
    uint32_t rows[HASH_CHUNK * ENGRAM_ROWS_PER_TOKEN];
    struct outbuf out;
    /* --summary */
    uint64_t *seen[ENGRAM_TABLES];              /* a bit per row of each table   */
    size_t distinct[ENGRAM_TABLES], masked;
    double hash_s;                              /* sum of each chunk's best time */
};

/* The rest of nf's numbers checked and counted into *n, not kept (buf:
 * cap numbers of scratch).  0 or an exit code. */
static int count_rest(struct numfile *nf, uint32_t *buf, size_t cap, size_t *n)
{
    size_t got;
    do {
        int st = numfile_read(nf, buf, cap, &got);
        if (st)
            return st;
        *n += got;
    } while (got == cap);
    return 0;
}

/* The next chunk of tokens (*k, 0 at the end) and as many mask entries,
 * one more when the tokens end, to see that the mask ends with them.  0,
 * or an exit code after printing what is wrong (for a mask of another
 * length, the two files' lengths: what is left of them is read to count). */
static int next_chunk(struct hash_run *H, size_t *k)
{
    int st = numfile_read(&H->tok, H->tokens, HASH_CHUNK, k);
    if (st || !H->with_mask)
        return st;
    size_t want = *k < HASH_CHUNK ? *k + 1 : *k, km;
    st = numfile_read(&H->mask, H->maskv, want, &km);
    if (st)
        return st;
    if (km != *k) {
        size_t nt = H->done + *k, nm = H->done + km;
        if (km == want && (st = count_rest(&H->mask, H->maskv, HASH_CHUNK, &nm)) != 0)
            return st;
        if (*k == HASH_CHUNK && (st = count_rest(&H->tok, H->tokens, HASH_CHUNK, &nt)) != 0)
            return st;
        fprintf(stderr, "%s: mask file has %zu entries for %zu tokens\n", prog, nm, nt);
        return EXIT_DATA;
    }
    for (size_t i = 0; i < *k; i++)
        H->mask8[i] = (uint8_t)H->maskv[i];
    return 0;
}

/* A failed hash of the chunk: a token >= vocab named by its position in
 * the stream (the library names it in the chunk), or the library's error. */
static int hash_error(const struct hash_run *H, const engram_hasher *hs, size_t k, int rc,
                      const engram_error *err)
{
    uint32_t vocab = engram_hasher_layout(hs)->vocab;
    for (size_t i = 0; i < k; i++)
        if (H->tokens[i] >= vocab) {
            fprintf(stderr, "%s: hash: token %u at position %zu is not < vocab %u\n", prog,
                    H->tokens[i], H->done + i, vocab);
            return EXIT_DATA;
        }
    return fail_lib(rc, err, "hash");
}

/* One chunk's rows into the summary's counts. */
static void count_chunk(struct hash_run *H, size_t k)
{
    for (size_t i = 0; H->with_mask && i < k; i++)
        H->masked += !H->mask8[i];
    for (size_t i = 0; i < k; i++)
        for (int t = 0; t < ENGRAM_TABLES; t++) {
            const uint32_t *r = H->rows + i * ENGRAM_ROWS_PER_TOKEN + t * ENGRAM_COLUMNS;
            uint64_t *seen = H->seen[t];
            size_t fresh = 0;
            for (int c = 0; c < ENGRAM_COLUMNS; c++) {
                uint64_t bit = 1ull << (r[c] & 63);
                fresh += !(seen[r[c] >> 6] & bit);
                seen[r[c] >> 6] |= bit;
            }
            H->distinct[t] += fresh;
        }
}

static void print_chunk(struct hash_run *H, size_t k)
{
    for (size_t i = 0; i < k; i++)
        for (int c = 0; c < ENGRAM_ROWS_PER_TOKEN; c++)
            out_u32(&H->out, H->rows[i * ENGRAM_ROWS_PER_TOKEN + c],
                    c + 1 < ENGRAM_ROWS_PER_TOKEN ? ' ' : '\n');
}

static void hash_summary(const struct hash_run *H)
{
    size_t n = H->done, req = n * ENGRAM_COLUMNS;
    printf("tokens:          %zu (%zu masked)\n", n, H->masked);
    printf("row requests:    %zu (48 per token)\n", n * ENGRAM_ROWS_PER_TOKEN);
    for (int t = 0; t < ENGRAM_TABLES; t++)
        printf("table %d:         %zu distinct rows of %zu requests (%.1f%% repeated)\n", t,
               H->distinct[t], req, req ? 100.0 * (double)(req - H->distinct[t]) / (double)req : 0.0);
    if (n && H->hash_s > 0)
        printf("hash speed:      %.2f M tokens/s on one core (%.1f ns/token, best of 5 a chunk)\n",
               (double)n / H->hash_s / 1e6, H->hash_s / (double)n * 1e9);
}

/* The streams hashed from history h, chunk by chunk: each printed, or
 * counted for the summary (then hashed 4 times more from the same history,
 * for its best time).  0 or an exit code. */
static int hash_stream(struct hash_run *H, const engram_hasher *hs, engram_history *h, int summary)
{
    for (;;) {
        size_t k;
        int st = next_chunk(H, &k);
        if (st || k == 0)
            return st;
        engram_error err = {0};
        const uint8_t *mask = H->with_mask ? H->mask8 : NULL;
        engram_history start = *h;
        double t0 = now_s();
        int rc = engram_hash_tokens(hs, h, H->tokens, mask, k, H->rows, &err);
        double best = now_s() - t0;
        if (rc < 0)
            return hash_error(H, hs, k, rc, &err);
        if (summary) {
            for (int rep = 1; rep < 5; rep++) {
                engram_history hh = start;
                t0 = now_s();
                engram_hash_tokens(hs, &hh, H->tokens, mask, k, H->rows, NULL);
                double dt = now_s() - t0;
                best = dt < best ? dt : best;
            }
            H->hash_s += best;
            count_chunk(H, k);
        } else {
            print_chunk(H, k);
        }
        H->done += k;
        if (k < HASH_CHUNK)
            return 0;
    }
}

/* hash on a PLE model: 16 global row ids per line (head 0 first), a mask
 * entry 0 hashing its token as padding (EOS).  0 or an exit code. */
static int hash_stream_ple(struct hash_run *H, const engram_model *m, engram_ple_history *h)
{
    for (;;) {
        size_t k;
        int st = next_chunk(H, &k);
        if (st || k == 0)
            return st;
        if (H->with_mask)
            for (size_t i = 0; i < k; i++)
                H->mask8[i] = H->mask8[i] ? ENGRAM_PLE_TEXT : ENGRAM_PLE_PAD;
        engram_error err = {0};
        int rc = engram_ple_hash(m, h, H->tokens, H->with_mask ? H->mask8 : NULL, k, H->rows, &err);
        if (rc < 0) {
            out_flush(&H->out);
            fprintf(stderr, "%s: hash: in the tokens from %zu on: %s\n", prog, H->done, err.msg);
            return rc == -EINVAL ? EXIT_DATA : EXIT_SYSTEM;
        }
        for (size_t i = 0; i < k; i++)
            for (int c = 0; c < ENGRAM_PLE_ROWS_PER_TOKEN; c++)
                out_u32(&H->out, H->rows[i * ENGRAM_PLE_ROWS_PER_TOKEN + (size_t)c],
                        c == ENGRAM_PLE_ROWS_PER_TOKEN - 1 ? '\n' : ' ');
        H->done += k;
        if (k < HASH_CHUNK)
            return 0;
    }
}

static int cmd_hash(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(hash_help, stdout);
        return 0;
    }
    const char *path = NULL, *tok_path = NULL, *mask_path = NULL, *hist = NULL;
    int summary = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tokens") || !strcmp(a, "--mask") || !strcmp(a, "--history")) {
            if (i + 1 >= argc)
                return fail_usage("hash: %s needs a value", a);
            const char **dst = a[2] == 't' ? &tok_path : a[2] == 'm' ? &mask_path : &hist;
            *dst = argv[++i];
        } else if (!strcmp(a, "--summary")) {
            summary = 1;
        } else if (a[0] == '-') {
            return fail_usage("hash: unknown option '%s'", a);
        } else if (!path) {
            path = a;
        } else {
            return fail_usage("hash: more than one MODEL");
        }
    }
    if (!path || !tok_path)
        return fail_usage("hash: MODEL and --tokens FILE are required");
    if (mask_path && !strcmp(tok_path, "-") && !strcmp(mask_path, "-"))
        return fail_usage("hash: --tokens and --mask cannot both be '-' (they are read in step)");
    engram_history h;
    engram_history_reset(&h);
    if (hist && parse_history(hist, &h) < 0)
        return fail_usage("hash: --history takes 3 comma-separated ids (newest first, -1 = dead)");

    struct hash_run *H = calloc(1, sizeof *H);
    if (!H) {
        fprintf(stderr, "%s: hash: out of memory\n", prog);
        return EXIT_SYSTEM;
    }
    H->tok.fd = H->mask.fd = -1;
    H->with_mask = mask_path != NULL;
    engram_model *m = NULL;
    int st = numfile_open(&H->tok, tok_path, UINT32_MAX, "token");
    if (!st && mask_path)
        st = numfile_open(&H->mask, mask_path, 1, "mask");
    if (!st)
        st = open_model_any(path, &m);
    engram_model_info mi;
    if (!st)
        engram_model_get_info(m, &mi);
    if (!st && mi.family.member == ENGRAM_MEMBER_PLE) {
        if (summary || hist)
            st = fail_usage("hash: --summary and --history serve V4.1 models only so far; '%s' "
                            "is a %s model", path, mi.family.name);
        engram_ple_history ph;
        engram_ple_history_reset(m, &ph);
        if (!st)
            st = hash_stream_ple(H, m, &ph);
        out_flush(&H->out);
        summary = 0;
        goto done;
    }
    for (int t = 0; !st && summary && t < ENGRAM_TABLES; t++) {
        uint32_t rows = engram_model_layout(m)->rows[t];
        if (!(H->seen[t] = calloc(rows / 64 + 1, sizeof *H->seen[t]))) {
            fprintf(stderr, "%s: hash: out of memory for the summary's %u-row bitmap\n", prog, rows);
            st = EXIT_SYSTEM;
        }
    }
    if (!st)
        st = hash_stream(H, engram_model_hasher(m), &h, summary);
    out_flush(&H->out);
    if (!st && summary)
        hash_summary(H);
done:
    engram_model_close(m);
    numfile_close(&H->tok);
    numfile_close(&H->mask);
    for (int t = 0; t < ENGRAM_TABLES; t++)
        free(H->seen[t]);
    free(H);
    return st;
}

/* ---------------------------------------------------------------- rows */

static const char *rows_help =
    "usage: engram rows MODEL --table T (ROW... | --rows FILE)\n"
    "Decodes rows of table T (0 = layer 1, 1 = layer 14); ROW ids are table-local,\n"
    "as `engram hash` prints them; FILE holds whitespace-separated ids.  Prints one\n"
    "line per row: the 256 decoded values (%.9g, single spaces).  If any requested\n"
    "row is out of range or does not decode, nothing is printed and the command\n"
    "exits 1 naming the row and the reason.  FILE may hold up to 2^24 ids (more:\n"
    "exit 1 as it is read); rows are decoded 4096 at a time, twice when there are\n"
    "more (once to check them all, once to print): memory is the ids (4 bytes each)\n"
    "and 5 MiB.\n";

#define ROWS_CHUNK 4096u /* rows decoded at a time: 4 MiB of values */

/* The n rows of table t decoded and printed, ROWS_CHUNK at a time: as one
 * engram_model_read_f32 of them all would, the first row out of range, or
 * else the first that does not decode, is the error, and nothing is
 * printed then (more than a chunk: all are decoded once to check them
 * before the pass that prints).  0 or an exit code. */
static int print_rows(const engram_model *m, int t, const uint32_t *ids, size_t n)
{
    engram_model_info in;
    engram_model_get_info(m, &in);
    const int nv = (int)in.family.row_values; /* 256, or 160 for PLE */
    if ((uint32_t)t >= in.family.tables)
        return fail_usage("rows: '%s' has one table: --table 0", in.path);
    float *vals = malloc((n < ROWS_CHUNK ? (n ? n : 1) : ROWS_CHUNK) * (size_t)nv * sizeof *vals);
    if (!vals) {
        fprintf(stderr, "%s: rows: out of memory\n", prog);
        return EXIT_SYSTEM;
    }
    engram_error err = {0};
    int st = 0;
    /* the rows the file holds: the table, or a shard file's block */
    uint64_t first = in.shard.first_row[t], rows = in.shard.rows[t];
    for (size_t i = 0; i < n && !st; i++)
        if (ids[i] - first >= rows) /* the library's message for it */
            st = fail_lib(engram_model_read_f32(m, t, ids + i, 1, vals, &err), &err, "rows");
    for (int pass = n > ROWS_CHUNK ? 0 : 1; pass < 2 && !st; pass++)
        for (size_t at = 0; at < n && !st; at += ROWS_CHUNK) {
            size_t k = n - at < ROWS_CHUNK ? n - at : ROWS_CHUNK;
            int rc = engram_model_read_f32(m, t, ids + at, k, vals, &err);
            if (rc < 0)
                st = fail_lib(rc, &err, "rows");
            for (size_t r = 0; pass == 1 && !st && r < k; r++)
                for (int i = 0; i < nv; i++)
                    printf("%.9g%c", (double)vals[r * (size_t)nv + (size_t)i],
                           i + 1 < nv ? ' ' : '\n');
        }
    free(vals);
    return st;
}

static int cmd_rows(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(rows_help, stdout);
        return 0;
    }
    const char *path = NULL, *rows_path = NULL;
    int64_t table = -1;
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int st = 0;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i];
        uint64_t v;
        if (!strcmp(a, "--table")) {
            if (i + 1 >= argc || parse_u64(argv[i + 1], ENGRAM_TABLES - 1, &v) < 0)
                st = fail_usage("rows: --table takes 0 or 1");
            else
                table = (int64_t)v, i++;
        } else if (!strcmp(a, "--rows")) {
            if (i + 1 >= argc)
                st = fail_usage("rows: --rows needs a FILE");
            else
                rows_path = argv[++i];
        } else if (a[0] == '-') {
            st = fail_usage("rows: unknown option '%s'", a);
        } else if (!path) {
            path = a;
        } else if (parse_u64(a, UINT32_MAX, &v) == 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                uint32_t *nv = realloc(ids, cap * sizeof *ids);
                if (!nv) {
                    st = fail_oom("rows: the row list", cap * sizeof *ids);
                    break;
                }
                ids = nv;
            }
            ids[n++] = (uint32_t)v;
        } else {
            st = fail_usage("rows: '%s' is not a row id", a);
        }
    }
    if (!st && (!path || table < 0 || (n == 0) == !rows_path))
        st = fail_usage("rows: MODEL, --table T and either ROW ids or --rows FILE are required");
    if (!st && rows_path)
        st = read_numbers(rows_path, UINT32_MAX, &ids, &n, "row");
    engram_model *m = NULL;
    if (!st)
        st = open_model_any(path, &m);
    if (!st)
        st = print_rows(m, (int)table, ids, n);
    engram_model_close(m);
    free(ids);
    return st;
}

/* ---------------------------------------------------------------- verify */

static const char *verify_help =
    "usage: engram verify MODEL [--table T]\n"
    "Scans whole tables with large sequential reads and lists every row that would\n"
    "be rejected, one line each:\n"
    "  table T row R: REASON\n"
    "V4.1 (tables 0 and 1): a NaN code, a NaN scale or a non-finite value; PLE (one\n"
    "table, 0): a BF16 value with an all-ones exponent (NaN or infinity), named by\n"
    "its index and bits.  Then one summary line per table.  Holes of sparse files\n"
    "(all zero, valid) are skipped without reading.  Read data is dropped from the\n"
    "page cache as it goes.  A progress bar is drawn on stderr when it is a\n"
    "terminal.  Exits 1 if any row is invalid.\n";

#define VERIFY_CHUNK_ROWS 16384u /* 4.3 MB per read (V4.1), 5.2 MB (PLE) */

struct scan_stats {
    uint64_t bad, read_bytes, hole_bytes;
};

/* What a table's rows are: their size and how one is checked. */
struct scan_rows {
    uint32_t bytes;     /* 264 (V4.1) or 320 (PLE)               */
    int bf16;           /* PLE: BF16 values, no codec to ask      */
};

/* The first of k BF16 rows (rb bytes each) holding a value whose exponent
 * is all ones (the PLE output stage refuses NaN and infinity): its index
 * within buf, with the value's index and bits; k if there is none. */
static size_t bf16_first_bad(const uint8_t *buf, size_t k, uint32_t rb, unsigned *vi, uint16_t *bits)
{
    for (size_t r = 0; r < k; r++) {
        const uint8_t *p = buf + r * rb;
        unsigned any = 0;
        for (uint32_t i = 0; i < rb; i += 2) /* the high byte holds the exponent's top 7 bits */
            any |= (p[i + 1] & 0x7fu) == 0x7fu && (p[i] & 0x80u);
        if (!any)
            continue;
        for (uint32_t i = 0; i < rb; i += 2) {
            uint16_t v = (uint16_t)(p[i] | p[i + 1] << 8);
            if ((v & 0x7f80u) == 0x7f80u) {
                *vi = i / 2;
                *bits = v;
                return r;
            }
        }
    }
    return k;
}

/* Lists the invalid rows among k read at table row `row`; counts them. */
static void report_bad_rows(int t, uint64_t row, const uint8_t *buf, size_t k,
                            const struct scan_rows *sr, int tty, struct scan_stats *s)
{
    size_t at = 0;
    while (at < k) {
        size_t i;
        char reason[256];
        if (sr->bf16) {
            unsigned vi = 0;
            uint16_t bits = 0;
            i = at + bf16_first_bad(buf + at * sr->bytes, k - at, sr->bytes, &vi, &bits);
            if (i == k)
                break;
            snprintf(reason, sizeof reason, "value %u: %s (BF16 0x%04x)", vi,
                     bits & 0x7fu ? "NaN" : bits & 0x8000u ? "-infinity" : "+infinity", bits);
        } else {
            engram_error e;
            if (engram_rows_check(buf + at * sr->bytes, k - at, &e) != -EDOM)
                break;
            i = at + (size_t)e.row;
            snprintf(reason, sizeof reason, "%s", row_reason(&e));
        }
        if (tty)
            fputc('\n', stderr);
        printf("table %d row %" PRIu64 ": %s\n", t, row + i, reason);
        s->bad++;
        at = i + 1;
    }
}

/* ti: the rows the file holds (a shard's block: rows counts them, and
 * `first` is the table row id of the first, as rows are named) */
static int scan_table(int fd, int t, const engram_table_info *ti, uint64_t first,
                      const struct scan_rows *sr, uint8_t *buf, int tty, struct scan_stats *s)
{
    const uint32_t rb = sr->bytes;
    uint64_t row = 0;
    double t0 = now_s(), last = 0;
    while (row < ti->rows) {
        uint64_t off = ti->offset + row * rb;
        /* Skip holes: they read as zeros, and zero rows are valid. */
        off_t data = lseek(fd, (off_t)off, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            data = (off_t)(ti->offset + ti->bytes);
        if (data > (off_t)off) {
            uint64_t skip_rows = ((uint64_t)data - off) / rb;
            if (skip_rows > ti->rows - row)
                skip_rows = ti->rows - row;
            row += skip_rows;
            s->hole_bytes += skip_rows * rb;
            if (skip_rows)
                continue;
        }
        uint64_t k = ti->rows - row < VERIFY_CHUNK_ROWS ? ti->rows - row : VERIFY_CHUNK_ROWS;
        size_t bytes = (size_t)k * rb;
        off = ti->offset + row * rb;
        size_t got = 0;
        while (got < bytes) {
            ssize_t r = pread(fd, buf + got, bytes - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                int e = r < 0 ? errno : EIO;
                fprintf(stderr, "%s%s: table %d: read at offset %" PRIu64 " failed: %s\n",
                        tty ? "\n" : "", prog, t, off + got, strerror(e));
                return EXIT_SYSTEM;
            }
            got += (size_t)r;
        }
        posix_fadvise(fd, (off_t)off, (off_t)bytes, POSIX_FADV_DONTNEED);
        s->read_bytes += bytes;
        report_bad_rows(t, first + row, buf, (size_t)k, sr, tty, s);
        row += k;
        if (tty && now_s() - last > 0.2) {
            last = now_s();
            progress_bar(t, row * rb, ti->bytes, t0);
        }
    }
    if (tty) {
        progress_bar(t, ti->bytes, ti->bytes, t0);
        fputc('\n', stderr);
    }
    return 0;
}

static int cmd_verify(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(verify_help, stdout);
        return 0;
    }
    const char *path = NULL;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        uint64_t v;
        if (!strcmp(argv[i], "--table")) {
            if (i + 1 >= argc || parse_u64(argv[i + 1], ENGRAM_TABLES - 1, &v) < 0)
                return fail_usage("verify: --table takes 0 or 1");
            only = (int)v;
            i++;
        } else if (argv[i][0] == '-') {
            return fail_usage("verify: unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return fail_usage("verify: more than one MODEL");
        }
    }
    if (!path)
        return fail_usage("verify: MODEL is required");
    engram_model *m;
    int st = open_model_any(path, &m);
    if (st)
        return st;
    engram_model_info in;
    engram_model_get_info(m, &in);
    const struct scan_rows sr = {in.family.row_bytes, in.family.encoding == ENGRAM_ROWS_BF16};
    if (only >= 0 && (uint32_t)only >= in.family.tables) {
        engram_model_close(m);
        return fail_usage("verify: '%s' is a %s model with one table: --table 0", path,
                          in.family.name);
    }
    int fd = engram_model_dup_fd(m);
    uint8_t *buf = malloc((size_t)VERIFY_CHUNK_ROWS * sr.bytes);
    int tty = isatty(2);
    uint64_t total_bad = 0;
    if (fd < 0 || !buf) {
        fprintf(stderr, "%s: %s\n", prog, fd < 0 ? strerror(-fd) : "out of memory");
        st = EXIT_SYSTEM;
    }
    for (int t = 0; t < (int)in.family.tables && !st; t++) {
        if (only >= 0 && t != only)
            continue;
        struct scan_stats s = {0};
        double t0 = now_s();
        engram_table_info held = in.table[t];
        held.rows = in.shard.rows[t];
        st = scan_table(fd, t, &held, in.shard.first_row[t], &sr, buf, tty, &s);
        double dt = now_s() - t0;
        if (st)
            break;
        total_bad += s.bad;
        if (in.shard.world)
            printf("table %d: shard rank %u of %u: rows [%" PRIu64 ", %" PRIu64 ") of %" PRIu64 "\n", t,
                   in.shard.rank, in.shard.world, in.shard.first_row[t], in.shard.first_row[t] + held.rows,
                   in.table[t].rows);
        printf("table %d: %" PRIu64 " rows, %" PRIu64 " invalid; read %.3f GB in %.2f s (%.1f MB/s), %.3f GB of holes skipped\n",
               t, held.rows, s.bad, (double)s.read_bytes / 1e9, dt,
               dt > 0 ? (double)s.read_bytes / dt / 1e6 : 0.0, (double)s.hole_bytes / 1e9);
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    engram_model_close(m);
    if (!st && total_bad)
        st = EXIT_DATA;
    return st;
}

/* ---------------------------------------------------------------- main */

static const char *main_help =
    "usage: engram COMMAND [ARGS]   (engram COMMAND --help for each)\n"
    "commands:\n"
    "  info MODEL [--json]                 model, layout and placement summary\n"
    "  hash MODEL --tokens FILE [...]      row ids of a token stream\n"
    "  rows MODEL --table T ROW...         decoded rows\n"
    "  verify MODEL [--table T]            scan tables for invalid rows (V4.1, PLE)\n"
    "  apply MODEL --layer 1|14 [...]      an Engram layer on a token stream and a residual\n"
    "  run [MODEL] [...]                   sessions, prefill and decode in a simulated engine\n"
    "  build OUT.gguf [...]                write a complete V4.1-layout model\n"
    "  shard MODEL --ranks N --out DIR     row-block shard files (and --check FILE...)\n"
    "  tokmap TOKENIZER.json [...]         token map of a tokenizer (V', SHA-256)\n"
    "  layout --vocab-size V' [...]        multipliers and primes of a layout\n"
    "  quantize IN OUT / dequantize IN OUT float rows <-> 264-byte rows\n"
    "  bench io FILE [...]                 reader vs fio vs the reference's baseline\n"
    "  version, --version                  print the library's version\n"
    "exit codes: 0 ok, 1 invalid data (model, row, token), 2 usage, 3 system error\n"
    "outputs: a new name or regular file is replaced whole on success; a character\n"
    "device or FIFO (or - for stdout) is written in place; links, folders and block\n"
    "devices are refused (docs/cli.md)\n";

static const char *version_help =
    "usage: engram version   (or engram --version)\n"
    "Prints \"engram VERSION\": the library's engram_version().\n";

/* SIGINT, SIGTERM, SIGHUP, SIGPIPE: the outputs' temporaries removed, then the
 * signal's default action (SA_RESETHAND), so the caller sees the signal. */
static void on_fatal_signal(int sig)
{
    engram_output_abandon_all();
    raise(sig);
}

int main(int argc, char **argv)
{
    /* past RLIMIT_FSIZE a write fails with EFBIG, which every command
     * handles (its output removed), instead of the process being killed
     * with its temporary file left behind */
    signal(SIGXFSZ, SIG_IGN);
    /* descriptors 0-2 open (on /dev/null if the caller closed them), so no
     * output file becomes one and receives the report or an error */
    int nullfd;
    while ((nullfd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && nullfd <= 2)
        fcntl(nullfd, F_SETFD, 0); /* one of 0-2: kept across exec like any */
    if (nullfd > 2)
        close(nullfd);
    /* an interrupted command leaves no temporary behind */
    /* (a signal the caller ignores, as a shell does SIGINT for a
     * background job, stays ignored) */
    static const int fatal[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) {
        struct sigaction old, sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sa.sa_flags = SA_RESETHAND;
        if (sigaction(fatal[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(fatal[i], &sa, NULL);
    }
    if (argc < 2)
        return fail_usage("a COMMAND is required");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(main_help, stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (has_help(argc - 1, argv + 1))
            fputs(version_help, stdout);
        else
            printf("engram %s\n", engram_version());
        return 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"info", cmd_info}, {"hash", cmd_hash}, {"rows", cmd_rows},
        {"verify", cmd_verify}, {"build", cmd_build}, {"bench", cmd_bench},
        {"apply", cmd_apply}, {"run", cmd_run},
    };
    for (size_t i = 0; i <= sizeof cmds / sizeof cmds[0]; i++)
        if (i == sizeof cmds / sizeof cmds[0] || !strcmp(cmd, cmds[i].name)) {
            int rc = i < sizeof cmds / sizeof cmds[0] ? cmds[i].fn(argc - 1, argv + 1)
                                                      : cmd_tools(cmd, argc - 1, argv + 1);
            if (rc < 0)
                break; /* not a tool either */
            if (fflush(stdout) != 0 && rc == 0) {
                fprintf(stderr, "%s: write to stdout failed\n", prog);
                rc = EXIT_SYSTEM;
            }
            return rc;
        }
    return fail_usage("unknown command '%s'", cmd);
}
