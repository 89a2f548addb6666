/*
 * test_ple_build.c - engram_build_ple_model (engram_tools.h): the qwen4exp
 * file it writes opens through the strict parser (format/ple_file.h) with
 * every key of SPEC.md section 10 of its exact type and value, the layout
 * equal to the generators' (ple_gen.h) and the multipliers SPEC's; the
 * tensors in order with their types and shapes, the table page aligned;
 * the values drawn as documented (table rows of sigma 0.05, BF16; norms
 * near 1) and accepted by the PLE output stage, which runs on rows read
 * from the file.  One seed gives one file byte for byte, another seed
 * another file, and the weights do not depend on the table's fill.  The
 * full-size base gives SPEC's 320,001,536 rows as a hole, and SPEC's known
 * rows of {9707}, {9707, 11}, {9707, 11, 220} from the file's layout.  Bad
 * options are refused with -EINVAL and nothing written; a build that fails
 * half way (RLIMIT_FSIZE) leaves the old file and no temporary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "../src/format/gguf.h"
#include "../src/format/ple_file.h"
#include "../src/output/ple_apply.h"
#include "../src/tools/ple_gen.h"

#define VOCAB 248320u
#define EOS 248044u
#define SMALL_BASE 2000u
#define SMALL_W 16u

static const uint64_t spec_mult[3] = {23703573157769ull, 20109073645365ull, 8052911324071ull};
static const uint32_t spec_sizes[16] = {20000003, 20000023, 20000033, 20000047, 20000059, 20000063,
                                        20000069, 20000077, 20000081, 20000093, 20000107, 20000147,
                                        20000153, 20000159, 20000161, 20000171};

static int build(const char *path, uint32_t base, uint32_t width, engram_fill fill, uint64_t seed)
{
    engram_ple_build_opts o;
    memset(&o, 0, sizeof o);
    o.base = base;
    o.width = width;
    o.fill = fill;
    o.seed = seed;
    engram_error err;
    int rc = engram_build_ple_model(path, &o, &err);
    if (rc < 0)
        fprintf(stderr, "build %s: %s\n", path, err.msg);
    return rc;
}

static float bf16_f(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* A scalar key of this type and value. */
static void check_u32(const gguf_file *g, const char *key, uint64_t want)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    CHECK(kv && kv->type == GGUF_U32);
    if (kv)
        CHECK_EQ(kv->u, want);
    else
        fprintf(stderr, "missing key %s\n", key);
}

/* An array key of this element type and length, read as u64. */
static void check_array(const gguf_file *g, const char *key, uint32_t type, uint64_t n, const uint64_t *want)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    CHECK(kv && kv->type == GGUF_ARRAY && kv->arr_type == type && kv->arr_count == n);
    if (!kv || kv->arr_count != n || n > 16)
        return;
    uint64_t got64[16];
    uint32_t got32[16];
    CHECK_EQ(gguf_read_array(g, kv, type, n, type == GGUF_U64 ? (void *)got64 : (void *)got32, NULL), 0);
    for (uint64_t i = 0; i < n; i++)
        CHECK_EQ(type == GGUF_U64 ? got64[i] : got32[i], want[i]);
}

