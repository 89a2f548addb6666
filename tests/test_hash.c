/*
 * test_hash.c - the n-gram hash against an independent full-history oracle.
 *
 * The oracle looks back over the whole token array (no rolling state), forms
 * the products in 128 bits, reduces with the compiler's 128-bit `%` and
 * computes column offsets itself.  Each implementation (scalar, AVX-512) is
 * compared with it; chunking, snapshots, restores and masks must not change
 * a single row id.
 */
#include "hash/hash.h"
#include "testutil.h"

__extension__ typedef unsigned __int128 u128;

struct oracle {
    const engram_layout *l;
    const uint32_t *tokens;
    const uint8_t *mask;
    size_t n;
    engram_history start;   /* history before tokens[0] */
};

/* Compressed id at position i (may be negative: reaches into start). */
static int64_t id_at(const struct oracle *o, long i)
{
    if (i < 0) {
        long k = -i - 1;
        return k < ENGRAM_HISTORY ? o->start.id[k] : -1;
    }
    if (o->mask && !o->mask[i])
        return -1;
    return o->l->token_map[o->tokens[i]];
}

static void oracle_rows(const struct oracle *o, size_t i, uint32_t out[48])
{
    const engram_layout *l = o->l;
    int64_t ids[4];
    int dead = 0;
    for (int j = 0; j < 4; j++) {
        int64_t v = id_at(o, (long)i - j);
        if (v < 0)
            dead = 1;
        ids[j] = dead ? l->pad_id : v;
    }
    for (int t = 0; t < 2; t++) {
        u128 prod = (u128)(uint64_t)ids[0] * l->multipliers[t][0];
        if ((uint64_t)(prod >> 64) != 0)
            fprintf(stderr, "oracle: product overflowed 64 bits\n");
        uint64_t h = (uint64_t)prod;
        uint64_t offset = 0;
        for (int j = 1; j < 4; j++) {
            h ^= (uint64_t)((u128)(uint64_t)ids[j] * l->multipliers[t][j]);
            for (int k = 0; k < 8; k++) {
                uint32_t p = l->primes[t][(j - 1) * 8 + k];
                out[t * 24 + (j - 1) * 8 + k] = (uint32_t)((u128)h % p + offset);
                offset += p;
            }
        }
    }
}

static const engram_simd impls[] = {ENGRAM_SIMD_SCALAR, ENGRAM_SIMD_AVX2, ENGRAM_SIMD_AVX512,
                                    ENGRAM_SIMD_AUTO};

/* Compares every implementation on the stream, in one call, with the oracle. */
static void differential(const engram_hasher *h, const uint32_t *tokens, const uint8_t *mask,
                         size_t n, engram_history start, const char *what)
{
    struct oracle o = {engram_hasher_layout(h), tokens, mask, n, start};
    uint32_t *want = malloc(n * 48 * sizeof *want);
    uint32_t *got = malloc((n * 48 + 16) * sizeof *got);
    for (size_t i = 0; i < n; i++)
        oracle_rows(&o, i, want + i * 48);
    for (size_t k = 0; k < sizeof impls / sizeof impls[0]; k++) {
        if (!engram_simd_supported(impls[k]))
            continue;
        for (size_t i = 0; i < n * 48 + 16; i++)
            got[i] = 0xdeadbeef;
        engram_history hist = start;
        CHECK_EQ(hash_tokens_with(h, impls[k], &hist, tokens, mask, n, got, NULL), 0);
        size_t bad = 0;
        for (size_t i = 0; i < n * 48; i++)
            if (got[i] != want[i] && bad++ < 3)
                fprintf(stderr, "%s/%s: token %zu column %zu: %u, oracle %u\n", what,
                        engram_simd_name(impls[k]), i / 48, i % 48, got[i], want[i]);
        CHECK_EQ(bad, 0);
        for (size_t i = n * 48; i < n * 48 + 16; i++)
            CHECK(got[i] == 0xdeadbeef);
        /* The history after the call is the last 3 positions. */
        for (int j = 0; j < 3; j++)
            CHECK_EQ((int64_t)hist.id[j], id_at(&o, (long)n - 1 - j));
    }
    free(want);
    free(got);
}

