/*
 * gguf.c - GGUF reader: every byte of the file is treated as hostile.
 *
 * The header is read through a cursor that refills a small window with
 * pread; nothing is mapped.  Arrays are skipped (their offset recorded) so a
 * 100 GB file with a huge array costs no memory, and tensor data is only
 * bounds-checked, never touched.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "common/util.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as little-endian u32 */
#define WINDOW (1u << 20)

/* ------------------------------------------------------------ type tables */

static const uint8_t vtype_size[GGUF_NTYPES] = {
    [GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2,
    [GGUF_U32] = 4, [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1,
    [GGUF_STRING] = 0, [GGUF_ARRAY] = 0, [GGUF_U64] = 8, [GGUF_I64] = 8,
    [GGUF_F64] = 8,
};

static const char *const vtype_names[GGUF_NTYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
    "array", "u64", "i64", "f64",
};

const char *gguf_vtype_name(uint32_t t)
{
    return t < GGUF_NTYPES ? vtype_names[t] : "unknown";
}

struct ggml_type_desc {
    const char *name;
    uint32_t block;     /* elements per block */
    uint32_t size;      /* bytes per block    */
};

/* ggml's type ids; gaps are ids ggml removed. */
static const struct ggml_type_desc ggml_types[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},     [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},   [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},  [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},        [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},       [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *ggml_type_name(uint32_t t)
{
    return t < N_GGML_TYPES ? ggml_types[t].name : NULL;
}

int ggml_tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *dims,
                      uint64_t *bytes)
{
    if (type >= N_GGML_TYPES || !ggml_types[type].name || n_dims == 0 ||
        n_dims > GGUF_MAX_DIMS)
        return -1;
    const struct ggml_type_desc *d = &ggml_types[type];
    if (dims[0] % d->block != 0)
        return -1;
    uint64_t total = dims[0] / d->block, t;
    if (mul_u64(total, d->size, &total))
        return -1;
    for (uint32_t i = 1; i < n_dims; i++) {
        if (mul_u64(total, dims[i], &t))
            return -1;
        total = t;
    }
    *bytes = total;
    return 0;
}

/* ------------------------------------------------------------ cursor */

struct cursor {
    int fd;
    uint64_t size;      /* file size: the hard bound                         */
    uint64_t pos;       /* absolute position of the next byte                */
    unsigned char *win; /* window of the file [win_off, win_off + win_len)   */
    uint64_t win_off;
    size_t win_len;
    engram_error *err;
    const char *what;   /* what is being parsed, for messages                */
    uint64_t meta_bytes; /* memory taken so far by loaded metadata           */
};

static int cur_truncated(struct cursor *c, uint64_t need)
{
    return err_set(c->err, -EBADMSG, c->pos,
                   "truncated file: %s needs %llu bytes at offset %llu, file has %llu",
                   c->what, (unsigned long long)need, (unsigned long long)c->pos,
                   (unsigned long long)c->size);
}

/* Copies n bytes at the cursor into dst (dst may be NULL to skip). */
static int cur_read(struct cursor *c, void *dst, uint64_t n)
{
    uint64_t end;
    if (add_u64(c->pos, n, &end) || end > c->size)
        return cur_truncated(c, n);
    unsigned char *out = dst;
    while (n > 0) {
        if (c->pos < c->win_off || c->pos >= c->win_off + c->win_len) {
            if (!dst) { /* skipping: no need to read what is skipped */
                c->pos += n;
                return 0;
            }
            uint64_t left = c->size - c->pos;
            size_t len = left < WINDOW ? (size_t)left : WINDOW;
            int rc = util_pread_full(c->fd, c->win, len, c->pos);
            if (rc < 0)
                return err_set(c->err, rc, c->pos, "read failed at offset %llu: %s",
                               (unsigned long long)c->pos, engram_strerror(rc));
            c->win_off = c->pos;
            c->win_len = len;
        }
        size_t at = (size_t)(c->pos - c->win_off);
        size_t take = c->win_len - at;
        if (take > n)
            take = (size_t)n;
        if (out) {
            memcpy(out, c->win + at, take);
            out += take;
        }
        c->pos += take;
        n -= take;
    }
    return 0;
}

static int cur_u32(struct cursor *c, uint32_t *v)
{
    unsigned char b[4];
    *v = 0;
    int rc = cur_read(c, b, 4);
    if (rc == 0)
        *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
             (uint32_t)b[3] << 24;
    return rc;
}

static int cur_u64(struct cursor *c, uint64_t *v)
{
    unsigned char b[8];
    *v = 0;
    int rc = cur_read(c, b, 8);
    if (rc == 0) {
        uint64_t x = 0;
        for (int i = 7; i >= 0; i--)
            x = x << 8 | b[i];
        *v = x;
    }
    return rc;
}

static int cur_charge(struct cursor *c, uint64_t bytes)
{
    if (bytes > GGUF_MAX_META_BYTES || c->meta_bytes + bytes > GGUF_MAX_META_BYTES)
        return err_set(c->err, -EBADMSG, c->pos,
                       "%s at offset %llu: metadata exceeds the %u MiB limit",
                       c->what, (unsigned long long)c->pos, GGUF_MAX_META_BYTES >> 20);
    c->meta_bytes += bytes;
    return 0;
}

/* Reads a GGUF string (u64 length + bytes) into a new NUL-terminated copy.
 * max bounds the length; longer strings are rejected. */
static int cur_string(struct cursor *c, uint64_t max, char **out, uint64_t *len)
{
    uint64_t at = c->pos, n;
    int rc = cur_u64(c, &n);
    if (rc < 0)
        return rc;
    if (n > max)
        return err_set(c->err, -EBADMSG, at,
                       "%s at offset %llu: string length %llu exceeds %llu",
                       c->what, (unsigned long long)at, (unsigned long long)n,
                       (unsigned long long)max);
    if (n > c->size - c->pos)
        return cur_truncated(c, n);
    if ((rc = cur_charge(c, n + 1)) < 0)
        return rc;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return err_set(c->err, -ENOMEM, at, "out of memory reading %s", c->what);
    if ((rc = cur_read(c, s, n)) < 0) {
        free(s);
        return rc;
    }
    s[n] = '\0';
    if (memchr(s, '\0', (size_t)n)) {
        free(s);
        return err_set(c->err, -EBADMSG, at, "%s at offset %llu: string contains NUL",
                       c->what, (unsigned long long)at);
    }
    *out = s;
    if (len)
        *len = n;
    return 0;
}

/* ------------------------------------------------------------ parsing */

static int parse_scalar(struct cursor *c, gguf_kv *kv)
{
    unsigned char b[8] = {0};
    uint32_t t = kv->type;
    int rc = cur_read(c, b, vtype_size[t]);
    if (rc < 0)
        return rc;
    uint64_t u = 0;
    for (int i = vtype_size[t] - 1; i >= 0; i--)
        u = u << 8 | b[i];
    kv->u = u;
    switch (t) {
    case GGUF_I8: kv->i = (int8_t)u; break;
    case GGUF_I16: kv->i = (int16_t)u; break;
    case GGUF_I32: kv->i = (int32_t)u; break;
    case GGUF_I64: kv->i = (int64_t)u; break;
    case GGUF_F32: { float f; uint32_t w = (uint32_t)u; memcpy(&f, &w, 4); kv->f = f; break; }
    case GGUF_F64: memcpy(&kv->f, &u, 8); break;
    case GGUF_BOOL:
        if (u > 1)
            return err_set(c->err, -EBADMSG, kv->value_offset,
                           "key '%s' at offset %llu: bool value %llu is not 0 or 1",
                           kv->key, (unsigned long long)kv->value_offset,
                           (unsigned long long)u);
        break;
    default: kv->i = (int64_t)u; break;
    }
    return 0;
}

static int parse_array(struct cursor *c, gguf_kv *kv)
{
    uint64_t at = c->pos;
    int rc;
    if ((rc = cur_u32(c, &kv->arr_type)) < 0 || (rc = cur_u64(c, &kv->arr_count)) < 0)
        return rc;
    kv->value_offset = c->pos;
    if (kv->arr_type >= GGUF_NTYPES || kv->arr_type == GGUF_ARRAY)
        return err_set(c->err, -EBADMSG, at,
                       "key '%s' at offset %llu: array element type %u is not supported",
                       kv->key, (unsigned long long)at, kv->arr_type);
    if (kv->arr_type == GGUF_STRING) {
        /* Walk the strings to find the end; each is at least 8 bytes. */
        if (kv->arr_count > (c->size - c->pos) / 8)
            return cur_truncated(c, kv->arr_count * 8);
        for (uint64_t i = 0; i < kv->arr_count; i++) {
            uint64_t n;
            if ((rc = cur_u64(c, &n)) < 0 || (rc = cur_read(c, NULL, n)) < 0)
                return rc;
        }
        return 0;
    }
    uint64_t bytes;
    if (mul_u64(kv->arr_count, vtype_size[kv->arr_type], &bytes))
        return err_set(c->err, -EBADMSG, at,
                       "key '%s' at offset %llu: array size overflows", kv->key,
                       (unsigned long long)at);
    return cur_read(c, NULL, bytes);
}

static int parse_kv(struct cursor *c, gguf_kv *kv)
{
    int rc;
    kv->key_offset = c->pos;
    c->what = "metadata key";
    if ((rc = cur_string(c, GGUF_MAX_KEY, &kv->key, NULL)) < 0)
        return rc;
    if (kv->key[0] == '\0')
        return err_set(c->err, -EBADMSG, kv->key_offset, "empty key at offset %llu",
                       (unsigned long long)kv->key_offset);
    c->what = kv->key;
    uint64_t tat = c->pos;
    if ((rc = cur_u32(c, &kv->type)) < 0)
        return rc;
    kv->value_offset = c->pos;
    if (kv->type >= GGUF_NTYPES)
        return err_set(c->err, -EBADMSG, tat, "key '%s' at offset %llu: unknown value type %u",
                       kv->key, (unsigned long long)tat, kv->type);
    if (kv->type == GGUF_STRING)
        return cur_string(c, UINT64_MAX, &kv->str, &kv->str_len);
    if (kv->type == GGUF_ARRAY)
        return parse_array(c, kv);
    return parse_scalar(c, kv);
}

static int parse_tensor(struct cursor *c, gguf_tensor *t)
{
    int rc;
    t->info_offset = c->pos;
    c->what = "tensor name";
    if ((rc = cur_string(c, GGUF_MAX_NAME, &t->name, NULL)) < 0)
        return rc;
    c->what = t->name;
    uint64_t at = c->pos;
    if ((rc = cur_u32(c, &t->n_dims)) < 0)
        return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(c->err, -EBADMSG, at, "tensor '%s' at offset %llu: %u dimensions",
                       t->name, (unsigned long long)at, t->n_dims);
    for (int i = 0; i < GGUF_MAX_DIMS; i++)
        t->dims[i] = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) {
        at = c->pos;
        if ((rc = cur_u64(c, &t->dims[i])) < 0)
            return rc;
        if (t->dims[i] == 0 || t->dims[i] > (uint64_t)INT64_MAX)
            return err_set(c->err, -EBADMSG, at,
                           "tensor '%s' at offset %llu: dimension %u is %llu", t->name,
                           (unsigned long long)at, i, (unsigned long long)t->dims[i]);
    }
    at = c->pos;
    if ((rc = cur_u32(c, &t->type)) < 0)
        return rc;
    if (!ggml_type_name(t->type))
        return err_set(c->err, -EBADMSG, at, "tensor '%s' at offset %llu: unknown type %u",
                       t->name, (unsigned long long)at, t->type);
    if (ggml_tensor_bytes(t->type, t->n_dims, t->dims, &t->bytes) < 0)
        return err_set(c->err, -EBADMSG, at,
                       "tensor '%s' at offset %llu: shape does not fit type %s (or overflows)",
                       t->name, (unsigned long long)at, ggml_type_name(t->type));
    return cur_u64(c, &t->offset); /* relative until the data start is known */
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Finds a duplicate among n names; returns its index or -1 (or -2: no memory). */
static long find_duplicate(char *const *names, uint64_t n, size_t stride)
{
    if (n < 2)
        return -1;
    char **sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return -2;
    for (uint64_t i = 0; i < n; i++)
        sorted[i] = *(char *const *)((const char *)names + i * stride);
    qsort(sorted, n, sizeof *sorted, cmp_str_ptr);
    const char *dup = NULL;
    for (uint64_t i = 1; i < n && !dup; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            dup = sorted[i];
    free(sorted);
    if (!dup)
        return -1;
    /* The second occurrence in file order is the one to blame. */
    int seen = 0;
    for (uint64_t i = 0; i < n; i++)
        if (strcmp(*(char *const *)((const char *)names + i * stride), dup) == 0 && seen++)
            return (long)i;
    return -1;
}

struct span {
    uint64_t start, end;
    uint64_t index;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static int check_tensor_data(gguf_file *g, engram_error *err)
{
    if (g->n_tensors == 0)
        return 0;
    struct span *sp = malloc(g->n_tensors * sizeof *sp);
    if (!sp)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors && rc == 0; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t rel = t->offset, abs, end;
        if (rel % g->alignment != 0)
            rc = err_set(err, -EBADMSG, t->info_offset,
                         "tensor '%s' (info at offset %llu): data offset %llu is not a multiple of the alignment %u",
                         t->name, (unsigned long long)t->info_offset,
                         (unsigned long long)rel, g->alignment);
        else if (add_u64(g->data_start, rel, &abs) || add_u64(abs, t->bytes, &end) ||
                 end > g->size)
            rc = err_set(err, -EBADMSG, t->info_offset,
                         "tensor '%s' (info at offset %llu): data [%llu, +%llu) lies outside the file (%llu bytes)",
                         t->name, (unsigned long long)t->info_offset,
                         (unsigned long long)(g->data_start + rel),
                         (unsigned long long)t->bytes, (unsigned long long)g->size);
        else {
            t->offset = abs;
            sp[i] = (struct span){abs, end, i};
        }
    }
    if (rc == 0) {
        qsort(sp, g->n_tensors, sizeof *sp, cmp_span);
        for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++)
            if (sp[i].start < sp[i - 1].end) {
                gguf_tensor *t = &g->tensors[sp[i].index];
                rc = err_set(err, -EBADMSG, t->info_offset,
                             "tensor '%s' (info at offset %llu): data overlaps tensor '%s'",
                             t->name, (unsigned long long)t->info_offset,
                             g->tensors[sp[i - 1].index].name);
            }
    }
    free(sp);
    return rc;
}

static int parse_header(struct cursor *c, gguf_file *g)
{
    uint32_t magic;
    int rc;
    c->what = "header";
    if ((rc = cur_u32(c, &magic)) < 0)
        return rc;
    if (magic != GGUF_MAGIC)
        return err_set(c->err, -EBADMSG, 0, "not a GGUF file (magic at offset 0)");
    if ((rc = cur_u32(c, &g->version)) < 0)
        return rc;
    if (g->version == 0x03000000u || g->version == 0x02000000u)
        return err_set(c->err, -ENOTSUP, 4, "big-endian GGUF is not supported (offset 4)");
    if (g->version != 2 && g->version != 3)
        return err_set(c->err, -ENOTSUP, 4, "GGUF version %u is not supported (offset 4; v2 and v3 are)",
                       g->version);
    uint64_t at = c->pos;
    if ((rc = cur_u64(c, &g->n_tensors)) < 0 || (rc = cur_u64(c, &g->n_kv)) < 0)
        return rc;
    if (g->n_tensors > GGUF_MAX_ITEMS || g->n_kv > GGUF_MAX_ITEMS)
        return err_set(c->err, -EBADMSG, at,
                       "header at offset %llu: %llu tensors / %llu keys exceed the limit of %u",
                       (unsigned long long)at, (unsigned long long)g->n_tensors,
                       (unsigned long long)g->n_kv, GGUF_MAX_ITEMS);
    /* Each key takes >= 12 bytes and each tensor info >= 28 in the file. */
    if (g->n_kv > c->size / 12 || g->n_tensors > c->size / 28)
        return err_set(c->err, -EBADMSG, at,
                       "header at offset %llu: counts (%llu keys, %llu tensors) cannot fit in %llu bytes",
                       (unsigned long long)at, (unsigned long long)g->n_kv,
                       (unsigned long long)g->n_tensors, (unsigned long long)c->size);
    if ((rc = cur_charge(c, g->n_kv * sizeof(gguf_kv) + g->n_tensors * sizeof(gguf_tensor))) < 0)
        return rc;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return err_set(c->err, -ENOMEM, at, "out of memory");

    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(c, &g->kv[i])) < 0)
            return rc;
    long dup = find_duplicate(&g->kv[0].key, g->n_kv, sizeof(gguf_kv));
    if (dup == -2)
        return err_set(c->err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    if (dup >= 0)
        return err_set(c->err, -EBADMSG, g->kv[dup].key_offset,
                       "duplicate key '%s' at offset %llu", g->kv[dup].key,
                       (unsigned long long)g->kv[dup].key_offset);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32 || al->u == 0 || (al->u & (al->u - 1)) != 0)
            return err_set(c->err, -EBADMSG, al->key_offset,
                           "key 'general.alignment' at offset %llu: must be a u32 power of two",
                           (unsigned long long)al->key_offset);
        g->alignment = (uint32_t)al->u;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor(c, &g->tensors[i])) < 0)
            return rc;
    dup = find_duplicate(&g->tensors[0].name, g->n_tensors, sizeof(gguf_tensor));
    if (dup == -2)
        return err_set(c->err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    if (dup >= 0)
        return err_set(c->err, -EBADMSG, g->tensors[dup].info_offset,
                       "duplicate tensor '%s' at offset %llu", g->tensors[dup].name,
                       (unsigned long long)g->tensors[dup].info_offset);

    uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
    if (add_u64(c->pos, pad, &g->data_start) || (g->n_tensors > 0 && g->data_start > c->size))
        return err_set(c->err, -EBADMSG, c->pos,
                       "truncated file: tensor data would start at %llu, file has %llu bytes",
                       (unsigned long long)(c->pos + pad), (unsigned long long)c->size);
    return check_tensor_data(g, c->err);
}

