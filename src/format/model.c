/* model.c - an open model of the family: GGUF header, validated layout
 * (V4.1's, or the PLE member's through ple_file.c), table placement and the
 * exact single-row read path. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "hash/hash.h"
#include "layout.h"
#include "model.h"
#include "ple_file.h"
#include "codec/rowcodec.h"
#include "common/util.h"

#define PAGE_ALIGN 4096u

struct engram_model {
    gguf_file *g;
    engram_layout layout;
    uint32_t *map;
    engram_hasher *hasher;
    engram_model_info info;
    char *path;
    char table_name[ENGRAM_TABLES][48];
    const gguf_tensor *weights[ENGRAM_TABLES][3]; /* engram_kv, q_norm, k_norm */
    engram_member member;
    struct ple_file ple;       /* the PLE member's keys and tensors       */
};

int model_member(const engram_model *m) { return (int)m->member; }

const gguf_file *model_gguf(const engram_model *m)
{
    return m->g;
}

const struct ple_file *model_ple(const engram_model *m)
{
    return m->member == ENGRAM_MEMBER_PLE ? &m->ple : NULL;
}

int model_v41_only(const engram_model *m, const char *what, engram_error *err)
{
    if (m->member == ENGRAM_MEMBER_V41)
        return 0;
    return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                   "%s: '%s' is a %s model, which it does not serve yet (issue #22)", what,
                   m->path, m->info.family.name);
}

static const engram_family v41_family = {
    .member = ENGRAM_MEMBER_V41, .name = "deepseek-v4.1-engram", .ngram = ENGRAM_NGRAM,
    .heads = ENGRAM_HEADS, .tables = ENGRAM_TABLES, .rows_per_token = ENGRAM_COLUMNS,
    .row_bytes = ENGRAM_ROW_BYTES, .row_values = ENGRAM_ROW_VALUES,
    .encoding = ENGRAM_ROWS_E4M3_E8M0, .raw_ids = 0, .history = ENGRAM_HISTORY,
    .layers = {1, 14}, .state_floats = 0,
};

/* The PLE member's half of engram_model_open: the qwen4exp keys and
 * tensors (ple_file.c), the one table's placement. */
static int open_ple(struct engram_model *m, engram_error *err)
{
    int rc = ple_file_read(m->g, &m->ple, err);
    if (rc < 0)
        return rc;
    m->member = ENGRAM_MEMBER_PLE;
    engram_model_info *i = &m->info;
    const gguf_tensor *t = m->ple.table;
    snprintf(m->table_name[0], sizeof m->table_name[0], "%s", t->name);
    i->table[0].name = m->table_name[0];
    i->table[0].layer = m->ple.layer;
    i->table[0].rows = m->ple.layout.rows;
    i->table[0].offset = t->offset;
    i->table[0].bytes = t->bytes;
    i->shard.rows[0] = i->shard.total_rows[0] = m->ple.layout.rows;
    i->has_projection = 1;
    i->width = m->ple.width;
    i->streams = PLE_STREAMS;
    int last = 1;
    for (uint64_t k = 0; k < m->g->n_tensors; k++)
        if (&m->g->tensors[k] != t && m->g->tensors[k].offset >= t->offset)
            last = 0;
    i->tables_last = last;
    i->table0_page_aligned = t->offset % PAGE_ALIGN == 0;
    i->family = (engram_family){
        .member = ENGRAM_MEMBER_PLE, .name = "qwen3.8-ple", .ngram = PLE_NGRAM,
        .heads = PLE_HEADS / 2, .tables = 1, .rows_per_token = PLE_HEADS,
        .row_bytes = PLE_ROW_BYTES, .row_values = PLE_ROW_VALUES, .encoding = ENGRAM_ROWS_BF16,
        .raw_ids = 1, .history = PLE_NGRAM - 1, .vocab = m->ple.layout.vocab,
        .eos = m->ple.layout.eos, .layers = {m->ple.layer, 0},
        .state_floats = 3u * (m->ple.conv_kernel - 1) * PLE_STREAMS * m->ple.width,
    };
    return 0;
}

