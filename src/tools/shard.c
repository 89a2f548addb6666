/*
 * shard.c - row-block shard files (issue #24, docs/shards.md): rank r of N
 * gets a V4.1 file with every key and non-table tensor of the model, and
 * of each table only rows [floor(r R / N), floor((r + 1) R / N)), plus the
 * shard keys that say so.  Rows are copied with plain reads a chunk at a
 * time (bounded memory whatever the table), all-zero chunks left as holes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram_tools.h"
#include "format/gguf.h"
#include "common/util.h"
#include "sha256.h"

#define SHARD_KEY "deepseek41.engram.shard."
#define COPY_CHUNK (4u << 20)          /* bytes per read (non-table tensors)    */
#define COPY_ROWS 16384u               /* rows per read: 4.3 MB                 */
#define META_MAX (1ull << 30)          /* metadata copied: refused above 1 GiB  */
#define ID_PREFIX_BYTES 4096u          /* of each weight tensor, into the id    */

static const char *const table_name[ENGRAM_TABLES] = {"blk.1.engram_embd.weight",
                                                       "blk.14.engram_embd.weight"};

static void le32(struct sha256 *h, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    sha256_update(h, b, 4);
}

static void le64(struct sha256 *h, uint64_t v)
{
    le32(h, (uint32_t)v);
    le32(h, (uint32_t)(v >> 32));
}

/* The model (V4.1, unsharded) and its parsed file, opened together. */
struct src {
    engram_model *m;
    engram_model_info in;
    gguf_file *g;
    const gguf_tensor *tab[ENGRAM_TABLES];
};

static void src_close(struct src *s)
{
    engram_model_close(s->m);
    gguf_close(s->g);
}

static int src_open(const char *path, struct src *s, engram_error *err)
{
    memset(s, 0, sizeof *s);
    int rc = engram_model_open(path, &s->m, err);
    if (rc < 0)
        return rc;
    engram_model_get_info(s->m, &s->in);
    if (s->in.family.member != ENGRAM_MEMBER_V41)
        rc = err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                     "'%s' is a %s model: shard files are made of V4.1 models only", path,
                     s->in.family.name);
    else if (s->in.shard.world)
        rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                     "'%s' is already a shard (rank %u of %u): shard the whole model", path,
                     s->in.shard.rank, s->in.shard.world);
    if (rc == 0)
        rc = gguf_open(path, &s->g, err);
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++)
        if (!(s->tab[t] = gguf_find_tensor(s->g, table_name[t])))
            rc = err_set(err, -ESTALE, ENGRAM_NO_OFFSET, "'%s' changed while it was opened", path);
    if (rc < 0)
        src_close(s);
    return rc;
}

static void to_hex(const uint8_t h[32], char out[ENGRAM_SHARD_ID_HEX + 1])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

static int identity(const struct src *s, char out[ENGRAM_SHARD_ID_HEX + 1], engram_error *err)
{
    const engram_layout *l = engram_model_layout(s->m);
    struct sha256 h;
    sha256_init(&h);
    static const char tag[] = "engram shard model id v1";
    sha256_update(&h, tag, sizeof tag);
    le32(&h, l->vocab);
    le32(&h, l->compressed_vocab);
    le32(&h, l->pad_id);
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        le32(&h, l->rows[t]);
        for (int c = 0; c < ENGRAM_COLUMNS; c++)
            le32(&h, l->primes[t][c]);
        for (int j = 0; j < ENGRAM_NGRAM; j++)
            le64(&h, l->multipliers[t][j]);
    }
    for (uint32_t i = 0; i < l->vocab; i++)
        le32(&h, l->token_map[i]);
    uint8_t *buf = malloc(ID_PREFIX_BYTES);
    if (!buf)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = 0;
    for (uint64_t i = 0; i < s->g->n_tensors && rc == 0; i++) {
        const gguf_tensor *t = &s->g->tensors[i];
        sha256_update(&h, t->name, strlen(t->name) + 1);
        le32(&h, t->type);
        le32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            le64(&h, t->dims[d]);
        if (t == s->tab[0] || t == s->tab[1])
            continue;
        /* the first 4 KiB of each weight tensor: models alike in shape
         * and tables' ends but of other weights are told apart */
        size_t n = t->bytes < ID_PREFIX_BYTES ? (size_t)t->bytes : ID_PREFIX_BYTES;
        if ((rc = util_pread_full(s->g->fd, buf, n, t->offset)) < 0)
            rc = err_set(err, rc, t->offset, "reading tensor '%s' at offset %llu: %s", t->name,
                         (unsigned long long)t->offset, engram_strerror(rc));
        else
            sha256_update(&h, buf, n);
    }
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++) {
        uint32_t ends[2] = {0, (uint32_t)(s->in.table[t].rows - 1)};
        rc = engram_model_read_raw(s->m, t, ends, 2, buf, err);
        if (rc == 0)
            sha256_update(&h, buf, 2 * ENGRAM_ROW_BYTES);
    }
    free(buf);
    if (rc < 0)
        return rc;
    uint8_t d[32];
    sha256_final(&h, d);
    to_hex(d, out);
    return 0;
}

