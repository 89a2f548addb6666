/* ple_file.c - the qwen4exp file's PLE keys and tensors (see ple_file.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ple_file.h"
#include "common/util.h"

#define KEY(k) PLE_ARCH ".ple." k

static int is_int_type(uint32_t t)
{
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 ||
           t == GGUF_I32 || t == GGUF_U64 || t == GGUF_I64;
}

static int is_signed(uint32_t t)
{
    return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

static int missing(const char *key, engram_error *err)
{
    return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "missing key '%s'", key);
}

/* An integer scalar key, any integer type, in [lo, hi]. */
static int int_key(const gguf_file *g, const char *key, uint64_t lo, uint64_t hi, int required,
                   uint64_t *out, engram_error *err)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return required ? missing(key, err) : 1;
    if (!is_int_type(kv->type))
        return err_set(err, -EBADMSG, kv->key_offset, "key '%s' at offset %llu: type %s, expected an integer",
                       key, (unsigned long long)kv->key_offset, gguf_vtype_name(kv->type));
    if ((is_signed(kv->type) && kv->i < 0) || kv->u < lo || kv->u > hi)
        return err_set(err, -EBADMSG, kv->value_offset,
                       "key '%s' at offset %llu: %lld is not in %llu..%llu", key,
                       (unsigned long long)kv->value_offset,
                       is_signed(kv->type) ? (long long)kv->i : (long long)kv->u,
                       (unsigned long long)lo, (unsigned long long)hi);
    *out = kv->u;
    return 0;
}

/* An integer array key of exactly n elements (any integer type), each read
 * as an unsigned 64-bit value; negative elements are refused. */
static int int_array(const gguf_file *g, const char *key, uint64_t n, uint64_t *out, engram_error *err)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return missing(key, err);
    if (kv->type != GGUF_ARRAY || !is_int_type(kv->arr_type) || kv->arr_count != n)
        return err_set(err, -EBADMSG, kv->key_offset,
                       "key '%s' at offset %llu: expected an array of %llu integers", key,
                       (unsigned long long)kv->key_offset, (unsigned long long)n);
    uint64_t raw[PLE_HEADS];
    int rc = gguf_read_array(g, kv, kv->arr_type, n, raw, err);
    if (rc < 0)
        return rc;
    const uint8_t *b = (const uint8_t *)raw;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        switch (kv->arr_type) {
        case GGUF_U8: v = b[i]; break;
        case GGUF_I8: v = (int8_t)b[i]; break;
        case GGUF_U16: { uint16_t x; memcpy(&x, b + 2 * i, 2); v = x; break; }
        case GGUF_I16: { int16_t x; memcpy(&x, b + 2 * i, 2); v = x; break; }
        case GGUF_U32: { uint32_t x; memcpy(&x, b + 4 * i, 4); v = x; break; }
        case GGUF_I32: { int32_t x; memcpy(&x, b + 4 * i, 4); v = x; break; }
        default: { memcpy(&v, b + 8 * i, 8); break; }
        }
        if (v < 0 && kv->arr_type != GGUF_U64)
            return err_set(err, -EBADMSG, kv->value_offset, "key '%s' at offset %llu: element %llu is negative",
                           key, (unsigned long long)kv->value_offset, (unsigned long long)i);
        out[i] = (uint64_t)v;
    }
    return 0;
}

