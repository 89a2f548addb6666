/*
 * test_ple_model.c - the PLE member through the public API (issue #22): a
 * qwen4exp file opens with engram_model_open and says which member it is
 * (engram_family); engram_ple_hash gives SPEC.md section 10's known rows on
 * a full-size layout (a sparse file: the table is holes) and the same rows
 * however the stream is cut; rows read back as written (raw, BF16, F32:
 * the values a formula put there), through the reader too; what does not
 * serve the member yet refuses it with -ENOTSUP, and V4.1 models refuse
 * the PLE hash.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "../src/format/gguf.h"
#include "../src/tools/ple_gen.h"

#define VOCAB 248320u
#define EOS 248044u
#define W 64u

/* Row r, value c of the small file's table: BF16 bits from a formula,
 * never NaN or Inf (exponent field below 0xff). */
static uint16_t cell(uint64_t r, unsigned c)
{
    uint32_t x = (uint32_t)(r * 2654435761u + c * 40503u);
    return (uint16_t)((x & 0x807f) | ((0x70 + (x >> 16) % 32) << 7));
}

static int fill_table(void *ctx, int fd, uint64_t off, uint64_t bytes)
{
    (void)ctx;
    static uint8_t buf[320 * 256];
    for (uint64_t done = 0; done < bytes;) {
        uint64_t r0 = done / 320, k = (bytes - done) / 320 < 256 ? (bytes - done) / 320 : 256;
        for (uint64_t r = 0; r < k; r++)
            for (unsigned c = 0; c < 160; c++) {
                uint16_t b = cell(r0 + r, c);
                buf[r * 320 + 2 * c] = (uint8_t)b;
                buf[r * 320 + 2 * c + 1] = (uint8_t)(b >> 8);
            }
        if (pwrite(fd, buf, k * 320, (off_t)(off + done)) != (ssize_t)(k * 320))
            return -EIO;
        done += k * 320;
    }
    return 0;
}

/* A qwen4exp file of layout l; the table filled by the formula or left as
 * holes. */
static int write_ple(const char *path, const struct ple_layout *l, int filled)
{
    gguf_writer *w = gguf_writer_new(3, 32);
    gguf_w_str(w, "general.architecture", "qwen4exp");
    uint32_t layers[1] = {1};
    gguf_w_array(w, "qwen4exp.ple.layers", GGUF_U32, layers, 1);
    gguf_w_u32(w, "qwen4exp.ple.ngram_size", 3);
    gguf_w_u32(w, "qwen4exp.ple.heads_per_ngram", 8);
    gguf_w_u32(w, "qwen4exp.ple.conv_kernel", 4);
    gguf_w_u32(w, "qwen4exp.vocab_size", l->vocab);
    gguf_w_u32(w, "qwen4exp.ple.eos_token_id", l->eos);
    uint64_t m[3], off[16], sz[16];
    for (int j = 0; j < 3; j++)
        m[j] = l->multipliers[j];
    for (int h = 0; h < 16; h++) {
        off[h] = l->offsets[h];
        sz[h] = l->sizes[h];
    }
    gguf_w_array(w, "qwen4exp.ple.layer_multipliers", GGUF_U64, m, 3);
    gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_U64, off, 16);
    gguf_w_array(w, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, sz, 16);
    gguf_w_u32(w, "qwen4exp.embedding_length_per_layer_input", 160);
    float eps = 1e-6f;
    gguf_w_scalar(w, "qwen4exp.attention.layer_norm_rms_epsilon", GGUF_F32, &eps);
    uint64_t dk[2] = {2560, 4 * W}, dv[2] = {2560, W}, dn[1] = {4 * W}, dc[2] = {4, 4 * W};
    gguf_w_tensor(w, "blk.1.ple_key.weight", GGML_BF16, 2, dk, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_value.weight", GGML_BF16, 2, dv, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_key.weight", GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_query.weight", GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_conv.weight", GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_conv1d.weight", GGML_F32, 2, dc, 0, NULL, NULL);
    uint64_t dt[2] = {160, l->rows};
    gguf_w_tensor(w, "per_layer_token_embd.weight", GGML_BF16, 2, dt, 4096,
                  filled ? fill_table : NULL, NULL);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    engram_error err;
    int rc = fd < 0 ? -errno : gguf_w_write_fd(w, fd, &err);
    if (fd >= 0)
        close(fd);
    gguf_writer_free(w);
    return rc;
}

