/*
 * test_tools.c - the model tools' library parts against known answers:
 * SPEC.md section 5's V4.1 multipliers, normalize() cases worked out by hand
 * from SPEC.md section 4's rules, a small tokenizer.json whose map is
 * derived by hand, hostile tokenizer files, SHA-256 test vectors (FIPS
 * 180-2), and quantizer edge cases checked through the decoder.  (The real
 * DeepSeek V3 tokenizer's V' and map SHA-256, and a numpy/Fraction
 * reference for the quantizer, are in test_cli.sh.)
 */
#include <float.h>
#include <math.h>

#include "alloc_shim.h"
#include "testutil.h"

#include "tools/sha256.h"

static void multipliers(void)
{
    /* SPEC.md section 5, V' = 99092. */
    static const uint64_t want[2][4] = {
        {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull},
        {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull},
    };
    uint64_t m[4];
    CHECK_EQ(engram_layout_multipliers(99092, 1, 4, m), 0);
    for (int j = 0; j < 4; j++)
        CHECK_EQ(m[j], want[0][j]);
    CHECK_EQ(engram_layout_multipliers(99092, 14, 4, m), 0);
    for (int j = 0; j < 4; j++)
        CHECK_EQ(m[j], want[1][j]);
    /* Fewer draws are a prefix of the same stream. */
    uint64_t m3[3];
    CHECK_EQ(engram_layout_multipliers(99092, 14, 3, m3), 0);
    CHECK(memcmp(m3, want[1], sizeof m3) == 0);
    /* Any V': odd and within the overflow bound. */
    for (uint32_t v = 1; v < (1u << 24); v = v * 3 + 7) {
        CHECK_EQ(engram_layout_multipliers(v, 7, 4, m), 0);
        for (int j = 0; j < 4; j++)
            CHECK((m[j] & 1) && m[j] <= (uint64_t)INT64_MAX / v);
    }
    CHECK_EQ(engram_layout_multipliers(0, 1, 4, m), -EINVAL);
    CHECK_EQ(engram_layout_multipliers((1u << 24) + 1, 1, 4, m), -EINVAL);
    CHECK_EQ(engram_layout_multipliers(99092, 1, 0, m), -EINVAL);
}

/* normalize(in) must be want (both with explicit lengths). */
static void norm_case(const char *in, size_t in_len, const char *want, size_t want_len)
{
    char *out = NULL;
    size_t n = 0;
    int rc = engram_text_normalize(in, in_len, &out, &n);
    CHECK_EQ(rc, 0);
    if (rc == 0 && (n != want_len || memcmp(out, want, n) != 0)) {
        tu_failures++;
        fprintf(stderr, "normalize('%.*s') = '%.*s' (%zu bytes), want '%.*s'\n", (int)in_len, in,
                (int)n, out, n, (int)want_len, want);
    }
    free(out);
}
#define NORM(a, b) norm_case(a, sizeof(a) - 1, b, sizeof(b) - 1)