/* Barrett reduction: the two inequalities the proof in hash.h rests on, and
 * the inputs where one correction step is needed, for every prime used. */
static void reduction(const engram_layout *l)
{
    uint32_t primes[48 + 8];
    int np = 0;
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 24; c++)
            primes[np++] = l->primes[t][c];
    const uint32_t extra[] = {2, 3, 5, 7, 65521, 646403, 2147483647u, 4294967291u};
    for (int i = 0; i < 8; i++)
        primes[np++] = extra[i];
    uint64_t seed = 99, checked = 0;
    for (int i = 0; i < np; i++) {
        uint32_t p = primes[i];
        uint64_t r = engram_recip(p);
        /* r = floor((2^64 - 1) / p)  =>  r * p <= 2^64 - 1 < (r + 1) * p + p. */
        CHECK((u128)r * p <= (u128)UINT64_MAX);
        CHECK((u128)(r + 1) * p + p > (u128)UINT64_MAX);
        uint64_t kmax = UINT64_MAX / p;
        for (uint64_t d = 0; d < 20000; d++) {
            uint64_t ks[2] = {d, kmax - d};
            for (int s = 0; s < 2; s++) {
                uint64_t k = ks[s];
                uint64_t base = k * p;
                uint64_t hs[3] = {base, base + 1, base - 1};
                for (int q = 0; q < 3; q++) {
                    CHECK_EQ(engram_reduce(hs[q], r, p), hs[q] % p);
                    checked++;
                }
            }
        }
        uint64_t tops[4] = {UINT64_MAX, UINT64_MAX - 1, (uint64_t)1 << 63, ((uint64_t)1 << 63) - 1};
        for (int q = 0; q < 4; q++)
            CHECK_EQ(engram_reduce(tops[q], r, p), tops[q] % p);
        for (int q = 0; q < 200000; q++) {
            uint64_t hv = tu_rand(&seed) >> (tu_rand(&seed) % 64);
            CHECK_EQ(engram_reduce(hv, r, p), hv % p);
            checked++;
        }
    }
    printf("reduction: %llu inputs over %d primes agree with %%\n", (unsigned long long)checked, np);
}

static void make_stream(uint32_t *tokens, uint8_t *mask, size_t n, uint32_t vocab, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        /* A small alphabet so n-grams repeat, plus rare large ids. */
        uint64_t r = tu_rand(&seed);
        tokens[i] = r % 8 == 0 ? (uint32_t)(r >> 8) % vocab : (uint32_t)(r >> 8) % 50;
        mask[i] = 1;
    }
    /* Masks: singles, a run of 5, a masked first token, a masked last token. */
    size_t singles[] = {0, 7, 40, 41, 90, n - 1};
    for (size_t k = 0; k < sizeof singles / sizeof singles[0]; k++)
        if (singles[k] < n)
            mask[singles[k]] = 0;
    for (size_t i = 120; i < 125 && i < n; i++)
        mask[i] = 0;
}

static void chunking(const engram_hasher *h, const uint32_t *tokens, const uint8_t *mask,
                     size_t n)
{
    uint32_t *one = malloc(n * 48 * sizeof *one), *parts = malloc(n * 48 * sizeof *parts);
    engram_history h1;
    engram_history_reset(&h1);
    CHECK_EQ(engram_hash_tokens(h, &h1, tokens, mask, n, one, NULL), 0);
    size_t mismatched = 0;
    for (size_t chunk = 1; chunk <= n; chunk++) {
        engram_history h2;
        engram_history_reset(&h2);
        for (size_t at = 0; at < n; at += chunk) {
            size_t k = n - at < chunk ? n - at : chunk;
            if (chunk == 1) /* the decode-step call */
                CHECK_EQ(engram_hash_token(h, &h2, tokens[at], !mask[at], parts + at * 48), 0);
            else
                CHECK_EQ(engram_hash_tokens(h, &h2, tokens + at, mask + at, k, parts + at * 48, NULL), 0);
        }
        mismatched += memcmp(one, parts, n * 48 * sizeof *one) != 0;
        mismatched += memcmp(&h1, &h2, sizeof h1) != 0;
    }
    CHECK_EQ(mismatched, 0);
    printf("chunking: every chunk size 1..%zu gives the one-call rows\n", n);
    free(one);
    free(parts);
}