int gguf_open(const char *path, gguf_file **out, engram_error *err)
{
    gguf_file *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        int e = -errno;
        free(g);
        return err_set(err, e, ENGRAM_NO_OFFSET, "cannot open '%s': %s", path,
                       engram_strerror(e));
    }
    struct stat st;
    int rc = 0;
    if (fstat(g->fd, &st) < 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot stat '%s'", path);
    else if (!S_ISREG(st.st_mode))
        rc = err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "'%s' is not a regular file", path);
    if (rc == 0) {
        g->size = (uint64_t)st.st_size;
        struct cursor c = {.fd = g->fd, .size = g->size, .err = err};
        c.win = malloc(WINDOW);
        if (!c.win)
            rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        else
            rc = parse_header(&c, g);
        free(c.win);
    }
    if (rc < 0) {
        gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

void gguf_close(gguf_file *g)
{
    if (!g)
        return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str);
        }
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++)
            free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    if (g->fd >= 0)
        close(g->fd);
    free(g);
}

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0)
            return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

int gguf_read_array(const gguf_file *g, const gguf_kv *kv, uint32_t elem_type,
                    uint64_t count, void *out, engram_error *err)
{
    if (kv->type != GGUF_ARRAY || kv->arr_type != elem_type || kv->arr_count != count)
        return err_set(err, -EBADMSG, kv->key_offset,
                       "key '%s' at offset %llu: expected array %s[%llu], found %s%s%s[%llu]",
                       kv->key, (unsigned long long)kv->key_offset, gguf_vtype_name(elem_type),
                       (unsigned long long)count, gguf_vtype_name(kv->type),
                       kv->type == GGUF_ARRAY ? " of " : "",
                       kv->type == GGUF_ARRAY ? gguf_vtype_name(kv->arr_type) : "",
                       (unsigned long long)(kv->type == GGUF_ARRAY ? kv->arr_count : 1));
    if (elem_type >= GGUF_NTYPES || vtype_size[elem_type] == 0)
        return err_set(err, -EINVAL, kv->key_offset, "key '%s': cannot read %s arrays",
                       kv->key, gguf_vtype_name(elem_type));
    size_t bytes = (size_t)count * vtype_size[elem_type]; /* checked at parse */
    int rc = util_pread_full(g->fd, out, bytes, kv->value_offset);
    if (rc < 0)
        return err_set(err, rc, kv->value_offset, "key '%s': read at offset %llu failed: %s",
                       kv->key, (unsigned long long)kv->value_offset, engram_strerror(rc));
    /* The file is little-endian; so is every host this builds for. */
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian host required");
    return 0;
}
