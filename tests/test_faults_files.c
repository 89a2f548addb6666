/*
 * test_faults_files.c - model files and the objects made from them under
 * faults (faults.h): every allocation and every pread of a model open, a
 * GGUF string across the reader's read window with each read failed, every
 * allocation of the hasher, the row cache and the GGUF writer, and every
 * allocation and every pwrite of a model build for each filler.
 * TF_ONLY=TEXT runs the scenarios whose names hold TEXT.
 */
#include <dirent.h>
#include <sys/stat.h>

#include "../src/format/gguf.h"
#include "../src/io/rowcache.h"
#include "../src/common/util.h"
#include "faults.h"

/* A model open, or a GGUF open, that must fail whenever a call fails. */
struct open_ctx {
    const char *path;
    engram_model *m;
    gguf_file *g;
    int gguf;
    uint64_t fail_offset; /* counts failures whose error names this offset */
    long at_offset;
};

static int open_run(void *vc, engram_error *err)
{
    struct open_ctx *c = vc;
    c->m = NULL;
    c->g = NULL;
    int rc = c->gguf ? gguf_open(c->path, &c->g, err) : engram_model_open(c->path, &c->m, err);
    if (rc < 0) {
        CHECK(c->m == NULL && c->g == NULL);
        c->at_offset += err->offset == c->fail_offset;
    }
    return rc;
}

static void open_done(void *vc, int faulted)
{
    struct open_ctx *c = vc;
    CHECK(!faulted); /* no fallback: a failed call must fail the open */
    engram_model_close(c->m);
    gguf_close(c->g);
}

/* A model open (the GGUF reader's header, keys, strings and tensor infos,
 * the layout, the token map, the checks) with every allocation, then every
 * pread, failed in turn: -ENOMEM / -EIO, nothing returned, no descriptor
 * left open; then the decoding reads' one buffer. */
static void model_open_faults(const char *path)
{
    int fds0 = open_fds();
    struct open_ctx c = {.path = path};
    struct op op = {open_run, open_done, &c};
    long allocs = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
    long reads = fails_in_turn(&op, &preads, -EIO, "", NULL);
    CHECK(allocs > 5 && reads > 2);
    CHECK_EQ(open_fds(), fds0);
    printf("model open: each of %ld allocations failed in turn: -ENOMEM; each of %ld reads: -EIO\n",
           allocs, reads);
    engram_error err;
    engram_model *m = NULL;
    /* the decoding reads' one temporary buffer: -ENOMEM, output untouched */
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    uint32_t rows[2] = {0, 1};
    uint16_t out[2 * 256];
    memset(out, 0x5a, sizeof out);
    lib_alloc = (struct fail_plan){0, 1, 1};
    int rc = engram_model_read_bf16(m, 0, rows, 2, out, &err);
    lib_alloc.armed = 0;
    CHECK_ERR(rc, err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(((uint8_t *)out)[i] == 0x5a);
    CHECK_EQ(engram_model_read_bf16(m, 0, rows, 2, out, &err), 0);
    engram_model_close(m);
}

/* A GGUF string that crosses the reader's 1 MiB read window: a file of one
 * 1.5 MiB string value, opened with each of its reads failed in turn; the
 * read inside the string fails the open with -EIO naming its offset. */
static void long_string_faults(void)
{
    char path[512];
    tu_path(path, sizeof path, "longstr.gguf");
    const uint64_t n = 3u << 19;
    unsigned char head[4 + 4 + 8 + 8 + 8 + 3 + 4 + 8];
    unsigned char *p = head;
    uint32_t version = 3, type = 8; /* a string value */
    uint64_t tensors = 0, kvs = 1, klen = 3;
    memcpy(p, "GGUF", 4), p += 4;
    memcpy(p, &version, 4), p += 4;
    memcpy(p, &tensors, 8), p += 8;
    memcpy(p, &kvs, 8), p += 8;
    memcpy(p, &klen, 8), p += 8;
    memcpy(p, "big", 3), p += 3;
    memcpy(p, &type, 4), p += 4;
    memcpy(p, &n, 8);
    char *str = malloc(n);
    memset(str, 'a', n);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(head, 1, sizeof head, f) == sizeof head && fwrite(str, 1, n, f) == n);
    if (f)
        fclose(f);
    free(str);
    struct open_ctx c = {.path = path, .gguf = 1, .fail_offset = 1u << 20};
    struct op op = {open_run, open_done, &c};
    long reads = fails_in_turn(&op, &preads, -EIO, "read failed", NULL);
    CHECK(reads >= 2);          /* the window, then the rest of the string */
    CHECK_EQ(c.at_offset, 1);   /* one failed read began inside the string */
    unlink(path);
    printf("long string: each of %ld reads failed in turn: -EIO\n", reads);
}