static void full_size(void)
{
    /* Qwen3.8's own layout (base 19,999,999, ple_index 0): the table is
     * 95.37 GiB of holes */
    struct ple_layout l;
    CHECK_EQ(ple_layout_generate(0, 19999999u, VOCAB, EOS, PLE_NO_IMAGE, &l, NULL), 0);
    char path[300];
    tu_path(path, sizeof path, "ple_full.gguf");
    CHECK_EQ(write_ple(path, &l, 0), 0);
    engram_model *m = tu_open_model(path);
    CHECK(m != NULL);
    if (!m)
        return;
    engram_model_info in;
    engram_model_get_info(m, &in);
    const engram_family *f = &in.family;
    CHECK_EQ(f->member, ENGRAM_MEMBER_PLE);
    CHECK(!strcmp(f->name, "qwen3.8-ple"));
    CHECK_EQ(f->ngram, 3u);
    CHECK_EQ(f->heads, 8u);
    CHECK_EQ(f->tables, 1u);
    CHECK_EQ(f->rows_per_token, 16u);
    CHECK_EQ(f->row_bytes, 320u);
    CHECK_EQ(f->row_values, 160u);
    CHECK_EQ(f->encoding, ENGRAM_ROWS_BF16);
    CHECK_EQ(f->raw_ids, 1);
    CHECK_EQ(f->history, 2u);
    CHECK_EQ(f->vocab, VOCAB);
    CHECK_EQ(f->eos, EOS);
    CHECK_EQ(f->layers[0], 1u);
    CHECK_EQ(f->state_floats, 9u * 4u * W);
    CHECK_EQ(in.table[0].rows, 320001536ull); /* SPEC: 320,001,446 padded to 128 */
    CHECK_EQ(in.table[0].bytes, 320001536ull * 320);
    CHECK_EQ(in.table[0].offset % 4096, 0ull);
    CHECK(in.tables_last);
    CHECK_EQ(in.width, W);
    CHECK_EQ(in.streams, 4u);
    CHECK(!strcmp(in.architecture, "qwen4exp"));

    /* SPEC.md section 10's known rows: heads 0, 7, 8, 15 of the last token
     * of each sequence, from a sequence start */
    static const uint32_t seq[3] = {9707, 11, 220};
    static const uint32_t known[3][4] = {{16410909, 152932897, 169641436, 300984276},
                                         {18158303, 159566246, 175132467, 307699687},
                                         {15029315, 143479041, 162897307, 308764256}};
    for (int n = 1; n <= 3; n++) {
        engram_ple_history h;
        engram_ple_history_reset(m, &h);
        uint32_t rows[3 * 16];
        engram_error err;
        CHECK_EQ(engram_ple_hash(m, &h, seq, NULL, (size_t)n, rows, &err), 0);
        const uint32_t *last = rows + 16 * (n - 1);
        CHECK_EQ(last[0], known[n - 1][0]);
        CHECK_EQ(last[7], known[n - 1][1]);
        CHECK_EQ(last[8], known[n - 1][2]);
        CHECK_EQ(last[15], known[n - 1][3]);
        /* every id lies in its head's range, below the row count */
        for (int k = 0; k < 16 * n; k++)
            CHECK(rows[k] < 320001446u);
    }

    /* a stream cut anywhere hashes as one call; EOS and padding rules pass
     * through the public kinds */
    enum { N = 200 };
    uint32_t tok[N], one[N * 16], cut[N * 16];
    uint8_t kinds[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) {
        tok[i] = i % 37 == 5 ? EOS : (uint32_t)(tu_rand(&seed) % VOCAB);
        kinds[i] = i % 23 == 4 ? ENGRAM_PLE_PAD : i % 41 == 9 ? ENGRAM_PLE_IMAGE : ENGRAM_PLE_TEXT;
    }
    engram_ple_history h1, h2;
    engram_ple_history_reset(m, &h1);
    CHECK_EQ(engram_ple_hash(m, &h1, tok, kinds, N, one, NULL), 0);
    for (int trial = 0; trial < 20; trial++) {
        engram_ple_history_reset(m, &h2);
        memset(cut, 0, sizeof cut);
        for (size_t at = 0; at < N;) {
            size_t k = 1 + tu_rand(&seed) % 17;
            k = k > N - at ? N - at : k;
            CHECK_EQ(engram_ple_hash(m, &h2, tok + at, kinds + at, k, cut + at * 16, NULL), 0);
            at += k;
        }
        CHECK(memcmp(one, cut, sizeof one) == 0);
        CHECK(memcmp(&h1, &h2, sizeof h1) == 0);
    }
    /* padding hashes as EOS: a padded token's rows are EOS's after the
     * same history */
    uint32_t eos_tok = EOS, a[16], b[16];
    uint8_t pad = ENGRAM_PLE_PAD;
    engram_ple_history_reset(m, &h1);
    engram_ple_history_reset(m, &h2);
    CHECK_EQ(engram_ple_hash(m, &h1, &seq[0], &pad, 1, a, NULL), 0);
    CHECK_EQ(engram_ple_hash(m, &h2, &eos_tok, NULL, 1, b, NULL), 0);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* refusals: an id >= vocab (nothing written, history kept), NULLs,
     * and what does not serve the member yet */
    uint32_t bad[2] = {5, VOCAB}, out[32];
    memset(out, 0xab, sizeof out);
    engram_ple_history before;
    engram_ple_history_reset(m, &h1);
    before = h1;
    engram_error err;
    CHECK_EQ(engram_ple_hash(m, &h1, bad, NULL, 2, out, &err), -EINVAL);
    CHECK(out[0] == 0xabababab && out[31] == 0xabababab);
    CHECK(memcmp(&before, &h1, sizeof h1) == 0);
    CHECK_EQ(engram_ple_hash(NULL, &h1, bad, NULL, 1, out, &err), -EINVAL);
    CHECK_EQ(engram_ple_hash(m, NULL, bad, NULL, 1, out, &err), -EINVAL);
    CHECK_EQ(engram_ple_hash(m, &h1, NULL, NULL, 1, out, &err), -EINVAL);
    CHECK_EQ(engram_ple_hash(m, &h1, bad, NULL, 1, NULL, &err), -EINVAL);
    CHECK_EQ(engram_ple_hash(m, &h1, NULL, NULL, 0, NULL, &err), 0);
    CHECK(engram_model_layout(m) == NULL);
    CHECK(engram_model_hasher(m) == NULL);
    /* the uncached reader serves the member: the first and last rows of
     * the full-size table (holes) arrive as zero BF16 rows */
    engram_reader *r = NULL;
    CHECK_EQ(engram_reader_open(m, NULL, &r, &err), 0);
    uint32_t edge[16] = {0};
    edge[15] = 320001535u;
    static uint16_t got[16 * 160];
    memset(got, 0x55, sizeof got);
    CHECK_EQ(engram_reader_batch(r, 0, edge, 1, ENGRAM_BF16, got, &err), 0);
    int zeros = 1;
    for (size_t k = 0; k < 16 * 160; k++)
        zeros &= got[k] == 0;
    CHECK(zeros);
    edge[3] = 320001536u;
    CHECK_ERR(engram_reader_batch(r, 0, edge, 1, ENGRAM_BF16, got, &err), err, -EINVAL, "out of range");
    CHECK_ERR(engram_reader_batch(r, 1, edge, 1, ENGRAM_BF16, got, &err), err, -EINVAL, "table 1");
    engram_reader_close(r);
    engram_pool *p = NULL;
    CHECK_ERR(engram_pool_open(m, NULL, &p, &err), err, -ENOTSUP, "qwen3.8-ple");
    CHECK(p == NULL);
    engram_layer *L = NULL;
    CHECK_ERR(engram_layer_open(m, 1, &L, &err), err, -EINVAL, "one table");
    CHECK(L == NULL);
    /* holes read as zero rows; the last row exists, one past it does not */
    uint32_t ids[2] = {0, 320001535u};
    uint8_t raw[2 * 320];
    memset(raw, 0x11, sizeof raw);
    CHECK_EQ(engram_model_read_raw(m, 0, ids, 2, raw, &err), 0);
    int zero = 1;
    for (size_t k = 0; k < sizeof raw; k++)
        zero &= raw[k] == 0;
    CHECK(zero);
    ids[0] = 320001536u;
    CHECK_ERR(engram_model_read_raw(m, 0, ids, 1, raw, &err), err, -EINVAL, "out of range");
    CHECK_ERR(engram_model_read_raw(m, 1, ids + 1, 1, raw, &err), err, -EINVAL, "only table");
    engram_model_close(m);
}

