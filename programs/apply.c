/*
 * apply.c - engram apply: the whole Engram layer on a token stream, from
 * the SSD to the residual: hash (with a starting history), read the layer's
 * rows through the uncached reader, decode, project, gate and update a
 * residual read from a file, written to another through a temporary name.
 * A PLE model (SPEC.md section 10) takes the same road through the
 * family's calls: engram_ple_hash, the reader's BF16 rows (16 a token) and
 * engram_apply_seq, whose per-sequence state is carried from call to call.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const char *apply_help =
    "usage: engram apply MODEL --layer 1|14 --tokens FILE --residual-in IN --residual-out OUT\n"
    "                    [--mask FILE] [--history A,B,C] [--threads N] [--kv-out FILE]\n"
    "                    [--device cpu|cuda|cuda-fma] [--chunk N] [--residual-bf16]\n"
    "Runs one Engram layer (SPEC.md section 8) over a token stream: hashes the\n"
    "tokens (from --history: 3 compressed ids, newest first, -1 = dead; default\n"
    "all dead), reads the layer's 24 rows per token through the uncached reader,\n"
    "decodes them, projects them with the layer's F16 weights, and applies the\n"
    "cosine gate and the update to the residual.\n"
    "IN: raw little-endian float32 [token][S][W] (S = 4 streams, W from the model),\n"
    "or seed:N for a deterministic pseudo-random residual of BF16 values in [-4, 4].\n"
    "OUT: the updated residual, same layout, every value a BF16 value; masked\n"
    "tokens (mask 0) are copied bit for bit.  OUT is written under a temporary\n"
    "name and renamed only when everything succeeded (a device or FIFO, or - for\n"
    "stdout, is written in place; a link is refused).  --kv-out FILE also writes\n"
    "each token's projection, float32 [token][(S+1)W].  --threads N: workers for\n"
    "the projection (default: the CPUs this process may run on, as for engram\n"
    "run; the output is the same bits at every count).  --device cuda: project, gate and update on the\n"
    "GPU (builds with the CUDA path; rows go there raw and are decoded there;\n"
    "more than 64 tokens a call are projected on the tensor cores, their sums\n"
    "promoted to F32 every 256 products: the CPU path's accuracy); --device\n"
    "cuda-fma: every sum by F32 FMAs on the CUDA cores (slower for long inputs).\n"
    "--chunk N: tokens per apply call (1..2048, default 256; results do not depend\n"
    "on it).  --residual-bf16: IN and OUT hold BF16 bit patterns (little-endian\n"
    "uint16) instead of float32.\n"
    "PLE model (qwen4exp): --layer is its one layer (engram info); the tokens are\n"
    "hashed with engram_ple_hash from a sequence start (a mask 0 is a padding\n"
    "position: hashed as EOS, left untouched, a zero convolution frame), the 16\n"
    "BF16 rows a token read through the reader, and engram_apply_seq applied with\n"
    "the sequence's state carried from call to call; OUT keeps float32 values\n"
    "(BF16 with --residual-bf16).  --history, --kv-out and --device other than cpu\n"
    "are V4.1's (usage error).\n"
    "Memory: about 50 MB at W = 5120 whatever the\n"
    "stream's length (2048 tokens of rows at a time, 256 of residual), plus 5 bytes\n"
    "a token for the token and mask files, which hold at most 2^24 items each (a\n"
    "longer one is refused as it is read: exit 1).\n"
    "Exit codes: 0 ok; 1 invalid data (IN's size, a bad token or mask, a layer\n"
    "without projection weights, NaN/Inf in IN, non-finite results); 2 usage;\n"
    "3 system error.\n";

#define READ_CHUNK ENGRAM_BATCH_TOKENS
#define APPLY_CHUNK 256u /* tokens per apply call unless --chunk */


/* The command line. */
struct apply_opts {
    const char *path, *tok_path, *mask_path, *hist, *in, *outp, *kv_path, *device;
    uint64_t layer, threads, chunk;
    int bf16;              /* --residual-bf16                                */
    int device_given;
};