static void normalize(void)
{
    NORM("Hello", "hello");
    NORM(" ", " ");                       /* exactly one space stays      */
    NORM("   ", " ");                     /* collapses to " ", which stays */
    NORM("\t\r\n", " ");
    NORM("  a \t b  ", "a b");
    NORM("\xc4\xb0", "i");                /* U+0130: NFD gives I + U+0307, Mn dropped */
    NORM("\xc3\xa9t\xc3\xa9", "ete");     /* accents are Mn after NFD     */
    NORM("\xef\xac\x81", "fi");           /* U+FB01 ligature, NFKC        */
    NORM("\xef\xbc\xa1\xef\xbc\xa2", "ab"); /* fullwidth A B, NFKC       */
    NORM("\xc2\xa0x\xe3\x80\x80", "x");   /* NBSP and U+3000 -> spaces (NFKC), stripped */
    NORM("\xe2\x80\xa8", "");             /* U+2028: White_Space, stripped to "" */
    NORM("\xce\x91\xce\xa3", "\xce\xb1\xcf\x83"); /* "ΑΣ" -> "ασ": no final-sigma rule */
    NORM("a\xc2\x85" "b", "a\xc2\x85" "b"); /* U+0085 inside: not collapsed */
    NORM("\xc2\x85" "b\xe2\x80\x8a", "b"); /* U+0085, U+200A at the ends: stripped */
    NORM("\xe2\x80\x8b", "\xe2\x80\x8b"); /* U+200B is not White_Space    */
    NORM("\0", "\0");                     /* U+0000 is kept, length 1     */
    NORM("", "");
    NORM("\xe2\x84\xaa", "k");            /* KELVIN SIGN -> K -> k        */
    NORM("\xe2\x91\xa0", "1");            /* circled one, NFKC            */
    char *out = NULL;
    size_t n;
    /* every allocation of a normalization failed in turn: -ENOMEM, nothing
     * returned (malloc is wrapped for this test, see the Makefile: lib_alloc,
     * tests/alloc_shim.h; utf8proc's own allocations, a shared library's,
     * are not counted) */
    {
        lib_alloc = (struct fail_plan){0, 0, 1}; /* counts only */
        char *o2 = NULL;
        size_t n2 = 0;
        CHECK_EQ(engram_text_normalize("Gr\xc3\xbc\xc3\x9f  Gott", 13, &o2, &n2), 0);
        long total = lib_alloc.calls;
        lib_alloc.armed = 0;
        free(o2);
        CHECK(total >= 1);
        for (long k = 1; k <= total; k++) {
            lib_alloc = (struct fail_plan){0, k, 1};
            o2 = NULL;
            int r = engram_text_normalize("Gr\xc3\xbc\xc3\x9f  Gott", 13, &o2, &n2);
            lib_alloc.armed = 0;
            CHECK_EQ(r, -ENOMEM);
            CHECK(o2 == NULL);
        }
    }
    /* refused arguments: NULL outputs or text, over 1 GiB (not read) */
    CHECK_EQ(engram_text_normalize(NULL, 1, &out, &n), -EINVAL);
    CHECK_EQ(engram_text_normalize("a", 1, NULL, &n), -EINVAL);
    CHECK_EQ(engram_text_normalize("a", 1, &out, NULL), -EINVAL);
    CHECK_EQ(engram_text_normalize("a", ((size_t)1 << 30) + 1, &out, &n), -EINVAL);
    {
        engram_tokmap tm;
        engram_error e;
        int r = engram_tokmap_from_json(NULL, &tm, &e);
        CHECK_ERR(r, e, -EINVAL, "NULL argument");
        r = engram_tokmap_from_json("x.json", NULL, &e);
        CHECK_ERR(r, e, -EINVAL, "NULL argument");
    }
    CHECK_EQ(engram_text_normalize("\xc3", 1, &out, &n), -EILSEQ);
    CHECK_EQ(engram_text_normalize("\xed\xa0\x80", 3, &out, &n), -EILSEQ); /* surrogate */
    CHECK_EQ(engram_text_normalize("\xc0\xaf", 2, &out, &n), -EILSEQ);     /* overlong  */
    CHECK(out == NULL);
}

