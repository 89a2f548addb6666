/*
 * layout_gen.c - generating a layout (SPEC.md section 5): the multipliers,
 * numpy's default_rng(10007 * layer).integers(0, half, n) reproduced
 * without numpy (SeedSequence -> PCG64 -> Lemire's bounded integers), then
 * 2r + 1; and the primes, by the shared-`seen` allocation.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "engram_tools.h"
#include "format/layout.h"
#include "common/util.h"


__extension__ typedef unsigned __int128 u128;

/* ------------------------------------------------------------ SeedSequence */

struct hashmix {
    uint32_t hc;
};

static uint32_t hashmix(struct hashmix *h, uint32_t v)
{
    v ^= h->hc;
    h->hc *= 0x931e8875u;
    v *= h->hc;
    return v ^ (v >> 16);
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t r = 0xca01f9ddu * x - 0x4973f715u * y;
    return r ^ (r >> 16);
}

/* SeedSequence(entropy).generate_state(4, uint64), for entropy < 2^64. */
static void seed_sequence(uint64_t entropy, uint64_t s[4])
{
    uint32_t words[4] = {0, 0, 0, 0};
    int n_words = 0;
    do {
        words[n_words++] = (uint32_t)entropy;
        entropy >>= 32;
    } while (entropy != 0);
    struct hashmix h = {0x43b0d7e5u};
    uint32_t pool[4];
    for (int i = 0; i < 4; i++)
        pool[i] = hashmix(&h, i < n_words ? words[i] : 0);
    for (int src = 0; src < 4; src++)
        for (int dst = 0; dst < 4; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(&h, pool[src]));
    uint32_t hc2 = 0x8b51f9ddu, st[8];
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4] ^ hc2;
        hc2 *= 0x58f38dedu;
        v *= hc2;
        st[i] = v ^ (v >> 16);
    }
    for (int i = 0; i < 4; i++)
        s[i] = (uint64_t)st[2 * i] | (uint64_t)st[2 * i + 1] << 32;
}

/* ------------------------------------------------------------ PCG64 */

struct pcg64 {
    u128 state, inc;
};

static void pcg_step(struct pcg64 *p)
{
    const u128 mult = (u128)0x2360ED051FC65DA4ull << 64 | 0x4385DF649FCCF645ull;
    p->state = p->state * mult + p->inc;
}

static void pcg_seed(struct pcg64 *p, const uint64_t s[4])
{
    u128 initstate = (u128)s[0] << 64 | s[1];
    u128 initseq = (u128)s[2] << 64 | s[3];
    p->inc = initseq << 1 | 1;
    p->state = 0;
    pcg_step(p);
    p->state += initstate;
    pcg_step(p);
}

static uint64_t pcg_next64(struct pcg64 *p)
{
    pcg_step(p);
    uint64_t x = (uint64_t)(p->state >> 64) ^ (uint64_t)p->state;
    unsigned rot = (unsigned)(p->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

/* integers(0, high) for high > 2^32: Lemire's multiply-and-reject. */
static uint64_t pcg_below(struct pcg64 *p, uint64_t high)
{
    u128 m = (u128)pcg_next64(p) * high;
    if ((uint64_t)m < high) {
        uint64_t t = (0 - high) % high;
        while ((uint64_t)m < t)
            m = (u128)pcg_next64(p) * high;
    }
    return (uint64_t)(m >> 64);
}

int engram_layout_multipliers(uint32_t compressed_vocab, uint32_t layer, int n, uint64_t *out)
{
    if (compressed_vocab == 0 || compressed_vocab > ENGRAM_MAX_VOCAB || n < 1 || n > 64 || !out)
        return -EINVAL;
    uint64_t bound = (uint64_t)INT64_MAX / compressed_vocab, half = bound / 2;
    /* V' <= 2^24 keeps half above 2^32, the range numpy draws 64 bits for. */
    uint64_t s[4];
    seed_sequence(10007ull * layer, s);
    struct pcg64 p;
    pcg_seed(&p, s);
    for (int i = 0; i < n; i++)
        out[i] = 2 * pcg_below(&p, half) + 1;
    return 0;
}

/* ------------------------------------------------------------ primes */

int engram_layout_primes(uint32_t base, int n_layers, int ngram, int heads,
                         uint32_t *out, size_t out_len)
{
    if (!out || n_layers < 1 || ngram < 2 || heads < 1 || n_layers > 64 || ngram > 64 ||
        heads > 64 || base < 1)
        return -EINVAL;
    size_t total = (size_t)n_layers * (size_t)(ngram - 1) * (size_t)heads;
    if (out_len < total)
        return -EINVAL;
    size_t k = 0;
    for (int layer = 0; layer < n_layers; layer++)
        for (int n = 2; n <= ngram; n++) {
            uint64_t cur = (uint64_t)base - 1;
            for (int h = 0; h < heads; h++) {
                for (;;) {
                    cur++;
                    if (cur > UINT32_MAX)
                        return -ERANGE;
                    if (!util_is_prime_u32((uint32_t)cur))
                        continue;
                    int seen = 0;
                    for (size_t i = 0; i < k && !seen; i++)
                        seen = out[i] == cur;
                    if (!seen)
                        break;
                }
                out[k++] = (uint32_t)cur;
            }
        }
    return 0;
}