/* One apply's state, from its inputs to its outputs. */
struct apply {
    engram_model *m;
    engram_reader *rd;
    engram_layer *L;
    engram_layer_info li;
    struct dev *d;
    int ple;               /* the PLE member: engram_apply_seq, its state     */
    engram_applier *A;     /* PLE: the applier (V4.1 applies through d)       */
    float *state;          /* PLE: [li.state_floats], from +0                 */
    uint8_t *kinds;        /* PLE: a read chunk's hash kinds (mask 0: PAD)    */
    uint64_t calls;        /* apply calls made                                */
    engram_ple_history ph; /* PLE: the hash's last 2 ids, from a sequence start */
    int t;                 /* the layer's table: 0 (layer 1) or 1 (layer 14)   */
    uint32_t *tokens, *rows48; /* rows48: a read chunk's row ids, 48 a token (PLE 16) */
    size_t n;              /* tokens                                          */
    uint8_t *mask;
    size_t per, nkv;       /* per token: S x W residual, (S+1) x W projection  */
    int rdt;               /* rows as the device wants them: BF16 or raw      */
    size_t tokb;           /* bytes of one token's rows in that form (24, PLE 16) */
    void *rows;
    float *x, *kv;
    uint16_t *xb;          /* --residual-bf16: a chunk's residual as stored    */
    size_t elem;           /* bytes of a residual value in the files: 4 or 2   */
    int in_fd;
    int seeded;
    uint64_t seed;
    struct fout out, kvo;
    int out_open, kv_open;
    /* for the summary */
    double t_read, t_apply;
    uint64_t masked, fnv;
};

/* A BF16 bit pattern's value, and the top half of a float (exact for a
 * float that is a BF16 value, as the residuals written here are). */
static float bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* The options and the starting history: 0, or the exit code of a usage
 * error (printed). */
static int parse_apply_opts(int argc, char **argv, struct apply_opts *o, engram_history *h)
{
    *o = (struct apply_opts){.device = "cpu", .threads = engram_default_threads(), .chunk = APPLY_CHUNK,
                             .layer = UINT64_MAX};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--tokens") ? &o->tok_path
                         : !strcmp(a, "--mask") ? &o->mask_path
                         : !strcmp(a, "--history") ? &o->hist
                         : !strcmp(a, "--residual-in") ? &o->in
                         : !strcmp(a, "--residual-out") ? &o->outp
                         : !strcmp(a, "--kv-out") ? &o->kv_path
                         : !strcmp(a, "--device") ? &o->device
                         : NULL;
        if (!strcmp(a, "--residual-bf16")) {
            o->bf16 = 1;
            continue;
        }
        if (dst || !strcmp(a, "--layer") || !strcmp(a, "--threads") || !strcmp(a, "--chunk")) {
            if (i + 1 >= argc)
                return fail_usage("apply: %s needs a value", a);
            const char *v = argv[++i];
            o->device_given |= dst == &o->device;
            if (dst)
                *dst = v;
            else if (!strcmp(a, "--layer") && parse_u64(v, UINT32_MAX, &o->layer) < 0)
                return fail_usage("apply: --layer takes a layer number (1 or 14; PLE: its layer)");
            else if (!strcmp(a, "--chunk") &&
                     (parse_u64(v, READ_CHUNK, &o->chunk) < 0 || o->chunk == 0))
                return fail_usage("apply: --chunk takes 1..%u", READ_CHUNK);
            else if (!strcmp(a, "--threads") &&
                     (parse_u64(v, ENGRAM_APPLY_MAX_THREADS, &o->threads) < 0 || o->threads == 0))
                return fail_usage("apply: --threads takes 1..%u", ENGRAM_APPLY_MAX_THREADS);
        } else if (a[0] == '-') {
            return fail_usage("apply: unknown option '%s'", a);
        } else if (!o->path) {
            o->path = a;
        } else {
            return fail_usage("apply: more than one MODEL");
        }
    }
    if (!o->path || o->layer == UINT64_MAX || !o->tok_path || !o->in || !o->outp)
        return fail_usage("apply: MODEL, --layer, --tokens, --residual-in and --residual-out are required");
    if (!dev_name_ok(o->device))
        return fail_usage("apply: unknown device '%s' (cpu, cuda or cuda-fma)", o->device);
    engram_history_reset(h);
    if (o->hist && parse_history(o->hist, h) < 0)
        return fail_usage("apply: --history takes 3 comma-separated ids (newest first, -1 = dead)");
    /* the outputs, before anything is read: each a kind of file fout
     * writes, none the same file as another or as an input */
    const char *paths[6] = {o->outp, o->kv_path, o->path, o->tok_path, o->mask_path,
                            strncmp(o->in, "seed:", 5) ? o->in : NULL};
    const char *names[6] = {"--residual-out", "--kv-out", "MODEL", "--tokens", "--mask",
                            "--residual-in"};
    int st = fout_check(o->outp, 0);
    if (!st && o->kv_path)
        st = fout_check(o->kv_path, 0);
    return st ? st : fout_distinct(paths, names, 6, 2);
}