static void check_keys(const gguf_file *g, const struct ple_layout *l)
{
    CHECK_EQ(g->version, 3u);
    CHECK_EQ(g->n_kv, 13u);
    const gguf_kv *arch = gguf_find_kv(g, "general.architecture");
    CHECK(arch && arch->type == GGUF_STRING && strcmp(arch->str, "qwen4exp") == 0);
    const gguf_kv *name = gguf_find_kv(g, "general.name");
    CHECK(name && name->type == GGUF_STRING);
    check_u32(g, "qwen4exp.vocab_size", VOCAB);
    check_u32(g, "qwen4exp.embedding_length_per_layer_input", 160);
    const gguf_kv *eps = gguf_find_kv(g, "qwen4exp.attention.layer_norm_rms_epsilon");
    CHECK(eps && eps->type == GGUF_F32 && (float)eps->f == 1e-6f);
    const uint64_t one = 1;
    check_array(g, "qwen4exp.ple.layers", GGUF_U32, 1, &one);
    check_u32(g, "qwen4exp.ple.ngram_size", 3);
    check_u32(g, "qwen4exp.ple.heads_per_ngram", 8);
    check_u32(g, "qwen4exp.ple.conv_kernel", 4);
    check_u32(g, "qwen4exp.ple.eos_token_id", EOS);
    CHECK(gguf_find_kv(g, "qwen4exp.ple.image_token_id") == NULL);
    uint64_t off[16], sz[16];
    for (int h = 0; h < 16; h++) {
        off[h] = l->offsets[h];
        sz[h] = l->sizes[h];
    }
    check_array(g, "qwen4exp.ple.layer_multipliers", GGUF_U64, 3, spec_mult);
    check_array(g, "qwen4exp.ple.head_offsets", GGUF_U64, 16, off);
    check_array(g, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, 16, sz);
}

/* The tensors in file order, their types and shapes; the table page
 * aligned and first; all inside the file. */
static void check_tensors(const gguf_file *g, uint64_t rows, uint64_t w)
{
    static const char *const names[7] = {
        "per_layer_token_embd.weight", "blk.1.ple_key.weight", "blk.1.ple_value.weight",
        "blk.1.ple_norm_key.weight", "blk.1.ple_norm_query.weight", "blk.1.ple_norm_conv.weight",
        "blk.1.ple_conv1d.weight"};
    const uint32_t types[7] = {GGML_BF16, GGML_BF16, GGML_BF16, GGML_F32, GGML_F32, GGML_F32, GGML_F32};
    const uint32_t nd[7] = {2, 2, 2, 1, 1, 1, 2};
    const uint64_t d0[7] = {160, 2560, 2560, 4 * w, 4 * w, 4 * w, 4};
    const uint64_t d1[7] = {rows, 4 * w, w, 1, 1, 1, 4 * w};
    CHECK_EQ(g->n_tensors, 7u);
    for (uint64_t i = 0; i < 7 && i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        CHECK(strcmp(t->name, names[i]) == 0);
        CHECK_EQ(t->type, types[i]);
        CHECK_EQ(t->n_dims, nd[i]);
        CHECK_EQ(t->dims[0], d0[i]);
        CHECK_EQ(t->dims[1], d1[i]);
        CHECK_EQ(t->bytes, d0[i] * d1[i] * (types[i] == GGML_BF16 ? 2 : 4));
        CHECK(t->offset + t->bytes <= g->size);
        if (i > 0)
            CHECK(t->offset >= g->tensors[i - 1].offset + g->tensors[i - 1].bytes);
    }
    CHECK_EQ(g->tensors[0].offset % 4096, 0u);
}

/* Every value of a tensor read as F32 (BF16 widened); n values. */
static float *read_values(const gguf_file *g, const gguf_tensor *t, uint64_t *n)
{
    size_t es = t->type == GGML_BF16 ? 2 : 4;
    *n = t->bytes / es;
    unsigned char *raw = malloc((size_t)t->bytes);
    float *v = malloc((size_t)*n * sizeof *v);
    CHECK(raw && v && pread(g->fd, raw, (size_t)t->bytes, (off_t)t->offset) == (ssize_t)t->bytes);
    for (uint64_t i = 0; i < *n; i++) {
        if (es == 2) {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            v[i] = bf16_f(h);
        } else {
            memcpy(&v[i], raw + 4 * i, 4);
        }
    }
    free(raw);
    return v;
}

/* Mean and sigma within tol of the documented ones, every value finite
 * and within the bell's reach (3.47 sigma, a BF16 step more). */
