/*
 * test_ple.c - the PLE member's hash and layout (SPEC.md section 10),
 * against SPEC's known answers: the 16 sizes and 3 multipliers derived
 * from their generators, the padded row count, the known rows of {9707},
 * {9707, 11}, {9707, 11, 220}; then the EOS, padding and image rules, the
 * refusals, and chunked hashing against a look-back reference written
 * from SPEC's words (the lags read from the sequence, 128-bit remainders).
 */
#include <errno.h>
#include <string.h>

#include "testutil.h"
#include "../src/hash/ple.h"
#include "../src/tools/ple_gen.h"

#define EOS 248044u
#define VOCAB 248320u

/* SPEC 10's figures. */
static const uint32_t spec_sizes[PLE_HEADS] = {
    20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
    20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171};
static const uint64_t spec_mult[PLE_NGRAM] = {23703573157769ull, 20109073645365ull, 8052911324071ull};

/* The rows of position i of seq (effective ids: padding and images already
 * replaced), reading its lags from seq itself. */
static void reference(const struct ple_layout *l, const uint32_t *seq, size_t i, uint32_t out[PLE_HEADS])
{
    __extension__ typedef unsigned __int128 u128;
    uint32_t t0 = seq[i], t1 = i >= 1 ? seq[i - 1] : l->eos, t2 = i >= 2 ? seq[i - 2] : l->eos;
    if (t1 == l->eos)
        t2 = l->eos;
    u128 a = (u128)((uint64_t)t0 * l->multipliers[0]) ^ (u128)((uint64_t)t1 * l->multipliers[1]);
    u128 b = a ^ (u128)((uint64_t)t2 * l->multipliers[2]);
    for (int h = 0; h < PLE_HEADS; h++)
        out[h] = l->offsets[h] + (uint32_t)((h < 8 ? a : b) % l->sizes[h]);
}

static void known_answers(const struct ple_layout *l)
{
    for (int h = 0; h < PLE_HEADS; h++)
        CHECK_EQ(l->sizes[h], spec_sizes[h]);
    uint64_t sum = 0;
    for (int h = 0; h < PLE_HEADS; h++) {
        CHECK_EQ(l->offsets[h], sum);
        sum += spec_sizes[h];
    }
    CHECK_EQ(sum, 320001446ull);
    CHECK_EQ(l->rows, 320001536ull);
    for (int j = 0; j < PLE_NGRAM; j++)
        CHECK_EQ(l->multipliers[j], spec_mult[j]);
    CHECK_EQ(ple_layout_check(l, NULL), 0);

    /* {9707} -> heads 0, 7, 8, 15; then {9707, 11}, {9707, 11, 220} */
    static const uint32_t want[3][4] = {{16410909, 152932897, 169641436, 300984276},
                                        {18158303, 159566246, 175132467, 307699687},
                                        {15029315, 143479041, 162897307, 308764256}};
    const uint32_t seq[3] = {9707, 11, 220};
    uint32_t rows[3 * PLE_HEADS];
    struct ple_history h;
    ple_history_start(l, &h);
    CHECK_EQ(ple_hash(l, seq, NULL, 3, &h, rows, NULL), 0);
    static const int heads[4] = {0, 7, 8, 15};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            CHECK_EQ(rows[i * PLE_HEADS + heads[k]], want[i][k]);
    CHECK_EQ(h.lag[0], 220u);
    CHECK_EQ(h.lag[1], 11u);
}

/* EOS: the token after one hashes like a sequence start, the one after
 * that like the start of {b, c}; the EOS keeps its own lags. */
static void eos_rules(const struct ple_layout *l)
{
    const uint32_t a = 5, b = 9707, c = 11;
    const uint32_t seq[5] = {a, 77, EOS, b, c};
    uint32_t rows[5 * PLE_HEADS], fresh[2 * PLE_HEADS], ref[PLE_HEADS];
    struct ple_history h;
    ple_history_start(l, &h);
    CHECK_EQ(ple_hash(l, seq, NULL, 5, &h, rows, NULL), 0);
    const uint32_t bc[2] = {b, c};
    ple_history_start(l, &h);
    CHECK_EQ(ple_hash(l, bc, NULL, 2, &h, fresh, NULL), 0);
    CHECK(memcmp(rows + 3 * PLE_HEADS, fresh, sizeof fresh) == 0);
    for (size_t i = 0; i < 5; i++) {
        reference(l, seq, i, ref);
        CHECK(memcmp(rows + i * PLE_HEADS, ref, sizeof ref) == 0);
    }
    /* the EOS position: t1 = 77, t2 = a (not EOS) */
    const uint32_t pre[3] = {a, 77, EOS};
    reference(l, pre, 2, ref);
    CHECK(memcmp(rows + 2 * PLE_HEADS, ref, sizeof ref) == 0);
}

/* Padding positions hash as EOS; image positions as image_token_id, or EOS
 * without one. */
static void kinds(struct ple_layout l)
{
    const uint32_t seq[4] = {100, 200, 300, 400};
    const uint8_t kind[4] = {PLE_TEXT, PLE_PAD, PLE_IMAGE, PLE_TEXT};
    uint32_t rows[4 * PLE_HEADS], ref[PLE_HEADS];
    for (int with_image = 0; with_image < 2; with_image++) {
        l.image = with_image ? 248056u : PLE_NO_IMAGE;
        const uint32_t eff[4] = {100, EOS, with_image ? 248056u : EOS, 400};
        struct ple_history h;
        ple_history_start(&l, &h);
        CHECK_EQ(ple_hash(&l, seq, kind, 4, &h, rows, NULL), 0);
        for (size_t i = 0; i < 4; i++) {
            reference(&l, eff, i, ref);
            CHECK(memcmp(rows + i * PLE_HEADS, ref, sizeof ref) == 0);
        }
    }
    /* a padded or image position's id is not looked at */
    const uint32_t big[2] = {VOCAB + 5, 7};
    const uint8_t pad[2] = {PLE_PAD, PLE_TEXT};
    struct ple_history h;
    ple_history_start(&l, &h);
    CHECK_EQ(ple_hash(&l, big, pad, 2, &h, rows, NULL), 0);
}

