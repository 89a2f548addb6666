/*
 * ple_layer.c - one PLE layer's weights (ple_apply.h), from memory or from
 * a qwen4exp file, validated (every value finite) and kept in the panel
 * layout the projection kernels stream: 64 outputs side by side for each
 * input, so a kernel reads each panel front to back.  W_k and W_v keep
 * their file type (the kernels widen each weight to F32 as they load it);
 * the convolution's taps are turned tap-major so that the kernels read
 * channels contiguously.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ple_kernels.h"
#include "common/util.h"

/* Where a tensor's elements come from: memory, or a file read with pread
 * (fd >= 0: the tensor starts at file offset `off`). */
struct source {
    const char *name;
    uint32_t type;
    const void *mem;
    int fd;
    uint64_t off;
};

static size_t type_size(uint32_t t)
{
    return t == GGML_F32 ? 4 : 2;
}

static int bad_value(uint32_t type, const void *p, size_t i)
{
    switch (type) {
    case GGML_BF16: return (((const uint16_t *)p)[i] & 0x7f80u) == 0x7f80u;
    case GGML_F16: return (((const uint16_t *)p)[i] & 0x7c00u) == 0x7c00u;
    default: return !isfinite(((const float *)p)[i]);
    }
}

static int nonfinite(const struct source *s, size_t elem, uint64_t row, uint64_t col,
                     engram_error *err)
{
    if (s->fd < 0)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "tensor '%s': element [%llu][%llu] is not finite",
                       s->name, (unsigned long long)row, (unsigned long long)col);
    uint64_t at = s->off + (uint64_t)elem * type_size(s->type);
    return err_set(err, -EBADMSG, at, "tensor '%s': element [%llu][%llu] (offset %llu) is not finite",
                   s->name, (unsigned long long)row, (unsigned long long)col, (unsigned long long)at);
}

/* Elements [first, first + count) of s: a pointer into memory, or read
 * into buf. */
static int fetch(const struct source *s, size_t first, size_t count, void *buf, const void **out,
                 engram_error *err)
{
    size_t es = type_size(s->type);
    if (s->fd < 0) {
        *out = (const uint8_t *)s->mem + first * es;
        return 0;
    }
    uint64_t off = s->off + (uint64_t)first * es;
    int rc = util_pread_full(s->fd, buf, count * es, off);
    if (rc < 0)
        return err_set(err, rc, off, "tensor '%s': cannot read %zu bytes at offset %llu: %s", s->name,
                       count * es, (unsigned long long)off, engram_strerror(rc));
    *out = buf;
    return 0;
}

static void *map_zero(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* fewer TLB misses when streamed */
#endif
    return p;
}

/* A projection matrix of `rows` outputs of K inputs, output-major at s,
 * into panels (64 rows read at a time, transposed). */
static int load_mat(struct ple_mat *m, const struct source *s, uint32_t rows, engram_error *err)
{
    size_t es = type_size(s->type);
    m->type = s->type;
    m->rows = rows;
    m->panels = (rows + PLE_PANEL - 1) / PLE_PANEL;
    m->bytes = (size_t)m->panels * PLE_K * PLE_PANEL * es;
    m->w = map_zero(m->bytes);
    if (!m->w)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot allocate %zu bytes for '%s'", m->bytes,
                       s->name);
    void *buf = s->fd >= 0 ? malloc(PLE_PANEL * PLE_K * es) : NULL;
    if (s->fd >= 0 && !buf)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = 0;
    for (uint32_t q = 0; q < m->panels && rc == 0; q++) {
        uint32_t o0 = q * PLE_PANEL, n = rows - o0 < PLE_PANEL ? rows - o0 : PLE_PANEL;
        const void *src;
        if ((rc = fetch(s, (size_t)o0 * PLE_K, (size_t)n * PLE_K, buf, &src, err)) < 0)
            break;
        uint8_t *dst = (uint8_t *)m->w + (size_t)q * PLE_K * PLE_PANEL * es;
        for (uint32_t j = 0; j < n && rc == 0; j++)
            for (uint32_t i = 0; i < PLE_K; i++) {
                size_t at = (size_t)j * PLE_K + i;
                if (bad_value(s->type, src, at)) {
                    rc = nonfinite(s, (size_t)(o0 + j) * PLE_K + i, o0 + j, i, err);
                    break;
                }
                memcpy(dst + ((size_t)i * PLE_PANEL + j) * es, (const uint8_t *)src + at * es, es);
            }
    }
    free(buf);
    return rc;
}

/* n F32 values of s into dst, each finite (`cols` per row, for messages). */
static int load_f32(float *dst, const struct source *s, size_t n, size_t cols, engram_error *err)
{
    const void *src;
    int rc = fetch(s, 0, n, dst, &src, err);
    if (rc < 0)
        return rc;
    if (src != dst)
        memcpy(dst, src, n * sizeof *dst);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return nonfinite(s, i, i / cols, i % cols, err);
    return 0;
}

void ple_layer_free(struct ple_layer *L)
{
    if (!L)
        return;
    for (int k = 0; k < 2; k++)
        if (L->m[k].w)
            munmap(L->m[k].w, L->m[k].bytes);
    free(L->gk);
    free(L->gq);
    free(L->gc);
    free(L->conv);
    free(L);
}

uint32_t ple_layer_width(const struct ple_layer *L)
{
    return L ? L->W : 0;
}

uint64_t ple_layer_bytes(const struct ple_layer *L)
{
    return L ? L->bytes : 0;
}

size_t ple_state_floats(const struct ple_layer *L)
{
    return L ? (size_t)L->frames * L->C : 0;
}

