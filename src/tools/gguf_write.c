/*
 * gguf_write.c - GGUF writer.  Metadata is serialized as it is added; tensor
 * data is produced by callbacks at write time, or left as a hole, so full-size
 * tables cost nothing until someone fills them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "common/util.h"

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t dims[GGUF_MAX_DIMS];
    uint64_t bytes, align_to, rel;
    gguf_fill_fn fill;
    void *ctx;
};

struct gguf_writer {
    uint32_t version, alignment;
    unsigned char *meta;     /* serialized key/value pairs */
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    struct wtensor *t;
    uint64_t n_t, cap_t;
    int failed;              /* an add ran out of memory: write refuses */
};

static const uint8_t scalar_size[GGUF_NTYPES] = {
    [GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2, [GGUF_U32] = 4,
    [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1, [GGUF_U64] = 8, [GGUF_I64] = 8,
    [GGUF_F64] = 8,
};

gguf_writer *gguf_writer_new(uint32_t version, uint32_t alignment)
{
    if ((version != 2 && version != 3) || alignment == 0 || (alignment & (alignment - 1)))
        return NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->version = version;
        w->alignment = alignment;
    }
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->meta);
    free(w);
}

static int put(gguf_writer *w, const void *p, size_t n)
{
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n)
            cap *= 2;
        unsigned char *m = realloc(w->meta, cap);
        if (!m) {
            w->failed = 1;
            return -ENOMEM;
        }
        w->meta = m;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
}

static int put_u32(gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(gguf_writer *w, uint64_t v) { return put(w, &v, 8); }

static int put_str(gguf_writer *w, const char *s)
{
    size_t n = strlen(s);
    int rc = put_u64(w, n);
    return rc < 0 ? rc : put(w, s, n);
}

static int put_key(gguf_writer *w, const char *key, uint32_t type)
{
    int rc = put_str(w, key);
    if (rc == 0)
        rc = put_u32(w, type);
    if (rc == 0)
        w->n_kv++;
    return rc;
}

int gguf_w_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v)
{
    if (type >= GGUF_NTYPES || scalar_size[type] == 0)
        return -EINVAL;
    int rc = put_key(w, key, type);
    return rc < 0 ? rc : put(w, v, scalar_size[type]);
}

int gguf_w_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return gguf_w_scalar(w, key, GGUF_U32, &v);
}

int gguf_w_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return gguf_w_scalar(w, key, GGUF_U64, &v);
}

int gguf_w_str(gguf_writer *w, const char *key, const char *v)
{
    int rc = put_key(w, key, GGUF_STRING);
    return rc < 0 ? rc : put_str(w, v);
}

int gguf_w_array(gguf_writer *w, const char *key, uint32_t elem_type,
                 const void *data, uint64_t count)
{
    if (elem_type >= GGUF_NTYPES || scalar_size[elem_type] == 0)
        return -EINVAL;
    int rc = put_key(w, key, GGUF_ARRAY);
    if (rc == 0)
        rc = put_u32(w, elem_type);
    if (rc == 0)
        rc = put_u64(w, count);
    if (rc == 0)
        rc = put(w, data, (size_t)count * scalar_size[elem_type]);
    return rc;
}

int gguf_w_raw(gguf_writer *w, const char *key, uint32_t type, const void *value, size_t n)
{
    if (type >= GGUF_NTYPES)
        return -EINVAL;
    int rc = put_key(w, key, type);
    return rc < 0 ? rc : put(w, value, n);
}

int gguf_w_array_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t count)
{
    int rc = put_key(w, key, GGUF_ARRAY);
    if (rc == 0)
        rc = put_u32(w, GGUF_STRING);
    if (rc == 0)
        rc = put_u64(w, count);
    for (uint64_t i = 0; i < count && rc == 0; i++)
        rc = put_str(w, strs[i]);
    return rc;
}

int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type,
                  uint32_t n_dims, const uint64_t *dims, uint64_t align_to,
                  gguf_fill_fn fill, void *ctx)
{
    uint64_t bytes;
    if (ggml_tensor_bytes(type, n_dims, dims, &bytes) < 0 ||
        (align_to & (align_to - 1)) != 0)
        return -EINVAL;
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? 2 * w->cap_t : 8;
        struct wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) {
            w->failed = 1;
            return -ENOMEM;
        }
        w->t = t;
        w->cap_t = cap;
    }
    struct wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) {
        w->failed = 1;
        return -ENOMEM;
    }
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t i = 0; i < GGUF_MAX_DIMS; i++)
        t->dims[i] = i < n_dims ? dims[i] : 1;
    t->bytes = bytes;
    t->align_to = align_to;
    t->fill = fill;
    t->ctx = ctx;
    w->n_t++;
    return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

int gguf_w_write_fd(gguf_writer *w, int fd, engram_error *err)
{
    if (w->failed)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory while adding metadata");
    /* Header = fixed part + metadata + tensor infos (whose size we know). */
    uint64_t info_len = 0;
    for (uint64_t i = 0; i < w->n_t; i++)
        info_len += 8 + strlen(w->t[i].name) + 4 + 8 * w->t[i].n_dims + 4 + 8;
    uint64_t header_len = 4 + 4 + 8 + 8 + w->meta_len + info_len;
    uint64_t data_start = align_up(header_len, w->alignment);
    uint64_t rel = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        rel = align_up(rel, w->alignment);
        if (w->t[i].align_to > w->alignment)
            rel = align_up(data_start + rel, w->t[i].align_to) - data_start;
        w->t[i].rel = rel;
        rel += w->t[i].bytes;
    }
    uint64_t total = data_start + rel;

    unsigned char *hdr = calloc(1, (size_t)data_start);
    if (!hdr)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    unsigned char *p = hdr;
    uint32_t magic = 0x46554747u;
    memcpy(p, &magic, 4); p += 4;
    memcpy(p, &w->version, 4); p += 4;
    memcpy(p, &w->n_t, 8); p += 8;
    memcpy(p, &w->n_kv, 8); p += 8;
    memcpy(p, w->meta, w->meta_len); p += w->meta_len;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        uint64_t n = strlen(t->name);
        memcpy(p, &n, 8); p += 8;
        memcpy(p, t->name, n); p += n;
        memcpy(p, &t->n_dims, 4); p += 4;
        memcpy(p, t->dims, 8 * t->n_dims); p += 8 * t->n_dims;
        memcpy(p, &t->type, 4); p += 4;
        memcpy(p, &t->rel, 8); p += 8;
    }
    int rc = util_pwrite_full(fd, hdr, (size_t)data_start, 0);
    free(hdr);
    if (rc < 0)
        return err_set(err, rc, 0, "writing the header failed: %s", engram_strerror(rc));
    if (ftruncate(fd, (off_t)total) < 0)
        return err_set(err, -errno, total, "cannot size the file to %llu bytes",
                       (unsigned long long)total);
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        if (!t->fill)
            continue;
        rc = t->fill(t->ctx, fd, data_start + t->rel, t->bytes);
        if (rc < 0)
            return err_set(err, rc, data_start + t->rel, "writing tensor '%s' failed: %s",
                           t->name, engram_strerror(rc));
    }
    return 0;
}