/* Files in the test directory whose names start with prefix. */
static int files_named(const char *prefix)
{
    char probe[512];
    tu_path(probe, sizeof probe, "x");
    probe[strlen(probe) - 1] = '\0'; /* the directory, with its '/' */
    DIR *d = opendir(probe);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* A model build that must leave neither the file nor a temporary one when
 * it fails (all or nothing). */
struct build_ctx {
    const char *path;
    engram_build_opts o;
};

static int build_run(void *vc, engram_error *err)
{
    struct build_ctx *c = vc;
    int rc = engram_build_model(c->path, &c->o, err);
    if (rc < 0)
        CHECK_EQ(files_named("bfault"), 0);
    return rc;
}

static void build_done(void *vc, int faulted)
{
    struct build_ctx *c = vc;
    CHECK(!faulted);
    CHECK_EQ(unlink(c->path), 0);
}

/* engram_build_model with every allocation, then every pwrite, failed in
 * turn, for each way of filling the tables: -ENOMEM / -EIO, no file left. */
static void build_faults(void)
{
    /* small tables (24 x ~300 rows each): a build is ~4 MB of writes */
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 300), 0);
    static const engram_fill fills[] = {ENGRAM_FILL_RANDOM, ENGRAM_FILL_POOL, ENGRAM_FILL_SPARSE,
                                        ENGRAM_FILL_NORMAL};
    static const char *const names[] = {"random", "pool", "sparse", "normal"};
    char path[512];
    tu_path(path, sizeof path, "bfault.gguf");
    for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
        struct build_ctx c = {.path = path, .o = {.layout = l, .fill = fills[i], .width = 16, .seed = 3}};
        struct op op = {build_run, build_done, &c};
        long allocs = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
        long writes = fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL);
        pwrite_zero = 1; /* a write that writes nothing: -EIO, not a loop */
        CHECK_EQ(fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL), writes);
        pwrite_zero = 0;
        CHECK(allocs > 3 && writes > 3);
        printf("model build (%s tables): each of %ld allocations failed in turn: -ENOMEM; "
               "each of %ld writes failed, or wrote nothing: -EIO; no file left\n", names[i], allocs, writes);
    }
}

/* engram_build_ple_model the same way, its table drawn and a hole. */
struct ple_build_ctx {
    const char *path;
    engram_ple_build_opts o;
};

static int ple_build_run(void *vc, engram_error *err)
{
    struct ple_build_ctx *c = vc;
    int rc = engram_build_ple_model(c->path, &c->o, err);
    if (rc < 0)
        CHECK_EQ(files_named("bfault"), 0);
    return rc;
}

static void ple_build_faults(void)
{
    char path[512];
    tu_path(path, sizeof path, "bfault_ple.gguf");
    static const engram_fill fills[] = {ENGRAM_FILL_NORMAL, ENGRAM_FILL_ZERO};
    for (size_t i = 0; i < 2; i++) {
        /* 16 heads of ~3000 rows, W = 16: ~16 MB of table, 0.4 MB of weights */
        struct ple_build_ctx c = {.path = path, .o = {.base = 3000, .width = 16, .fill = fills[i], .seed = 3}};
        struct op op = {ple_build_run, build_done, &c};
        long allocs = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
        long writes = fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL);
        pwrite_zero = 1;
        CHECK_EQ(fails_in_turn(&op, &pwrites, -EIO, "I/O error", NULL), writes);
        pwrite_zero = 0;
        CHECK(allocs > 3 && writes > 3);
        printf("qwen4exp build (%s table): each of %ld allocations failed in turn: -ENOMEM; "
               "each of %ld writes failed, or wrote nothing: -EIO; no file left\n",
               i ? "a hole" : "normal", allocs, writes);
    }
}