void ple_layer_describe(const struct ple_layer *L, struct ple_weights *w)
{
    memset(w, 0, sizeof *w);
    w->width = L->W;
    w->kernel = L->kernel;
    w->eps = L->eps;
    w->key_type = L->m[0].type;
    w->value_type = L->m[1].type;
}

/* A panel matrix back to output-major [rows][K]. */
static void unpanel(const struct ple_mat *m, void *dst)
{
    size_t es = type_size(m->type);
    for (uint32_t o = 0; o < m->rows; o++) {
        const uint8_t *src = (const uint8_t *)m->w + ((size_t)(o / PLE_PANEL) * PLE_K * PLE_PANEL + o % PLE_PANEL) * es;
        uint8_t *d = (uint8_t *)dst + (size_t)o * PLE_K * es;
        for (uint32_t i = 0; i < PLE_K; i++)
            memcpy(d + (size_t)i * es, src + (size_t)i * PLE_PANEL * es, es);
    }
}

void ple_layer_export(const struct ple_layer *L, void *key, void *value, float *norm_key,
                      float *norm_query, float *norm_conv, float *conv)
{
    const size_t C = L->C;
    if (key)
        unpanel(&L->m[0], key);
    if (value)
        unpanel(&L->m[1], value);
    if (norm_key)
        memcpy(norm_key, L->gk, C * sizeof(float));
    if (norm_query)
        memcpy(norm_query, L->gq, C * sizeof(float));
    if (norm_conv)
        memcpy(norm_conv, L->gc, C * sizeof(float));
    if (conv)
        for (size_t c = 0; c < C; c++)
            for (uint32_t k = 0; k < L->kernel; k++)
                conv[c * L->kernel + k] = L->conv[(size_t)k * C + c];
}

/* src[0..5]: key, value, norm_key, norm_query, norm_conv, conv. */
static int build(uint32_t W, uint32_t T, float eps, const struct source *src, struct ple_layer **out,
                 engram_error *err)
{
    if (W == 0 || W > ENGRAM_MAX_WIDTH)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "width %u is not in 1..%u", W, ENGRAM_MAX_WIDTH);
    if (T == 0 || T > PLE_MAX_KERNEL)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "convolution of %u taps: 1..%u", T, PLE_MAX_KERNEL);
    if (!(eps > 0.0f) || !isfinite(eps))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "eps %g is not a positive finite number", (double)eps);
    for (int k = 0; k < 2; k++)
        if (src[k].type != GGML_BF16 && src[k].type != GGML_F16 && src[k].type != GGML_F32)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "tensor '%s': type %u is not BF16, F16 or F32",
                           src[k].name, src[k].type);
    struct ple_layer *L = calloc(1, sizeof *L);
    if (!L)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    L->W = W;
    L->C = 4 * W;
    L->N = 5 * W;
    L->kernel = T;
    L->frames = PLE_DILATION * (T - 1);
    L->eps = eps;
    size_t C = L->C;
    L->gk = malloc(C * sizeof(float));
    L->gq = malloc(C * sizeof(float));
    L->gc = malloc(C * sizeof(float));
    L->conv = malloc(C * T * sizeof(float));
    float *taps = malloc(C * T * sizeof(float));
    int rc = 0;
    if (!L->gk || !L->gq || !L->gc || !L->conv || !taps)
        rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    if (rc == 0)
        rc = load_mat(&L->m[0], &src[0], L->C, err);
    if (rc == 0)
        rc = load_mat(&L->m[1], &src[1], W, err);
    float *norms[3] = {L->gk, L->gq, L->gc};
    for (int k = 0; k < 3 && rc == 0; k++)
        rc = load_f32(norms[k], &src[2 + k], C, C, err);
    if (rc == 0)
        rc = load_f32(taps, &src[5], C * T, T, err);
    if (rc == 0)
        for (size_t c = 0; c < C; c++)
            for (uint32_t k = 0; k < T; k++)
                L->conv[(size_t)k * C + c] = taps[c * T + k];
    free(taps);
    if (rc < 0) {
        ple_layer_free(L);
        return rc;
    }
    L->panels = L->m[0].panels + L->m[1].panels;
    L->bytes = sizeof *L + L->m[0].bytes + L->m[1].bytes + (3 + (uint64_t)T) * C * sizeof(float);
    *out = L;
    return 0;
}

int ple_layer_new(const struct ple_weights *w, struct ple_layer **out, engram_error *err)
{
    if (!w || !out || !w->key || !w->value || !w->norm_key || !w->norm_query || !w->norm_conv || !w->conv)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    const struct source src[6] = {
        {"ple_key", w->key_type, w->key, -1, 0},
        {"ple_value", w->value_type, w->value, -1, 0},
        {"ple_norm_key", GGML_F32, w->norm_key, -1, 0},
        {"ple_norm_query", GGML_F32, w->norm_query, -1, 0},
        {"ple_norm_conv", GGML_F32, w->norm_conv, -1, 0},
        {"ple_conv1d", GGML_F32, w->conv, -1, 0},
    };
    return build(w->width, w->kernel, w->eps, src, out, err);
}

int ple_layer_open(const gguf_file *g, const struct ple_file *f, struct ple_layer **out,
                   engram_error *err)
{
    if (!g || !f || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    const gguf_tensor *t[6] = {f->key, f->value, f->norm_key, f->norm_query, f->norm_conv, f->conv};
    struct source src[6];
    for (int k = 0; k < 6; k++)
        src[k] = (struct source){t[k]->name, t[k]->type, NULL, g->fd, t[k]->offset};
    int rc = build(f->width, f->conv_kernel, f->eps, src, out, err);
    /* the weights were read once: leave no copy of them in the page cache */
    for (int k = 0; k < 6; k++)
        posix_fadvise(g->fd, (off_t)t[k]->offset, (off_t)t[k]->bytes, POSIX_FADV_DONTNEED);
    return rc;
}