static int layout_keys(const gguf_file *g, struct ple_file *f, engram_error *err)
{
    uint64_t v, m[PLE_NGRAM], off[PLE_HEADS], sz[PLE_HEADS];
    int rc;
    if ((rc = int_key(g, KEY("ngram_size"), PLE_NGRAM, PLE_NGRAM, 1, &v, err)) < 0 ||
        (rc = int_key(g, KEY("heads_per_ngram"), PLE_HEADS / 2, PLE_HEADS / 2, 1, &v, err)) < 0 ||
        (rc = int_key(g, KEY("conv_kernel"), 1, 16, 1, &v, err)) < 0)
        return rc;
    f->conv_kernel = (uint32_t)v;
    if ((rc = int_array(g, KEY("layers"), 1, &v, err)) < 0)
        return rc;
    if (v > 4096)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "key '%s': layer %llu", KEY("layers"),
                       (unsigned long long)v);
    f->layer = (uint32_t)v;
    /* the vocabulary: its own key, else the tokenizer's token list */
    const gguf_kv *tok = gguf_find_kv(g, "tokenizer.ggml.tokens");
    rc = int_key(g, PLE_ARCH ".vocab_size", 2, UINT32_MAX - 1, 0, &v, err);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        if (!tok || tok->type != GGUF_ARRAY || tok->arr_count < 2 || tok->arr_count >= UINT32_MAX)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "no vocabulary: neither '%s' nor a token list 'tokenizer.ggml.tokens'",
                           PLE_ARCH ".vocab_size");
        v = tok->arr_count;
    }
    f->layout.vocab = (uint32_t)v;
    if ((rc = int_key(g, KEY("eos_token_id"), 0, f->layout.vocab - 1, 1, &v, err)) < 0)
        return rc;
    f->layout.eos = (uint32_t)v;
    rc = int_key(g, KEY("image_token_id"), 0, f->layout.vocab - 1, 0, &v, err);
    if (rc < 0)
        return rc;
    f->layout.image = rc == 1 ? PLE_NO_IMAGE : (uint32_t)v;
    if ((rc = int_array(g, KEY("layer_multipliers"), PLE_NGRAM, m, err)) < 0 ||
        (rc = int_array(g, KEY("head_offsets"), PLE_HEADS, off, err)) < 0 ||
        (rc = int_array(g, KEY("head_vocab_sizes"), PLE_HEADS, sz, err)) < 0)
        return rc;
    for (int h = 0; h < PLE_HEADS; h++) {
        if (off[h] > INT32_MAX || sz[h] > INT32_MAX || off[h] + sz[h] > INT32_MAX)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "head %d: rows [%llu, +%llu) do not fit int32 ('%s', '%s')", h,
                           (unsigned long long)off[h], (unsigned long long)sz[h], KEY("head_offsets"),
                           KEY("head_vocab_sizes"));
        f->layout.offsets[h] = (uint32_t)off[h];
        f->layout.sizes[h] = (uint32_t)sz[h];
    }
    for (int j = 0; j < PLE_NGRAM; j++)
        f->layout.multipliers[j] = m[j];
    return 0;
}

/* Tensor `name`: present, of n dims with dims d, of one of the types. */
static int need_tensor(const gguf_file *g, const char *name, uint32_t n, const uint64_t *d,
                       const uint32_t *types, int ntypes, const gguf_tensor **out, engram_error *err)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "missing tensor '%s'", name);
    int ok = 0;
    for (int i = 0; i < ntypes; i++)
        ok |= t->type == types[i];
    if (!ok) {
        const char *tn = ggml_type_name(t->type);
        return err_set(err, -EBADMSG, t->info_offset, "tensor '%s' at offset %llu: type %s is not accepted%s",
                       name, (unsigned long long)t->info_offset, tn ? tn : "unknown",
                       types[0] == GGML_BF16 && ntypes == 1 ? " (the table must be BF16; quantized or"
                                                              " converted tables are refused)" : "");
    }
    int same = t->n_dims == n;
    for (uint32_t i = 0; i < n && same; i++)
        same = t->dims[i] == d[i];
    if (!same) {
        char want[96], got[96];
        int a = 0, b = 0;
        for (uint32_t i = 0; i < n; i++)
            a += snprintf(want + a, sizeof want - (size_t)a, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
        for (uint32_t i = 0; i < t->n_dims && i < GGUF_MAX_DIMS; i++)
            b += snprintf(got + b, sizeof got - (size_t)b, i ? ", %llu" : "%llu", (unsigned long long)t->dims[i]);
        return err_set(err, -EBADMSG, t->info_offset, "tensor '%s' at offset %llu: shape [%s], expected [%s]",
                       name, (unsigned long long)t->info_offset, got, want);
    }
    *out = t;
    return 0;
}