static int write_text(const char *name, const char *text, char *path, size_t n)
{
    tu_path(path, n, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/*
 * A tokenizer whose map follows from SPEC.md section 4 by hand.  Byte-level
 * strings: "Ġ" = 0x20, "Ċ" = 0x0A, "Ã©" = C3 A9 ("é"), "Ã" alone = C3
 * (invalid UTF-8), "ï¿½" = EF BF BD (U+FFFD), "Ä°" = C4 B0 (U+0130).
 */
static const char *small_json =
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":9,\"content\":\"<\xef\xbd\x9c" "end\xef\xbd\x9c>\",\"special\":true},"
        "{\"id\":10,\"content\":\"\xef\xbc\xa1\xef\xbc\xa2\",\"special\":false},"
        "{\"id\":13,\"content\":\" \",\"special\":false}],"
        "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{"
        "\"\\u0120\":0,\"\\u0120\\u0120\":1,\"A\":2,\"a\":3,\"\\u00c3\\u00a9\":4,\"\\u00c3\":5,"
        "\"\\u010a\":6,\"\\u00ef\\u00bf\\u00bd\":8,\"x\":10,\"\\u00c4\\u00b0\":11,\"\\u00e9\":12},"
        "\"merges\":[]}}";

static void small_tokenizer(void)
{
    /* id : text             -> key             compressed id
     *  0 : " "              -> " "             0
     *  1 : "  "             -> " "             0
     *  2 : "A"              -> "a"             1
     *  3 : "a"              -> "a"             1
     *  4 : "é"              -> "e"             2
     *  5 : C3 (invalid)     -> raw "Ã"         3
     *  6 : "\n"             -> " "             0
     *  7 : (no token)       -> ""              4
     *  8 : U+FFFD           -> raw "ï¿½"       5
     *  9 : "<｜end｜>"      -> "<|end|>"       6
     * 10 : added "ＡＢ"     -> "ab"            7   (overrides vocab "x")
     * 11 : U+0130           -> "i"             8
     * 12 : "é" as a char (U+00E9 is byte 0xE9 in the alphabet: lone E9,
     *      invalid)         -> raw "é"         9
     * 13 : added " "        -> " "             0 */
    static const uint32_t want[14] = {0, 0, 1, 1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0};
    char path[600];
    CHECK_EQ(write_text("tok.json", small_json, path, sizeof path), 0);
    engram_tokmap tm;
    engram_error err;
    int rc = engram_tokmap_from_json(path, &tm, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    CHECK_EQ(tm.vocab, 14);
    CHECK_EQ(tm.compressed_vocab, 10);
    CHECK_EQ(tm.missing, 1);
    CHECK_EQ(tm.raw_keys, 3);
    for (int i = 0; i < 14; i++)
        CHECK_EQ(tm.map[i], want[i]);
    CHECK_EQ(tm.group[0], 4);
    CHECK(tm.key_len[3] == 2 && memcmp(tm.key[3], "\xc3\x83", 2) == 0);
    CHECK(tm.key_len[6] == 7 && memcmp(tm.key[6], "<|end|>", 7) == 0);
    CHECK(tm.key_len[4] == 0);
    /* The map's SHA-256, recomputed here from the hand-derived map. */
    struct sha256 h;
    uint8_t d[32];
    sha256_init(&h);
    for (int i = 0; i < 14; i++) {
        uint8_t le[4] = {(uint8_t)want[i], 0, 0, 0};
        sha256_update(&h, le, 4);
    }
    sha256_final(&h, d);
    CHECK(memcmp(d, tm.sha256, 32) == 0);
    engram_tokmap_free(&tm);
    engram_tokmap_free(&tm); /* cleared: a second free is harmless */
}

static void hostile_tokenizers(void)
{
    static const struct {
        const char *json;
        int code;
        const char *needle;
    } cases[] = {
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -ENOTSUP, "not a byte-level BPE"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"Metaspace\"}}",
         -ENOTSUP, "not a byte-level BPE"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "id 0 to two tokens"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":16777216}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "empty vocabulary"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"added_tokens\":[{\"id\":1}]}",
         -EBADMSG, "added_tokens[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"added_tokens\":{}}",
         -EBADMSG, "not an array"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1}},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "duplicate"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}", -EBADMSG, "line 1"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"added_tokens\":[{\"id\":3,\"content\":\"x\"},{\"id\":3,\"content\":\"y\"}]}",
         -EBADMSG, "reuses id 3"},
        {"[1,2,3]", -EBADMSG, "no model object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}",
         -EBADMSG, "no model.vocab object"},
        {"", -EBADMSG, "line"},
    };
    char path[600];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ(write_text("bad.json", cases[i].json, path, sizeof path), 0);
        engram_tokmap tm;
        memset(&tm, 0x5a, sizeof tm);
        engram_error err;
        int rc = engram_tokmap_from_json(path, &tm, &err);
        CHECK_ERR(rc, err, cases[i].code, cases[i].needle);
        CHECK(tm.vocab == 0x5a5a5a5au); /* untouched on failure */
    }
    /* A Sequence decoder that contains ByteLevel is accepted. */
    CHECK_EQ(write_text("seq.json",
                        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":"
                        "\"Sequence\",\"decoders\":[{\"type\":\"Strip\"},{\"type\":\"ByteLevel\"}]}}",
                        path, sizeof path), 0);
    engram_tokmap tm;
    engram_error err;
    CHECK_EQ(engram_tokmap_from_json(path, &tm, &err), 0);
    CHECK_EQ(tm.compressed_vocab, 1);
    engram_tokmap_free(&tm);
    tu_path(path, sizeof path, "missing.json");
    CHECK_EQ(engram_tokmap_from_json(path, &tm, &err), -ENOENT);
    CHECK_ERR(engram_tokmap_from_json(tu_tmpdir(), &tm, &err), err, -EINVAL, "not a regular file");
    /* Over the size limit: a sparse file, nothing parsed. */
    tu_path(path, sizeof path, "huge.json");
    CHECK_EQ(write_text("huge.json", "{", path, sizeof path), 0);
    CHECK_EQ(truncate(path, (off_t)ENGRAM_TOKENIZER_MAX_BYTES + 1), 0);
    CHECK_ERR(engram_tokmap_from_json(path, &tm, &err), err, -EFBIG, "limit");
    unlink(path);
}