static void check_stats(const gguf_file *g, const gguf_tensor *t, double mean, double sigma, double tol)
{
    uint64_t n;
    float *v = read_values(g, t, &n);
    double s = 0, s2 = 0, reach = 0;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            bad++;
        s += v[i];
        s2 += ((double)v[i] - mean) * ((double)v[i] - mean);
        reach = fmax(reach, fabs(v[i] - mean));
    }
    double m = s / (double)n, sd = sqrt(s2 / (double)n);
    CHECK_EQ(bad, 0u);
    CHECK(fabs(m - mean) < tol * sigma);
    CHECK(fabs(sd - sigma) < tol * sigma);
    CHECK(reach <= 3.47 * sigma * 1.01 + (mean != 0 ? 1e-6 : 0));
    if (fabs(m - mean) >= tol * sigma || fabs(sd - sigma) >= tol * sigma)
        fprintf(stderr, "%s: mean %g sigma %g (want %g, %g)\n", t->name, m, sd, mean, sigma);
    free(v);
}

static int read_file(const char *path, unsigned char **buf, size_t *len)
{
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) < 0)
        return -1;
    *len = (size_t)st.st_size;
    *buf = malloc(*len);
    ssize_t got = *buf ? pread(fd, *buf, *len, 0) : -1;
    close(fd);
    return got == (ssize_t)*len ? 0 : -1;
}

/* The output stage takes the file's weights and runs on rows read from
 * its table: finite outputs that differ from the input residual. */
static void check_apply(const gguf_file *g, const struct ple_file *f)
{
    struct ple_layer *L = NULL;
    engram_error err;
    int rc = ple_layer_open(g, f, &L, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "ple_layer_open: %s\n", err.msg);
        return;
    }
    enum { N = 12 };
    const uint32_t tok[N] = {9707, 11, 220, 1000, EOS, 5, 77, 248000, 3, 3, 3, 42};
    uint32_t rows[N * PLE_HEADS];
    struct ple_history h;
    ple_history_start(&f->layout, &h);
    CHECK_EQ(ple_hash(&f->layout, tok, NULL, N, &h, rows, NULL), 0);
    uint16_t *e = malloc((size_t)N * PLE_K * 2);
    for (int i = 0; i < N * PLE_HEADS && e; i++)
        CHECK(pread(g->fd, e + (size_t)i * PLE_ROW_VALUES, PLE_ROW_BYTES,
                    (off_t)(f->table->offset + (uint64_t)rows[i] * PLE_ROW_BYTES)) == PLE_ROW_BYTES);
    size_t C = (size_t)PLE_STREAMS * f->width;
    float *x = malloc((size_t)N * C * 4), *x0 = malloc((size_t)N * C * 4);
    float *state = calloc(ple_state_floats(L), 4);
    uint64_t s = 5;
    for (size_t i = 0; x && x0 && i < N * C; i++)
        x[i] = x0[i] = (float)((double)(tu_rand(&s) >> 11) / 9007199254740992.0 - 0.5);
    struct ple_applier *a = NULL;
    CHECK_EQ(ple_applier_new(L, NULL, &a, NULL), 0);
    if (a && e && x && x0 && state) {
        CHECK_EQ(ple_apply(a, e, x, ENGRAM_F32, NULL, N, state, &err), 0);
        size_t changed = 0, finite = 0;
        for (size_t i = 0; i < N * C; i++) {
            finite += isfinite(x[i]) != 0;
            changed += x[i] != x0[i];
        }
        CHECK_EQ(finite, N * C);
        CHECK(changed > N * C / 2);
    }
    ple_applier_free(a);
    ple_layer_free(L);
    free(e), free(x), free(x0), free(state);
}

