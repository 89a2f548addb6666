/*
 * test_parsers.c - the engram command's input parsers (programs/cli.c) on
 * hand-written inputs with known answers, every error branch included:
 * token and mask files (parse_numbers; numfile and read_numbers, which
 * stream a file through the same parser, against it), --history (parse_history: nothing
 * written on error) and .npy headers (npy_parse: each field, each version,
 * the size checks), and the device choice (programs/device.c).  The fuzz target tests/fuzz/fuzz_cli.c covers the same
 * functions on arbitrary bytes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../programs/cli.h"
#include "alloc_shim.h"
#include "testutil.h"

/* Allocation failures: the test is linked with --wrap=malloc,--wrap=realloc,
 * --wrap=calloc, and lib_alloc (tests/alloc_shim.h) fails the N-th call. */

static int nums(const char *text, size_t len, uint64_t max, const uint32_t *want, size_t nwant)
{
    uint32_t *v = NULL;
    size_t n = 0, bad = 999;
    int rc = parse_numbers(text, len, max, &v, &n, &bad);
    if (rc == 0) {
        CHECK_EQ(n, nwant);
        CHECK(n == nwant && (n == 0 || memcmp(v, want, n * 4) == 0));
        free(v);
        return 0;
    }
    CHECK(v == NULL);
    return rc == -EINVAL ? -(int)bad - 1 : rc; /* -(bad item + 1) */
}

static void numbers(void)
{
    const uint32_t a[] = {0, 7, 4294967295u};
    CHECK_EQ(nums("0 7\n4294967295\r\n", 16, UINT32_MAX, a, 3), 0);
    CHECK_EQ(nums("  \t\n", 4, UINT32_MAX, NULL, 0), 0); /* no items */
    CHECK_EQ(nums("", 0, UINT32_MAX, NULL, 0), 0);
    const uint32_t b[] = {1, 0, 1};
    CHECK_EQ(nums("1 0 1", 5, 1, b, 3), 0); /* a mask */
    CHECK_EQ(nums("1 2 1", 5, 1, NULL, 0), -2);           /* item 1 > max */
    CHECK_EQ(nums("5 4294967296", 12, UINT32_MAX, NULL, 0), -2); /* overflow */
    CHECK_EQ(nums("5 -1", 4, UINT32_MAX, NULL, 0), -2);    /* negative */
    CHECK_EQ(nums("+5", 2, UINT32_MAX, NULL, 0), -1);      /* sign */
    CHECK_EQ(nums("5 x7", 4, UINT32_MAX, NULL, 0), -2);    /* not a number */
    CHECK_EQ(nums("5 7x", 4, UINT32_MAX, NULL, 0), -2);    /* trailing text */
    CHECK_EQ(nums("5,7", 3, UINT32_MAX, NULL, 0), -1);     /* commas are not separators */
    CHECK_EQ(nums("5 7\0 9", 6, UINT32_MAX, NULL, 0), -2); /* a NUL is not an end */
    CHECK_EQ(nums("1 2 3 0000000000000000000000000000000001", 40, UINT32_MAX, NULL, 0), -4); /* too long */
    const uint32_t seven[] = {7};
    CHECK_EQ(nums("0000000000000000000000000000007", 31, UINT32_MAX, seven, 1), 0); /* 31 characters */
    CHECK_EQ(nums("00000000000000000000000000000007", 32, UINT32_MAX, NULL, 0), -1); /* 32: too long */
    /* 3000 items: the array grows */
    char *big = malloc(3000 * 6);
    uint32_t *want = malloc(3000 * 4);
    size_t len = 0;
    for (uint32_t i = 0; i < 3000; i++) {
        want[i] = i * 7;
        len += (size_t)sprintf(big + len, "%u ", i * 7);
    }
    CHECK_EQ(nums(big, len, UINT32_MAX, want, 3000), 0);
    /* out of memory at the first allocation and at the growth: -ENOMEM, nothing returned */
    for (long k = 1; k <= 2; k++) {
        uint32_t *v = (uint32_t *)1;
        size_t cnt = 77, bad = 0;
        lib_alloc = (struct fail_plan){0, k, 1};
        int rc = parse_numbers(big, len, UINT32_MAX, &v, &cnt, &bad);
        lib_alloc.armed = 0;
        CHECK_EQ(rc, -ENOMEM);
        CHECK(v == (uint32_t *)1 && cnt == 77);
    }
    free(big);
    free(want);
}