static void sha256_vectors(void)
{
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct sha256 h;
        uint8_t d[32];
        char hex[65];
        sha256_init(&h);
        sha256_update(&h, v[i].msg, strlen(v[i].msg));
        sha256_final(&h, d);
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", d[k]);
        CHECK(strcmp(hex, v[i].hex) == 0);
    }
    /* One million 'a', fed in uneven pieces. */
    struct sha256 h;
    uint8_t d[32];
    char hex[65], a[1100];
    memset(a, 'a', sizeof a);
    sha256_init(&h);
    size_t left = 1000000, step = 1;
    while (left) {
        size_t k = step < left ? step : left;
        sha256_update(&h, a, k);
        left -= k;
        step = step % 997 + 13;
    }
    sha256_final(&h, d);
    for (int k = 0; k < 32; k++)
        snprintf(hex + 2 * k, 3, "%02x", d[k]);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
}

/* Quantizer edge cases; values checked through the library's decoder. */
static void quantizer(void)
{
    float x[256], y[256];
    uint8_t q[264], q2[264];
    engram_error err;
    uint64_t sat = 0;
    /* Zeros and negative zeros: code 0 / 0x80, scale 2^0 (byte 127). */
    for (int i = 0; i < 256; i++)
        x[i] = i % 2 ? -0.0f : 0.0f;
    CHECK_EQ(engram_rows_quantize_f32(x, 1, q, &sat, &err), 0);
    for (int i = 0; i < 256; i++)
        CHECK_EQ(q[i], i % 2 ? 0x80 : 0);
    for (int b = 0; b < 8; b++)
        CHECK_EQ(q[256 + b], 127);
    /* +-448 * 2^k: scale byte 127 + k, code 0x7E (0xFE negative). */
    for (int k = -127; k <= 120; k += 31) {
        for (int i = 0; i < 256; i++)
            x[i] = (float)ldexp(i % 3 ? 448.0 : -448.0, k);
        CHECK_EQ(engram_rows_quantize_f32(x, 1, q, &sat, &err), 0);
        CHECK_EQ(q[256], 127 + k);
        CHECK_EQ(q[0], 0xFE);
        CHECK_EQ(q[1], 0x7E);
        CHECK_EQ(engram_rows_decode_f32(ENGRAM_SIMD_SCALAR, q, 1, y, NULL), 0);
        CHECK(memcmp(x, y, sizeof x) == 0); /* exact: 448 * 2^k is a float and a BF16 */
    }
    /* Just above 448 * 2^e needs the next exponent. */
    for (int i = 0; i < 256; i++)
        x[i] = 1.0f;
    x[0] = nextafterf(448.0f, 1e9f);
    CHECK_EQ(engram_rows_quantize_f32(x, 1, q, &sat, &err), 0);
    CHECK_EQ(q[256], 128);
    CHECK_EQ(q[257], 127 - 8); /* max 1.0: 1 <= 448 * 2^-8 = 1.75 */
    /* Ties to even at scale 2^0 (spacing 2 in [16, 32)): 17 -> 16,
     * 19 -> 20, 21 -> 20, 23 -> 24; 0.5 * 2^-9 -> 0, 1.5 * 2^-9 -> 2^-8. */
    memset(x, 0, sizeof x);
    x[0] = 448.0f;
    x[1] = 17.0f;
    x[2] = 19.0f;
    x[3] = 21.0f;
    x[4] = 23.0f;
    x[5] = (float)ldexp(0.5, -9);
    x[6] = (float)ldexp(1.5, -9);
    x[7] = (float)ldexp(7.5, -9); /* subnormal 7 vs normal 8 (2^-6): even is 8 */
    CHECK_EQ(engram_rows_quantize_f32(x, 1, q, &sat, &err), 0);
    CHECK_EQ(engram_rows_decode_f32(ENGRAM_SIMD_SCALAR, q, 1, y, NULL), 0);
    CHECK(y[1] == 16.0f && y[2] == 20.0f && y[3] == 20.0f && y[4] == 24.0f);
    CHECK(y[5] == 0.0f && y[6] == (float)ldexp(2, -9) && y[7] == (float)ldexp(1, -6));
    CHECK_EQ(q[7], 0x08);
    /* Near FLT_MAX: 2^128 is not a float, so those saturate (counted). */
    for (int i = 0; i < 256; i++)
        x[i] = i % 2 ? -FLT_MAX : FLT_MAX;
    sat = 0;
    CHECK_EQ(engram_rows_quantize_f32(x, 1, q, &sat, &err), 0);
    CHECK_EQ(sat, 256);
    CHECK_EQ(engram_rows_check(q, 1, &err), 0);
    CHECK_EQ(engram_rows_decode_f32(ENGRAM_SIMD_SCALAR, q, 1, y, NULL), 0);
    CHECK(y[0] == (float)ldexp(240.0, 120) && y[1] == -(float)ldexp(240.0, 120));
    /* NaN and Inf: rejected, index named, output untouched. */
    for (int i = 0; i < 256; i++)
        x[i] = 1.0f;
    x[77] = NAN;
    memset(q2, 0xA5, sizeof q2);
    memset(&err, 0, sizeof err);
    CHECK_ERR(engram_rows_quantize_f32(x, 1, q2, NULL, &err), err, -EDOM,
              "row 0, value 77: NaN cannot be quantized");
    CHECK_EQ(err.row, 0);
    CHECK(err.offset == ENGRAM_NO_OFFSET);
    for (int i = 0; i < 264; i++)
        CHECK_EQ(q2[i], 0xA5);
    x[77] = 1.0f;
    x[200] = -INFINITY;
    CHECK_ERR(engram_rows_quantize_f32(x, 1, q2, NULL, &err), err, -EDOM,
              "row 0, value 200: infinity cannot be quantized");
    CHECK_EQ(err.row, 0);
    for (int i = 0; i < 264; i++)
        CHECK_EQ(q2[i], 0xA5);
    /* Several rows: err.row is the row's index in the call, the value's
     * index is within its row; nothing of the rows before it is written. */
    {
        static float x3[3 * 256];
        static uint8_t q3[3 * 264];
        for (int i = 0; i < 3 * 256; i++)
            x3[i] = 0.5f;
        x3[2 * 256 + 5] = NAN;
        x3[2 * 256 + 9] = INFINITY;
        memset(q3, 0xA5, sizeof q3);
        CHECK_ERR(engram_rows_quantize_f32(x3, 3, q3, NULL, &err), err, -EDOM,
                  "row 2, value 5: NaN");
        CHECK_EQ(err.row, 2);
        for (size_t i = 0; i < sizeof q3; i++)
            CHECK_EQ(q3[i], 0xA5);
        x3[2 * 256 + 5] = 1.0f;
        CHECK_ERR(engram_rows_quantize_f32(x3, 3, q3, NULL, &err), err, -EDOM,
                  "row 2, value 9: infinity");
        CHECK_EQ(err.row, 2);
        CHECK_EQ(engram_rows_quantize_f32(x3, 3, q3, NULL, NULL), -EDOM); /* err may be NULL */
    }
    /* BF16 input: the same rows as the float input they represent. */
    uint16_t hb[256];
    uint64_t s = 3;
    for (int i = 0; i < 256; i++) {
        hb[i] = (uint16_t)(tu_rand(&s) & 0xFFFF);
        if ((hb[i] & 0x7F80) == 0x7F80)
            hb[i] &= 0xBFFF; /* keep finite */
        uint32_t u = (uint32_t)hb[i] << 16;
        memcpy(&x[i], &u, 4);
    }
    CHECK_EQ(engram_rows_quantize_bf16(hb, 1, q, NULL, &err), 0);
    /* refused arguments: NULL input or output for rows, a count past SIZE_MAX / 264 */
    CHECK_ERR(engram_rows_quantize_bf16(NULL, 1, q, NULL, &err), err, -EINVAL, "NULL");
    CHECK(err.row == ENGRAM_NO_ROW);
    CHECK_EQ(engram_rows_quantize_bf16(hb, 1, NULL, NULL, &err), -EINVAL);
    CHECK_ERR(engram_rows_quantize_bf16(hb, SIZE_MAX / 264 + 1, q, NULL, &err), err, -EINVAL,
              "overflows");
    CHECK_EQ(engram_rows_quantize_f32(NULL, 1, q, NULL, &err), -EINVAL);
    CHECK_EQ(engram_rows_quantize_f32(x, SIZE_MAX / 264 + 1, q, NULL, &err), -EINVAL);
    CHECK_EQ(engram_rows_quantize_f32(x, 1, q2, NULL, &err), 0);
    CHECK(memcmp(q, q2, 264) == 0);
    CHECK_EQ(engram_rows_check(q, 1, &err), 0);
    /* Random rows of every magnitude: always decodable, and within half an
     * E4M3 step (2^-4 relative) of the input wherever the value is at
     * least 2^-6 of its block's scale (the normal range of E4M3). */
    uint64_t worse = 0;
    for (int r = 0; r < 2000; r++) {
        int k = (int)(tu_rand(&s) % 260) - 140;
        for (int i = 0; i < 256; i++) {
            double g = (double)(tu_rand(&s) % 2000001) / 1000000.0 - 1.0;
            x[i] = (float)ldexp(g, k);
        }
        CHECK_EQ(engram_rows_quantize_f32(x, 1, q, NULL, &err), 0);
        CHECK_EQ(engram_rows_decode_f32(ENGRAM_SIMD_AUTO, q, 1, y, NULL), 0);
        for (int i = 0; i < 256; i++) {
            double scale = ldexp(1.0, q[256 + i / 32] - 127);
            if (fabs((double)x[i]) >= ldexp(scale, -6) && fabs((double)y[i]) > ldexp(1.0, -126) &&
                fabs((double)x[i] - (double)y[i]) > ldexp(fabs((double)x[i]), -4))
                worse++;
        }
    }
    CHECK_EQ(worse, 0);
    CHECK_EQ(engram_rows_quantize_f32(NULL, 1, q, NULL, &err), -EINVAL);
}