static void small_file(void)
{
    char a[300], b[300], c[300], z[300];
    tu_path(a, sizeof a, "a.gguf");
    tu_path(b, sizeof b, "b.gguf");
    tu_path(c, sizeof c, "c.gguf");
    tu_path(z, sizeof z, "z.gguf");
    CHECK_EQ(build(a, SMALL_BASE, SMALL_W, ENGRAM_FILL_NORMAL, 7), 0);
    struct ple_layout want;
    CHECK_EQ(ple_layout_generate(0, SMALL_BASE, VOCAB, EOS, PLE_NO_IMAGE, &want, NULL), 0);
    gguf_file *g = NULL;
    engram_error err;
    CHECK_EQ(gguf_open(a, &g, &err), 0);
    if (!g)
        return;
    struct ple_file f;
    int rc = ple_file_read(g, &f, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "ple_file_read: %s\n", err.msg);
        gguf_close(g);
        return;
    }
    CHECK(memcmp(&f.layout, &want, sizeof want) == 0);
    for (int j = 0; j < 3; j++)
        CHECK_EQ(f.layout.multipliers[j], spec_mult[j]);
    CHECK_EQ(f.layout.sizes[0], 2003u); /* the first prime after 2000 */
    CHECK_EQ(f.layer, 1u);
    CHECK_EQ(f.conv_kernel, 4u);
    CHECK_EQ(f.width, SMALL_W);
    CHECK(f.eps == 1e-6f);
    check_keys(g, &want);
    check_tensors(g, want.rows, SMALL_W);
    /* the values: table rows sigma 0.05 (BF16), projections 0.02, norms
     * 1 + 0.05 x, taps 0.1 x */
    check_stats(g, f.table, 0.0, 0.05, 0.02);
    check_stats(g, f.key, 0.0, 0.02, 0.03);
    check_stats(g, f.value, 0.0, 0.02, 0.03);
    check_stats(g, f.norm_key, 1.0, 0.05, 0.3);
    check_stats(g, f.norm_query, 1.0, 0.05, 0.3);
    check_stats(g, f.norm_conv, 1.0, 0.05, 0.3);
    check_stats(g, f.conv, 0.0, 0.1, 0.3);
    /* rows differ from each other (a sample of neighbours) */
    {
        unsigned char r0[PLE_ROW_BYTES], r1[PLE_ROW_BYTES];
        int same = 0;
        for (uint64_t r = 0; r + 1 < want.rows; r += 997) {
            CHECK(pread(g->fd, r0, sizeof r0, (off_t)(f.table->offset + r * PLE_ROW_BYTES)) == PLE_ROW_BYTES);
            CHECK(pread(g->fd, r1, sizeof r1, (off_t)(f.table->offset + (r + 1) * PLE_ROW_BYTES)) == PLE_ROW_BYTES);
            same += memcmp(r0, r1, sizeof r0) == 0;
        }
        CHECK_EQ(same, 0);
    }
    check_apply(g, &f);
    uint64_t table_off = f.table->offset, table_bytes = f.table->bytes;
    gguf_close(g);

    /* one seed, one file; another seed, another table and other weights;
     * the weights do not depend on the fill */
    CHECK_EQ(build(b, SMALL_BASE, SMALL_W, ENGRAM_FILL_NORMAL, 7), 0);
    CHECK_EQ(build(c, SMALL_BASE, SMALL_W, ENGRAM_FILL_NORMAL, 8), 0);
    CHECK_EQ(build(z, SMALL_BASE, SMALL_W, ENGRAM_FILL_ZERO, 7), 0);
    unsigned char *fa = NULL, *fb = NULL, *fc = NULL, *fz = NULL;
    size_t la = 0, lb = 0, lc = 0, lz = 0;
    CHECK_EQ(read_file(a, &fa, &la), 0);
    CHECK_EQ(read_file(b, &fb, &lb), 0);
    CHECK_EQ(read_file(c, &fc, &lc), 0);
    CHECK_EQ(read_file(z, &fz, &lz), 0);
    if (fa && fb && fc && fz && la == lb && la == lc && la == lz) {
        size_t te = (size_t)(table_off + table_bytes);
        CHECK(memcmp(fa, fb, la) == 0);
        CHECK(memcmp(fa, fc, (size_t)table_off) == 0); /* the header: the seed is not in it */
        CHECK(memcmp(fa + table_off, fc + table_off, (size_t)table_bytes) != 0);
        CHECK(memcmp(fa + te, fc + te, la - te) != 0);
        CHECK(memcmp(fa + te, fz + te, la - te) == 0);
        size_t nz = 0;
        for (size_t i = (size_t)table_off; i < te; i++)
            nz += fz[i] != 0;
        CHECK_EQ(nz, 0u);
    } else {
        CHECK(0);
    }
    free(fa), free(fb), free(fc), free(fz);
    unlink(a), unlink(b), unlink(c), unlink(z);
}