static int check_tensor(const gguf_tensor *t, uint32_t type, uint64_t d0, uint64_t d1,
                        engram_error *err)
{
    if (t->type != type || t->n_dims != 2 || t->dims[0] != d0 || t->dims[1] != d1)
        return err_set(err, -EBADMSG, t->info_offset,
                       "tensor '%s' (info at offset %llu): %s [%llu, %llu]%s, expected %s [%llu, %llu]",
                       t->name, (unsigned long long)t->info_offset,
                       ggml_type_name(t->type) ? ggml_type_name(t->type) : "?",
                       (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                       t->n_dims != 2 ? " (not 2-D)" : "", ggml_type_name(type),
                       (unsigned long long)d0, (unsigned long long)d1);
    return 0;
}

/* Per Engram layer, engram_kv F16 [6144, (S+1)W] and engram_q_norm /
 * engram_k_norm F32 [W, S]: W and the stream count S come from the norms'
 * shapes and everything else is checked against them and against the row
 * geometry (6144 = 24 rows x 256 values).  A layer has all three or none;
 * both layers that have them must agree on W and S. */
static int check_projection(struct engram_model *m, engram_error *err)
{
    static const char *const parts[3] = {"engram_kv", "engram_q_norm", "engram_k_norm"};
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        const gguf_tensor *ts[3];
        char name[3][64];
        int present = 0;
        for (int p = 0; p < 3; p++) {
            snprintf(name[p], sizeof name[p], "blk.%d.%s.weight", engram_table_layer[t], parts[p]);
            ts[p] = gguf_find_tensor(m->g, name[p]);
            present += ts[p] != NULL;
        }
        if (present == 0)
            continue;
        for (int p = 0; p < 3; p++)
            if (!ts[p])
                return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                               "projection weights of layer %d are incomplete: missing tensor '%s'",
                               engram_table_layer[t], name[p]);
        const gguf_tensor *q = ts[1];
        if (q->n_dims != 2 || q->type != GGML_F32 || q->dims[0] == 0 || q->dims[1] == 0 ||
            q->dims[0] > ENGRAM_MAX_WIDTH || q->dims[1] > ENGRAM_MAX_STREAMS)
            return err_set(err, -EBADMSG, q->info_offset,
                           "tensor '%s' (info at offset %llu): %s with %u dims [%llu, %llu], expected "
                           "F32 [W, S] with 1 <= W <= %u and 1 <= S <= %u",
                           q->name, (unsigned long long)q->info_offset,
                           ggml_type_name(q->type) ? ggml_type_name(q->type) : "?", q->n_dims,
                           (unsigned long long)q->dims[0], (unsigned long long)q->dims[1],
                           ENGRAM_MAX_WIDTH, ENGRAM_MAX_STREAMS);
        uint32_t w = (uint32_t)q->dims[0], streams = (uint32_t)q->dims[1];
        int rc;
        if ((rc = check_tensor(ts[2], GGML_F32, w, streams, err)) < 0)
            return rc;
        if ((rc = check_tensor(ts[0], GGML_F16, ENGRAM_COLUMNS * ENGRAM_ROW_VALUES,
                               (uint64_t)(streams + 1) * w, err)) < 0)
            return rc;
        if (m->info.width && (m->info.width != w || m->info.streams != streams))
            return err_set(err, -EBADMSG, q->info_offset,
                           "tensor '%s': width %u x %u streams, but the other layer has %u x %u",
                           q->name, w, streams, m->info.width, m->info.streams);
        m->info.width = w;
        m->info.streams = streams;
        m->info.table[t].has_projection = 1;
        for (int p = 0; p < 3; p++)
            m->weights[t][p] = ts[p];
    }
    m->info.has_projection = m->info.table[0].has_projection && m->info.table[1].has_projection;
    return 0;
}

/* The shard keys (docs/shards.md): all or none; the block they name must
 * be the floor formula's for (rank, world, R), R = the layout's rows (its
 * primes' sum: a shard keeps the unsharded layout).  Fills info.shard
 * (world 0 and the whole tables for a file without them). */