static int tensors(const gguf_file *g, struct ple_file *f, engram_error *err)
{
    static const uint32_t bf16[] = {GGML_BF16};
    static const uint32_t weights[] = {GGML_BF16, GGML_F16, GGML_F32};
    static const uint32_t f32[] = {GGML_F32};
    const uint64_t e = (uint64_t)PLE_HEADS * PLE_ROW_VALUES;
    int rc;
    uint64_t d[2] = {PLE_ROW_VALUES, f->layout.rows};
    /* the table's rows come from its shape; the layout is checked after */
    const gguf_tensor *t = gguf_find_tensor(g, "per_layer_token_embd.weight");
    if (t && t->n_dims == 2)
        d[1] = f->layout.rows = t->dims[1];
    if ((rc = need_tensor(g, "per_layer_token_embd.weight", 2, d, bf16, 1, &f->table, err)) < 0)
        return rc;
    char name[96];
    snprintf(name, sizeof name, "blk.%u.ple_value.weight", f->layer);
    const gguf_tensor *v = gguf_find_tensor(g, name);
    if (!v || v->n_dims != 2 || v->dims[1] == 0 || v->dims[1] > ENGRAM_MAX_WIDTH)
        return err_set(err, -EBADMSG, v ? v->info_offset : ENGRAM_NO_OFFSET,
                       "tensor '%s': missing, or not [%llu, W] with W in 1..%u", name,
                       (unsigned long long)e, ENGRAM_MAX_WIDTH);
    f->width = (uint32_t)v->dims[1];
    const uint64_t w4 = (uint64_t)PLE_STREAMS * f->width;
    d[0] = e;
    d[1] = f->width;
    if ((rc = need_tensor(g, name, 2, d, weights, 3, &f->value, err)) < 0)
        return rc;
    snprintf(name, sizeof name, "blk.%u.ple_key.weight", f->layer);
    d[1] = w4;
    if ((rc = need_tensor(g, name, 2, d, weights, 3, &f->key, err)) < 0)
        return rc;
    static const char *const norms[3] = {"key", "query", "conv"};
    const gguf_tensor **nt[3] = {&f->norm_key, &f->norm_query, &f->norm_conv};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%u.ple_norm_%s.weight", f->layer, norms[i]);
        if ((rc = need_tensor(g, name, 1, &w4, f32, 1, nt[i], err)) < 0)
            return rc;
    }
    snprintf(name, sizeof name, "blk.%u.ple_conv1d.weight", f->layer);
    d[0] = f->conv_kernel;
    d[1] = w4;
    return need_tensor(g, name, 2, d, f32, 1, &f->conv, err);
}

int ple_file_read(const gguf_file *g, struct ple_file *out, engram_error *err)
{
    if (!g || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    const gguf_kv *arch = gguf_find_kv(g, "general.architecture");
    if (!arch || arch->type != GGUF_STRING || strcmp(arch->str, PLE_ARCH) != 0)
        return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET, "not a %s file (general.architecture is '%s')",
                       PLE_ARCH, arch && arch->type == GGUF_STRING ? arch->str : "absent");
    struct ple_file f;
    memset(&f, 0, sizeof f);
    uint64_t v;
    int rc = layout_keys(g, &f, err);
    if (rc < 0)
        return rc;
    if ((rc = int_key(g, PLE_ARCH ".embedding_length_per_layer_input", PLE_ROW_VALUES, PLE_ROW_VALUES, 1,
                      &v, err)) < 0)
        return rc;
    const gguf_kv *eps = gguf_find_kv(g, PLE_ARCH ".attention.layer_norm_rms_epsilon");
    if (!eps)
        return missing(PLE_ARCH ".attention.layer_norm_rms_epsilon", err);
    if (eps->type != GGUF_F32 || !(eps->f > 0 && eps->f < 1))
        return err_set(err, -EBADMSG, eps->key_offset, "key '%s' at offset %llu: not an F32 in (0, 1)",
                       eps->key, (unsigned long long)eps->key_offset);
    f.eps = (float)eps->f;
    if ((rc = tensors(g, &f, err)) < 0)
        return rc;
    if ((rc = ple_layout_check(&f.layout, err)) < 0)
        return rc;
    *out = f;
    return 0;
}