static void snapshot_restore(const engram_hasher *h, const uint32_t *tokens, size_t n)
{
    /* No masks here: a restore rebuilds from plain tokens. */
    uint32_t *all = malloc(n * 48 * sizeof *all), *rest = malloc(n * 48 * sizeof *rest);
    engram_history hist;
    engram_history_reset(&hist);
    CHECK_EQ(engram_hash_tokens(h, &hist, tokens, NULL, n, all, NULL), 0);
    for (size_t cut = 0; cut <= n; cut += 7) {
        engram_history a, snap;
        engram_history_reset(&a);
        CHECK_EQ(engram_hash_tokens(h, &a, tokens, NULL, cut, rest, NULL), 0);
        snap = a; /* snapshot = copy */
        engram_history r;
        CHECK_EQ(engram_history_from_tokens(h, &r, tokens, cut), 0);
        CHECK(memcmp(&r, &snap, sizeof r) == 0);
        CHECK_EQ(engram_hash_tokens(h, &r, tokens + cut, NULL, n - cut, rest, NULL), 0);
        CHECK(memcmp(rest, all + cut * 48, (n - cut) * 48 * sizeof *rest) == 0);
        CHECK_EQ(engram_hash_tokens(h, &snap, tokens + cut, NULL, n - cut, rest, NULL), 0);
        CHECK(memcmp(rest, all + cut * 48, (n - cut) * 48 * sizeof *rest) == 0);
    }
    free(all);
    free(rest);
}

/* A masked token hashes exactly as an all-pad n-gram, and kills the history. */
static void masked_is_pad(const engram_hasher *h)
{
    const engram_layout *l = engram_hasher_layout(h);
    engram_history hist = {{5, 6, 7}};
    uint32_t got[48], want[48];
    CHECK_EQ(engram_hash_token(h, &hist, 123, 1, got), 0);
    CHECK(hist.id[0] == ENGRAM_DEAD && hist.id[1] == 5 && hist.id[2] == 6);
    uint32_t tok = 0;
    engram_layout pad_layout = *l;
    uint32_t *map = malloc(l->vocab * sizeof *map);
    for (uint32_t i = 0; i < l->vocab; i++)
        map[i] = l->pad_id; /* every token -> pad: the n-gram [pad, pad, pad, pad] */
    pad_layout.token_map = map;
    engram_hasher *hp;
    CHECK_EQ(engram_hasher_new(&pad_layout, &hp, NULL), 0);
    engram_history hh = {{(int32_t)l->pad_id, (int32_t)l->pad_id, (int32_t)l->pad_id}};
    CHECK_EQ(engram_hash_token(hp, &hh, tok, 0, want), 0);
    CHECK(memcmp(got, want, sizeof got) == 0);
    engram_hasher_free(hp);
    free(map);
}

