/*
 * ple_build.c - writes complete qwen4exp models (SPEC.md section 10): the
 * PLE keys, the table first (page aligned, as SPEC's GGUF order has it),
 * then layer 1's weights.  Every value is a function of (seed, tensor,
 * element index) alone: element i of a tensor is draw i of a splitmix64
 * stream whose start depends on the seed and the tensor, so a chunk, a row
 * or a whole tensor can be produced anywhere, in any order, with the same
 * bits, and one seed gives one file byte for byte.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram_tools.h"
#include "format/gguf.h"
#include "common/util.h"
#include "ple_gen.h"

#define PLE_VOCAB 248320u          /* Qwen3.8's raw vocabulary             */
#define PLE_EOS 248044u
#define PLE_LAYER 1u               /* the PLE layer, 0-based (HF: 2)       */
#define PLE_KERNEL 4u              /* taps of the depthwise convolution    */
#define PLE_STREAMS 4u
#define PLE_EPS 1e-6f
#define TABLE_ALIGN 4096u          /* the table's start: a page (direct reads) */

/* Scales (standard deviations) of the drawn values.  The table: rows as a
 * trained embedding holds them, small and centred.  W_k and W_v: about
 * 1 / sqrt(K) (K = 2560 inputs), so a projection of a row set keeps the
 * rows' scale.  The norms are stored as 1 + w with w small; the
 * convolution's taps are modest so that SiLU(c) stays of the order of g. */
#define SIGMA_TABLE 0.05f
#define SIGMA_PROJ 0.02f
#define SIGMA_NORM 0.05f
#define SIGMA_CONV 0.1f

#define GAMMA 0x9e3779b97f4a7c15ull
#define CHUNK_VALUES (1u << 20)    /* values drawn per write (2 or 4 MiB)  */

enum { T_TABLE, T_KEY, T_VALUE, T_NORM_KEY, T_NORM_QUERY, T_NORM_CONV, T_CONV, T_COUNT };

struct fill_ctx {
    const engram_ple_build_opts *o;
    int tensor;                    /* T_*                                  */
    uint32_t type;                 /* GGML_BF16 or GGML_F32                */
    float sigma, mean;
    uint64_t *done, total;         /* progress over all filled bytes       */
};

/* One value of a normal-like distribution (mean 0, sigma 1): the sum of
 * four 16-bit uniforms, centred and scaled (a bell on [-3.46, 3.46]). */
