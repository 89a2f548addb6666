/*
 * test_model.c - opening models: every validation rule of SPEC.md section 3
 * on crafted files (each error names its key or tensor), placement flags,
 * the exact row read path and its errors (out of range, NaN rows, a file
 * that shrinks under the reader), the builder's sparse fill read back (a
 * random row at every 4096th, holes between), and a full-size V4.1 model
 * of holes whose second table lies past 100 GB.
 */
#include "format/gguf.h"
#include "testutil.h"

#define VOCAB 1000
#define CVOCAB 700
#define BASE 3000

/* What to write; the defaults form a valid small model. */
struct variant {
    const char *arch, *encoding;
    int cvocab_type;           /* GGUF_U32 normally */
    uint32_t cvocab, pad;
    uint64_t map_len;          /* token_map length */
    uint32_t map_bad_at;       /* if nonzero: token_map[at] = V' */
    uint64_t rows_len, primes_len, mult_len;
    int mult_type;
    int even_mult, big_mult, rows_off_by_one, prime_one;
    int dup_key;
    uint64_t table_d0;         /* 264 */
    int64_t table_rows_delta;  /* table 1 row dimension - rows[1] */
    int table_type;
    int omit_table1, extra_after, no_page_align, table1_first;
    /* projection weights of layer 1 (and 14 when proj14): written when proj */
    int proj, proj14, omit_k, q_type;
    uint64_t kv_d0, kv_d1, q_d0, q_d1, k_d0, k_d1, w14;
    uint64_t truncate_by;
    const char *omit_key;      /* a required key left out */
};

static struct variant defaults(void)
{
    struct variant v;
    memset(&v, 0, sizeof v);
    v.arch = "deepseek41";
    v.encoding = "e4m3_e8m0_32_row264";
    v.cvocab_type = GGUF_U32;
    v.cvocab = CVOCAB;
    v.pad = 2;
    v.map_len = VOCAB;
    v.rows_len = 2;
    v.primes_len = 48;
    v.mult_len = 8;
    v.mult_type = GGUF_U64;
    v.table_d0 = 264;
    v.table_type = GGML_I8;
    /* a valid projection: W = 16, S = 4 */
    v.q_type = GGML_F32;
    v.kv_d0 = 6144;
    v.kv_d1 = 5 * 16;
    v.q_d0 = v.k_d0 = 16;
    v.q_d1 = v.k_d1 = 4;
    v.w14 = 16;
    return v;
}

static int keep(const struct variant *v, const char *key)
{
    return !v->omit_key || strcmp(v->omit_key, key) != 0;
}