static void history(void)
{
    engram_history h, before;
    for (int i = 0; i < 3; i++)
        before.id[i] = 100 + i;
    h = before;
    CHECK_EQ(parse_history("5,-1,2147483647", &h), 0);
    CHECK(h.id[0] == 5 && h.id[1] == ENGRAM_DEAD && h.id[2] == 2147483647);
    const char *badv[] = {"", " 1,2,3", "1,2",  "1,2,3,4", "1,,2", ",1,2", "1,2,", "1,2,x", "1,2,-2",
                          "1,2,2147483648", "1, 2,3", "1,2,+3", "1,2,00000000000000000003"};
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        h = before;
        int rc = parse_history(badv[i], &h);
        CHECK_EQ(rc, -1);
        CHECK(memcmp(&h, &before, sizeof h) == 0); /* nothing written */
        if (rc != -1)
            fprintf(stderr, "history '%s' accepted\n", badv[i]);
    }
}

/* a .npy file image: magic, version v, header text (padded as numpy does) */
static size_t npy(uint8_t *buf, int v, const char *dict, size_t data_bytes)
{
    size_t pre = v == 1 ? 10 : 12, dl = strlen(dict);
    size_t hl = ((pre + dl + 1 + 63) / 64) * 64 - pre;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)v;
    buf[7] = 0;
    if (v == 1) {
        buf[8] = (uint8_t)hl;
        buf[9] = (uint8_t)(hl >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (uint8_t)(hl >> (8 * i));
    }
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hl - dl - 1);
    buf[pre + hl - 1] = '\n';
    memset(buf + pre + hl, 0, data_bytes);
    return pre + hl + data_bytes;
}