/* The full-size base: SPEC's sizes and rows, a hole; SPEC's known rows
 * from the file's layout, reading zeros. */
static void full_size(void)
{
    char p[300];
    tu_path(p, sizeof p, "full.gguf");
    CHECK_EQ(build(p, 0, 8, ENGRAM_FILL_ZERO, 1), 0);
    struct stat st;
    CHECK_EQ(stat(p, &st), 0);
    CHECK((uint64_t)st.st_size > 320001536ull * 320);
    CHECK((uint64_t)st.st_blocks * 512 < (16u << 20)); /* a hole, not 102 GB */
    gguf_file *g = NULL;
    engram_error err;
    CHECK_EQ(gguf_open(p, &g, &err), 0);
    if (!g)
        return;
    struct ple_file f;
    CHECK_EQ(ple_file_read(g, &f, &err), 0);
    CHECK_EQ(f.layout.rows, 320001536u);
    CHECK_EQ(f.width, 8u);
    uint64_t at = 0;
    for (int h = 0; h < 16; h++) {
        CHECK_EQ(f.layout.sizes[h], spec_sizes[h]);
        CHECK_EQ(f.layout.offsets[h], at);
        at += spec_sizes[h];
    }
    CHECK_EQ(at, 320001446u);
    for (int j = 0; j < 3; j++)
        CHECK_EQ(f.layout.multipliers[j], spec_mult[j]);
    struct ple_layout gen;
    CHECK_EQ(ple_layout_generate(0, 19999999u, VOCAB, EOS, PLE_NO_IMAGE, &gen, NULL), 0);
    CHECK(memcmp(&f.layout, &gen, sizeof gen) == 0);
    check_tensors(g, 320001536u, 8);
    static const uint32_t want[3][4] = {{16410909, 152932897, 169641436, 300984276},
                                        {18158303, 159566246, 175132467, 307699687},
                                        {15029315, 143479041, 162897307, 308764256}};
    static const int heads[4] = {0, 7, 8, 15};
    const uint32_t seq[3] = {9707, 11, 220};
    uint32_t rows[3 * PLE_HEADS];
    struct ple_history h;
    ple_history_start(&f.layout, &h);
    CHECK_EQ(ple_hash(&f.layout, seq, NULL, 3, &h, rows, NULL), 0);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) {
            uint32_t r = rows[i * PLE_HEADS + heads[k]];
            CHECK_EQ(r, want[i][k]);
            unsigned char row[PLE_ROW_BYTES], zero[PLE_ROW_BYTES] = {0};
            CHECK(pread(g->fd, row, sizeof row, (off_t)(f.table->offset + (uint64_t)r * PLE_ROW_BYTES)) ==
                  PLE_ROW_BYTES);
            CHECK(memcmp(row, zero, sizeof row) == 0);
        }
    /* the last row lies inside the file, the weights after it */
    CHECK(f.table->offset + 320001536ull * PLE_ROW_BYTES <= f.key->offset);
    printf("full size: %llu bytes, %llu on disk, table at %llu\n", (unsigned long long)st.st_size,
           (unsigned long long)st.st_blocks * 512, (unsigned long long)f.table->offset);
    gguf_close(g);
    unlink(p);
}

