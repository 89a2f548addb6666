/*
 * build.c - writes complete ds4-dialect models: layout keys, optional
 * projection weights, and the two tables last (table 0 page aligned).
 * Every byte is a function of (seed, tensor, position), so a model is
 * reproducible and sparse fills can write rows independently.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engram_tools.h"
#include "format/gguf.h"
#include "format/layout.h"
#include "common/util.h"

#define FILL_CHUNK_ROWS 16384u      /* 4.3 MB of rows per write */
#define SPARSE_EVERY 4096u

struct fill_ctx {
    const engram_build_opts *o;
    int table;                      /* table index, or -1 for weights */
    uint64_t salt;
    uint64_t *done, total;          /* progress over all filled bytes */
};

static void progress(struct fill_ctx *c, uint64_t add)
{
    *c->done += add;
    if (c->o->progress)
        c->o->progress(c->o->progress_ctx, *c->done, c->total);
}

/* A random valid row: no NaN code, scales mostly near 2^0 with a tail over
 * the whole non-overflowing range (so small-scale, subnormal results occur). */
static void random_row(uint64_t seed, uint8_t *row)
{
    uint64_t st = seed;
    for (int i = 0; i < ENGRAM_ROW_VALUES; i += 8) {
        uint64_t r = splitmix64(&st);
        for (int k = 0; k < 8; k++) {
            uint8_t c = (uint8_t)(r >> (8 * k));
            row[i + k] = (c & 0x7f) == 0x7f ? (uint8_t)(c - 1) : c;
        }
    }
    uint64_t r = splitmix64(&st);
    for (int b = 0; b < 8; b++) {
        uint8_t x = (uint8_t)(r >> (8 * b));
        row[ENGRAM_ROW_VALUES + b] = (x & 0xf0) == 0 ? (uint8_t)(x * 246 / 15) /* 0..246 */
                                                     : (uint8_t)(112 + (x & 15));
    }
}

/* A row as a trained table might hold: 256 values of an approximately
 * normal distribution (sum of four uniforms, mean 0, sigma 1), quantized by
 * SPEC section 7's quantizer. */