static int check_shard(struct engram_model *m, engram_error *err)
{
    engram_shard_info *sh = &m->info.shard;
    memset(sh, 0, sizeof *sh);
    for (int t = 0; t < ENGRAM_TABLES; t++)
        sh->rows[t] = sh->total_rows[t] = m->layout.rows[t];
    static const char *const keys[5] = {
        ENGRAM_SHARD_KEY "rank", ENGRAM_SHARD_KEY "world", ENGRAM_SHARD_KEY "first_row",
        ENGRAM_SHARD_KEY "total_rows", ENGRAM_SHARD_KEY "model_id"};
    static const uint32_t types[5] = {GGUF_U32, GGUF_U32, GGUF_ARRAY, GGUF_ARRAY, GGUF_STRING};
    const gguf_kv *kv[5];
    int present = 0;
    for (int k = 0; k < 5; k++)
        present += (kv[k] = gguf_find_kv(m->g, keys[k])) != NULL;
    if (present == 0)
        return 0;
    for (int k = 0; k < 5; k++) {
        if (!kv[k])
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "shard file: missing key '%s' (a shard file has all five shard keys)", keys[k]);
        if (kv[k]->type != types[k])
            return err_set(err, -EBADMSG, kv[k]->key_offset, "key '%s' at offset %llu: type %s, expected %s",
                           keys[k], (unsigned long long)kv[k]->key_offset, gguf_vtype_name(kv[k]->type),
                           gguf_vtype_name(types[k]));
    }
    uint32_t first[ENGRAM_TABLES], total[ENGRAM_TABLES];
    int rc;
    if ((rc = gguf_read_array(m->g, kv[2], GGUF_U32, ENGRAM_TABLES, first, err)) < 0 ||
        (rc = gguf_read_array(m->g, kv[3], GGUF_U32, ENGRAM_TABLES, total, err)) < 0)
        return rc;
    uint64_t rank = kv[0]->u, world = kv[1]->u;
    if (world == 0 || world > ENGRAM_SHARD_MAX_WORLD || rank >= world)
        return err_set(err, -EBADMSG, kv[0]->key_offset,
                       "shard file: rank %llu of world %llu: the world must be 1..%u and the rank below it",
                       (unsigned long long)rank, (unsigned long long)world, ENGRAM_SHARD_MAX_WORLD);
    const char *id = kv[4]->str;
    size_t idn = strlen(id);
    int hex = idn == ENGRAM_SHARD_ID_HEX && (uint64_t)idn == kv[4]->str_len;
    for (size_t i = 0; i < idn && hex; i++)
        hex = (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f');
    if (!hex)
        return err_set(err, -EBADMSG, kv[4]->key_offset,
                       "key '%s' at offset %llu: not %d lowercase hex digits", keys[4],
                       (unsigned long long)kv[4]->key_offset, ENGRAM_SHARD_ID_HEX);
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        uint64_t R = m->layout.rows[t];
        if (total[t] != R)
            return err_set(err, -EBADMSG, kv[3]->key_offset,
                           "key '%s' at offset %llu: table %d: total_rows %u, but the layout's rows (sum of "
                           "its primes) are %llu",
                           keys[3], (unsigned long long)kv[3]->key_offset, t, total[t],
                           (unsigned long long)R);
        uint64_t lo = rank * R / world, hi = (rank + 1) * R / world;
        if (first[t] != lo)
            return err_set(err, -EBADMSG, kv[2]->key_offset,
                           "key '%s' at offset %llu: table %d: first_row %u, but rank %llu of %llu owns rows "
                           "[%llu, %llu) of %llu",
                           keys[2], (unsigned long long)kv[2]->key_offset, t, first[t],
                           (unsigned long long)rank, (unsigned long long)world, (unsigned long long)lo,
                           (unsigned long long)hi, (unsigned long long)R);
        if (hi == lo)
            return err_set(err, -EBADMSG, kv[1]->key_offset,
                           "shard file: rank %llu of %llu owns no row of table %d (%llu rows): a world "
                           "larger than a table is refused",
                           (unsigned long long)rank, (unsigned long long)world, t, (unsigned long long)R);
        sh->first_row[t] = lo;
        sh->rows[t] = hi - lo;
    }
    sh->rank = (uint32_t)rank;
    sh->world = (uint32_t)world;
    memcpy(sh->model_id, id, ENGRAM_SHARD_ID_HEX + 1);
    return 0;
}

static int check_tables(struct engram_model *m, engram_error *err)
{
    const gguf_tensor *tab[ENGRAM_TABLES];
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        snprintf(m->table_name[t], sizeof m->table_name[t], "blk.%d.engram_embd.weight",
                 engram_table_layer[t]);
        tab[t] = gguf_find_tensor(m->g, m->table_name[t]);
        if (!tab[t])
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "missing table tensor '%s'",
                           m->table_name[t]);
        /* a shard's tensor holds its block's rows (check_shard) */
        int rc = check_tensor(tab[t], GGML_I8, ENGRAM_ROW_BYTES, m->info.shard.rows[t], err);
        if (rc < 0)
            return rc;
        engram_table_info *ti = &m->info.table[t];
        ti->name = m->table_name[t];
        ti->layer = engram_table_layer[t];
        ti->rows = m->layout.rows[t];
        ti->offset = tab[t]->offset;
        ti->bytes = tab[t]->bytes; /* = rows * 264, inside the file (gguf.c) */
    }
    int last = tab[0]->offset < tab[1]->offset;
    for (uint64_t i = 0; i < m->g->n_tensors && last; i++) {
        const gguf_tensor *t = &m->g->tensors[i];
        if (t != tab[0] && t != tab[1] && t->offset >= tab[0]->offset)
            last = 0;
    }
    m->info.tables_last = last;
    m->info.table0_page_aligned = tab[0]->offset % PAGE_ALIGN == 0;
    return 0;
}