static void errors(const engram_hasher *h)
{
    const engram_layout *l = engram_hasher_layout(h);
    uint32_t tokens[6] = {1, 2, 3, l->vocab, 4, 5};
    uint32_t rows[6 * 48];
    for (size_t i = 0; i < 6 * 48; i++)
        rows[i] = 0x01020304;
    engram_history hist = {{9, 8, 7}}, before = hist;
    engram_error err;
    int rc = engram_hash_tokens(h, &hist, tokens, NULL, 6, rows, &err);
    CHECK_ERR(rc, err, -EINVAL, "position 3");
    CHECK(memcmp(&hist, &before, sizeof hist) == 0);
    for (size_t i = 0; i < 6 * 48; i++)
        CHECK(rows[i] == 0x01020304);

    int32_t bad_hist[] = {-2, (int32_t)l->compressed_vocab, INT32_MIN, INT32_MAX};
    for (int k = 0; k < 4; k++) {
        engram_history hb = {{1, bad_hist[k], 1}}, hb0 = hb;
        rc = engram_hash_tokens(h, &hb, tokens, NULL, 3, rows, &err);
        CHECK_ERR(rc, err, -EINVAL, "history[1]");
        CHECK(memcmp(&hb, &hb0, sizeof hb) == 0);
        rc = engram_hash_token(h, &hb, 1, 0, rows);
        CHECK_EQ(rc, -EINVAL);
        CHECK(memcmp(&hb, &hb0, sizeof hb) == 0);
    }
    for (size_t i = 0; i < 6 * 48; i++)
        CHECK(rows[i] == 0x01020304);
    engram_history hr = {{1, 2, 3}}, hr0 = hr;
    CHECK_EQ(engram_history_from_tokens(h, &hr, tokens, 4), -EINVAL);
    CHECK(memcmp(&hr, &hr0, sizeof hr) == 0);
    CHECK_EQ(engram_hash_tokens(h, &hr, tokens, NULL, 0, NULL, NULL), 0);
    CHECK(memcmp(&hr, &hr0, sizeof hr) == 0);
}

