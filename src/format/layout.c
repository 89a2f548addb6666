/* layout.c - layout keys: reading, the validation rules of SPEC.md section 3,
 * and the prime allocation of section 5. */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "layout.h"
#include "common/util.h"

/* Validates; *key receives the metadata key the failing rule is about. */
static int layout_check(const engram_layout *l, engram_error *err, const char **key)
{
    *key = NULL;
    if (!l || !l->token_map)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "layout has no token map");
    *key = ENGRAM_ARCH ".engram.compressed_vocab_size";
    if (l->compressed_vocab == 0 || l->compressed_vocab > ENGRAM_MAX_VOCAB)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "compressed_vocab_size %u is not in 1..%u",
                       l->compressed_vocab, ENGRAM_MAX_VOCAB);
    *key = ENGRAM_ARCH ".engram.token_map";
    if (l->vocab == 0 || l->vocab > ENGRAM_MAX_VOCAB)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "token_map length %u is not in 1..%u",
                       l->vocab, ENGRAM_MAX_VOCAB);
    *key = ENGRAM_ARCH ".engram.pad_id";
    if (l->pad_id >= l->compressed_vocab)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "pad_id %u is not < compressed vocab %u",
                       l->pad_id, l->compressed_vocab);
    /* id * m must not overflow a signed 64-bit product for any id < V'. */
    uint64_t bound = (uint64_t)INT64_MAX / l->compressed_vocab;
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        *key = ENGRAM_ARCH ".engram.multipliers";
        for (int j = 0; j < ENGRAM_NGRAM; j++) {
            uint64_t m = l->multipliers[t][j];
            if ((m & 1) == 0 || m > bound)
                return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                               "multipliers[%d][%d] = %llu must be odd and <= INT64_MAX / V' = %llu",
                               t, j, (unsigned long long)m, (unsigned long long)bound);
        }
        uint64_t sum = 0;
        *key = ENGRAM_ARCH ".engram.primes";
        for (int c = 0; c < ENGRAM_COLUMNS; c++) {
            if (l->primes[t][c] < 2)
                return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "primes[%d][%d] = %u is < 2", t,
                               c, l->primes[t][c]);
            sum += l->primes[t][c];
        }
        *key = ENGRAM_ARCH ".engram.rows";
        if (sum != l->rows[t])
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "table %d: sum of primes %llu != rows %u", t,
                           (unsigned long long)sum, l->rows[t]);
    }
    *key = ENGRAM_ARCH ".engram.token_map";
    for (uint32_t i = 0; i < l->vocab; i++)
        if (l->token_map[i] >= l->compressed_vocab)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "token_map[%u] = %u is not < compressed vocab %u", i,
                           l->token_map[i], l->compressed_vocab);
    *key = NULL;
    return 0;
}

int engram_layout_validate(const engram_layout *l, engram_error *err)
{
    const char *key;
    return layout_check(l, err, &key);
}

static int need_kv(const gguf_file *g, const char *key, uint32_t type, const gguf_kv **out,
                   engram_error *err)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "missing key '%s'", key);
    if (kv->type != type)
        return err_set(err, -EBADMSG, kv->key_offset,
                       "key '%s' at offset %llu: type %s, expected %s", key,
                       (unsigned long long)kv->key_offset, gguf_vtype_name(kv->type),
                       gguf_vtype_name(type));
    *out = kv;
    return 0;
}