/* A hasher, a row cache: no fallback, every failed allocation -ENOMEM. */
struct small_ctx {
    const engram_layout *l;
    engram_hasher *h;
    struct rowcache *c;
    int cache;
};

static int small_run(void *vc, engram_error *err)
{
    struct small_ctx *c = vc;
    c->h = NULL;
    c->c = NULL;
    if (!c->cache)
        return engram_hasher_new(c->l, &c->h, err);
    int rc = rowcache_new(1u << 20, &c->c);
    if (rc < 0)
        err_set(err, rc, ENGRAM_NO_OFFSET, "out of memory");
    return rc;
}

static void small_done(void *vc, int faulted)
{
    struct small_ctx *c = vc;
    CHECK(!faulted);
    engram_hasher_free(c->h);
    rowcache_free(c->c);
}

/* The GGUF writer: metadata, tensors and the file, with every allocation
 * failed in turn.  The call whose allocation failed returns -ENOMEM (the
 * others 0: the writer records the failure), and the write then refuses:
 * -ENOMEM, the file empty. */
static void writer_adds(gguf_writer *w, long fail_at, int *wrong)
{
    static const char *const strs[3] = {"x", "yy", "zzz"};
    static uint32_t arr[3000];
    uint64_t dims[2] = {64, 4};
    for (int i = 0; i < 8; i++) {
        char key[32];
        snprintf(key, sizeof key, "key.%d", i);
        long before = lib_alloc.calls;
        int rc;
        switch (i % 4) {
        case 0: rc = gguf_w_str(w, key, "a value"); break;
        case 1: rc = gguf_w_array(w, key, GGUF_U32, arr, 3000); break;
        case 2: rc = gguf_w_array_str(w, key, strs, 3); break;
        default: rc = gguf_w_tensor(w, key, GGML_F32, 2, dims, 0, NULL, NULL); break;
        }
        int here = before < fail_at && lib_alloc.calls >= fail_at;
        *wrong += rc != (here ? -ENOMEM : 0);
    }
}

static void writer_faults(void)
{
    char path[512];
    tu_path(path, sizeof path, "wfault.gguf");
    long total = 0, refused = 0;
    for (long k = 0; k == 0 || k <= total; k++) {
        int wrong = 0;
        lib_alloc = (struct fail_plan){0, k, 1}; /* k = 0: counts only */
        gguf_writer *w = gguf_writer_new(3, 32);
        if (w)
            writer_adds(w, k, &wrong);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        engram_error err;
        int rc = w ? gguf_w_write_fd(w, fd, &err) : -ENOMEM;
        lib_alloc.armed = 0;
        struct stat st;
        CHECK_EQ(fstat(fd, &st), 0);
        close(fd);
        gguf_writer_free(w);
        CHECK_EQ(wrong, 0);
        if (k == 0) {
            total = lib_alloc.calls;
            CHECK_EQ(rc, 0);
            CHECK(st.st_size > 0);
            continue;
        }
        if (w)
            CHECK_ERR(rc, err, -ENOMEM, "out of memory");
        CHECK_EQ(rc, -ENOMEM);
        CHECK_EQ(st.st_size, 0);
        refused++;
    }
    unlink(path);
    CHECK(total > 5);
    printf("GGUF writer: each of %ld allocations failed in turn: -ENOMEM, nothing written\n", refused);
}

static void small_faults(const engram_layout *l)
{
    for (int cache = 0; cache < 2; cache++) {
        struct small_ctx c = {.l = l, .cache = cache};
        struct op op = {small_run, small_done, &c};
        long n = fails_in_turn(&op, &lib_alloc, -ENOMEM, "out of memory", NULL);
        CHECK(n >= 2);
        printf("%s: each of %ld allocations failed in turn: -ENOMEM\n",
               cache ? "row cache" : "hasher", n);
    }
    writer_faults();
}

int main(void)
{
    static uint32_t map[3000];
    engram_layout l;
    char path[512];
    faults_model(&l, map, path, sizeof path);

    SCENARIO("model open: every allocation", model_open_faults(path));
    SCENARIO("model open: a long string", long_string_faults());
    SCENARIO("hasher, cache, writer", small_faults(&l));
    SCENARIO("model build: every alloc/write", build_faults());
    SCENARIO("qwen4exp build: every alloc/write", ple_build_faults());

    tu_cleanup();
    return tu_finish("test_faults_files");
}