/* The tokens and, with --mask, one 0/1 per token.  0 or an exit code. */
static int read_tokens(struct apply *r, const struct apply_opts *o)
{
    uint32_t *maskv = NULL;
    size_t nm = 0;
    int st = read_numbers(o->tok_path, UINT32_MAX, &r->tokens, &r->n, "token");
    if (!st && o->mask_path) {
        st = read_numbers(o->mask_path, 1, &maskv, &nm, "mask");
        if (!st && nm != r->n) {
            fprintf(stderr, "%s: apply: mask file '%s' has %zu entries for %zu tokens\n", prog,
                    o->mask_path, nm, r->n);
            st = EXIT_DATA;
        }
        if (!st && !(r->mask = malloc(r->n ? r->n : 1)))
            st = fail_oom("apply: the mask", r->n);
        for (size_t i = 0; !st && i < r->n; i++)
            r->mask[i] = (uint8_t)maskv[i];
    }
    free(maskv);
    return st;
}

/* The member of the open model and what the command line asks of it: the
 * layer (V4.1: 1 or 14; PLE: its one layer), and for PLE none of V4.1's
 * own options.  0 or the exit code of a usage error (printed). */
static int check_member(struct apply *r, const struct apply_opts *o)
{
    engram_model_info in;
    engram_model_get_info(r->m, &in);
    r->ple = in.family.member == ENGRAM_MEMBER_PLE;
    if (!r->ple) {
        if (o->layer != 1 && o->layer != 14)
            return fail_usage("apply: --layer takes 1 or 14");
        r->t = o->layer == 1 ? 0 : 1;
        return 0;
    }
    if (o->layer != in.family.layers[0])
        return fail_usage("apply: '%s' is a %s model with one layer, %u: --layer %u", o->path,
                          in.family.name, in.family.layers[0], in.family.layers[0]);
    if (o->kv_path)
        return fail_usage("apply: --kv-out writes V4.1's projection, (S+1)W values a token; a PLE "
                          "layer's keys (4W) and value (W) feed its gate and convolution and the "
                          "library does not give them out (engram_project is V4.1's)");
    if (o->hist)
        return fail_usage("apply: --history sets V4.1's compressed ids; a PLE stream starts here at "
                          "a sequence start (its convolution state cannot be rebuilt from ids)");
    if (o->device_given && strcmp(o->device, "cpu"))
        return fail_usage("apply: --device %s: the PLE layer is applied on the CPU here", o->device);
    r->t = 0;
    engram_ple_history_reset(r->m, &r->ph);
    return 0;
}

/* The layer's weights.  0 or an exit code. */
static int open_layer(struct apply *r, engram_error *err)
{
    int rc = engram_layer_open(r->m, r->t, &r->L, err);
    if (rc < 0)
        return rc == -ENOENT ? (fprintf(stderr, "%s: apply: %s\n", prog, err->msg), EXIT_DATA)
                             : fail_lib(rc, err, "apply: loading the layer");
    engram_layer_get_info(r->L, &r->li);
    return 0;
}

/* The residual input: a file of exactly n x S x W floats, or seed:N.  0
 * or an exit code. */