int engram_model_identity(const char *path, char out[ENGRAM_SHARD_ID_HEX + 1], engram_error *err)
{
    if (!path || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    struct src s;
    int rc = src_open(path, &s, err);
    if (rc < 0)
        return rc;
    rc = identity(&s, out, err);
    src_close(&s);
    return rc;
}

/* Copies [from, from + bytes) of the source to the tensor's place. */
struct copy {
    int src_fd;
    uint64_t from;
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    uint64_t *done, total;
};

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static int copy_fill(void *vctx, int fd, uint64_t offset, uint64_t bytes)
{
    struct copy *c = vctx;
    size_t chunk = (size_t)COPY_ROWS * ENGRAM_ROW_BYTES;
    uint8_t *buf = malloc(chunk);
    if (!buf)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t at = 0; at < bytes && rc == 0; at += chunk) {
        size_t n = bytes - at < chunk ? (size_t)(bytes - at) : chunk;
        rc = util_pread_full(c->src_fd, buf, n, c->from + at);
        /* the output was sized with ftruncate: zeros are already there */
        if (rc == 0 && !all_zero(buf, n))
            rc = util_pwrite_full(fd, buf, n, offset + at);
        *c->done += n;
        if (c->progress)
            c->progress(c->progress_ctx, *c->done, c->total);
    }
    free(buf);
    return rc;
}

/* Every key of the source as it is (its serialized value copied byte for
 * byte), then the shard keys. */
static int copy_keys(const struct src *s, gguf_writer *w, engram_error *err)
{
    const gguf_file *g = s->g;
    if (g->n_kv == 0 || g->n_tensors == 0)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "no keys or no tensors");
    /* the keys lie back to back before the tensor infos */
    uint64_t lo = g->kv[0].key_offset, hi = g->tensors[0].info_offset;
    if (hi < lo || hi - lo > META_MAX)
        return err_set(err, -EFBIG, lo, "metadata of %llu bytes: refused above %llu",
                       (unsigned long long)(hi - lo), (unsigned long long)META_MAX);
    uint8_t *meta = malloc(hi - lo ? (size_t)(hi - lo) : 1);
    if (!meta)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for %llu bytes of metadata",
                       (unsigned long long)(hi - lo));
    int rc = util_pread_full(g->fd, meta, (size_t)(hi - lo), lo);
    if (rc < 0)
        rc = err_set(err, rc, lo, "reading the metadata: %s", engram_strerror(rc));
    for (uint64_t i = 0; i < g->n_kv && rc == 0; i++) {
        const gguf_kv *kv = &g->kv[i];
        uint64_t v = kv->type == GGUF_ARRAY ? kv->value_offset - 12 : kv->value_offset;
        uint64_t end = i + 1 < g->n_kv ? g->kv[i + 1].key_offset : hi;
        if (v < lo || end < v || end > hi) {
            rc = err_set(err, -EBADMSG, kv->key_offset, "key '%s': keys out of order", kv->key);
            break;
        }
        if (!strncmp(kv->key, SHARD_KEY, strlen(SHARD_KEY)))
            continue; /* not a shard: none there (src_open) */
        if (gguf_w_raw(w, kv->key, kv->type, meta + (v - lo), (size_t)(end - v)) < 0)
            rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    free(meta);
    return rc;
}

