/*
 * apply.c - engram apply: the whole Engram layer on a token stream, from
 * the SSD to the residual: hash (with a starting history), read the layer's
 * rows through the uncached reader, decode, project, gate and update a
 * residual read from a file, written to another through a temporary name.
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
    "                    [--device cpu|cuda|cuda-fma|cuda-fast]\n"
    "Runs one Engram layer (SPEC.md section 8) over a token stream: hashes the\n"
    "tokens (from --history: 3 compressed ids, newest first, -1 = dead; default\n"
    "all dead), reads the layer's 24 rows per token through the uncached reader,\n"
    "decodes them, projects them with the layer's F16 weights, and applies the\n"
    "cosine gate and the update to the residual.\n"
    "IN: raw little-endian float32 [token][S][W] (S = 4 streams, W from the model),\n"
    "or seed:N for a deterministic pseudo-random residual of BF16 values in (-4, 4).\n"
    "OUT: the updated residual, same layout, every value a BF16 value; masked\n"
    "tokens (mask 0) are copied bit for bit.  OUT is written under a temporary\n"
    "name and renamed only when everything succeeded.  --kv-out FILE also writes\n"
    "each token's projection, float32 [token][(S+1)W].  --threads N: workers for\n"
    "the projection (default 1).  --device cuda: project, gate and update on the\n"
    "GPU (builds with the CUDA path; rows go there raw and are decoded there;\n"
    "more than 8 tokens a call are projected on the tensor cores, their sums\n"
    "promoted to F32 every 256 products: the CPU path's accuracy); --device\n"
    "cuda-fma: every sum by F32 FMAs on the CUDA cores (slower for long inputs);\n"
    "--device cuda-fast: more than 8 tokens through cuBLAS, the tensor cores' own\n"
    "sums (faster, less accurate than the CPU's).\n"
    "Memory: about 50 MB at W = 5120 whatever the\n"
    "stream's length (2048 tokens of rows at a time, 256 of residual).\n"
    "Exit codes: 0 ok; 1 invalid data (IN's size, a bad token or mask, a layer\n"
    "without projection weights, NaN/Inf in IN, non-finite results); 2 usage;\n"
    "3 system error.\n";

#define READ_CHUNK ENGRAM_BATCH_TOKENS
#define APPLY_CHUNK 256u

static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* seed:N residual: element e of the stream is a function of (N, e) alone. */
static void seeded_resid(uint64_t seed, uint64_t first, size_t count, float *out)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t s = seed * 0x2545f4914f6cdd1dull + first + i;
        uint64_t r = mix64(&s);
        union { float f; uint32_t u; } v;
        v.f = ((float)(r >> 40) / (float)(1u << 24) - 0.5f) * 8.0f;
        v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u; /* BF16, nearest even */
        out[i] = v.f;
    }
}

struct run {
    engram_model *m;
    engram_reader *rd;
    engram_layer *L;
    struct dev *d;
    uint32_t *tokens, *rows48;
    uint8_t *mask;
    void *rows;
    float *x, *kv;
    int in_fd;
    int seeded;
    uint64_t seed;
};