static int open_residual(struct apply *r, const char *in)
{
    if (!strncmp(in, "seed:", 5)) {
        r->seeded = 1;
        if (parse_u64(in + 5, UINT64_MAX, &r->seed) < 0)
            return fail_usage("apply: --residual-in seed:N takes a decimal N");
        return 0;
    }
    r->in_fd = open(in, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (r->in_fd < 0 || fstat(r->in_fd, &sb) < 0) {
        fprintf(stderr, "%s: apply: cannot read '%s': %s\n", prog, in, strerror(errno));
        return EXIT_SYSTEM;
    }
    int st = input_regular(in, &sb);
    if (st)
        return st;
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != (uint64_t)r->n * r->per * r->elem) {
        fprintf(stderr,
                "%s: apply: residual '%s' has %lld bytes; %zu tokens x %u streams x %u x %zu bytes "
                "= %llu expected\n", prog, in, (long long)sb.st_size, r->n, r->li.streams, r->li.width,
                r->elem, (unsigned long long)((uint64_t)r->n * r->per * r->elem));
        return EXIT_DATA;
    }
    return 0;
}

/* The device that applies the layer, the reader of its rows and the
 * buffers of one chunk.  0 or an exit code. */
static int open_device(struct apply *r, const struct apply_opts *o, engram_error *err)
{
    int rc;
    size_t stride = ENGRAM_ROWS_PER_TOKEN;
    if (r->ple) { /* the CPU's applier, the state from +0, BF16 rows as the reader gives them */
        engram_apply_opts ao = {.threads = (unsigned)o->threads};
        if ((rc = engram_applier_new(r->L, &ao, &r->A, err)) < 0)
            return fail_lib(rc, err, "apply");
        r->rdt = ENGRAM_BF16;
        stride = ENGRAM_PLE_ROWS_PER_TOKEN;
        r->tokb = (size_t)ENGRAM_PLE_ROWS_PER_TOKEN * 320;
        r->state = calloc(r->li.state_floats ? r->li.state_floats : 1, sizeof *r->state);
        r->kinds = malloc(READ_CHUNK);
        if (!r->state || !r->kinds)
            return fail_oom("apply: the PLE state", r->li.state_floats * sizeof *r->state);
    } else {
        rc = dev_open(o->device, r->L, (unsigned)o->threads, (size_t)o->chunk, &r->d, err);
        if (rc < 0)
            return rc == -EINVAL ? fail_usage("apply: %s", err->msg) : fail_lib(rc, err, "apply");
        r->rdt = dev_rows_dtype(r->d);
        size_t rowb = r->rdt == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2;
        r->tokb = (size_t)ENGRAM_COLUMNS * rowb;
    }
    if ((rc = engram_reader_open(r->m, NULL, &r->rd, err)) < 0)
        return fail_lib(rc, err, "apply: opening the reader");
    r->rows48 = malloc((size_t)READ_CHUNK * stride * sizeof *r->rows48);
    r->rows = malloc((size_t)READ_CHUNK * r->tokb);
    r->x = malloc((size_t)o->chunk * r->per * 4);
    r->xb = o->bf16 ? malloc((size_t)o->chunk * r->per * 2) : NULL;
    r->kv = o->kv_path ? malloc((size_t)o->chunk * r->nkv * 4) : NULL;
    if (!r->rows48 || !r->rows || !r->x || (o->bf16 && !r->xb) || (o->kv_path && !r->kv))
        return fail_oom("apply: the buffers of a chunk", 0);
    return 0;
}

/* OUT and, with --kv-out, its file, each under a temporary name.  0 or an
 * exit code. */
static int open_outputs(struct apply *r, const struct apply_opts *o)
{
    int st = fout_open(&r->out, o->outp);
    if (st)
        return st;
    r->out_open = 1;
    if (o->kv_path) {
        if ((st = fout_open(&r->kvo, o->kv_path)) != 0)
            return st;
        r->kv_open = 1;
    }
    return 0;
}

/* c tokens from stream position pos, whose rows are the read chunk's from
 * token j: their residual read (or seeded), the layer applied, the results
 * counted into the checksum and written.  0 or an exit code. */