static void small_rows(void)
{
    struct ple_layout l;
    CHECK_EQ(ple_layout_generate(0, 1000, VOCAB, EOS, PLE_NO_IMAGE, &l, NULL), 0);
    char path[300];
    tu_path(path, sizeof path, "ple_small.gguf");
    CHECK_EQ(write_ple(path, &l, 1), 0);
    engram_model *m = tu_open_model(path);
    CHECK(m != NULL);
    if (!m)
        return;
    /* rows read back as the formula wrote them: raw bytes, BF16 bits, F32
     * (BF16 widened: the bits shifted up) */
    uint32_t ids[5] = {0, 1, 777, l.rows / 2, l.rows - 1};
    uint8_t raw[5 * 320];
    uint16_t bf[5 * 160];
    float f[5 * 160];
    engram_error err;
    CHECK_EQ(engram_model_read_raw(m, 0, ids, 5, raw, &err), 0);
    CHECK_EQ(engram_model_read_bf16(m, 0, ids, 5, bf, &err), 0);
    CHECK_EQ(engram_model_read_f32(m, 0, ids, 5, f, &err), 0);
    int same_raw = 1, same_bf = 1, same_f = 1;
    for (int i = 0; i < 5; i++)
        for (unsigned c = 0; c < 160; c++) {
            uint16_t want = cell(ids[i], c);
            same_raw &= raw[i * 320 + 2 * c] == (uint8_t)want &&
                        raw[i * 320 + 2 * c + 1] == (uint8_t)(want >> 8);
            same_bf &= bf[i * 160 + c] == want;
            uint32_t u;
            memcpy(&u, &f[i * 160 + c], 4);
            same_f &= u == (uint32_t)want << 16;
        }
    CHECK(same_raw);
    CHECK(same_bf);
    CHECK(same_f);
    engram_model_close(m);
}

