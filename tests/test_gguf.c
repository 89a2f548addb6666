/*
 * test_gguf.c - the GGUF reader on good files (v2, v3, every value type,
 * string arrays, other alignments) and on hostile ones: every truncation of
 * a small file, targeted corruption of each header field, and random byte
 * mutations.  Hostile files must fail cleanly with a message, never crash
 * (this test also runs under ASan+UBSan).
 */
#include "format/gguf.h"
#include "testutil.h"

static const char *tokens_arr[] = {"<pad>", "hello", "", "w\xc3\xb6rld"};

static int write_sample(const char *path, uint32_t version, uint32_t alignment)
{
    gguf_writer *w = gguf_writer_new(version, alignment);
    if (!w)
        return -1;
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    int32_t i32 = -2000000000;
    float f32 = 1.5f;
    uint8_t b = 1;
    int64_t i64 = INT64_MIN;
    double f64 = -2.25;
    gguf_w_str(w, "general.architecture", "test");
    if (alignment != GGUF_DEFAULT_ALIGNMENT)
        gguf_w_u32(w, "general.alignment", alignment);
    gguf_w_scalar(w, "t.u8", GGUF_U8, &u8);
    gguf_w_scalar(w, "t.i8", GGUF_I8, &i8);
    gguf_w_scalar(w, "t.u16", GGUF_U16, &u16);
    gguf_w_scalar(w, "t.i16", GGUF_I16, &i16);
    gguf_w_u32(w, "t.u32", 4000000000u);
    gguf_w_scalar(w, "t.i32", GGUF_I32, &i32);
    gguf_w_scalar(w, "t.f32", GGUF_F32, &f32);
    gguf_w_scalar(w, "t.bool", GGUF_BOOL, &b);
    gguf_w_u64(w, "t.u64", UINT64_MAX);
    gguf_w_scalar(w, "t.i64", GGUF_I64, &i64);
    gguf_w_scalar(w, "t.f64", GGUF_F64, &f64);
    uint32_t arr[5] = {1, 2, 3, 4, 5};
    gguf_w_array(w, "t.arr", GGUF_U32, arr, 5);
    gguf_w_array_str(w, "t.strs", tokens_arr, 4);
    uint64_t d0[2] = {8, 2}, d1[1] = {64}, d2[3] = {256, 1, 2};
    gguf_w_tensor(w, "t0", GGML_F32, 2, d0, 0, NULL, NULL);
    gguf_w_tensor(w, "t1", GGML_Q8_0, 1, d1, 0, NULL, NULL);
    gguf_w_tensor(w, "t2", GGML_Q3_K, 3, d2, 4096, NULL, NULL);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = gguf_w_write_fd(w, fd, NULL);
    close(fd);
    gguf_writer_free(w);
    return rc;
}

