/* hash.c - rolling multiply-xor hash of the last 4 compressed ids into
 * 24 row ids per table (SPEC.md section 6). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "common/util.h"

static hash_ngram_fn impl_for(engram_simd s);

int engram_hasher_new(const engram_layout *layout, engram_hasher **out, engram_error *err)
{
    if (!layout || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = engram_layout_validate(layout, err);
    if (rc < 0)
        return rc;
    struct engram_hasher *h = calloc(1, sizeof *h);
    uint32_t *map = malloc((size_t)layout->vocab * sizeof *map);
    if (!h || !map) {
        free(h);
        free(map);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    memcpy(map, layout->token_map, (size_t)layout->vocab * sizeof *map);
    h->ngram = impl_for(ENGRAM_SIMD_AUTO);
    h->layout = *layout;
    h->layout.token_map = map;
    h->map = map;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        uint32_t off = 0;
        for (int c = 0; c < ENGRAM_COLUMNS; c++) {
            h->recip[t][c] = engram_recip(layout->primes[t][c]);
            h->offset[t][c] = off;
            off += layout->primes[t][c]; /* sum == rows[t] < 2^32, validated */
        }
    }
    *out = h;
    return 0;
}

void engram_hasher_free(engram_hasher *h)
{
    if (!h)
        return;
    free(h->map);
    free(h);
}

const engram_layout *engram_hasher_layout(const engram_hasher *h)
{
    return h ? &h->layout : NULL;
}

void engram_history_reset(engram_history *hist)
{
    if (!hist)
        return;
    for (int i = 0; i < ENGRAM_HISTORY; i++)
        hist->id[i] = ENGRAM_DEAD;
}

void hash_ngram_scalar(const struct engram_hasher *h, const uint64_t ids[ENGRAM_NGRAM],
                       uint32_t *restrict out)
{
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const uint64_t *m = h->layout.multipliers[t];
        uint64_t x = ids[0] * m[0];
        for (int j = 1; j < ENGRAM_NGRAM; j++) {
            x ^= ids[j] * m[j];
            int c0 = (j - 1) * ENGRAM_HEADS;
            for (int k = 0; k < ENGRAM_HEADS; k++) {
                int c = c0 + k;
                out[t * ENGRAM_COLUMNS + c] =
                    engram_reduce(x, h->recip[t][c], h->layout.primes[t][c]) + h->offset[t][c];
            }
        }
    }
}

static int check_history(const struct engram_hasher *h, const engram_history *hist,
                         engram_error *err)
{
    for (int i = 0; i < ENGRAM_HISTORY; i++) {
        int32_t v = hist->id[i];
        if (v != ENGRAM_DEAD && (v < 0 || (uint32_t)v >= h->layout.compressed_vocab))
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "history[%d] = %d is neither -1 nor a compressed id < %u", i, v,
                           h->layout.compressed_vocab);
    }
    return 0;
}

static hash_ngram_fn impl_for(engram_simd s)
{
    if (s == ENGRAM_SIMD_AUTO)
        s = engram_simd_selected();
    if (s == ENGRAM_SIMD_SCALAR)
        return hash_ngram_scalar;
    if (!hash_avx512_built() || !engram_simd_supported(s))
        return NULL;
    if (s == ENGRAM_SIMD_AVX512)
        return hash_ngram_avx512;
    if (s == ENGRAM_SIMD_AVX2)
        return hash_ngram_avx2;
    return NULL;
}

int engram_hash_tokens(const engram_hasher *h, engram_history *hist, const uint32_t *tokens,
                       const uint8_t *mask, size_t n, uint32_t *rows, engram_error *err)
{
    return hash_tokens_with(h, ENGRAM_SIMD_AUTO, hist, tokens, mask, n, rows, err);
}

int hash_tokens_with(const engram_hasher *h, engram_simd s, engram_history *hist,
                     const uint32_t *tokens, const uint8_t *mask, size_t n, uint32_t *rows,
                     engram_error *err)
{
    hash_ngram_fn ngram = s == ENGRAM_SIMD_AUTO && h ? h->ngram : impl_for(s);
    if (!ngram)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "hash implementation %s unavailable",
                       engram_simd_name(s));
    if (!h || !hist || (n > 0 && (!tokens || !rows)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = check_history(h, hist, err);
    if (rc < 0)
        return rc;
    const uint32_t vocab = h->layout.vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "token %u at position %zu is not < vocab %u", tokens[i], i, vocab);

    /* Walking from the newest id back, the first dead one latches: it and
     * everything older hash as pad. */
    int32_t ids[ENGRAM_NGRAM] = {0, hist->id[0], hist->id[1], hist->id[2]};
    const uint32_t *map = h->map;
    const uint64_t pad = h->layout.pad_id;
    for (size_t i = 0; i < n; i++) {
        ids[0] = (mask && !mask[i]) ? ENGRAM_DEAD : (int32_t)map[tokens[i]];
        uint64_t v[ENGRAM_NGRAM];
        int dead = 0;
        for (int j = 0; j < ENGRAM_NGRAM; j++) {
            dead |= ids[j] < 0;
            v[j] = dead ? pad : (uint64_t)ids[j];
        }
        ngram(h, v, rows + i * ENGRAM_ROWS_PER_TOKEN);
        ids[3] = ids[2];
        ids[2] = ids[1];
        ids[1] = ids[0];
    }
    hist->id[0] = ids[1];
    hist->id[1] = ids[2];
    hist->id[2] = ids[3];
    return 0;
}

int engram_hash_token(const engram_hasher *h, engram_history *hist, uint32_t token, int masked,
                      uint32_t rows[ENGRAM_ROWS_PER_TOKEN])
{
    uint8_t m = masked ? 0 : 1;
    return engram_hash_tokens(h, hist, &token, &m, 1, rows, NULL);
}

int engram_history_from_tokens(const engram_hasher *h, engram_history *hist,
                               const uint32_t *tokens, size_t n)
{
    if (!h || !hist || (n > 0 && !tokens))
        return -EINVAL;
    size_t k = n < ENGRAM_HISTORY ? n : ENGRAM_HISTORY;
    for (size_t i = 0; i < k; i++)
        if (tokens[n - 1 - i] >= h->layout.vocab)
            return -EINVAL;
    engram_history_reset(hist);
    for (size_t i = 0; i < k; i++)
        hist->id[i] = (int32_t)h->map[tokens[n - 1 - i]];
    return 0;
}