int engram_model_open(const char *path, engram_model **out, engram_error *err)
{
    if (!path || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    struct engram_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    int rc = gguf_open(path, &m->g, err);
    const gguf_kv *ak = rc == 0 ? gguf_find_kv(m->g, "general.architecture") : NULL;
    if (ak && ak->type == GGUF_STRING && !strcmp(ak->str, PLE_ARCH)) {
        rc = open_ple(m, err);
        if (rc < 0) {
            engram_model_close(m);
            return rc;
        }
        goto info; /* the V4.1 layout, tables and hasher are not this file's */
    }
    if (rc == 0)
        rc = layout_from_gguf(m->g, &m->layout, &m->map, err);
    if (rc == 0)
        rc = check_shard(m, err);
    if (rc == 0)
        rc = check_tables(m, err);
    if (rc == 0)
        rc = check_projection(m, err);
    if (rc == 0)
        rc = engram_hasher_new(&m->layout, &m->hasher, err);
    if (rc < 0) {
        engram_model_close(m);
        return rc;
    }
    /* The hasher keeps its own copy of the token map: the model's layout
     * points at it, so the map is held once. */
    free(m->map);
    m->map = NULL;
    m->layout.token_map = engram_hasher_layout(m->hasher)->token_map;
    m->info.family = v41_family;
    m->info.family.vocab = m->layout.vocab;
info:;
    engram_model_info *i = &m->info;
    const gguf_kv *arch = gguf_find_kv(m->g, "general.architecture");
    i->path = m->path;
    i->architecture = arch && arch->type == GGUF_STRING ? arch->str : "";
    i->gguf_version = m->g->version;
    i->file_bytes = m->g->size;
    i->n_tensors = m->g->n_tensors;
    i->n_kv = m->g->n_kv;
    i->alignment = m->g->alignment;
    *out = m;
    return 0;
}

void engram_model_close(engram_model *m)
{
    if (!m)
        return;
    engram_hasher_free(m->hasher);
    free(m->map);
    gguf_close(m->g);
    free(m->path);
    free(m);
}

const engram_layout *engram_model_layout(const engram_model *m)
{
    return m && m->member == ENGRAM_MEMBER_V41 ? &m->layout : NULL;
}

const engram_hasher *engram_model_hasher(const engram_model *m) { return m ? m->hasher : NULL; }

void engram_ple_history_reset(const engram_model *m, engram_ple_history *h)
{
    if (!m || !h || m->member != ENGRAM_MEMBER_PLE)
        return;
    struct ple_history s;
    ple_history_start(&m->ple.layout, &s);
    memcpy(h->lag, s.lag, sizeof h->lag);
}

int engram_ple_hash(const engram_model *m, engram_ple_history *h, const uint32_t *tokens,
                    const uint8_t *kinds, size_t n, uint32_t *rows, engram_error *err)
{
    if (!m || !h || (n > 0 && (!tokens || !rows)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (m->member != ENGRAM_MEMBER_PLE)
        return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                       "engram_ple_hash: '%s' is not a PLE (qwen4exp) model", m->path);
    struct ple_history s;
    memcpy(s.lag, h->lag, sizeof s.lag);
    int rc = ple_hash(&m->ple.layout, tokens, kinds, n, &s, rows, err);
    if (rc == 0)
        memcpy(h->lag, s.lag, sizeof h->lag);
    return rc;
}

void engram_model_get_info(const engram_model *m, engram_model_info *info)
{
    if (m && info)
        *info = m->info;
}

int model_fd(const engram_model *m) { return m->g->fd; }

const gguf_tensor *model_weight(const engram_model *m, int table, int part)
{
    return m->weights[table][part];
}

int engram_model_dup_fd(const engram_model *m)
{
    if (!m)
        return -EINVAL;
    int fd = fcntl(m->g->fd, F_DUPFD_CLOEXEC, 0);
    return fd < 0 ? -errno : fd;
}

/* The arguments of a row read: the model, the table, the row ids and the
 * output (out: raw rows or decoded values). */
static int check_rows(const engram_model *m, int t, const uint32_t *rows, size_t n,
                      const void *out, engram_error *err)
{
    if (!m || (n > 0 && (!rows || !out)))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (t < 0 || (uint32_t)t >= m->info.family.tables)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not %s", t,
                       m->info.family.tables == 1 ? "0 (the only table)" : "0 or 1");
    for (size_t i = 0; i < n; i++) {
        int rc = model_row_check(&m->info, t, rows[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int model_row_check(const engram_model_info *in, int t, uint32_t row, engram_error *err)
{
    const engram_shard_info *sh = &in->shard;
    if (row >= in->table[t].rows)
        return err_set_row(err, -EINVAL, row, "row %u of table %d: out of range (table has %llu rows)",
                           row, t, (unsigned long long)in->table[t].rows);
    if (row - sh->first_row[t] >= sh->rows[t]) /* unsigned: rows below the block wrap above it */
        return err_set_row(err, -EINVAL, row,
                           "row %u of table %d is not in this shard's block [%llu, %llu) (rank %u of %u)",
                           row, t, (unsigned long long)sh->first_row[t],
                           (unsigned long long)(sh->first_row[t] + sh->rows[t]), sh->rank, sh->world);
    return 0;
}

int engram_model_read_raw(const engram_model *m, int t, const uint32_t *rows, size_t n,
                          uint8_t *raw, engram_error *err)
{
    int rc = check_rows(m, t, rows, n, raw, err);
    if (rc < 0)
        return rc;
    uint64_t base = m->info.table[t].offset;
    size_t rb = m->info.family.row_bytes;
    for (size_t i = 0; i < n; i++) {
        uint64_t off = base + (rows[i] - m->info.shard.first_row[t]) * rb;
        /* Through a row-sized buffer, so a failing row leaves its part of
         * raw untouched (the documented promise). */
        uint8_t one[PLE_ROW_BYTES > ENGRAM_ROW_BYTES ? PLE_ROW_BYTES : ENGRAM_ROW_BYTES];
        rc = util_pread_full(m->g->fd, one, rb, off);
        if (rc == 0)
            memcpy(raw + i * rb, one, rb);
        if (rc < 0)
            return err_set_at(err, rc, off, rows[i], "row %u of table %d (file offset %llu): %s",
                              rows[i], t, (unsigned long long)off, engram_strerror(rc));
    }
    return 0;
}

/* Temporary memory: n * 264 bytes, so that out stays untouched on error. */
static int read_decoded(const engram_model *m, int t, const uint32_t *rows, size_t n, void *out,
                        int f32, engram_error *err)
{
    int rc = check_rows(m, t, rows, n, out, err);
    if (rc < 0 || n == 0)
        return rc;
    uint8_t *raw = malloc(n * m->info.family.row_bytes);
    if (!raw)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory for %zu rows", n);
    rc = engram_model_read_raw(m, t, rows, n, raw, err);
    if (rc == 0 && m->member == ENGRAM_MEMBER_PLE) {
        /* BF16 rows: the values as they are, or widened exactly */
        if (f32)
            rows_bf16_widen(raw, n * PLE_ROW_VALUES, out);
        else
            rows_bf16_copy(raw, n * PLE_ROW_VALUES, out);
    } else if (rc == 0) {
        engram_error e; /* e.row: the first invalid row's index in rows */
        rc = f32 ? engram_rows_decode_f32(ENGRAM_SIMD_AUTO, raw, n, out, &e)
                 : engram_rows_decode_bf16(ENGRAM_SIMD_AUTO, raw, n, out, &e);
        if (rc == -EDOM) {
            size_t bad = (size_t)e.row;
            const char *why = "invalid";
            row_check_reason(raw + bad * ENGRAM_ROW_BYTES, &why);
            err_set_row(err, rc, rows[bad], "row %u of table %d: %s", rows[bad], t, why);
        }
    }
    free(raw);
    return rc;
}

int engram_model_read_f32(const engram_model *m, int t, const uint32_t *rows, size_t n,
                          float *out, engram_error *err)
{
    return read_decoded(m, t, rows, n, out, 1, err);
}

int engram_model_read_bf16(const engram_model *m, int t, const uint32_t *rows, size_t n,
                           uint16_t *out, engram_error *err)
{
    return read_decoded(m, t, rows, n, out, 0, err);
}