/* The default width (0 = 2560, the real one). */
static void default_width(void)
{
    char p[300];
    tu_path(p, sizeof p, "w.gguf");
    CHECK_EQ(build(p, 500, 0, ENGRAM_FILL_ZERO, 3), 0);
    gguf_file *g = NULL;
    CHECK_EQ(gguf_open(p, &g, NULL), 0);
    if (!g)
        return;
    struct ple_file f;
    CHECK_EQ(ple_file_read(g, &f, NULL), 0);
    CHECK_EQ(f.width, 2560u);
    check_tensors(g, f.layout.rows, 2560);
    gguf_close(g);
    unlink(p);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void refusals(void)
{
    char p[400], old[400], dir[300];
    tu_path(dir, sizeof dir, "refuse");
    CHECK_EQ(mkdir(dir, 0700), 0);
    snprintf(p, sizeof p, "%s/never.gguf", dir);
    snprintf(old, sizeof old, "%s/old.gguf", dir);
    engram_ple_build_opts o;
    memset(&o, 0, sizeof o);
    o.base = SMALL_BASE;
    o.width = SMALL_W;
    engram_error err;
    int rc = engram_build_ple_model(NULL, &o, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_build_ple_model(p, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    const engram_fill bad_fill[4] = {ENGRAM_FILL_RANDOM, ENGRAM_FILL_SPARSE, ENGRAM_FILL_POOL, (engram_fill)99};
    for (int i = 0; i < 4; i++) {
        o.fill = bad_fill[i];
        rc = engram_build_ple_model(p, &o, &err);
        CHECK_ERR(rc, err, -EINVAL, "zero (holes) or normal");
    }
    o.fill = ENGRAM_FILL_NORMAL;
    o.width = ENGRAM_MAX_WIDTH + 1;
    rc = engram_build_ple_model(p, &o, &err);
    CHECK_ERR(rc, err, -EINVAL, "width 65537");
    o.width = SMALL_W;
    o.base = 200000000u; /* 16 heads of 2e8 pass int32 */
    rc = engram_build_ple_model(p, &o, &err);
    CHECK_ERR(rc, err, -EINVAL, "base 200000000");
    o.base = SMALL_BASE;
    CHECK(access(p, F_OK) != 0);
    CHECK_EQ(count_entries(dir), 0);

    /* refused over an existing file: it stays as it was */
    FILE *fo = fopen(old, "w");
    CHECK(fo && fputs("old", fo) >= 0);
    if (fo)
        fclose(fo);
    o.fill = ENGRAM_FILL_RANDOM;
    rc = engram_build_ple_model(old, &o, &err);
    CHECK_EQ(rc, -EINVAL);
    /* a build that fails half way (RLIMIT_FSIZE: the header is written,
     * sizing the file is refused; test_faults_files fails each write in
     * turn): the old file and nothing else */
    o.fill = ENGRAM_FILL_NORMAL;
    struct rlimit lim, small;
    CHECK_EQ(getrlimit(RLIMIT_FSIZE, &lim), 0);
    small = lim;
    small.rlim_cur = 1u << 20;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    rc = engram_build_ple_model(old, &o, &err);
    CHECK_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    signal(SIGXFSZ, prev);
    CHECK_ERR(rc, err, -EFBIG, "");
    unsigned char *buf = NULL;
    size_t len = 0;
    CHECK_EQ(read_file(old, &buf, &len), 0);
    CHECK(len == 3 && buf && memcmp(buf, "old", 3) == 0);
    free(buf);
    CHECK_EQ(count_entries(dir), 1);
    /* a missing folder: -ENOENT, nothing created */
    char missing[400];
    snprintf(missing, sizeof missing, "%s/no/such.gguf", dir);
    rc = engram_build_ple_model(missing, &o, &err);
    CHECK_EQ(rc, -ENOENT);
    CHECK_EQ(count_entries(dir), 1);
}

int main(void)
{
    small_file();
    full_size();
    default_width();
    refusals();
    tu_cleanup();
    return tu_finish("test_ple_build");
}