/* read(2) as the tokenizer's loader sees it (linked with --wrap=read, see
 * the Makefile): READ_PLAIN passes through; READ_CHOPPY answers every other
 * call EINTR or EAGAIN and the rest one byte at a time; READ_EIO fails the
 * second call (the document, shorter than one read, complete before it: a
 * loader that kept what it parsed would leak it, which LeakSanitizer sees
 * in the ASan build); READ_GROWS, once the file is read, returns as many
 * spaces as asked, for ever: a file that grows while it is parsed. */
enum { READ_PLAIN, READ_CHOPPY, READ_EIO, READ_GROWS };
static int read_mode;
static long read_calls;
ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __wrap_read(int fd, void *buf, size_t n);
ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    long k = ++read_calls;
    switch (read_mode) {
    case READ_CHOPPY:
        if (k % 2) {
            errno = k % 4 == 1 ? EINTR : EAGAIN;
            return -1;
        }
        return __real_read(fd, buf, n ? 1 : 0);
    case READ_EIO:
        if (k == 2) {
            errno = EIO;
            return -1;
        }
        return __real_read(fd, buf, n);
    case READ_GROWS: {
        ssize_t r = __real_read(fd, buf, n);
        if (r != 0)
            return r;
        memset(buf, ' ', n);
        return (ssize_t)n;
    }
    default:
        return __real_read(fd, buf, n);
    }
}