static int apply_chunk(struct apply *r, const struct apply_opts *o, size_t pos, size_t j, size_t c,
                       engram_error *err)
{
    uint64_t first = (uint64_t)pos * r->per;
    size_t nv = c * r->per;
    int rc;
    if (r->seeded) {
        cli_seeded_resid(r->seed, first, nv, r->x);
        for (size_t i = 0; r->xb && i < nv; i++) /* BF16 values: the top half is exact */
            r->xb[i] = bf16_bits(r->x[i]);
    } else if ((rc = pread_all(r->in_fd, r->xb ? (void *)r->xb : (void *)r->x, nv * r->elem,
                               first * r->elem)) < 0) {
        fprintf(stderr, "%s: apply: reading '%s': %s\n", prog, o->in, strerror(-rc));
        return EXIT_SYSTEM;
    }
    const uint8_t *mk = r->mask ? r->mask + pos : NULL;
    const uint8_t *rows = (const uint8_t *)r->rows + j * r->tokb;
    double ta = now_s();
    if (r->ple) {
        rc = engram_apply_seq(r->A, rows, ENGRAM_BF16, r->xb ? (void *)r->xb : (void *)r->x,
                              r->xb ? ENGRAM_BF16 : ENGRAM_F32, mk, c, r->state, err);
    } else {
        for (size_t i = 0; r->xb && !r->seeded && i < nv; i++)
            r->x[i] = bf16_value(r->xb[i]);
        rc = dev_apply(r->d, rows, r->tokb, r->x, mk, c, r->kv, err);
        for (size_t i = 0; r->xb && rc >= 0 && i < nv; i++) /* BF16 values out: exact */
            r->xb[i] = bf16_bits(r->x[i]);
    }
    r->t_apply += now_s() - ta;
    r->calls++;
    if (rc < 0) {
        /* messages name the token within the call: give the stream's */
        fprintf(stderr, "%s: apply: tokens %zu..%zu: %s\n", prog, pos, pos + c - 1, err->msg);
        return rc == -EDOM || rc == -EINVAL ? EXIT_DATA : EXIT_SYSTEM;
    }
    for (size_t i = 0; mk && i < c; i++)
        r->masked += mk[i] == 0;
    const void *xo = r->xb ? (const void *)r->xb : (const void *)r->x;
    const unsigned char *b = xo;
    for (size_t i = 0; i < nv * r->elem; i++)
        r->fnv = (r->fnv ^ b[i]) * 0x100000001b3ull;
    const char *failed = fwrite(xo, r->elem, nv, r->out.f) != nv ? o->outp
                         : o->kv_path && fwrite(r->kv, 4, c * r->nkv, r->kvo.f) != c * r->nkv
                             ? o->kv_path : NULL;
    if (failed) {
        fprintf(stderr, "%s: apply: writing '%s': %s\n", prog, failed, strerror(errno));
        return EXIT_SYSTEM;
    }
    return 0;
}

/* The whole stream from history h: READ_CHUNK tokens hashed and their
 * rows read at a time, applied APPLY_CHUNK tokens at a time.  0 or an
 * exit code. */
static int apply_stream(struct apply *r, const struct apply_opts *o, engram_history *h, engram_error *err)
{
    for (size_t at = 0; at < r->n; at += READ_CHUNK) {
        size_t k = r->n - at < READ_CHUNK ? r->n - at : READ_CHUNK;
        int rc;
        if (r->ple) { /* a mask 0 is a padding position: hashed as EOS */
            for (size_t i = 0; r->mask && i < k; i++)
                r->kinds[i] = r->mask[at + i] ? ENGRAM_PLE_TEXT : ENGRAM_PLE_PAD;
            rc = engram_ple_hash(r->m, &r->ph, r->tokens + at, r->mask ? r->kinds : NULL, k,
                                 r->rows48, err);
        } else {
            rc = engram_hash_tokens(engram_model_hasher(r->m), h, r->tokens + at,
                                    r->mask ? r->mask + at : NULL, k, r->rows48, err);
        }
        if (rc < 0) {
            /* name the position in the whole stream */
            fprintf(stderr, "%s: apply: tokens from %zu: %s\n", prog, at, err->msg);
            return EXIT_DATA;
        }
        double ta = now_s();
        rc = engram_reader_batch(r->rd, r->t, r->rows48, k, (engram_dtype)r->rdt, r->rows, err);
        r->t_read += now_s() - ta;
        if (rc < 0)
            return fail_lib(rc, err, "apply: reading rows");
        for (size_t j = 0; j < k; j += o->chunk) {
            size_t c = k - j < o->chunk ? k - j : (size_t)o->chunk;
            int st = apply_chunk(r, o, at + j, j, c, err);
            if (st)
                return st;
        }
    }
    return 0;
}