int engram_shard_write(const char *model, const char *model_id, unsigned rank, unsigned world,
                       const char *out, const engram_shard_write_opts *opts, engram_error *err)
{
    if (!model || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (world == 0 || world > 65536u || rank >= world)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "rank %u of a world of %u: the world must be 1..65536 and the rank below it", rank,
                       world);
    struct src s;
    int rc = src_open(model, &s, err);
    if (rc < 0)
        return rc;
    char id[ENGRAM_SHARD_ID_HEX + 1];
    if (model_id) {
        size_t n = strlen(model_id);
        int ok = n == ENGRAM_SHARD_ID_HEX;
        for (size_t i = 0; i < n && ok; i++)
            ok = (model_id[i] >= '0' && model_id[i] <= '9') || (model_id[i] >= 'a' && model_id[i] <= 'f');
        if (!ok)
            rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "model id '%s' is not %d lowercase hex digits",
                         model_id, ENGRAM_SHARD_ID_HEX);
        else
            memcpy(id, model_id, sizeof id);
    } else {
        rc = identity(&s, id, err);
    }
    uint32_t first[ENGRAM_TABLES], total[ENGRAM_TABLES];
    uint64_t nrows[ENGRAM_TABLES];
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++) {
        uint64_t R = s.in.table[t].rows;
        first[t] = (uint32_t)(rank * R / world);
        nrows[t] = (rank + 1) * R / world - first[t];
        total[t] = (uint32_t)R;
        if (nrows[t] == 0)
            rc = err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                         "a world of %u is larger than table %d (%llu rows): rank %u would own no row",
                         world, t, (unsigned long long)R, rank);
    }
    gguf_writer *w = rc == 0 ? gguf_writer_new(s.g->version, s.g->alignment) : NULL;
    if (rc == 0 && !w)
        rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    if (rc == 0)
        rc = copy_keys(&s, w, err);
    if (rc == 0 && (gguf_w_u32(w, SHARD_KEY "rank", rank) < 0 || gguf_w_u32(w, SHARD_KEY "world", world) < 0 ||
                    gguf_w_array(w, SHARD_KEY "first_row", GGUF_U32, first, ENGRAM_TABLES) < 0 ||
                    gguf_w_array(w, SHARD_KEY "total_rows", GGUF_U32, total, ENGRAM_TABLES) < 0 ||
                    gguf_w_str(w, SHARD_KEY "model_id", id) < 0))
        rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    /* the other tensors whole, in their order; then the tables' blocks,
     * last, table 0 page aligned (SPEC section 3's placement) */
    uint64_t n_t = s.g->n_tensors, done = 0, total_bytes = 0;
    struct copy *cp = rc == 0 ? calloc(n_t, sizeof *cp) : NULL;
    if (rc == 0 && !cp)
        rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    size_t k = 0;
    for (int pass = 0; pass < 1 + ENGRAM_TABLES && rc == 0; pass++)
        for (uint64_t i = 0; i < n_t && rc == 0; i++) {
            const gguf_tensor *t = &s.g->tensors[i];
            int tab = t == s.tab[0] ? 0 : t == s.tab[1] ? 1 : -1;
            if (pass == 0 ? tab >= 0 : tab != pass - 1)
                continue;
            uint64_t dims[GGUF_MAX_DIMS];
            memcpy(dims, t->dims, sizeof dims);
            uint64_t from = t->offset, bytes = t->bytes;
            if (tab >= 0) {
                dims[1] = nrows[tab];
                from += (uint64_t)first[tab] * ENGRAM_ROW_BYTES;
                bytes = nrows[tab] * ENGRAM_ROW_BYTES;
            }
            cp[k] = (struct copy){s.g->fd, from, opts ? opts->progress : NULL,
                                  opts ? opts->progress_ctx : NULL, &done, 0};
            total_bytes += bytes;
            if (gguf_w_tensor(w, t->name, t->type, t->n_dims, dims, tab == 0 ? 4096 : 0, copy_fill,
                              &cp[k]) < 0)
                rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot lay out tensor '%s'", t->name);
            k++;
        }
    for (size_t i = 0; i < k; i++)
        cp[i].total = total_bytes;
    if (rc == 0) {
        engram_output o;
        rc = engram_output_open(&o, out, ENGRAM_OUTPUT_SEEKABLE, err);
        if (rc == 0) {
            rc = gguf_w_write_fd(w, o.fd, err);
            int c = engram_output_close(&o, rc == 0, rc == 0 ? err : NULL);
            rc = rc < 0 ? rc : c;
        }
    }
    free(cp);
    gguf_writer_free(w);
    src_close(&s);
    return rc;
}