/* The tokenizer read through interrupted, short and failing reads, one
 * that never ends, and every counted allocation failing: the same map, or
 * the error, nothing returned. */
static void tokenizer_reads(void)
{
    char path[600];
    CHECK_EQ(write_text("reads.json", small_json, path, sizeof path), 0);
    engram_tokmap plain, tm;
    engram_error err;
    int rc = engram_tokmap_from_json(path, &plain, &err);
    CHECK_EQ(rc, 0);
    if (rc < 0)
        return;
    size_t len = strlen(small_json);
    CHECK(len < 65536); /* one of the loader's reads */
    read_mode = READ_CHOPPY;
    read_calls = 0;
    rc = engram_tokmap_from_json(path, &tm, &err);
    read_mode = READ_PLAIN;
    CHECK_EQ(rc, 0);
    CHECK(read_calls >= 2 * (long)len); /* every byte its own read, after a refusal */
    if (rc == 0) {
        CHECK_EQ(tm.vocab, plain.vocab);
        CHECK(memcmp(tm.map, plain.map, plain.vocab * sizeof *tm.map) == 0);
        CHECK(memcmp(tm.sha256, plain.sha256, 32) == 0);
        engram_tokmap_free(&tm);
    }
    read_mode = READ_EIO;
    read_calls = 0;
    memset(&tm, 0x5a, sizeof tm);
    rc = engram_tokmap_from_json(path, &tm, &err);
    read_mode = READ_PLAIN;
    CHECK_ERR(rc, err, -EIO, "cannot read");
    read_mode = READ_GROWS;
    read_calls = 0;
    rc = engram_tokmap_from_json(path, &tm, &err);
    read_mode = READ_PLAIN;
    CHECK_ERR(rc, err, -EFBIG, "grew past the limit");
    /* reads of 64 KiB: the first the file, then the limit's worth */
    CHECK(read_calls >= (long)(ENGRAM_TOKENIZER_MAX_BYTES / 65536) &&
          read_calls <= (long)(ENGRAM_TOKENIZER_MAX_BYTES / 65536) + 2);
    /* every allocation the library makes on the way failing in turn */
    lib_alloc = (struct fail_plan){0, 0, 1}; /* counts only */
    rc = engram_tokmap_from_json(path, &tm, &err);
    long total = lib_alloc.calls;
    lib_alloc.armed = 0;
    CHECK_EQ(rc, 0);
    if (rc == 0)
        engram_tokmap_free(&tm);
    CHECK(total >= 2);
    for (long k = 1; k <= total; k++) {
        lib_alloc = (struct fail_plan){0, k, 1};
        rc = engram_tokmap_from_json(path, &tm, &err);
        lib_alloc.armed = 0;
        CHECK_ERR(rc, err, -ENOMEM, "");
        if (rc == 0)
            engram_tokmap_free(&tm);
    }
    engram_tokmap_free(&plain);
    unlink(path);
}

int main(void)
{
    multipliers();
    normalize();
    small_tokenizer();
    hostile_tokenizers();
    tokenizer_reads();
    sha256_vectors();
    quantizer();
    tu_cleanup();
    return tu_finish("test_tools");
}