static void npy_headers(void)
{
    static uint8_t b[1 << 16];
    struct npy_info ni;
    size_t n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 256), }", 3 * 256 * 4);
    CHECK_EQ(npy_parse(b, n, n, &ni), 0);
    CHECK(ni.count == 768 && ni.bf16 == 0 && ni.data_offset == 128);
    n = npy(b, 2, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 256), }", 2 * 256 * 2);
    CHECK_EQ(npy_parse(b, n, n, &ni), 0);
    CHECK(ni.count == 512 && ni.bf16 == 1 && ni.data_offset == 128);
    n = npy(b, 3, "{'descr': '<i2', 'fortran_order': True, 'shape': (512,), }", 1024);
    CHECK_EQ(npy_parse(b, n, n, &ni), 0); /* one long axis: Fortran order is C order */
    CHECK(ni.count == 512 && ni.bf16 == 1);
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4);
    CHECK_EQ(npy_parse(b, n, n, &ni), 0); /* a scalar */
    CHECK_EQ(ni.count, 1);
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 256), }", 0);
    CHECK_EQ(npy_parse(b, n, n, &ni), 0);
    CHECK_EQ(ni.count, 0);
    /* the file may be longer than the bytes at hand */
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 256), }", 0);
    CHECK_EQ(npy_parse(b, n, n + 1000 * 256 * 4, &ni), 0);
    CHECK_EQ(npy_parse(b, n, n + 1000 * 256 * 4 - 1, &ni), -EBADMSG); /* one byte short */

    CHECK_EQ(npy_parse((const uint8_t *)"not numpy at all", 16, 16, &ni), -ENOENT);
    CHECK_EQ(npy_parse((const uint8_t *)"\x93NUMPY", 6, 6, &ni), -ENOENT); /* too short */
    /* version 2 needs 12 bytes of preamble: 11 are refused without reading
     * past them (exactly 11 bytes on the heap: ASan sees any overread) */
    uint8_t *eleven = malloc(11);
    memcpy(eleven, "\x93NUMPY\x02\x00\x10\x00\x00", 11);
    CHECK_EQ(npy_parse(eleven, 11, 11, &ni), -EBADMSG);
    free(eleven);
    /* the same 11 bytes at the end of a page followed by an inaccessible
     * one: an overread is a crash in every build, not only under ASan */
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *pages = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pages != MAP_FAILED);
    if (pages != MAP_FAILED) {
        CHECK_EQ(mprotect(pages + pg, (size_t)pg, PROT_NONE), 0);
        uint8_t *at = pages + pg - 11;
        memcpy(at, "\x93NUMPY\x02\x00\x10\x00\x00", 11);
        CHECK_EQ(npy_parse(at, 11, 11, &ni), -EBADMSG);
        munmap(pages, 2 * (size_t)pg);
    }
    n = npy(b, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16);
    CHECK_EQ(npy_parse(b, n, n, &ni), -ENOTSUP);
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 256), }", 2048);
    CHECK_EQ(npy_parse(b, n, n, &ni), -EDOM);
    const char *badd[] = {
        "{'fortran_order': False, 'shape': (2,), }",                   /* no descr */
        "{'descr': '<f4', 'shape': (2,), }",                           /* no order */
        "{'descr': '<f4', 'fortran_order': False, }",                  /* no shape */
        "{'fortran_order': False, 'shape': (2,), 'descr': '<f4 }",     /* quote */
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, }",     /* paren */
        "{'descr': '<f4', 'fortran_order': False, 'shape': 2, }",      /* not a tuple */
        "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }",   /* order */
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", /* dimension */
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",   /* more than the file */
        "{'fortran_order': False, 'shape': (2,), 'descr' }",           /* no ':' after a key */
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 0), }", /* overflow */
    };
    for (size_t i = 0; i < sizeof badd / sizeof badd[0]; i++) {
        n = npy(b, 1, badd[i], 8);
        int rc = npy_parse(b, n, n, &ni);
        CHECK_EQ(rc, -EBADMSG);
        if (rc != -EBADMSG)
            fprintf(stderr, "npy header %zu accepted (%d)\n", i, rc);
    }
    /* a header that ends inside the shape's tuple (no newline, no ')') */
    {
        const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,";
        size_t dl = strlen(d);
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        b[8] = (uint8_t)dl;
        b[9] = 0;
        memcpy(b + 10, d, dl);
        memset(b + 10 + dl, 0, 8);
        CHECK_EQ(npy_parse(b, 10 + dl + 8, 10 + dl + 8, &ni), -EBADMSG);
    }
    /* a NUL in the padding after every field */
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
    b[n - 8 - 3] = '\0';
    CHECK_EQ(npy_parse(b, n, n, &ni), -EBADMSG);
    n = npy(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
    b[6] = 4; /* version */
    CHECK_EQ(npy_parse(b, n, n, &ni), -EBADMSG);
    b[6] = 1;
    CHECK_EQ(npy_parse(b, 60, 60, &ni), -EBADMSG); /* header cut short */
    b[20] = '\0'; /* a NUL inside the header */
    CHECK_EQ(npy_parse(b, n, n, &ni), -EBADMSG);
    n = npy(b, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
    b[10] = 1; /* header length 65536 + ... */
    CHECK_EQ(npy_parse(b, n, n, &ni), -EBADMSG);
}

/* The CLI's device choice (programs/device.c): the CPU device opens, an
 * unknown name is refused, and its one allocation failing is -ENOMEM with
 * a message (nothing returned). */
static void devices(void)
{
    static uint32_t map[3000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 3000, 2000, 300), 0);
    char path[512];
    CHECK_EQ(tu_build("dev.gguf", &l, ENGRAM_FILL_RANDOM, 16, path, sizeof path), 0);
    engram_model *m = NULL;
    engram_layer *L = NULL;
    engram_error err;
    CHECK_EQ(engram_model_open(path, &m, &err), 0);
    if (!m)
        return;
    CHECK_EQ(engram_layer_open(m, 1, &L, &err), 0);
    struct dev *d = NULL;
    CHECK_EQ(dev_open("cpu", L, 1, 16, &d, &err), 0);
    CHECK(d != NULL && dev_rows_dtype(d) == ENGRAM_BF16);
    dev_close(d);
    d = NULL;
    CHECK_ERR(dev_open("tpu", L, 1, 16, &d, &err), err, -EINVAL, "unknown device");
    CHECK(d == NULL);
    /* cuda-fast was removed (#25): unknown, and the list names the three left */
    CHECK(dev_name_ok("cpu") && dev_name_ok("cuda") && dev_name_ok("cuda-fma") && !dev_name_ok("cuda-fast"));
    CHECK_ERR(dev_open("cuda-fast", L, 1, 16, &d, &err), err, -EINVAL,
              "unknown device 'cuda-fast' (cpu, cuda or cuda-fma)");
    CHECK(d == NULL);
    lib_alloc = (struct fail_plan){0, 1, 1}; /* dev_open's own allocation comes first */
    int rc = dev_open("cpu", L, 1, 16, &d, &err);
    lib_alloc.armed = 0;
    CHECK_ERR(rc, err, -ENOMEM, "out of memory");
    CHECK(d == NULL);
    engram_layer_close(L);
    engram_model_close(m);
    tu_cleanup();
}