static void normal_row(uint64_t seed, uint8_t *row)
{
    uint64_t st = seed;
    float v[ENGRAM_ROW_VALUES];
    for (int i = 0; i < ENGRAM_ROW_VALUES; i++) {
        uint64_t r = splitmix64(&st);
        float u = 0.0f;
        for (int k = 0; k < 4; k++)
            u += (float)((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
        v[i] = (u - 2.0f) * 1.7320508f;
    }
    engram_rows_quantize_f32(v, 1, row, NULL, NULL);
}

static uint64_t row_seed(const engram_build_opts *o, int table, uint64_t row)
{
    uint64_t st = o->seed ^ ((uint64_t)(table + 1) << 56) ^ row;
    return splitmix64(&st);
}

#define POOL_ROWS 65536u

static int fill_table(void *vctx, int fd, uint64_t offset, uint64_t bytes)
{
    struct fill_ctx *c = vctx;
    const engram_build_opts *o = c->o;
    uint64_t rows = bytes / ENGRAM_ROW_BYTES;
    uint8_t *pool = NULL;
    if (o->fill == ENGRAM_FILL_POOL) {
        if (!(pool = malloc((size_t)POOL_ROWS * ENGRAM_ROW_BYTES)))
            return -ENOMEM;
        for (uint32_t i = 0; i < POOL_ROWS; i++)
            random_row(row_seed(o, c->table, i), pool + (size_t)i * ENGRAM_ROW_BYTES);
    }
    if (o->fill == ENGRAM_FILL_SPARSE) {
        uint8_t row[ENGRAM_ROW_BYTES];
        for (uint64_t r = 0; r < rows; r += SPARSE_EVERY) {
            random_row(row_seed(o, c->table, r), row);
            int rc = util_pwrite_full(fd, row, sizeof row, offset + r * ENGRAM_ROW_BYTES);
            if (rc < 0)
                return rc;
            if ((r / SPARSE_EVERY) % 1024 == 1023)
                progress(c, 0);
        }
        progress(c, bytes);
        return 0;
    }
    uint8_t *buf = malloc((size_t)FILL_CHUNK_ROWS * ENGRAM_ROW_BYTES);
    if (!buf) {
        free(pool);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint64_t r = 0; r < rows && rc == 0; r += FILL_CHUNK_ROWS) {
        uint64_t k = rows - r < FILL_CHUNK_ROWS ? rows - r : FILL_CHUNK_ROWS;
        for (uint64_t i = 0; i < k; i++) {
            uint8_t *dst = buf + i * ENGRAM_ROW_BYTES;
            if (pool) {
                uint64_t h = (r + i) * 0x9e3779b97f4a7c15ull;
                memcpy(dst, pool + (size_t)(h >> 48) * ENGRAM_ROW_BYTES, ENGRAM_ROW_BYTES);
            } else if (o->fill == ENGRAM_FILL_NORMAL) {
                normal_row(row_seed(o, c->table, r + i), dst);
            } else {
                random_row(row_seed(o, c->table, r + i), dst);
            }
        }
        rc = util_pwrite_full(fd, buf, (size_t)k * ENGRAM_ROW_BYTES, offset + r * ENGRAM_ROW_BYTES);
        progress(c, k * ENGRAM_ROW_BYTES);
    }
    free(buf);
    free(pool);
    return rc;
}

/* F16 weights of magnitude 2^-10 .. 2^-3, F32 norms near 1. */
static int fill_weights(void *vctx, int fd, uint64_t offset, uint64_t bytes)
{
    struct fill_ctx *c = vctx;
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf)
        return -ENOMEM;
    uint64_t st = c->o->seed ^ c->salt;
    int f16 = c->table == -1;
    int rc = 0;
    for (uint64_t at = 0; at < bytes && rc == 0; at += CHUNK) {
        size_t n = bytes - at < CHUNK ? (size_t)(bytes - at) : CHUNK;
        for (size_t i = 0; i < n; i += 4) {
            uint64_t r = splitmix64(&st);
            if (f16) {
                uint16_t a = (uint16_t)((r & 0x8000) | ((5 + (r >> 16) % 8) << 10) | ((r >> 24) & 0x3ff));
                uint16_t b = (uint16_t)(((r >> 32) & 0x8000) | ((5 + (r >> 48) % 8) << 10) | ((r >> 54) & 0x3ff));
                memcpy(buf + i, &a, 2);
                memcpy(buf + i + 2, &b, 2);
            } else {
                float v = 0.75f + (float)(r >> 40) / (float)(1u << 24) * 0.5f;
                memcpy(buf + i, &v, 4);
            }
        }
        rc = util_pwrite_full(fd, buf, n, offset + at);
        progress(c, n);
    }
    free(buf);
    return rc;
}

static int add_metadata(gguf_writer *w, const engram_layout *l)
{
    int rc = 0;
    rc |= gguf_w_str(w, "general.architecture", ENGRAM_ARCH);
    rc |= gguf_w_str(w, "general.name", "engram generated model");
    rc |= gguf_w_str(w, ENGRAM_ARCH ".engram.encoding", ENGRAM_ENCODING);
    rc |= gguf_w_u32(w, ENGRAM_ARCH ".engram.compressed_vocab_size", l->compressed_vocab);
    rc |= gguf_w_u32(w, ENGRAM_ARCH ".engram.pad_id", l->pad_id);
    rc |= gguf_w_array(w, ENGRAM_ARCH ".engram.token_map", GGUF_U32, l->token_map, l->vocab);
    rc |= gguf_w_array(w, ENGRAM_ARCH ".engram.rows", GGUF_U32, l->rows, ENGRAM_TABLES);
    rc |= gguf_w_array(w, ENGRAM_ARCH ".engram.primes", GGUF_U32, l->primes,
                       ENGRAM_TABLES * ENGRAM_COLUMNS);
    rc |= gguf_w_array(w, ENGRAM_ARCH ".engram.multipliers", GGUF_U64, l->multipliers,
                       ENGRAM_TABLES * ENGRAM_NGRAM);
    return rc ? -ENOMEM : 0;
}

/* After a rename: the directory entry on disk too (engram_tools.h). */
void engram_sync_dir_of(const char *path)
{
    if (!path)
        return;
    const char *slash = strrchr(path, '/');
    char dir[4096];
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (!slash)
        strcpy(dir, ".");
    else if (n == 0)
        strcpy(dir, "/");
    else if (n < sizeof dir) {
        memcpy(dir, path, n);
        dir[n] = 0;
    } else
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int engram_build_model(const char *path, const engram_build_opts *o, engram_error *err)
{
    if (!path || !o)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = engram_layout_validate(&o->layout, err);
    if (rc < 0)
        return rc;
    int version = o->gguf_version ? o->gguf_version : 3;
    if ((version != 2 && version != 3) || o->fill > ENGRAM_FILL_NORMAL || o->width > (1u << 20))
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad build options");

    gguf_writer *w = gguf_writer_new((uint32_t)version, GGUF_DEFAULT_ALIGNMENT);
    if (!w)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    uint64_t done = 0, total = 0;
    struct fill_ctx ctx[3 * ENGRAM_TABLES + ENGRAM_TABLES];
    int nctx = 0;
    rc = add_metadata(w, &o->layout);
    for (int t = 0; t < ENGRAM_TABLES && rc == 0 && o->width > 0; t++) {
        static const char *const parts[3] = {"engram_kv", "engram_q_norm", "engram_k_norm"};
        for (int p = 0; p < 3 && rc == 0; p++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", engram_table_layer[t], parts[p]);
            uint64_t dims[2] = {p == 0 ? ENGRAM_COLUMNS * ENGRAM_ROW_VALUES : o->width,
                                p == 0 ? 5ull * o->width : 4};
            ctx[nctx] = (struct fill_ctx){o, p == 0 ? -1 : -2, 0x5eed0000ull + (uint64_t)nctx,
                                          &done, 0};
            rc = gguf_w_tensor(w, name, p == 0 ? GGML_F16 : GGML_F32, 2, dims, 0, fill_weights,
                               &ctx[nctx]);
            total += p == 0 ? dims[0] * dims[1] * 2 : dims[0] * dims[1] * 4;
            nctx++;
        }
    }
    for (int t = 0; t < ENGRAM_TABLES && rc == 0; t++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.engram_embd.weight", engram_table_layer[t]);
        uint64_t dims[2] = {ENGRAM_ROW_BYTES, o->layout.rows[t]};
        ctx[nctx] = (struct fill_ctx){o, t, 0, &done, 0};
        rc = gguf_w_tensor(w, name, GGML_I8, 2, dims, t == 0 ? 4096 : 0,
                           o->fill == ENGRAM_FILL_ZERO ? NULL : fill_table, &ctx[nctx]);
        if (o->fill != ENGRAM_FILL_ZERO)
            total += dims[1] * ENGRAM_ROW_BYTES;
        nctx++;
    }
    for (int i = 0; i < nctx; i++)
        ctx[i].total = total;
    if (rc < 0) {
        gguf_writer_free(w);
        return err_set(err, rc, ENGRAM_NO_OFFSET, "cannot lay out the model: %s",
                       engram_strerror(rc));
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
