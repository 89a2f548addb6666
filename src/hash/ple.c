/* ple.c - the PLE member's hash and layout rules (see ple.h, SPEC 10). */
#include <errno.h>

#include "ple.h"
#include "common/util.h"

int ple_layout_check(const struct ple_layout *l, engram_error *err)
{
    if (!l)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL layout");
    if (l->vocab < 2 || l->eos >= l->vocab)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "eos_token_id %u is not below the vocabulary (%u)",
                       l->eos, l->vocab);
    if (l->image != PLE_NO_IMAGE && l->image >= l->vocab)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "image_token_id %u is not below the vocabulary (%u)",
                       l->image, l->vocab);
    for (int i = 0; i < PLE_NGRAM; i++) {
        if (!(l->multipliers[i] & 1))
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "layer_multipliers[%d] = %llu is even", i,
                           (unsigned long long)l->multipliers[i]);
        if (l->multipliers[i] > (uint64_t)INT64_MAX / l->vocab)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "layer_multipliers[%d] = %llu: a product with an id below %u would reach 2^63",
                           i, (unsigned long long)l->multipliers[i], l->vocab);
    }
    uint64_t at = 0;
    for (int h = 0; h < PLE_HEADS; h++) {
        if (l->offsets[h] != at)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "head_offsets[%d] = %u is not the running sum of the sizes (%llu)", h,
                           l->offsets[h], (unsigned long long)at);
        if (!util_is_prime_u32(l->sizes[h]))
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "head_vocab_sizes[%d] = %u is not prime", h,
                           l->sizes[h]);
        at += l->sizes[h];
        if (at > (uint64_t)INT32_MAX)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "head %d ends at row %llu, past int32", h,
                           (unsigned long long)at);
    }
    if (l->rows < at || l->rows - at >= PLE_ROW_ALIGN || l->rows % PLE_ROW_ALIGN)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                       "the table has %llu rows; the heads need %llu, padded to a multiple of %u",
                       (unsigned long long)l->rows, (unsigned long long)at, PLE_ROW_ALIGN);
    return 0;
}

void ple_history_start(const struct ple_layout *l, struct ple_history *h)
{
    for (int i = 0; i < PLE_NGRAM - 1; i++)
        h->lag[i] = l->eos;
}

/* The id the hash reads at a position. */
static uint32_t effective(const struct ple_layout *l, uint32_t t, uint8_t kind)
{
    if (kind == PLE_PAD)
        return l->eos;
    if (kind == PLE_IMAGE)
        return l->image != PLE_NO_IMAGE ? l->image : l->eos;
    return t;
}

int ple_hash(const struct ple_layout *l, const uint32_t *tokens, const uint8_t *kind, size_t n,
             struct ple_history *h, uint32_t *rows, engram_error *err)
{
    if (!l || !h || (n > 0 && (!tokens || !rows)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    for (size_t i = 0; i < n; i++) {
        uint8_t k = kind ? kind[i] : PLE_TEXT;
        if (k > PLE_IMAGE)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "position %zu: kind %u", i, k);
        if (k == PLE_TEXT && tokens[i] >= l->vocab)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "position %zu: token %u >= vocabulary %u", i,
                           tokens[i], l->vocab);
    }
    uint32_t t1 = h->lag[0], t2 = h->lag[1];
    for (size_t i = 0; i < n; i++) {
        uint32_t t0 = effective(l, tokens[i], kind ? kind[i] : PLE_TEXT);
        if (t1 == l->eos) /* lag 2 lies behind an EOS */
            t2 = l->eos;
        uint64_t a = (uint64_t)t0 * l->multipliers[0] ^ (uint64_t)t1 * l->multipliers[1];
        uint64_t b = a ^ (uint64_t)t2 * l->multipliers[2];
        for (int k = 0; k < PLE_HEADS; k++)
            rows[i * PLE_HEADS + (size_t)k] =
                l->offsets[k] + (uint32_t)((k < PLE_HEADS / 2 ? a : b) % l->sizes[k]);
        t2 = t1;
        t1 = t0;
    }
    h->lag[0] = t1;
    h->lag[1] = t2;
    return 0;
}