static void round_trip(uint32_t version, uint32_t alignment)
{
    char path[512];
    tu_path(path, sizeof path, "sample.gguf");
    CHECK_EQ(write_sample(path, version, alignment), 0);
    gguf_file *g = NULL;
    engram_error err;
    CHECK_EQ(gguf_open(path, &g, &err), 0);
    if (!g)
        return;
    CHECK_EQ(g->version, version);
    CHECK_EQ(g->alignment, alignment);
    CHECK_EQ(g->n_tensors, 3);
    const gguf_kv *kv;
    CHECK((kv = gguf_find_kv(g, "t.u8")) && kv->type == GGUF_U8 && kv->u == 200);
    CHECK((kv = gguf_find_kv(g, "t.i8")) && kv->i == -100);
    CHECK((kv = gguf_find_kv(g, "t.u16")) && kv->u == 65000);
    CHECK((kv = gguf_find_kv(g, "t.i16")) && kv->i == -32000);
    CHECK((kv = gguf_find_kv(g, "t.u32")) && kv->u == 4000000000u);
    CHECK((kv = gguf_find_kv(g, "t.i32")) && kv->i == -2000000000);
    CHECK((kv = gguf_find_kv(g, "t.f32")) && kv->f == 1.5);
    CHECK((kv = gguf_find_kv(g, "t.bool")) && kv->u == 1);
    CHECK((kv = gguf_find_kv(g, "t.u64")) && kv->u == UINT64_MAX);
    CHECK((kv = gguf_find_kv(g, "t.i64")) && kv->i == INT64_MIN);
    CHECK((kv = gguf_find_kv(g, "t.f64")) && kv->f == -2.25);
    CHECK((kv = gguf_find_kv(g, "general.architecture")) && !strcmp(kv->str, "test"));
    kv = gguf_find_kv(g, "t.arr");
    uint32_t arr[5] = {0};
    CHECK(kv && gguf_read_array(g, kv, GGUF_U32, 5, arr, &err) == 0 && arr[4] == 5);
    CHECK(kv && gguf_read_array(g, kv, GGUF_U32, 4, arr, &err) == -EBADMSG);
    kv = gguf_find_kv(g, "t.strs");
    CHECK(kv && kv->arr_type == GGUF_STRING && kv->arr_count == 4);
    const gguf_tensor *t2 = gguf_find_tensor(g, "t2");
    CHECK(t2 && t2->offset % 4096 == 0 && t2->bytes == 110 * 2 && t2->dims[2] == 2);
    const gguf_tensor *t1 = gguf_find_tensor(g, "t1");
    CHECK(t1 && t1->bytes == 68 && t1->offset % alignment == 0);
    CHECK(gguf_find_tensor(g, "nope") == NULL);
    gguf_close(g);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void copy_file(const char *from, const char *to, uint64_t len)
{
    int a = open(from, O_RDONLY | O_CLOEXEC), b = open(to, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint8_t *buf = malloc(len ? len : 1);
    CHECK_EQ(pread(a, buf, len, 0), (ssize_t)len);
    CHECK_EQ(pwrite(b, buf, len, 0), (ssize_t)len);
    free(buf);
    close(a);
    close(b);
}

/* The reads a GGUF v3 reader makes of write_sample(3, 32)'s file, from the
 * format alone (as the writer was called above, not from the reader): a
 * file cut inside one of them must be refused naming exactly that read,
 * "needs N bytes at offset P".  Plus the reader's two documented
 * shortcuts: key and tensor counts that cannot fit in the file, and a
 * string array whose count cannot fit (8 bytes per string at least). */
struct field {
    uint64_t at, n;
};
static struct field fields[128], str_counts;
static int n_fields;
static uint64_t walk_at;

static void fld(uint64_t n)
{
    if (n > 0 && n_fields < 128)
        fields[n_fields++] = (struct field){walk_at, n};
    walk_at += n;
}

static void fstr(const char *s)
{
    fld(8);
    fld(strlen(s));
}

static void kv_scalar(const char *key, uint64_t size)
{
    fstr(key);
    fld(4);
    fld(size);
}

static uint64_t walk_sample(uint64_t *t0_info)
{
    n_fields = 0;
    walk_at = 0;
    fld(4); /* magic */
    fld(4); /* version */
    fld(8); /* tensors */
    fld(8); /* keys */
    fstr("general.architecture");
    fld(4);
    fstr("test");
    const char *keys[11] = {"t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32",
                            "t.f32", "t.bool", "t.u64", "t.i64", "t.f64"};
    const uint64_t sizes[11] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    for (int i = 0; i < 11; i++)
        kv_scalar(keys[i], sizes[i]);
    fstr("t.arr");
    fld(4); /* type: array */
    fld(4); /* element type */
    fld(8); /* count */
    fld(5 * 4);
    fstr("t.strs");
    fld(4);
    fld(4);
    fld(8);
    str_counts = (struct field){walk_at, 4 * 8};
    for (int i = 0; i < 4; i++)
        fstr(tokens_arr[i]);
    const char *names[3] = {"t0", "t1", "t2"};
    const int dims[3] = {2, 1, 3};
    for (int t = 0; t < 3; t++) {
        if (t == 0)
            *t0_info = walk_at;
        fstr(names[t]);
        fld(4); /* n_dims */
        for (int d = 0; d < dims[t]; d++)
            fld(8);
        fld(4); /* type */
        fld(8); /* offset */
    }
    return walk_at;
}

static void every_truncation(const char *good)
{
    char path[512];
    tu_path(path, sizeof path, "trunc.gguf");
    uint64_t size = file_size(good);
    uint64_t t0_info = 0, infos_end = walk_sample(&t0_info);
    /* the walk agrees with the reader on the good file */
    gguf_file *g0 = NULL;
    CHECK_EQ(gguf_open(good, &g0, NULL), 0);
    if (g0) {
        CHECK_EQ(g0->n_kv, 14);
        CHECK_EQ(g0->tensors[0].info_offset, t0_info);
        CHECK(g0->data_start >= infos_end && g0->data_start < infos_end + 32);
        gguf_close(g0);
    }
    const uint64_t counts_fit = 14 * 12 > 3 * 28 ? 14 * 12 : 3 * 28;
    int failures_ok = 0, exact = 0, named = 0;
    for (uint64_t len = 0; len < size; len++) {
        copy_file(good, path, len);
        gguf_file *g = NULL;
        engram_error err = {0};
        int rc = gguf_open(path, &g, &err);
        failures_ok += rc == -EBADMSG && g == NULL && err.msg[0] != '\0';
        if (len >= infos_end)
            continue; /* cut in the tensor data: refused by other checks */
        named++;
        char want[96];
        if (len >= 24 && len < counts_fit) {
            snprintf(want, sizeof want, "cannot fit in %llu bytes", (unsigned long long)len);
        } else {
            struct field f = {0, 0};
            if (len >= str_counts.at && len < str_counts.at + str_counts.n)
                f = str_counts;
            else
                for (int i = 0; i < n_fields; i++)
                    if (fields[i].at <= len && len < fields[i].at + fields[i].n)
                        f = fields[i];
            snprintf(want, sizeof want, "needs %llu bytes at offset %llu", (unsigned long long)f.n,
                     (unsigned long long)f.at);
        }
        if (strstr(err.msg, want))
            exact++;
        else
            fprintf(stderr, "cut at %llu: '%s' (wanted '%s')\n", (unsigned long long)len,
                    err.msg, want);
    }
    CHECK_EQ(failures_ok, size);
    CHECK_EQ(exact, named);
    printf("truncation: all %llu truncated files rejected; the %d cut in the header, keys or "
           "tensor infos name the read that was cut (offset and size, from the format)\n",
           (unsigned long long)size, named);
}

static void patch(const char *path, uint64_t off, const void *bytes, size_t n)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK_EQ(pwrite(fd, bytes, n, (off_t)off), (ssize_t)n);
    close(fd);
}

static void expect_fail(const char *good, uint64_t off, const void *bytes, size_t n, int want,
                        const char *needle)
{
    char path[512];
    tu_path(path, sizeof path, "corrupt.gguf");
    copy_file(good, path, file_size(good));
    patch(path, off, bytes, n);
    gguf_file *g = (gguf_file *)0x1;
    engram_error err = {0};
    int rc = gguf_open(path, &g, &err);
    if (rc != want || !strstr(err.msg, needle))
        fprintf(stderr, "corruption at %llu: rc %d '%s' (wanted '%s')\n", (unsigned long long)off,
                rc, err.msg, needle);
    CHECK_ERR(rc, err, want, needle);
    CHECK(g == (gguf_file *)0x1);
}

static void corruption(const char *good)
{
    gguf_file *g;
    CHECK_EQ(gguf_open(good, &g, NULL), 0);
    const gguf_kv *u32 = gguf_find_kv(g, "t.u32"), *bo = gguf_find_kv(g, "t.bool"),
                  *arr = gguf_find_kv(g, "t.arr"), *str = gguf_find_kv(g, "general.architecture");
    const gguf_tensor *t0 = gguf_find_tensor(g, "t0"), *t1 = gguf_find_tensor(g, "t1");
    uint64_t t0_info = t0->info_offset, t1_info = t1->info_offset; /* names are 2 bytes */
    uint64_t t0_ndims = t0_info + 8 + 2, t0_dims = t0_ndims + 4, t0_type = t0_dims + 16,
             t0_off = t0_type + 4;
    uint64_t t1_ndims = t1_info + 8 + 2, t1_dims = t1_ndims + 4, t1_type = t1_dims + 8,
             t1_off = t1_type + 4;
    uint64_t t0_rel = t0->offset - g->data_start, data_start = g->data_start;
    uint64_t u32_key = u32->key_offset, u32_type = u32->value_offset - 4;
    uint64_t bool_val = bo->value_offset, arr_type = arr->value_offset - 12,
             arr_count = arr->value_offset - 8, str_len = str->value_offset;
    gguf_close(g);

    uint32_t v32;
    uint64_t v64;
    expect_fail(good, 0, "GGUX", 4, -EBADMSG, "not a GGUF");
    v32 = 1;
    expect_fail(good, 4, &v32, 4, -ENOTSUP, "version 1");
    v32 = 0x03000000;
    expect_fail(good, 4, &v32, 4, -ENOTSUP, "big-endian");
    v64 = 1ull << 40;
    expect_fail(good, 8, &v64, 8, -EBADMSG, "exceed the limit");
    v64 = 100000;
    expect_fail(good, 16, &v64, 8, -EBADMSG, "cannot fit");
    v64 = 1ull << 63;
    expect_fail(good, u32_key, &v64, 8, -EBADMSG, "string length");
    v64 = 70000;
    expect_fail(good, u32_key, &v64, 8, -EBADMSG, "exceeds 65535");
    v64 = 0;
    expect_fail(good, u32_key, &v64, 8, -EBADMSG, "empty key");
    v32 = 13;
    expect_fail(good, u32_type, &v32, 4, -EBADMSG, "unknown value type 13");
    uint8_t two = 2;
    expect_fail(good, bool_val, &two, 1, -EBADMSG, "bool value 2");
    v32 = GGUF_ARRAY;
    expect_fail(good, arr_type, &v32, 4, -EBADMSG, "element type 9");
    v64 = 1ull << 62;
    expect_fail(good, arr_count, &v64, 8, -EBADMSG, "t.arr");
    v64 = 1ull << 40;
    expect_fail(good, str_len, &v64, 8, -EBADMSG, "general.architecture");
    uint8_t nul = 0;
    expect_fail(good, str_len + 9, &nul, 1, -EBADMSG, "NUL");
    v32 = 0;
    expect_fail(good, t0_ndims, &v32, 4, -EBADMSG, "0 dimensions");
    v32 = 5;
    expect_fail(good, t0_ndims, &v32, 4, -EBADMSG, "5 dimensions");
    v64 = 0;
    expect_fail(good, t0_dims, &v64, 8, -EBADMSG, "dimension 0 is 0");
    uint64_t huge[2] = {1ull << 62, 1ull << 62};
    expect_fail(good, t0_dims, huge, 16, -EBADMSG, "overflows");
    v32 = 99;
    expect_fail(good, t0_type, &v32, 4, -EBADMSG, "unknown type 99");
    v32 = 4; /* an id ggml removed */
    expect_fail(good, t0_type, &v32, 4, -EBADMSG, "unknown type 4");
    v64 = 33;
    expect_fail(good, t1_dims, &v64, 8, -EBADMSG, "does not fit type Q8_0");
    v64 = t0_rel + 1;
    expect_fail(good, t0_off, &v64, 8, -EBADMSG, "not a multiple of the alignment");
    v64 = 1ull << 50;
    expect_fail(good, t0_off, &v64, 8, -EBADMSG, "outside the file");
    v64 = UINT64_MAX - 31;
    expect_fail(good, t0_off, &v64, 8, -EBADMSG, "outside the file");
    v64 = t0_rel;
    expect_fail(good, t1_off, &v64, 8, -EBADMSG, "overlaps");
    expect_fail(good, t1_info + 8, "t0", 2, -EBADMSG, "duplicate tensor 't0'");
    expect_fail(good, u32_key + 8, "t.u64", 5, -EBADMSG, "duplicate key 't.u64'");
    (void)data_start;
}

static void alignment_key(void)
{
    char path[512];
    tu_path(path, sizeof path, "align.gguf");
    uint32_t bad[] = {0, 3, 48};
    for (int k = 0; k < 3; k++) {
        gguf_writer *w = gguf_writer_new(3, 32);
        gguf_w_u32(w, "general.alignment", bad[k]);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        CHECK_EQ(gguf_w_write_fd(w, fd, NULL), 0);
        close(fd);
        gguf_writer_free(w);
        gguf_file *g = NULL;
        engram_error err;
        CHECK_ERR(gguf_open(path, &g, &err), err, -EBADMSG, "general.alignment");
    }
    gguf_writer *w = gguf_writer_new(3, 32);
    gguf_w_u64(w, "general.alignment", 64);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK_EQ(gguf_w_write_fd(w, fd, NULL), 0);
    close(fd);
    gguf_writer_free(w);
    gguf_file *g = NULL;
    engram_error err;
    CHECK_ERR(gguf_open(path, &g, &err), err, -EBADMSG, "u32 power of two");
    CHECK(gguf_writer_new(4, 32) == NULL && gguf_writer_new(3, 24) == NULL);
}

static void not_regular(void)
{
    gguf_file *g = NULL;
    engram_error err;
    CHECK_ERR(gguf_open(tu_tmpdir(), &g, &err), err, -EBADMSG, "not a regular file");
    char path[512];
    tu_path(path, sizeof path, "missing.gguf");
    CHECK_ERR(gguf_open(path, &g, &err), err, -ENOENT, "cannot open");
}

/* Random mutations: whatever happens, no crash, and a success is coherent. */
static void mutations(const char *good)
{
    char path[512];
    tu_path(path, sizeof path, "mut.gguf");
    uint64_t size = file_size(good);
    uint8_t *orig = malloc(size), *buf = malloc(size);
    int fd = open(good, O_RDONLY | O_CLOEXEC);
    CHECK_EQ(pread(fd, orig, size, 0), (ssize_t)size);
    close(fd);
    uint64_t seed = 1234;
    int opened = 0, rejected = 0;
    /* Mutate the header region, where parsing happens. */
    uint64_t header = 700 < size ? 700 : size;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, orig, size);
        int flips = 1 + (int)(tu_rand(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            uint64_t at = tu_rand(&seed) % header;
            buf[at] = (uint8_t)(tu_rand(&seed) % 3 == 0 ? 0xff : tu_rand(&seed));
        }
        int w = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        CHECK_EQ(pwrite(w, buf, size, 0), (ssize_t)size);
        close(w);
        gguf_file *g = NULL;
        engram_error err = {0};
        int rc = gguf_open(path, &g, &err);
        if (rc == 0) {
            opened++;
            for (uint64_t i = 0; i < g->n_tensors; i++)
                CHECK(g->tensors[i].offset + g->tensors[i].bytes <= g->size);
            gguf_close(g);
        } else {
            rejected++;
            CHECK(err.msg[0] != '\0');
        }
    }
    printf("mutations: %d opened coherently, %d rejected with a message\n", opened, rejected);
    free(orig);
    free(buf);
}