/* Ids >= vocab and bad kinds are refused before anything is written. */
static void refusals(const struct ple_layout *l)
{
    const uint32_t seq[3] = {1, VOCAB, 2};
    uint32_t rows[3 * PLE_HEADS];
    memset(rows, 0xab, sizeof rows);
    struct ple_history h, h0;
    ple_history_start(l, &h);
    h.lag[0] = 42;
    h0 = h;
    engram_error e;
    CHECK_ERR(ple_hash(l, seq, NULL, 3, &h, rows, &e), e, -EINVAL, "248320");
    CHECK_EQ(rows[0], 0xababababu);
    CHECK(memcmp(&h, &h0, sizeof h) == 0);
    const uint8_t bad[3] = {0, 0, 9};
    const uint32_t ok[3] = {1, 2, 3};
    CHECK_ERR(ple_hash(l, ok, bad, 3, &h, rows, &e), e, -EINVAL, "kind");
    CHECK_EQ(rows[0], 0xababababu);
    CHECK_EQ(ple_hash(NULL, ok, NULL, 3, &h, rows, NULL), -EINVAL);
    CHECK_EQ(ple_hash(l, ok, NULL, 0, &h, NULL, NULL), 0);
}

/* A long sequence with EOS, padding and images, hashed in one call and in
 * chunks cut at random points (the history carried): the same rows, each
 * equal to the look-back reference. */
static void chunks(const struct ple_layout *l)
{
    enum { N = 5000 };
    static uint32_t seq[N], eff[N], one[N * PLE_HEADS], cut[N * PLE_HEADS];
    static uint8_t kind[N];
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) {
        uint64_t r = tu_rand(&s);
        seq[i] = (uint32_t)(r % VOCAB);
        if (r % 17 == 0)
            seq[i] = EOS;
        kind[i] = r % 23 == 0 ? PLE_PAD : r % 29 == 0 ? PLE_IMAGE : PLE_TEXT;
        eff[i] = kind[i] == PLE_TEXT ? seq[i] : kind[i] == PLE_PAD ? EOS : l->image;
    }
    struct ple_history h;
    ple_history_start(l, &h);
    CHECK_EQ(ple_hash(l, seq, kind, N, &h, one, NULL), 0);
    for (int round = 0; round < 20; round++) {
        ple_history_start(l, &h);
        for (size_t at = 0; at < N;) {
            size_t k = 1 + tu_rand(&s) % 300;
            if (k > N - at)
                k = N - at;
            CHECK_EQ(ple_hash(l, seq + at, kind + at, k, &h, cut + at * PLE_HEADS, NULL), 0);
            at += k;
        }
        CHECK(memcmp(one, cut, sizeof one) == 0);
    }
    uint32_t ref[PLE_HEADS];
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        reference(l, eff, i, ref);
        bad += memcmp(one + i * PLE_HEADS, ref, sizeof ref) != 0;
        for (int k = 0; k < PLE_HEADS; k++)
            bad += one[i * PLE_HEADS + k] < l->offsets[k] ||
                   one[i * PLE_HEADS + k] >= l->offsets[k] + l->sizes[k];
    }
    CHECK_EQ(bad, 0u);
}

/* Each rule of the layout check, broken once. */
static void layout_rules(const struct ple_layout *good)
{
    struct ple_layout l;
    engram_error e;
    l = *good;
    l.sizes[3] += 1; /* 20000048: even */
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "head_vocab_sizes[3]");
    l = *good;
    l.sizes[15] = 20000175; /* divisible by 5 */
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "head_vocab_sizes[15]");
    l = *good;
    l.offsets[0] = 1;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "head_offsets[0]");
    l = *good;
    l.multipliers[1] += 1;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "even");
    l = *good;
    l.multipliers[2] = ((uint64_t)INT64_MAX / VOCAB + 2) | 1;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "2^63");
    l = *good;
    l.rows += PLE_ROW_ALIGN;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "padded");
    l = *good;
    l.rows = 320001446;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "padded");
    l = *good;
    l.eos = VOCAB;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "eos_token_id");
    l = *good;
    l.image = VOCAB + 1;
    CHECK_ERR(ple_layout_check(&l, &e), e, -EBADMSG, "image_token_id");
    /* heads past int32: sizes from a base near 2^31 */
    CHECK_ERR(ple_layout_generate(0, 2147000000u, VOCAB, EOS, PLE_NO_IMAGE, &l, &e), e, -EINVAL,
              "int32");
    /* a second PLE layer's layout: the next 16 primes, other multipliers,
     * and still valid */
    CHECK_EQ(ple_layout_generate(1, 19999999u, VOCAB, EOS, PLE_NO_IMAGE, &l, NULL), 0);
    CHECK_EQ(l.sizes[0], 20000213u); /* the 17th prime after 19,999,999 (Python, trial division) */
    CHECK(l.multipliers[0] != good->multipliers[0]);
    CHECK_EQ(ple_layout_check(&l, NULL), 0);
}

int main(void)
{
    struct ple_layout l;
    CHECK_EQ(ple_layout_generate(0, 19999999u, VOCAB, EOS, 248056u, &l, NULL), 0);
    known_answers(&l);
    eos_rules(&l);
    kinds(l);
    refusals(&l);
    chunks(&l);
    layout_rules(&l);
    return tu_finish("test_ple");
}