/* ------------------------------------------------------------ files */

/* stderr to /dev/null around calls that print their errors (restore with
 * the returned descriptor). */
static int quiet(void)
{
    fflush(stderr);
    int saved = dup(2), nul = open("/dev/null", O_WRONLY);
    if (nul >= 0) {
        dup2(nul, 2);
        close(nul);
    }
    return saved;
}

static void loud(int saved)
{
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
}

static void write_file(const char *path, const char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK_EQ(fwrite(p, 1, n, f), n);
        fclose(f);
    }
}

/* path through numfile, cap numbers a call: the same numbers as
 * parse_numbers on text, or an error at the same item. */
static void stream_matches(const char *path, const char *text, size_t len, uint64_t max, size_t cap)
{
    uint32_t *want = NULL;
    size_t nwant = 0, bad = 0;
    int rc = parse_numbers(text, len, max, &want, &nwant, &bad);
    struct numfile *nf = malloc(sizeof *nf);
    uint32_t *got = malloc((len / 2 + cap + 1) * sizeof *got); /* room for every item */
    size_t n = 0, k = 0;
    int st = numfile_open(nf, path, max, "test");
    CHECK_EQ(st, 0);
    int saved = quiet();
    while (st == 0) {
        st = numfile_read(nf, got + n, cap, &k);
        n += st ? 0 : k;
        if (st || k < cap)
            break;
    }
    loud(saved);
    numfile_close(nf);
    if (rc == 0) {
        CHECK_EQ(st, 0);
        CHECK_EQ(n, nwant);
        CHECK(n == nwant && (n == 0 || memcmp(got, want, n * sizeof *got) == 0));
    } else {
        CHECK_EQ(rc, -EINVAL);
        CHECK_EQ(st, EXIT_DATA);
        CHECK_EQ(nf->items, bad); /* the invalid item's index */
        CHECK(n <= bad);
    }
    free(want);
    free(got);
    free(nf);
}

/* numfile reads 64 KiB at a time: items that straddle those reads (its
 * carry of a partial item), long and NUL-holding items among them, against
 * parse_numbers on the whole text. */