/* The metadata budget (GGUF_MAX_META_BYTES, 64 MiB of keys, strings and
 * infos held in memory), reached two ways by files built byte by byte
 * here: counts whose bookkeeping alone is over it, and strings that add up
 * to more.  Sparse where the parser does not read. */
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void meta_budget(void)
{
    char path[512];
    tu_path(path, sizeof path, "budget.gguf");
    /* 2^20 keys and 2^20 tensors: plausible for a 29 MiB file (12 and 28
     * bytes each at least), but their records exceed the budget. */
    uint8_t h[24];
    memcpy(h, "GGUF", 4);
    put_u32(h + 4, 3);
    put_u64(h + 8, GGUF_MAX_ITEMS);
    put_u64(h + 16, GGUF_MAX_ITEMS);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK_EQ(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    CHECK_EQ(ftruncate(fd, (off_t)GGUF_MAX_ITEMS * 28 + 64), 0);
    close(fd);
    CHECK((uint64_t)GGUF_MAX_ITEMS * (sizeof(gguf_kv) + sizeof(gguf_tensor)) > GGUF_MAX_META_BYTES);
    gguf_file *g = (gguf_file *)0x1;
    engram_error err = {0};
    int rc = gguf_open(path, &g, &err);
    CHECK_ERR(rc, err, -EBADMSG, "metadata exceeds the 64 MiB limit");
    CHECK(g == (gguf_file *)0x1);
    /* Two string values of 40 MiB: the first ('x' throughout) is loaded,
     * the second would take the total past the budget; refused before it
     * is read (its bytes, zeros, would be refused otherwise: a NUL). */
    const uint64_t big = 40ull << 20;
    uint8_t kv[8 + 1 + 4 + 8];
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    memcpy(h, "GGUF", 4);
    put_u32(h + 4, 3);
    put_u64(h + 8, 0);
    put_u64(h + 16, 2);
    CHECK_EQ(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    uint64_t at = sizeof h;
    char *x = malloc(big);
    memset(x, 'x', big);
    for (int i = 0; i < 2; i++) {
        put_u64(kv, 1);
        kv[8] = (uint8_t)('a' + i);
        put_u32(kv + 9, GGUF_STRING);
        put_u64(kv + 13, big);
        CHECK_EQ(pwrite(fd, kv, sizeof kv, (off_t)at), (ssize_t)sizeof kv);
        at += sizeof kv;
        if (i == 0)
            CHECK_EQ(pwrite(fd, x, big, (off_t)at), (ssize_t)big);
        at += big;
    }
    CHECK_EQ(ftruncate(fd, (off_t)at), 0);
    close(fd);
    free(x);
    g = (gguf_file *)0x1;
    rc = gguf_open(path, &g, &err);
    CHECK_ERR(rc, err, -EBADMSG, "metadata exceeds the 64 MiB limit");
    CHECK(strstr(err.msg, "key 'b'") || strstr(err.msg, "b at offset"));
    CHECK(g == (gguf_file *)0x1);
    unlink(path);
    printf("metadata budget: 2^20 keys + 2^20 tensors refused; a 40 MiB string after another refused\n");
}

/* The writer refuses what it cannot lay out (a new writer of an unknown
 * version or alignment, a scalar or array element type without a fixed
 * size, a tensor of an unknown type or a non-power-of-two alignment) and
 * records nothing for a refused call: the file written after them holds
 * exactly the accepted keys and tensors, and reads back. */
static void writer_refusals(void)
{
    CHECK(gguf_writer_new(1, 32) == NULL);
    CHECK(gguf_writer_new(4, 32) == NULL);
    CHECK(gguf_writer_new(3, 0) == NULL);
    CHECK(gguf_writer_new(3, 48) == NULL);
    gguf_writer *w = gguf_writer_new(3, 32);
    CHECK(w != NULL);
    if (!w)
        return;
    uint64_t v = 7;
    uint32_t arr[2] = {1, 2};
    uint64_t dims[2] = {32, 2};
    CHECK_EQ(gguf_w_u32(w, "a", 1), 0);
    CHECK_EQ(gguf_w_scalar(w, "bad.string", GGUF_STRING, &v), -EINVAL);
    CHECK_EQ(gguf_w_scalar(w, "bad.array", GGUF_ARRAY, &v), -EINVAL);
    CHECK_EQ(gguf_w_scalar(w, "bad.type", GGUF_NTYPES, &v), -EINVAL);
    CHECK_EQ(gguf_w_array(w, "bad.arr", GGUF_STRING, arr, 2), -EINVAL);
    CHECK_EQ(gguf_w_array(w, "bad.arr2", GGUF_NTYPES + 3, arr, 2), -EINVAL);
    CHECK_EQ(gguf_w_array(w, "b", GGUF_U32, arr, 2), 0);
    CHECK_EQ(gguf_w_tensor(w, "bad.type", 9999, 2, dims, 0, NULL, NULL), -EINVAL);
    CHECK_EQ(gguf_w_tensor(w, "bad.align", GGML_F32, 2, dims, 48, NULL, NULL), -EINVAL);
    CHECK_EQ(gguf_w_tensor(w, "t", GGML_F32, 2, dims, 0, NULL, NULL), 0);
    char path[512];
    tu_path(path, sizeof path, "refusals.gguf");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    engram_error err;
    CHECK_EQ(gguf_w_write_fd(w, fd, &err), 0);
    close(fd);
    gguf_writer_free(w);
    gguf_file *g = NULL;
    CHECK_EQ(gguf_open(path, &g, &err), 0);
    if (!g)
        return;
    CHECK_EQ(g->n_kv, 2);
    CHECK_EQ(g->n_tensors, 1);
    const gguf_kv *a = gguf_find_kv(g, "a"), *b = gguf_find_kv(g, "b");
    CHECK(a && a->type == GGUF_U32 && a->u == 1);
    CHECK(b && b->type == GGUF_ARRAY && b->arr_count == 2);
    CHECK(gguf_find_tensor(g, "t") != NULL);
    gguf_close(g);
    unlink(path);
}

int main(void)
{
    round_trip(3, 32);
    writer_refusals();
    round_trip(2, 32);
    round_trip(3, 64);
    char good[512];
    tu_path(good, sizeof good, "good.gguf");
    CHECK_EQ(write_sample(good, 3, 32), 0);
    /* Keep the sample small for the truncation sweep: drop t2's 4096 alignment. */
    every_truncation(good);
    corruption(good);
    alignment_key();
    not_regular();
    mutations(good);
    meta_budget();
    /* tensor sizes: unknown types, no or too many dimensions, a partial
     * block, a product that overflows 64 bits */
    uint64_t by = 0, d[GGUF_MAX_DIMS + 1] = {8, 2, 1, 1, 1};
    CHECK_EQ(ggml_tensor_bytes(GGML_F32, 2, d, &by), 0);
    CHECK_EQ(by, 64);
    CHECK_EQ(ggml_tensor_bytes(9999, 2, d, &by), -1);
    CHECK_EQ(ggml_tensor_bytes(GGML_F32, 0, d, &by), -1);
    CHECK_EQ(ggml_tensor_bytes(GGML_F32, GGUF_MAX_DIMS + 1, d, &by), -1);
    uint64_t q[1] = {33}, big[2] = {1ull << 40, 1ull << 40}, big1[1] = {1ull << 62};
    CHECK_EQ(ggml_tensor_bytes(GGML_Q8_0, 1, q, &by), -1);
    CHECK_EQ(ggml_tensor_bytes(GGML_F32, 2, big, &by), -1);
    CHECK_EQ(ggml_tensor_bytes(GGML_F32, 1, big1, &by), -1);
    CHECK_EQ(by, 64); /* untouched by the refusals */
    tu_cleanup();
    return tu_finish("test_gguf");
}