/* The outputs renamed into place when st is 0, removed otherwise; st, or
 * the first exit code of closing them. */
static int close_outputs(struct apply *r, int st)
{
    if (r->out_open) {
        int cst = fout_close(&r->out, st == 0);
        if (!st)
            st = cst;
    }
    if (r->kv_open) {
        int cst = fout_close(&r->kvo, st == 0);
        if (!st)
            st = cst;
    }
    return st;
}

static void print_summary(const struct apply *r, const struct apply_opts *o, double dt)
{
    engram_io_stats io;
    engram_reader_get_stats(r->rd, &io);
    printf("applied layer %" PRIu64 " to %zu tokens (%" PRIu64 " masked): W %u, %u streams\n",
           o->layer, r->n, r->masked, r->li.width, r->li.streams);
    printf("  rows: %" PRIu64 " requested, %" PRIu64 " read (%s%s), %.3f s\n", io.rows_requested,
           io.rows_read, io.engine, io.direct ? ", O_DIRECT" : ", buffered", r->t_read);
    printf("  apply on the %s: %.3f s (%.1f tokens/s, %" PRIu64 " thread%s); total %.3f s\n",
           o->device, r->t_apply, r->t_apply > 0 ? (double)r->n / r->t_apply : 0.0, o->threads,
           o->threads > 1 ? "s" : "", dt);
    if (r->ple)
        printf("  PLE: %" PRIu64 " call%s of engram_apply_seq (up to %" PRIu64 " tokens), a state "
               "of %zu floats carried\n", r->calls, r->calls == 1 ? "" : "s", o->chunk,
               r->li.state_floats);
    printf("  wrote %s (%zu x %zu %s), FNV-1a 64 of it: %016" PRIx64 "\n", o->outp, r->n, r->per,
           r->xb ? "bf16" : "float32", r->fnv);
}

static void close_apply(struct apply *r)
{
    if (r->in_fd >= 0)
        close(r->in_fd);
    engram_reader_close(r->rd);
    dev_close(r->d);
    engram_applier_free(r->A);
    engram_layer_close(r->L);
    engram_model_close(r->m);
    free(r->tokens);
    free(r->mask);
    free(r->rows48);
    free(r->rows);
    free(r->x);
    free(r->xb);
    free(r->kv);
    free(r->state);
    free(r->kinds);
}

int cmd_apply(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(apply_help, stdout);
        return 0;
    }
    struct apply_opts o;
    engram_history h;
    int st = parse_apply_opts(argc, argv, &o, &h);
    if (st)
        return st;
    struct apply r = {0};
    r.in_fd = -1;
    r.fnv = 0xcbf29ce484222325ull;
    r.elem = o.bf16 ? 2 : 4;
    engram_error err = {0};
    st = open_model_any(o.path, &r.m);
    if (!st)
        st = check_member(&r, &o);
    if (!st)
        st = read_tokens(&r, &o);
    if (!st)
        st = open_layer(&r, &err);
    r.per = (size_t)r.li.streams * r.li.width;
    r.nkv = (size_t)(r.li.streams + 1) * r.li.width;
    if (!st)
        st = open_residual(&r, o.in);
    if (!st)
        st = open_device(&r, &o, &err);
    if (!st)
        st = open_outputs(&r, &o);
    double t0 = now_s();
    if (!st)
        st = apply_stream(&r, &o, &h, &err);
    st = close_outputs(&r, st);
    if (!st)
        print_summary(&r, &o, now_s() - t0);
    close_apply(&r);
    return st;
}