int cmd_apply(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(apply_help, stdout);
        return 0;
    }
    const char *path = NULL, *tok_path = NULL, *mask_path = NULL, *hist = NULL, *in = NULL,
               *outp = NULL, *kv_path = NULL, *device = "cpu";
    uint64_t layer = 0, threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--tokens") ? &tok_path
                         : !strcmp(a, "--mask") ? &mask_path
                         : !strcmp(a, "--history") ? &hist
                         : !strcmp(a, "--residual-in") ? &in
                         : !strcmp(a, "--residual-out") ? &outp
                         : !strcmp(a, "--kv-out") ? &kv_path
                         : !strcmp(a, "--device") ? &device
                         : NULL;
        if (dst || !strcmp(a, "--layer") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc)
                return fail_usage("apply: %s needs a value", a);
            const char *v = argv[++i];
            if (dst)
                *dst = v;
            else if (!strcmp(a, "--layer") && (parse_u64(v, 14, &layer) < 0 || (layer != 1 && layer != 14)))
                return fail_usage("apply: --layer takes 1 or 14");
            else if (!strcmp(a, "--threads") &&
                     (parse_u64(v, ENGRAM_APPLY_MAX_THREADS, &threads) < 0 || threads == 0))
                return fail_usage("apply: --threads takes 1..%u", ENGRAM_APPLY_MAX_THREADS);
        } else if (a[0] == '-') {
            return fail_usage("apply: unknown option '%s'", a);
        } else if (!path) {
            path = a;
        } else {
            return fail_usage("apply: more than one MODEL");
        }
    }
    if (!path || !layer || !tok_path || !in || !outp)
        return fail_usage("apply: MODEL, --layer, --tokens, --residual-in and --residual-out are required");
    if (!dev_name_ok(device))
        return fail_usage("apply: unknown device '%s' (cpu, cuda, cuda-fma or cuda-fast)", device);
    engram_history h;
    engram_history_reset(&h);
    if (hist && parse_history(hist, &h) < 0)
        return fail_usage("apply: --history takes 3 comma-separated ids (newest first, -1 = dead)");
    int t = layer == 1 ? 0 : 1;

    struct run r = {0};
    r.in_fd = -1;
    uint32_t *maskv = NULL;
    size_t n = 0, nm = 0;
    int st = read_numbers(tok_path, UINT32_MAX, &r.tokens, &n, "token");
    if (!st && mask_path) {
        st = read_numbers(mask_path, 1, &maskv, &nm, "mask");
        if (!st && nm != n) {
            fprintf(stderr, "%s: apply: mask file '%s' has %zu entries for %zu tokens\n", prog,
                    mask_path, nm, n);
            st = EXIT_DATA;
        }
        if (!st && !(r.mask = malloc(n ? n : 1)))
            st = EXIT_SYSTEM;
        for (size_t i = 0; !st && i < n; i++)
            r.mask[i] = (uint8_t)maskv[i];
    }
    free(maskv);
    engram_error err = {0};
    int rc;
    if (!st)
        st = open_model(path, &r.m);
    if (!st && (rc = engram_layer_open(r.m, t, &r.L, &err)) < 0)
        st = rc == -ENOENT ? (fprintf(stderr, "%s: apply: %s\n", prog, err.msg), EXIT_DATA)
                           : fail_lib(rc, &err, "apply: loading the layer");
    engram_layer_info li = {0};
    if (!st)
        engram_layer_get_info(r.L, &li);
    const size_t per = (size_t)li.streams * li.width, nkv = (size_t)(li.streams + 1) * li.width;

    /* the residual input: a file of exactly n x S x W floats, or seed:N */
    if (!st && !strncmp(in, "seed:", 5)) {
        r.seeded = 1;
        if (parse_u64(in + 5, UINT64_MAX, &r.seed) < 0)
            st = fail_usage("apply: --residual-in seed:N takes a decimal N");
    } else if (!st) {
        r.in_fd = open(in, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (r.in_fd < 0 || fstat(r.in_fd, &sb) < 0) {
            fprintf(stderr, "%s: apply: cannot read '%s': %s\n", prog, in, strerror(errno));
            st = EXIT_SYSTEM;
        } else if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != (uint64_t)n * per * 4) {
            fprintf(stderr,
                    "%s: apply: residual '%s' has %lld bytes; %zu tokens x %u streams x %u x 4 bytes "
                    "= %llu expected\n", prog, in, (long long)sb.st_size, n, li.streams, li.width,
                    (unsigned long long)((uint64_t)n * per * 4));
            st = EXIT_DATA;
        }
    }
    if (!st && (rc = dev_open(device, r.L, (unsigned)threads, APPLY_CHUNK, &r.d, &err)) < 0)
        st = rc == -EINVAL ? fail_usage("apply: %s", err.msg) : fail_lib(rc, &err, "apply");
    int rdt = r.d ? dev_rows_dtype(r.d) : ENGRAM_BF16;
    size_t rowb = rdt == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2;
    size_t tokb = (size_t)ENGRAM_COLUMNS * rowb;
    if (!st && (rc = engram_reader_open(r.m, NULL, &r.rd, &err)) < 0)
        st = fail_lib(rc, &err, "apply: opening the reader");
    if (!st) {
        r.rows48 = malloc((size_t)READ_CHUNK * ENGRAM_ROWS_PER_TOKEN * sizeof *r.rows48);
        r.rows = malloc((size_t)READ_CHUNK * tokb);
        r.x = malloc((size_t)APPLY_CHUNK * per * 4);
        r.kv = kv_path ? malloc((size_t)APPLY_CHUNK * nkv * 4) : NULL;
        if (!r.rows48 || !r.rows || !r.x || (kv_path && !r.kv))
            st = EXIT_SYSTEM;
    }
    struct fout out = {0}, kvo = {0};
    int out_open = 0, kv_open = 0;
    if (!st && (st = fout_open(&out, outp)) == 0)
        out_open = 1;
    if (!st && kv_path && (st = fout_open(&kvo, kv_path)) == 0)
        kv_open = 1;

    double t0 = now_s(), t_read = 0, t_apply = 0;
    uint64_t masked = 0, fnv = 0xcbf29ce484222325ull;
    for (size_t at = 0; !st && at < n; at += READ_CHUNK) {
        size_t k = n - at < READ_CHUNK ? n - at : READ_CHUNK;
        rc = engram_hash_tokens(engram_model_hasher(r.m), &h, r.tokens + at, r.mask ? r.mask + at : NULL,
                                k, r.rows48, &err);
        if (rc < 0) {
            /* name the position in the whole stream */
            fprintf(stderr, "%s: apply: tokens from %zu: %s\n", prog, at, err.msg);
            st = EXIT_DATA;
            break;
        }
        double ta = now_s();
        rc = engram_reader_batch(r.rd, t, r.rows48, k, (engram_dtype)rdt, r.rows, &err);
        t_read += now_s() - ta;
        if (rc < 0) {
            st = fail_lib(rc, &err, "apply: reading rows");
            break;
        }
        for (size_t j = 0; !st && j < k; j += APPLY_CHUNK) {
            size_t c = k - j < APPLY_CHUNK ? k - j : APPLY_CHUNK;
            uint64_t first = (uint64_t)(at + j) * per;
            if (r.seeded) {
                seeded_resid(r.seed, first, c * per, r.x);
            } else if ((rc = pread_all(r.in_fd, r.x, c * per * 4, first * 4)) < 0) {
                fprintf(stderr, "%s: apply: reading '%s': %s\n", prog, in, strerror(-rc));
                st = EXIT_SYSTEM;
                break;
            }
            const uint8_t *mk = r.mask ? r.mask + at + j : NULL;
            ta = now_s();
            rc = dev_apply(r.d, (const uint8_t *)r.rows + j * tokb, tokb, r.x, mk, c, r.kv, &err);
            t_apply += now_s() - ta;
            if (rc < 0) {
                /* messages name the token within the call: give the stream's */
                fprintf(stderr, "%s: apply: tokens %zu..%zu: %s\n", prog, at + j, at + j + c - 1,
                        err.msg);
                st = rc == -EDOM || rc == -EINVAL ? EXIT_DATA : EXIT_SYSTEM;
                break;
            }
            for (size_t i = 0; mk && i < c; i++)
                masked += mk[i] == 0;
            const unsigned char *b = (const unsigned char *)r.x;
            for (size_t i = 0; i < c * per * 4; i++)
                fnv = (fnv ^ b[i]) * 0x100000001b3ull;
            if (fwrite(r.x, 4, c * per, out.f) != c * per ||
                (kv_path && fwrite(r.kv, 4, c * nkv, kvo.f) != c * nkv)) {
                fprintf(stderr, "%s: apply: writing '%s': %s\n", prog, outp, strerror(errno));
                st = EXIT_SYSTEM;
            }
        }
    }
    if (out_open) {
        int cst = fout_close(&out, st == 0);
        if (!st)
            st = cst;
    }
    if (kv_open) {
        int cst = fout_close(&kvo, st == 0);
        if (!st)
            st = cst;
    }
    if (!st) {
        engram_io_stats io;
        engram_reader_get_stats(r.rd, &io);
        double dt = now_s() - t0;
        printf("applied layer %" PRIu64 " to %zu tokens (%" PRIu64 " masked): W %u, %u streams\n",
               layer, n, masked, li.width, li.streams);
        printf("  rows: %" PRIu64 " requested, %" PRIu64 " read (%s%s), %.3f s\n", io.rows_requested,
               io.rows_read, io.engine, io.direct ? ", O_DIRECT" : ", buffered", t_read);
        printf("  apply on the %s: %.3f s (%.1f tokens/s, %" PRIu64 " thread%s); total %.3f s\n",
               device, t_apply, t_apply > 0 ? (double)n / t_apply : 0.0, threads,
               threads > 1 ? "s" : "", dt);
        printf("  wrote %s (%zu x %zu float32), FNV-1a 64 of it: %016" PRIx64 "\n", outp, n, per, fnv);
    }
    if (r.in_fd >= 0)
        close(r.in_fd);
    engram_reader_close(r.rd);
    dev_close(r.d);
    engram_layer_close(r.L);
    engram_model_close(r.m);
    free(r.tokens);
    free(r.mask);
    free(r.rows48);
    free(r.rows);
    free(r.x);
    free(r.kv);
    return st;
}