static void streams(void)
{
    char path[512];
    tu_path(path, sizeof path, "nums.txt");
    size_t size = 3 * 65536 + 100;
    char *text = malloc(size);
    uint64_t seed = 5;
    for (int c = 0; c < 120; c++) {
        size_t len = 0;
        /* a run of whitespace so that the next items sit about a read's end */
        size_t pad = 65536 - 40 + (size_t)c % 80 + (c >= 80 ? 65536 : 0);
        while (len < pad)
            text[len++] = " \t\n\r"[tu_rand(&seed) % 4];
        int invalid_at = c % 3 == 0 ? (int)(tu_rand(&seed) % 12) : -1;
        for (int i = 0; i < 12 && len + 80 < size; i++) {
            int kind = i == invalid_at ? 1 + (int)(tu_rand(&seed) % 4) : 0;
            size_t digits = kind == 1 ? 32 + tu_rand(&seed) % 40 : 1 + tu_rand(&seed) % (c % 2 ? 31 : 10);
            for (size_t d = 0; d < digits; d++) /* leading zeros: long and valid */
                text[len++] = (char)('0' + (kind == 0 && d + 6 < digits ? 0 : tu_rand(&seed) % 10));
            if (kind == 2)
                text[len - 1] = '\0';
            if (kind == 3)
                text[len++] = 'x';
            if (kind == 4)
                len += (size_t)sprintf(text + len, "4294967296");
            size_t sp = 1 + tu_rand(&seed) % 3;
            while (sp--)
                text[len++] = " \n"[tu_rand(&seed) % 2];
        }
        if (c % 5 == 0) /* ends inside an item */
            len -= len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\n');
        write_file(path, text, len);
        uint64_t max = c % 4 == 3 ? 99999 : UINT32_MAX;
        stream_matches(path, text, len, max, c % 2 ? 1 : 4096);
    }
    /* the whole of /dev/zero is never read: item 0 is invalid at once */
    struct numfile *nf = malloc(sizeof *nf);
    uint32_t v[4];
    size_t k = 99;
    CHECK_EQ(numfile_open(nf, "/dev/zero", UINT32_MAX, "test"), 0);
    int saved = quiet();
    CHECK_EQ(numfile_read(nf, v, 4, &k), EXIT_DATA);
    loud(saved);
    CHECK_EQ(nf->items, 0);
    numfile_close(nf);
    /* a directory: "Is a directory" when opened, not a read error later */
    saved = quiet();
    CHECK_EQ(numfile_open(nf, tu_tmpdir(), UINT32_MAX, "test"), EXIT_SYSTEM);
    CHECK_EQ(nf->fd, -EISDIR);
    tu_path(path, sizeof path, "missing");
    CHECK_EQ(numfile_open(nf, path, UINT32_MAX, "test"), EXIT_SYSTEM);
    CHECK_EQ(nf->fd, -ENOENT);
    tu_path(path, sizeof path, "nums.txt");
    loud(saved);
    free(nf);

    /* read_numbers: 2^24 numbers pass, one more is refused */
    size_t n = CLI_MAX_ITEMS;
    char *big = malloc(2 * (size_t)n + 2);
    for (size_t i = 0; i < n + 1; i++) {
        big[2 * i] = (char)('0' + i % 10);
        big[2 * i + 1] = '\n';
    }
    uint32_t *out = NULL;
    size_t count = 0;
    write_file(path, big, 2 * (size_t)n);
    CHECK_EQ(read_numbers(path, UINT32_MAX, &out, &count, "test"), 0);
    CHECK_EQ(count, n);
    CHECK(out && out[n - 1] == (n - 1) % 10);
    free(out);
    write_file(path, big, 2 * (size_t)n + 2);
    out = NULL;
    saved = quiet();
    CHECK_EQ(read_numbers(path, UINT32_MAX, &out, &count, "test"), EXIT_DATA);
    loud(saved);
    CHECK(out == NULL);
    free(big);

    /* slurp: at most max bytes */
    char *buf = NULL;
    size_t len = 0;
    write_file(path, "0123456789", 10);
    CHECK_EQ(slurp(path, 10, &buf, &len), 0);
    CHECK(len == 10 && buf && !memcmp(buf, "0123456789", 11));
    free(buf);
    buf = NULL;
    CHECK_EQ(slurp(path, 9, &buf, &len), -EFBIG);
    CHECK(buf == NULL);
    CHECK_EQ(slurp("/dev/zero", 100000, &buf, &len), -EFBIG);
    CHECK_EQ(slurp(tu_tmpdir(), 100, &buf, &len), -EISDIR);
    char missing[512];
    tu_path(missing, sizeof missing, "missing");
    CHECK_EQ(slurp(missing, 100, &buf, &len), -ENOENT);
    CHECK(buf == NULL);
    free(text);

    /* inputs read by their size */
    struct stat st;
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(input_regular(path, &st), 0);
    saved = quiet();
    CHECK_EQ(stat("/dev/zero", &st), 0);
    CHECK_EQ(input_regular("/dev/zero", &st), EXIT_DATA);
    CHECK_EQ(stat(tu_tmpdir(), &st), 0);
    CHECK_EQ(input_regular(tu_tmpdir(), &st), EXIT_SYSTEM);
    loud(saved);
    unlink(path);
}

int main(void)
{
    numbers();
    history();
    npy_headers();
    streams();
    devices();
    return tu_finish("test_parsers");
}