static void v41_refuses_ple_hash(void)
{
    engram_layout l;
    static uint32_t map[1000];
    char path[300];
    CHECK_EQ(tu_layout(&l, map, 1000, 900, 3000), 0);
    CHECK_EQ(tu_build("v41.gguf", &l, ENGRAM_FILL_ZERO, 0, path, sizeof path), 0);
    engram_model *m = tu_open_model(path);
    CHECK(m != NULL);
    if (!m)
        return;
    engram_model_info in;
    engram_model_get_info(m, &in);
    CHECK_EQ(in.family.member, ENGRAM_MEMBER_V41);
    CHECK_EQ(in.family.row_bytes, (uint32_t)ENGRAM_ROW_BYTES);
    CHECK_EQ(in.family.rows_per_token, (uint32_t)ENGRAM_COLUMNS);
    CHECK_EQ(in.family.tables, 2u);
    CHECK_EQ(in.family.vocab, 1000u);
    CHECK(engram_model_layout(m) != NULL);
    engram_ple_history h = {{1, 2}};
    uint32_t t = 5, rows[16];
    engram_error err;
    CHECK_ERR(engram_ple_hash(m, &h, &t, NULL, 1, rows, &err), err, -ENOTSUP, "not a PLE");
    engram_ple_history_reset(m, &h); /* nothing for a V4.1 model */
    CHECK(h.lag[0] == 1 && h.lag[1] == 2);
    engram_model_close(m);
}

int main(void)
{
    full_size();
    small_rows();
    v41_refuses_ple_hash();
    return tu_finish("test_ple_model");
}