/* SPEC.md section 5: V4.1 primes from base 16,000,000 and the demo model's. */
static void known_primes(void)
{
    uint32_t p[48];
    CHECK_EQ(engram_layout_primes(16000000, 2, 4, 8, p, 48), 0);
    CHECK_EQ(p[0], 16000057);
    CHECK_EQ(p[1], 16000079);
    CHECK_EQ(p[2], 16000081);
    CHECK_EQ(p[24], 16000477);
    uint64_t s0 = 0, s1 = 0;
    for (int i = 0; i < 24; i++) {
        s0 += p[i];
        s1 += p[24 + i];
    }
    CHECK_EQ(s0, 384006168);
    CHECK_EQ(s1, 384016682);
    uint32_t d[32];
    CHECK_EQ(engram_layout_primes(646400, 2, 3, 8, d, 32), 0);
    CHECK_EQ(d[0], 646403);
    CHECK_EQ(d[1], 646411);
    uint64_t d0 = 0, d1 = 0;
    for (int i = 0; i < 16; i++) {
        d0 += d[i];
        d1 += d[16 + i];
    }
    CHECK_EQ(d0, 10344164);
    CHECK_EQ(d1, 10348242);
    /* All distinct and prime (a naive check, independent of the library's). */
    for (int i = 0; i < 48; i++) {
        int prime = 1;
        for (uint32_t q = 2; (uint64_t)q * q <= p[i] && prime; q++)
            prime = p[i] % q != 0;
        CHECK(prime);
        for (int j = 0; j < i; j++)
            CHECK(p[i] != p[j]);
    }
    CHECK_EQ(engram_layout_primes(16000000, 2, 4, 8, p, 47), -EINVAL);
    /* arguments out of their ranges */
    CHECK_EQ(engram_layout_primes(0, 2, 4, 8, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 0, 4, 8, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 2, 1, 8, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 2, 4, 0, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 65, 2, 1, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 1, 65, 1, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(16000000, 1, 2, 65, p, 48), -EINVAL);
    CHECK_EQ(engram_layout_primes(4294967290u, 2, 4, 8, p, 48), -ERANGE);
}

static void bad_layouts(const engram_layout *good)
{
    engram_hasher *h = (engram_hasher *)0x1;
    engram_error err;
    engram_layout l = *good;
    l.multipliers[1][2] += 1; /* even */
    CHECK_ERR(engram_hasher_new(&l, &h, &err), err, -EBADMSG, "multipliers[1][2]");
    l = *good;
    l.multipliers[0][0] = (uint64_t)INT64_MAX / l.compressed_vocab + 2;
    l.multipliers[0][0] |= 1;
    CHECK_ERR(engram_hasher_new(&l, &h, &err), err, -EBADMSG, "INT64_MAX");
    l = *good;
    l.rows[0] += 1;
    CHECK_ERR(engram_hasher_new(&l, &h, &err), err, -EBADMSG, "sum of primes");
    l = *good;
    l.primes[1][5] = 1;
    CHECK_ERR(engram_hasher_new(&l, &h, &err), err, -EBADMSG, "primes[1][5]");
    l = *good;
    l.pad_id = l.compressed_vocab;
    CHECK_ERR(engram_hasher_new(&l, &h, &err), err, -EBADMSG, "pad_id");
    CHECK(h == (engram_hasher *)0x1);
}

/* NULL arguments: -EINVAL, the history untouched. */
static void null_arguments(const engram_hasher *h)
{
    uint32_t tokens[2] = {1, 2}, rows[2 * 48];
    engram_history hist = {{1, 2, 3}}, before = hist;
    engram_error err;
    CHECK_ERR(engram_hash_tokens(NULL, &hist, tokens, NULL, 2, rows, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_hash_tokens(h, NULL, tokens, NULL, 2, rows, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_hash_tokens(h, &hist, NULL, NULL, 2, rows, &err), err, -EINVAL, "NULL");
    CHECK_ERR(engram_hash_tokens(h, &hist, tokens, NULL, 2, NULL, &err), err, -EINVAL, "NULL");
    CHECK_EQ(engram_history_from_tokens(NULL, &hist, tokens, 2), -EINVAL);
    CHECK_EQ(engram_history_from_tokens(h, NULL, tokens, 2), -EINVAL);
    CHECK_EQ(engram_history_from_tokens(h, &hist, NULL, 2), -EINVAL);
    CHECK(memcmp(&hist, &before, sizeof hist) == 0);
    CHECK_EQ(engram_history_from_tokens(h, &hist, NULL, 0), 0); /* nothing: a reset history */
}

int main(void)
{
    enum { VOCAB = 129280, CVOCAB = 99092, N = 600 };
    static uint32_t map[VOCAB];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, VOCAB, CVOCAB, 16000000), 0);
    engram_hasher *h;
    engram_error err;
    CHECK_EQ(engram_hasher_new(&l, &h, &err), 0);

    known_primes();
    reduction(&l);
    bad_layouts(&l);
    null_arguments(h);

    uint32_t tokens[N];
    uint8_t mask[N];
    make_stream(tokens, mask, N, VOCAB, 3);
    engram_history dead;
    engram_history_reset(&dead);
    engram_history live = {{17, 0, (int32_t)CVOCAB - 1}};
    engram_history partly = {{17, ENGRAM_DEAD, 5}};
    differential(h, tokens, NULL, N, dead, "unmasked");
    differential(h, tokens, mask, N, dead, "masked");
    differential(h, tokens, mask, N, live, "history");
    differential(h, tokens, NULL, N, partly, "dead-in-history");
    differential(h, tokens + 1, mask + 1, 3, live, "short");

    /* Real text: the bundled token stream. */
    FILE *f = fopen("data/gpl3.tok", "r");
    CHECK(f != NULL);
    if (f) {
        uint32_t *real = malloc(20000 * sizeof *real);
        size_t n = 0;
        unsigned v;
        while (n < 20000 && fscanf(f, "%u", &v) == 1)
            real[n++] = v;
        fclose(f);
        CHECK(n > 2000);
        differential(h, real, NULL, n, dead, "gpl3");
        free(real);
    }
    chunking(h, tokens, mask, 300);
    snapshot_restore(h, tokens, 200);
    masked_is_pad(h);
    errors(h);
    engram_hasher_free(h);
    engram_hasher_free(NULL);
    return tu_finish("test_hash");
}
