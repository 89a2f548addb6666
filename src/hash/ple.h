/*
 * ple.h - the hash of the family's second member, Qwen3.8's per-layer
 * embedding (SPEC.md section 10): one table of 16 heads (8 over bigrams,
 * 8 over trigrams) addressed by raw token ids, EOS instead of a dead row.
 * Internal for now (issue #22): the public API will speak of the family
 * once the model file yields this layout; until then the layout is filled
 * by its generator (tools/ple_gen.h) or by hand.
 */
#ifndef ENGRAM_PLE_H
#define ENGRAM_PLE_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define PLE_NGRAM 3          /* current token + 2 previous                */
#define PLE_HEADS 16         /* 8 per order: heads 0-7 bigram, 8-15 trigram */
#define PLE_ROW_VALUES 160   /* BF16 values per row                       */
#define PLE_ROW_BYTES 320
#define PLE_ROW_ALIGN 128    /* rows are padded to a multiple of this     */
#define PLE_NO_IMAGE UINT32_MAX

struct ple_layout {
    uint64_t multipliers[PLE_NGRAM]; /* odd; lag 0 (the current token) first */
    uint32_t sizes[PLE_HEADS];       /* primes                               */
    uint32_t offsets[PLE_HEADS];     /* running sums of the sizes            */
    uint64_t rows;                   /* the table's rows (padded)            */
    uint32_t vocab;                  /* ids >= vocab are refused             */
    uint32_t eos;                    /* < vocab                              */
    uint32_t image;                  /* image_token_id, or PLE_NO_IMAGE      */
};

/* What a position is, for ple_hash: text (its own id), padding (attention
 * mask 0: hashed as EOS) or an image position (image_token_id, or EOS
 * when the layout has none). */
enum ple_kind { PLE_TEXT = 0, PLE_PAD = 1, PLE_IMAGE = 2 };

/* The layout's rules (SPEC 10): sizes prime, offsets the running sum, the
 * heads within rows and within int32, rows a multiple of 128 past the last
 * head by less than 128, multipliers odd and small enough that no product
 * with an id < vocab reaches 2^63 (so int64 floor-mod and uint64 mod
 * agree), eos and image < vocab.  0 or -EBADMSG naming the field. */
int ple_layout_check(const struct ple_layout *l, engram_error *err);

/* The two ids before a sequence's next token, as the hash reads them
 * (lag 1 first).  A sequence starts at {eos, eos}. */
struct ple_history {
    uint32_t lag[PLE_NGRAM - 1];
};
void ple_history_start(const struct ple_layout *l, struct ple_history *h);

/* Rows of n positions: rows[16 i + head], global row ids (offset + hash
 * mod size).  kind may be NULL (all text).  A lag before the start reads
 * EOS (the history), a lag that is an EOS or lies behind one reads EOS;
 * the EOS token keeps its own lags.  h advances over the n positions.
 * 0, or -EINVAL for an id >= vocab at a text position (nothing written,
 * h unchanged). */
int ple_hash(const struct ple_layout *l, const uint32_t *tokens, const uint8_t *kind, size_t n,
             struct ple_history *h, uint32_t *rows, engram_error *err);

#endif