int layout_from_gguf(const gguf_file *g, engram_layout *out, uint32_t **map_out,
                     engram_error *err)
{
    const gguf_kv *kv;
    const gguf_kv *arch = gguf_find_kv(g, "general.architecture");
    if (!arch || arch->type != GGUF_STRING || strcmp(arch->str, ENGRAM_ARCH) != 0)
        return err_set(err, -ENOTSUP, arch ? arch->key_offset : ENGRAM_NO_OFFSET,
                       "general.architecture is %s%s%s, expected '" ENGRAM_ARCH
                       "' (the ds4 dialect; the llama.cpp dialect is not supported)",
                       arch && arch->type == GGUF_STRING ? "'" : "",
                       !arch ? "missing" : arch->type == GGUF_STRING ? arch->str : "not a string",
                       arch && arch->type == GGUF_STRING ? "'" : "");
    int rc;
    if ((rc = need_kv(g, ENGRAM_ARCH ".engram.encoding", GGUF_STRING, &kv, err)) < 0)
        return rc;
    if (strcmp(kv->str, ENGRAM_ENCODING) != 0)
        return err_set(err, -ENOTSUP, kv->key_offset,
                       "key '" ENGRAM_ARCH ".engram.encoding' at offset %llu: '%s', expected '"
                       ENGRAM_ENCODING "'", (unsigned long long)kv->key_offset, kv->str);

    engram_layout l;
    memset(&l, 0, sizeof l);
    if ((rc = need_kv(g, ENGRAM_ARCH ".engram.compressed_vocab_size", GGUF_U32, &kv, err)) < 0)
        return rc;
    l.compressed_vocab = (uint32_t)kv->u;
    if ((rc = need_kv(g, ENGRAM_ARCH ".engram.pad_id", GGUF_U32, &kv, err)) < 0)
        return rc;
    l.pad_id = (uint32_t)kv->u;

    const char *arrays[3] = {ENGRAM_ARCH ".engram.rows", ENGRAM_ARCH ".engram.primes",
                             ENGRAM_ARCH ".engram.multipliers"};
    const uint32_t types[3] = {GGUF_U32, GGUF_U32, GGUF_U64};
    const uint64_t counts[3] = {ENGRAM_TABLES, ENGRAM_TABLES * ENGRAM_COLUMNS,
                                ENGRAM_TABLES * ENGRAM_NGRAM};
    void *dst[3] = {l.rows, l.primes, l.multipliers};
    for (int i = 0; i < 3; i++) {
        if ((rc = need_kv(g, arrays[i], GGUF_ARRAY, &kv, err)) < 0 ||
            (rc = gguf_read_array(g, kv, types[i], counts[i], dst[i], err)) < 0)
            return rc;
    }

    if ((rc = need_kv(g, ENGRAM_ARCH ".engram.token_map", GGUF_ARRAY, &kv, err)) < 0)
        return rc;
    if (kv->arr_type != GGUF_U32 || kv->arr_count == 0 || kv->arr_count > ENGRAM_MAX_VOCAB)
        return err_set(err, -EBADMSG, kv->key_offset,
                       "key '" ENGRAM_ARCH ".engram.token_map' at offset %llu: expected 1..%u u32 entries, found %llu of %s",
                       (unsigned long long)kv->key_offset, ENGRAM_MAX_VOCAB,
                       (unsigned long long)kv->arr_count, gguf_vtype_name(kv->arr_type));
    l.vocab = (uint32_t)kv->arr_count;
    uint32_t *map = malloc((size_t)l.vocab * sizeof *map);
    if (!map)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for the token map");
    if ((rc = gguf_read_array(g, kv, GGUF_U32, l.vocab, map, err)) < 0) {
        free(map);
        return rc;
    }
    l.token_map = map;
    const char *key = NULL;
    if ((rc = layout_check(&l, err, &key)) < 0) {
        const gguf_kv *bad = key ? gguf_find_kv(g, key) : NULL;
        if (err && bad) {
            char msg[2 * sizeof err->msg];
            snprintf(msg, sizeof msg, "key '%s' at offset %llu: %s", key,
                     (unsigned long long)bad->key_offset, err->msg);
            size_t len = strlen(msg);
            len = len < sizeof err->msg ? len : sizeof err->msg - 1;
            memcpy(err->msg, msg, len);
            err->msg[len] = '\0';
            err->offset = bad->key_offset;
        }
        free(map);
        return rc;
    }
    *out = l;
    *map_out = map;
    return 0;
}