static float normal_like(uint64_t r)
{
    float u = 0.0f;
    for (int k = 0; k < 4; k++)
        u += (float)((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
    return (u - 2.0f) * 1.7320508f;
}

/* BF16 of a finite float, round to nearest even. */
static uint16_t bf16_rne(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

/* The state before draw 0 of a tensor's stream. */
static uint64_t stream_start(uint64_t seed, int tensor)
{
    uint64_t st = seed ^ ((uint64_t)(tensor + 1) << 56) ^ 0x71e4e8f0c0ffee00ull;
    return splitmix64(&st);
}

static int fill_values(void *vctx, int fd, uint64_t offset, uint64_t bytes)
{
    struct fill_ctx *c = vctx;
    size_t es = c->type == GGML_BF16 ? 2 : 4;
    uint64_t n = bytes / es;
    size_t cap = n < CHUNK_VALUES ? (size_t)n : CHUNK_VALUES;
    unsigned char *buf = malloc((cap ? cap : 1) * es);
    if (!buf)
        return -ENOMEM;
    /* draw i is splitmix64's output for the state start + (i + 1) gamma */
    uint64_t st = stream_start(c->o->seed, c->tensor);
    int rc = 0;
    for (uint64_t at = 0; at < n && rc == 0; at += CHUNK_VALUES) {
        size_t k = n - at < CHUNK_VALUES ? (size_t)(n - at) : CHUNK_VALUES;
        for (size_t i = 0; i < k; i++) {
            float v = c->mean + c->sigma * normal_like(splitmix64(&st));
            if (es == 2) {
                uint16_t h = bf16_rne(v);
                memcpy(buf + 2 * i, &h, 2);
            } else {
                memcpy(buf + 4 * i, &v, 4);
            }
        }
        rc = util_pwrite_full(fd, buf, k * es, offset + at * es);
        *c->done += k * es;
        if (c->o->progress)
            c->o->progress(c->o->progress_ctx, *c->done, c->total);
    }
    free(buf);
    return rc;
}

static int add_metadata(gguf_writer *w, const struct ple_layout *l)
{
    uint64_t off[PLE_HEADS], sz[PLE_HEADS];
    for (int h = 0; h < PLE_HEADS; h++) {
        off[h] = l->offsets[h];
        sz[h] = l->sizes[h];
    }
    const uint32_t layers[1] = {PLE_LAYER};
    const float eps = PLE_EPS;
    int rc = 0;
    rc |= gguf_w_str(w, "general.architecture", "qwen4exp");
    rc |= gguf_w_str(w, "general.name", "engram generated qwen4exp model");
    rc |= gguf_w_u32(w, "qwen4exp.vocab_size", l->vocab);
    rc |= gguf_w_u32(w, "qwen4exp.embedding_length_per_layer_input", PLE_ROW_VALUES);
    rc |= gguf_w_scalar(w, "qwen4exp.attention.layer_norm_rms_epsilon", GGUF_F32, &eps);
    rc |= gguf_w_array(w, "qwen4exp.ple.layers", GGUF_U32, layers, 1);
    rc |= gguf_w_u32(w, "qwen4exp.ple.ngram_size", PLE_NGRAM);
    rc |= gguf_w_u32(w, "qwen4exp.ple.heads_per_ngram", PLE_HEADS / 2);
    rc |= gguf_w_u32(w, "qwen4exp.ple.conv_kernel", PLE_KERNEL);
    rc |= gguf_w_u32(w, "qwen4exp.ple.eos_token_id", l->eos);
    rc |= gguf_w_array(w, "qwen4exp.ple.layer_multipliers", GGUF_U64, l->multipliers, PLE_NGRAM);
    rc |= gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_U64, off, PLE_HEADS);
    rc |= gguf_w_array(w, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, sz, PLE_HEADS);
    return rc ? -ENOMEM : 0;
}

int engram_build_ple_model(const char *path, const engram_ple_build_opts *o, engram_error *err)
{
    if (!path || !o)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (o->fill != ENGRAM_FILL_ZERO && o->fill != ENGRAM_FILL_NORMAL)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "bad build options: a qwen4exp table is filled zero (holes) or normal");
    uint32_t width = o->width ? o->width : ENGRAM_PLE_WIDTH;
    if (width > ENGRAM_MAX_WIDTH)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad build options: width %u is not in 1..%u",
                       width, ENGRAM_MAX_WIDTH);
    uint32_t base = o->base ? o->base : ENGRAM_PLE_BASE;
    struct ple_layout l;
    engram_error gerr;
    if (ple_layout_generate(0, base, PLE_VOCAB, PLE_EOS, PLE_NO_IMAGE, &l, &gerr) < 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad build options: base %u: %s", base, gerr.msg);

    gguf_writer *w = gguf_writer_new(3, GGUF_DEFAULT_ALIGNMENT);
    if (!w)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    const uint64_t w4 = (uint64_t)PLE_STREAMS * width, K = (uint64_t)PLE_HEADS * PLE_ROW_VALUES;
    static const char *const names[T_COUNT] = {
        "per_layer_token_embd.weight", "ple_key", "ple_value", "ple_norm_key", "ple_norm_query",
        "ple_norm_conv", "ple_conv1d"};
    struct {
        uint32_t type, n_dims;
        uint64_t dims[2];
        float sigma, mean;
    } spec[T_COUNT] = {
        [T_TABLE] = {GGML_BF16, 2, {PLE_ROW_VALUES, l.rows}, SIGMA_TABLE, 0.0f},
        [T_KEY] = {GGML_BF16, 2, {K, w4}, SIGMA_PROJ, 0.0f},
        [T_VALUE] = {GGML_BF16, 2, {K, width}, SIGMA_PROJ, 0.0f},
        [T_NORM_KEY] = {GGML_F32, 1, {w4, 1}, SIGMA_NORM, 1.0f},
        [T_NORM_QUERY] = {GGML_F32, 1, {w4, 1}, SIGMA_NORM, 1.0f},
        [T_NORM_CONV] = {GGML_F32, 1, {w4, 1}, SIGMA_NORM, 1.0f},
        [T_CONV] = {GGML_F32, 2, {PLE_KERNEL, w4}, SIGMA_CONV, 0.0f},
    };
    uint64_t done = 0, total = 0;
    struct fill_ctx ctx[T_COUNT];
    int rc = add_metadata(w, &l);
    for (int t = 0; t < T_COUNT && rc == 0; t++) {
        char name[64];
        if (t == T_TABLE)
            snprintf(name, sizeof name, "%s", names[t]);
        else
            snprintf(name, sizeof name, "blk.%u.%s.weight", PLE_LAYER, names[t]);
        ctx[t] = (struct fill_ctx){o, t, spec[t].type, spec[t].sigma, spec[t].mean, &done, 0};
        int hole = t == T_TABLE && o->fill == ENGRAM_FILL_ZERO;
        rc = gguf_w_tensor(w, name, spec[t].type, spec[t].n_dims, spec[t].dims,
                           t == T_TABLE ? TABLE_ALIGN : 0, hole ? NULL : fill_values, &ctx[t]);
        if (!hole)
            total += spec[t].dims[0] * spec[t].dims[1] * (spec[t].type == GGML_BF16 ? 2 : 4);
    }
    for (int t = 0; t < T_COUNT; t++)
        ctx[t].total = total;
    if (rc < 0) {
        gguf_writer_free(w);
        return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot lay out the model: %s", engram_strerror(rc));
    }

    engram_output out;
    rc = engram_output_open(&out, path, ENGRAM_OUTPUT_SEEKABLE, err);
    if (rc == 0) {
        rc = gguf_w_write_fd(w, out.fd, err);
        int c = engram_output_close(&out, rc == 0, rc == 0 ? err : NULL);
        rc = rc < 0 ? rc : c;
    }
    gguf_writer_free(w);
    return rc;
}