static int write_variant(const char *path, const struct variant *v, const engram_layout *l)
{
    gguf_writer *w = gguf_writer_new(3, 32);
    if (v->arch)
        gguf_w_str(w, "general.architecture", v->arch);
    if (v->encoding)
        gguf_w_str(w, "deepseek41.engram.encoding", v->encoding);
    uint64_t cv = v->cvocab;
    if (keep(v, "deepseek41.engram.compressed_vocab_size"))
        gguf_w_scalar(w, "deepseek41.engram.compressed_vocab_size", (uint32_t)v->cvocab_type, &cv);
    if (keep(v, "deepseek41.engram.pad_id"))
        gguf_w_u32(w, "deepseek41.engram.pad_id", v->pad);
    uint32_t *map = calloc(v->map_len + 1, sizeof *map);
    for (uint64_t i = 0; i < v->map_len; i++)
        map[i] = i < l->vocab ? l->token_map[i] : 0;
    if (v->map_bad_at)
        map[v->map_bad_at] = v->cvocab;
    if (keep(v, "deepseek41.engram.token_map"))
        gguf_w_array(w, "deepseek41.engram.token_map", GGUF_U32, map, v->map_len);
    free(map);
    uint32_t rows[3] = {l->rows[0] + (uint32_t)v->rows_off_by_one, l->rows[1], 0};
    if (keep(v, "deepseek41.engram.rows"))
        gguf_w_array(w, "deepseek41.engram.rows", GGUF_U32, rows, v->rows_len);
    uint32_t primes[49];
    memcpy(primes, l->primes, sizeof l->primes);
    primes[48] = 7;
    if (v->prime_one)
        primes[30] = 1;
    if (keep(v, "deepseek41.engram.primes"))
        gguf_w_array(w, "deepseek41.engram.primes", GGUF_U32, primes, v->primes_len);
    uint64_t mult[9];
    memcpy(mult, l->multipliers, sizeof l->multipliers);
    mult[8] = 3;
    if (v->even_mult)
        mult[5] ^= 1;
    if (v->big_mult)
        mult[6] = ((uint64_t)INT64_MAX / v->cvocab + 1) | 1;
    uint32_t m32[9];
    for (int i = 0; i < 9; i++)
        m32[i] = (uint32_t)mult[i];
    if (keep(v, "deepseek41.engram.multipliers"))
        gguf_w_array(w, "deepseek41.engram.multipliers", v->mult_type == GGUF_U64 ? GGUF_U64 : GGUF_U32,
                     v->mult_type == GGUF_U64 ? (const void *)mult : (const void *)m32, v->mult_len);
    if (v->dup_key)
        gguf_w_u32(w, "deepseek41.engram.pad_id", v->pad);
    if (v->proj) {
        uint64_t kv[2] = {v->kv_d0, v->kv_d1}, q[2] = {v->q_d0, v->q_d1}, k[2] = {v->k_d0, v->k_d1};
        gguf_w_tensor(w, "blk.1.engram_kv.weight", GGML_F16, 2, kv, 0, NULL, NULL);
        gguf_w_tensor(w, "blk.1.engram_q_norm.weight", (uint32_t)v->q_type, 2, q, 0, NULL, NULL);
        if (!v->omit_k)
            gguf_w_tensor(w, "blk.1.engram_k_norm.weight", GGML_F32, 2, k, 0, NULL, NULL);
    }
    if (v->proj14) {
        uint64_t kv[2] = {6144, 5 * v->w14}, q[2] = {v->w14, 4};
        gguf_w_tensor(w, "blk.14.engram_kv.weight", GGML_F16, 2, kv, 0, NULL, NULL);
        gguf_w_tensor(w, "blk.14.engram_q_norm.weight", GGML_F32, 2, q, 0, NULL, NULL);
        gguf_w_tensor(w, "blk.14.engram_k_norm.weight", GGML_F32, 2, q, 0, NULL, NULL);
    }
    uint64_t d0[2] = {v->table_d0, l->rows[0]};
    uint64_t d1[2] = {v->table_d0, (uint64_t)((int64_t)l->rows[1] + v->table_rows_delta)};
    uint64_t align0 = v->no_page_align ? 0 : 4096;
    if (v->no_page_align) { /* push table 0 off a page boundary */
        uint64_t small[1] = {8};
        gguf_w_tensor(w, "pad.weight", GGML_F32, 1, small, 0, NULL, NULL);
    }
    if (v->table1_first && !v->omit_table1)
        gguf_w_tensor(w, "blk.14.engram_embd.weight", (uint32_t)v->table_type, 2, d1, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.engram_embd.weight", (uint32_t)v->table_type, 2, d0, align0, NULL, NULL);
    if (!v->table1_first && !v->omit_table1)
        gguf_w_tensor(w, "blk.14.engram_embd.weight", (uint32_t)v->table_type, 2, d1, 0, NULL, NULL);
    if (v->extra_after) {
        uint64_t small[1] = {64};
        gguf_w_tensor(w, "output.weight", GGML_F32, 1, small, 0, NULL, NULL);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    engram_error err;
    int rc = gguf_w_write_fd(w, fd, &err);
    gguf_writer_free(w);
    if (rc == 0 && v->truncate_by) {
        struct stat st;
        fstat(fd, &st);
        rc = ftruncate(fd, st.st_size - (off_t)v->truncate_by);
    }
    close(fd);
    return rc;
}

/* Writes the variant, opens it, expects `want` with `needle` in the message. */
static void expect_open(const struct variant *v, const engram_layout *l, int want,
                        const char *needle, const char *what)
{
    char path[512];
    tu_path(path, sizeof path, "variant.gguf");
    CHECK_EQ(write_variant(path, v, l), 0);
    engram_model *m = (engram_model *)0x1;
    engram_error err;
    memset(&err, 0, sizeof err);
    int rc = engram_model_open(path, &m, &err);
    if (want == 0) { /* a valid variant: the projection as written */
        CHECK_EQ(rc, 0);
        if (rc < 0) {
            fprintf(stderr, "variant '%s': %s\n", what, err.msg);
            return;
        }
        engram_model_info in;
        engram_model_get_info(m, &in);
        CHECK_EQ(in.table[0].has_projection, v->proj);
        CHECK_EQ(in.table[1].has_projection, v->proj14);
        CHECK_EQ(in.has_projection, v->proj && v->proj14);
        CHECK_EQ(in.width, v->q_d0);
        CHECK_EQ(in.streams, v->q_d1);
        engram_model_close(m);
        return;
    }
    if (rc != want || !strstr(err.msg, needle) || getenv("TEST_VERBOSE"))
        fprintf(stderr, "variant '%s': rc %d, message '%s'\n", what, rc, err.msg);
    CHECK_ERR(rc, err, want, needle);
    CHECK(m == (engram_model *)0x1); /* untouched on failure */
}

static void validation(const engram_layout *l)
{
    struct variant v;
#define CASE(field_assign, want, needle)                                   \
    do {                                                                   \
        v = defaults();                                                    \
        field_assign;                                                      \
        expect_open(&v, l, want, needle, #field_assign);                   \
    } while (0)
    CASE(v.arch = "llama", -ENOTSUP, "general.architecture");
    CASE(v.arch = NULL, -ENOTSUP, "missing");
    CASE(v.encoding = "q8_0", -ENOTSUP, "encoding");
    CASE(v.encoding = NULL, -EBADMSG, "missing key 'deepseek41.engram.encoding'");
    /* every other required key left out in turn */
    static const char *const required[] = {
        "deepseek41.engram.compressed_vocab_size", "deepseek41.engram.pad_id",
        "deepseek41.engram.rows", "deepseek41.engram.primes", "deepseek41.engram.multipliers",
        "deepseek41.engram.token_map"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "missing key '%s'", required[i]);
        CASE(v.omit_key = required[i], -EBADMSG, needle);
    }
    CASE(v.cvocab_type = GGUF_U64, -EBADMSG, "compressed_vocab_size' at offset");
    CASE(v.pad = CVOCAB, -EBADMSG, "pad_id");
    CASE(v.map_bad_at = 17, -EBADMSG, "token_map[17]");
    CASE(v.map_len = 0, -EBADMSG, "token_map");
    CASE(v.rows_len = 3, -EBADMSG, "engram.rows' at offset");
    CASE(v.primes_len = 47, -EBADMSG, "engram.primes' at offset");
    CASE(v.primes_len = 49, -EBADMSG, "expected array u32[48]");
    CASE(v.mult_len = 7, -EBADMSG, "engram.multipliers");
    CASE(v.mult_type = GGUF_U32, -EBADMSG, "expected array u64[8], found array of u32");
    CASE(v.even_mult = 1, -EBADMSG, "multipliers[1][1]");
    CASE(v.big_mult = 1, -EBADMSG, "INT64_MAX / V'");
    CASE(v.rows_off_by_one = 1, -EBADMSG, "sum of primes");
    CASE(v.prime_one = 1, -EBADMSG, "primes[1][6] = 1");
    CASE(v.dup_key = 1, -EBADMSG, "duplicate key 'deepseek41.engram.pad_id'");
    CASE(v.table_d0 = 256, -EBADMSG, "blk.1.engram_embd.weight");
    CASE(v.table_rows_delta = -1, -EBADMSG, "blk.14.engram_embd.weight");
    CASE(v.table_type = GGML_F32, -EBADMSG, "blk.1.engram_embd.weight");
    CASE(v.omit_table1 = 1, -EBADMSG, "missing table tensor 'blk.14.engram_embd.weight'");
    CASE(v.truncate_by = 1, -EBADMSG, "outside the file");
    CASE(v.truncate_by = 264 * 5, -EBADMSG, "blk.14.engram_embd.weight");
    /* Projection weights: shapes checked against each other and the rows. */
    CASE((v.proj = 1, v.omit_k = 1), -EBADMSG, "incomplete: missing tensor 'blk.1.engram_k_norm.weight'");
    CASE((v.proj = 1, v.kv_d1 = 5 * 16 + 1), -EBADMSG, "blk.1.engram_kv.weight");
    CASE((v.proj = 1, v.kv_d0 = 6143), -EBADMSG, "expected F16 [6144, 80]");
    CASE((v.proj = 1, v.q_type = GGML_F16), -EBADMSG, "blk.1.engram_q_norm.weight");
    CASE((v.proj = 1, v.k_d0 = 17), -EBADMSG, "blk.1.engram_k_norm.weight");
    CASE((v.proj = 1, v.k_d1 = 3), -EBADMSG, "expected F32 [16, 4]");
    CASE((v.proj = 1, v.q_d1 = 17, v.k_d1 = 17, v.kv_d1 = 18 * 16), -EBADMSG, "1 <= S <= 16");
    CASE((v.proj = 1, v.q_d0 = 0), -EBADMSG, "blk.1.engram_q_norm.weight");
    CASE((v.proj = 1, v.proj14 = 1, v.w14 = 32), -EBADMSG, "other layer");
    /* valid: one layer only, and another stream count */
    CASE(v.proj = 1, 0, "");
    CASE((v.proj = 1, v.q_d1 = 2, v.k_d1 = 2, v.kv_d1 = 3 * 16), 0, "");
    CASE((v.proj = 1, v.proj14 = 1), 0, "");
#undef CASE
}

static void placement(const engram_layout *l)
{
    struct { const char *name; int field; int last, aligned; } cases[] = {
        {"default", 0, 1, 1}, {"extra tensor after", 1, 0, 1},
        {"table 0 not page aligned", 2, 1, 0}, {"table 1 first", 3, 0, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct variant v = defaults();
        v.extra_after = cases[k].field == 1;
        v.no_page_align = cases[k].field == 2;
        v.table1_first = cases[k].field == 3;
        char path[512];
        tu_path(path, sizeof path, "placement.gguf");
        CHECK_EQ(write_variant(path, &v, l), 0);
        engram_model *m = NULL;
        engram_error err;
        int rc = engram_model_open(path, &m, &err);
        CHECK_EQ(rc, 0);
        if (rc < 0) {
            fprintf(stderr, "placement %s: %s\n", cases[k].name, err.msg);
            continue;
        }
        engram_model_info in;
        engram_model_get_info(m, &in);
        CHECK_EQ(in.tables_last, cases[k].last);
        CHECK_EQ(in.table0_page_aligned, cases[k].aligned);
        engram_model_close(m);
    }
}

/* Reads through the model equal bytes read straight from the file. */
static void reads(const engram_layout *l)
{
    char path[512];
    CHECK_EQ(tu_build("random.gguf", l, ENGRAM_FILL_RANDOM, 16, path, sizeof path), 0);
    engram_model *m;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    engram_model_info in;
    engram_model_get_info(m, &in);
    CHECK(in.has_projection && in.width == 16);
    CHECK(in.tables_last && in.table0_page_aligned);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t seed = 5;
    for (int t = 0; t < 2; t++) {
        enum { N = 300 };
        uint32_t rows[N];
        for (int i = 0; i < N; i++)
            rows[i] = i < 3 ? (i == 0 ? 0 : l->rows[t] - (uint32_t)i)
                            : (uint32_t)(tu_rand(&seed) % l->rows[t]);
        rows[N - 1] = rows[N / 2]; /* a duplicate */
        static uint8_t raw[N * 264], direct[N * 264];
        CHECK_EQ(engram_model_read_raw(m, t, rows, N, raw, &err), 0);
        for (int i = 0; i < N; i++) {
            ssize_t got = pread(fd, direct + i * 264, 264, (off_t)(in.table[t].offset + (uint64_t)rows[i] * 264));
            CHECK_EQ(got, 264);
        }
        CHECK(memcmp(raw, direct, sizeof raw) == 0);
        static float f[N * 256];
        static uint16_t b[N * 256], want[N * 256];
        CHECK_EQ(engram_model_read_f32(m, t, rows, N, f, &err), 0);
        CHECK_EQ(engram_model_read_bf16(m, t, rows, N, b, &err), 0);
        CHECK_EQ(engram_rows_decode_bf16(ENGRAM_SIMD_SCALAR, direct, N, want, NULL), 0);
        CHECK(memcmp(b, want, sizeof b) == 0);
        int same = 1;
        for (int i = 0; i < N * 256; i++) {
            uint32_t u;
            memcpy(&u, &f[i], 4);
            same &= u == (uint32_t)want[i] << 16;
        }
        CHECK(same);
    }
    close(fd);

    /* Out-of-range row: -EINVAL naming it, output untouched. */
    uint32_t bad[3] = {1, l->rows[1], 2};
    float out[3 * 256];
    memset(out, 0x33, sizeof out);
    int rc = engram_model_read_f32(m, 1, bad, 3, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "out of range");
    CHECK_EQ(err.row, l->rows[1]);
    rc = engram_model_read_f32(m, 2, bad, 1, out, &err);
    CHECK_ERR(rc, err, -EINVAL, "table 2");
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(((uint8_t *)out)[i] == 0x33);
    /* the same refusals from the raw read (not through the decoding reads),
     * and NULL arguments */
    uint8_t rawbad[3 * 264];
    memset(rawbad, 0x33, sizeof rawbad);
    rc = engram_model_read_raw(m, 1, bad, 3, rawbad, &err);
    CHECK_ERR(rc, err, -EINVAL, "out of range");
    CHECK_EQ(err.row, l->rows[1]);
    rc = engram_model_read_raw(m, 0, NULL, 1, rawbad, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    for (size_t i = 0; i < sizeof rawbad; i++)
        CHECK(rawbad[i] == 0x33);
    engram_model *m2 = (engram_model *)0x1;
    rc = engram_model_open(NULL, &m2, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    rc = engram_model_open(path, NULL, &err);
    CHECK_ERR(rc, err, -EINVAL, "NULL argument");
    CHECK(m2 == (engram_model *)0x1);
    engram_model_close(m);

    /* A NaN row: -EDOM naming the row and why. */
    int wfd = open(path, O_WRONLY | O_CLOEXEC);
    uint8_t nan_scale = 255;
    CHECK_EQ(pwrite(wfd, &nan_scale, 1, (off_t)(in.table[0].offset + 77ull * 264 + 260)), 1);
    uint8_t nan_code = 0xff;
    CHECK_EQ(pwrite(wfd, &nan_code, 1, (off_t)(in.table[1].offset + 5ull * 264 + 9)), 1);
    close(wfd);
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    uint32_t r77[3] = {3, 77, 4}, r5[1] = {5};
    memset(out, 0x33, sizeof out);
    rc = engram_model_read_f32(m, 0, r77, 3, out, &err);
    CHECK_ERR(rc, err, -EDOM, "row 77 of table 0: NaN scale");
    CHECK_EQ(err.row, 77);
    rc = engram_model_read_bf16(m, 1, r5, 1, (uint16_t *)out, &err);
    CHECK_ERR(rc, err, -EDOM, "row 5 of table 1: NaN code");
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(((uint8_t *)out)[i] == 0x33);

    /* The file shrinks under an open model: a short read, -EIO naming the row. */
    CHECK_EQ(truncate(path, (off_t)(in.table[1].offset + 100ull * 264 + 10)), 0);
    uint32_t r100[3] = {99, 100, 98};
    uint8_t raw2[3 * 264], row99[264];
    memset(raw2, 0x77, sizeof raw2);
    rc = engram_model_read_raw(m, 1, r100, 3, raw2, &err);
    CHECK_ERR(rc, err, -EIO, "row 100 of table 1");
    CHECK_EQ(err.row, 100);
    CHECK_EQ(err.offset, in.table[1].offset + 100ull * 264);
    /* as documented: the rows before the failing one are written, the rest
     * of the output is untouched */
    CHECK_EQ(engram_model_read_raw(m, 1, r100, 1, row99, &err), 0);
    CHECK(memcmp(raw2, row99, 264) == 0);
    for (size_t i = 264; i < sizeof raw2; i++)
        CHECK(raw2[i] == 0x77);
    engram_model_close(m);
    engram_model_close(NULL);
}

/* The sparse fill (engram_tools.h: holes, every 4096th row random), read
 * back through the exact path: each row r with r % 4096 == 0 is nonzero,
 * decodes and differs from the previous such row; its neighbours r - 1 and
 * r + 1 are all zero bytes.  (test_reader's full-size file is holes with
 * the rows it reads written by the test itself.) */
static void sparse_fill(const engram_layout *l)
{
    char path[512];
    CHECK_EQ(tu_build("sparse.gguf", l, ENGRAM_FILL_SPARSE, 0, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    CHECK(m != NULL);
    if (!m)
        return;
    engram_error err;
    unsigned filled = 0, want_filled = 0, bad = 0, holes = 0;
    uint8_t prev[264];
    for (int t = 0; t < 2; t++)
        for (uint32_t r = 0; r < l->rows[t]; r += 4096) {
            uint8_t raw[264];
            float v[256];
            want_filled++;
            int nonzero = 0;
            CHECK_EQ(engram_model_read_raw(m, t, &r, 1, raw, &err), 0);
            for (int i = 0; i < 264; i++)
                nonzero |= raw[i] != 0;
            int decodes = engram_model_read_f32(m, t, &r, 1, v, &err) == 0;
            int differs = r == 0 || memcmp(raw, prev, sizeof raw) != 0;
            filled += nonzero && decodes && differs;
            memcpy(prev, raw, sizeof raw);
            uint32_t near[2] = {r ? r - 1 : r + 2, r + 1};
            for (int k = 0; k < 2; k++) {
                if (near[k] >= l->rows[t])
                    continue;
                int zero = 1;
                CHECK_EQ(engram_model_read_raw(m, t, &near[k], 1, raw, &err), 0);
                for (int i = 0; i < 264; i++)
                    zero &= raw[i] == 0;
                bad += !zero;
                holes++;
            }
        }
    CHECK(want_filled >= 2 * 10); /* enough rows at this layout to mean something */
    CHECK_EQ(filled, want_filled);
    CHECK_EQ(bad, 0);
    printf("sparse fill: %u of %u rows at multiples of 4096 random and decodable, %u neighbours zero\n",
           filled, want_filled, holes - bad);
    engram_model_close(m);
}

/* A full-size V4.1 model (SPEC.md sections 2 and 5): sparse, 2 x ~101 GB
 * apparent.  Rows are written at the far ends, past 4 GiB and past 100 GB. */
static void full_size(void)
{
    static uint32_t map[129280];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 129280, 99092, 16000000), 0);
    CHECK_EQ(l.rows[0], 384006168);
    CHECK_EQ(l.rows[1], 384016682);
    char path[512];
    if (tu_build("full.gguf", &l, ENGRAM_FILL_ZERO, 0, path, sizeof path) < 0) {
        CHECK(0);
        return;
    }
    engram_model *m;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    engram_model_info in;
    engram_model_get_info(m, &in);
    CHECK_EQ(in.table[0].bytes, 384006168ull * 264);
    CHECK_EQ(in.table[1].bytes, 384016682ull * 264);
    CHECK(in.table[1].offset > 100000000000ull);
    CHECK(in.table[0].offset + in.table[0].bytes <= in.table[1].offset);
    CHECK_EQ(in.file_bytes, in.table[1].offset + in.table[1].bytes);
    CHECK(in.tables_last && in.table0_page_aligned);
    const engram_layout *ml = engram_model_layout(m);
    CHECK(memcmp(ml->multipliers, tu_v41_mult, sizeof tu_v41_mult) == 0);
    struct stat st;
    CHECK_EQ(stat(path, &st), 0);
    CHECK((uint64_t)st.st_blocks * 512 < 64ull << 20); /* sparse on disk */

    /* Rows at the ends of both tables, written by hand. */
    uint32_t far[2][3] = {{0, 16263 /* > 4 GiB / 264 */ * 1000, l.rows[0] - 1},
                          {0, 200000000, l.rows[1] - 1}};
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint8_t row[264];
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 256; i++)
                row[i] = (uint8_t)((i + k + t) & 0x7e);
            memset(row + 256, 120 + k + t, 8);
            uint64_t off = in.table[t].offset + (uint64_t)far[t][k] * 264;
            CHECK_EQ(pwrite(fd, row, 264, (off_t)off), 264);
        }
    for (int t = 0; t < 2; t++) {
        uint8_t got[3 * 264];
        CHECK_EQ(engram_model_read_raw(m, t, far[t], 3, got, &err), 0);
        for (int k = 0; k < 3; k++) {
            CHECK_EQ(got[k * 264 + 5], (uint8_t)((5 + k + t) & 0x7e));
            CHECK_EQ(got[k * 264 + 263], 120 + k + t);
        }
        /* A hole reads as zeros, which decode to +0. */
        uint32_t hole = far[t][1] + 1;
        float z[256];
        CHECK_EQ(engram_model_read_f32(m, t, &hole, 1, z, &err), 0);
        int zeros = 1;
        for (int i = 0; i < 256; i++)
            zeros &= z[i] == 0.0f;
        CHECK(zeros);
    }
    close(fd);
    /* Hash and read the rows of real text on the full-size layout. */
    uint32_t tokens[64];
    FILE *f = fopen("data/gpl3.tok", "r");
    size_t n = 0;
    unsigned v;
    while (f && n < 64 && fscanf(f, "%u", &v) == 1)
        tokens[n++] = v;
    if (f)
        fclose(f);
    CHECK_EQ(n, 64);
    engram_history h;
    engram_history_reset(&h);
    static uint32_t rows[64 * 48];
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(m), &h, tokens, NULL, n, rows, &err), 0);
    for (size_t i = 0; i < n * 48; i++)
        CHECK(rows[i] < l.rows[(i % 48) / 24]);
    static float vals[64 * 24 * 256];
    uint32_t t1[64 * 24];
    for (size_t i = 0; i < n; i++)
        memcpy(t1 + i * 24, rows + i * 48 + 24, 24 * sizeof *t1);
    CHECK_EQ(engram_model_read_f32(m, 1, t1, n * 24, vals, &err), 0);
    engram_model_close(m);
    unlink(path);
    printf("full size: tables of %u and %u rows, table 1 at offset %llu\n", l.rows[0], l.rows[1],
           (unsigned long long)in.table[1].offset);
}

int main(void)
{
    static uint32_t map[VOCAB];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, VOCAB, CVOCAB, BASE), 0);
    validation(&l);
    /* the builder's refusals: NULL arguments, a bad version, fill or width */
    {
        engram_build_opts o;
        memset(&o, 0, sizeof o);
        o.layout = l;
        char bp[512];
        tu_path(bp, sizeof bp, "never.gguf");
        engram_error be;
        int brc = engram_build_model(NULL, &o, &be);
        CHECK_ERR(brc, be, -EINVAL, "NULL argument");
        brc = engram_build_model(bp, NULL, &be);
        CHECK_ERR(brc, be, -EINVAL, "NULL argument");
        o.gguf_version = 4;
        brc = engram_build_model(bp, &o, &be);
        CHECK_ERR(brc, be, -EINVAL, "bad build options");
        o.gguf_version = 3;
        o.fill = (engram_fill)99;
        brc = engram_build_model(bp, &o, &be);
        CHECK_ERR(brc, be, -EINVAL, "bad build options");
        o.fill = ENGRAM_FILL_ZERO;
        o.width = (1u << 20) + 1;
        brc = engram_build_model(bp, &o, &be);
        CHECK_ERR(brc, be, -EINVAL, "bad build options");
        o.width = 0;
        o.layout.token_map = NULL; /* an invalid layout */
        brc = engram_build_model(bp, &o, &be);
        CHECK_ERR(brc, be, -EINVAL, "no token map");
        CHECK(access(bp, F_OK) != 0);
    }
    engram_layout nomap = l;
    nomap.token_map = NULL;
    engram_error e;
    int rc = engram_layout_validate(&nomap, &e);
    CHECK_ERR(rc, e, -EINVAL, "no token map");
    placement(&l);
    reads(&l);
    sparse_fill(&l);
    full_size();
    tu_cleanup();
    return tu_finish("test_model");
}
