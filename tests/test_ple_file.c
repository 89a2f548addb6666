/*
 * test_ple_file.c - the qwen4exp file's PLE keys and tensors (SPEC.md
 * section 10): a file written by the GGUF writer with the layout's
 * generators opens with every field as written; then one rule broken per
 * file, each refused with the key or tensor named (a quantized table by
 * its type, another architecture with -ENOTSUP).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "../src/format/gguf.h"
#include "../src/format/ple_file.h"
#include "../src/tools/ple_gen.h"

#define VOCAB 248320u
#define EOS 248044u
#define W 8u

enum breakage {
    OK, ARCH, QUANT_TABLE, F16_TABLE, NO_EOS, EOS_RANGE, IMAGE_RANGE, EVEN_MULT, SHORT_SIZES,
    NOT_PRIME, BAD_OFFSET, KEY_SHAPE, NORM_F16, CONV_SHAPE, NO_EPS, NGRAM, ROWS_SHORT, NEG_OFFSET,
    N_BREAKAGES
};

static const char *const expect[N_BREAKAGES] = {
    [ARCH] = "qwen4exp", [QUANT_TABLE] = "type Q8_0", [F16_TABLE] = "type F16", [NO_EOS] = "eos_token_id",
    [EOS_RANGE] = "eos_token_id", [IMAGE_RANGE] = "image_token_id", [EVEN_MULT] = "even",
    [SHORT_SIZES] = "head_vocab_sizes", [NOT_PRIME] = "not prime", [BAD_OFFSET] = "head_offsets[5]",
    [KEY_SHAPE] = "ple_key", [NORM_F16] = "ple_norm_query", [CONV_SHAPE] = "ple_conv1d",
    [NO_EPS] = "layer_norm_rms_epsilon", [NGRAM] = "ngram_size", [ROWS_SHORT] = "padded",
    [NEG_OFFSET] = "negative"};

static int write_file(const char *path, const struct ple_layout *l, enum breakage b)
{
    gguf_writer *w = gguf_writer_new(3, 32);
    gguf_w_str(w, "general.architecture", b == ARCH ? "llama" : "qwen4exp");
    uint32_t layers[1] = {1};
    gguf_w_array(w, "qwen4exp.ple.layers", GGUF_U32, layers, 1);
    gguf_w_u32(w, "qwen4exp.ple.ngram_size", b == NGRAM ? 4 : 3);
    gguf_w_u32(w, "qwen4exp.ple.heads_per_ngram", 8);
    gguf_w_u32(w, "qwen4exp.ple.conv_kernel", 4);
    gguf_w_u32(w, "qwen4exp.vocab_size", VOCAB);
    if (b != NO_EOS)
        gguf_w_u32(w, "qwen4exp.ple.eos_token_id", b == EOS_RANGE ? VOCAB : EOS);
    gguf_w_u32(w, "qwen4exp.ple.image_token_id", b == IMAGE_RANGE ? VOCAB + 7 : 248056u);
    uint64_t m[3], off[16], sz[16];
    for (int j = 0; j < 3; j++)
        m[j] = l->multipliers[j] + (b == EVEN_MULT && j == 2);
    for (int h = 0; h < 16; h++) {
        off[h] = l->offsets[h] + (b == BAD_OFFSET && h == 5);
        sz[h] = l->sizes[h] + (b == NOT_PRIME && h == 9 ? 1 : 0);
    }
    int64_t neg[16];
    for (int h = 0; h < 16; h++)
        neg[h] = h == 3 ? -1 : (int64_t)off[h];
    gguf_w_array(w, "qwen4exp.ple.layer_multipliers", GGUF_U64, m, 3);
    if (b == NEG_OFFSET)
        gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_I64, neg, 16);
    else
        gguf_w_array(w, "qwen4exp.ple.head_offsets", GGUF_U64, off, 16);
    gguf_w_array(w, "qwen4exp.ple.head_vocab_sizes", GGUF_U64, sz, b == SHORT_SIZES ? 15 : 16);
    gguf_w_u32(w, "qwen4exp.embedding_length_per_layer_input", 160);
    float eps = 1e-6f;
    if (b != NO_EPS)
        gguf_w_scalar(w, "qwen4exp.attention.layer_norm_rms_epsilon", GGUF_F32, &eps);
    uint64_t rows = b == ROWS_SHORT ? l->rows - 128 : l->rows;
    uint64_t dt[2] = {160, rows};
    gguf_w_tensor(w, "per_layer_token_embd.weight",
                  b == QUANT_TABLE ? GGML_Q8_0 : b == F16_TABLE ? GGML_F16 : GGML_BF16, 2, dt, 0, NULL, NULL);
    uint64_t dk[2] = {2560, 4 * W + (b == KEY_SHAPE)}, dv[2] = {2560, W}, dn[1] = {4 * W};
    uint64_t dc[2] = {b == CONV_SHAPE ? 3 : 4, 4 * W};
    gguf_w_tensor(w, "blk.1.ple_key.weight", GGML_BF16, 2, dk, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_value.weight", GGML_F16, 2, dv, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_key.weight", GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_query.weight", b == NORM_F16 ? GGML_F16 : GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_norm_conv.weight", GGML_F32, 1, dn, 0, NULL, NULL);
    gguf_w_tensor(w, "blk.1.ple_conv1d.weight", GGML_F32, 2, dc, 0, NULL, NULL);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    engram_error err;
    int rc = fd < 0 ? -errno : gguf_w_write_fd(w, fd, &err);
    if (fd >= 0)
        close(fd);
    gguf_writer_free(w);
    return rc;
}

int main(void)
{
    struct ple_layout l;
    CHECK_EQ(ple_layout_generate(0, 1000, VOCAB, EOS, 248056u, &l, NULL), 0);
    char path[300];
    tu_path(path, sizeof path, "ple.gguf");
    for (int b = 0; b < N_BREAKAGES; b++) {
        CHECK_EQ(write_file(path, &l, (enum breakage)b), 0);
        gguf_file *g = NULL;
        engram_error err;
        CHECK_EQ(gguf_open(path, &g, &err), 0);
        if (!g)
            continue;
        const char *seeds = getenv("TEST_PLE_SEEDS"); /* fuzz seeds: each file's header */
        if (seeds) {
            char sp[400];
            snprintf(sp, sizeof sp, "%s/ple_%02d.gguf", seeds, b);
            int in = open(path, O_RDONLY), out = open(sp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            static char buf[1 << 16];
            ssize_t got = in >= 0 ? pread(in, buf, g->data_start < sizeof buf ? g->data_start : sizeof buf, 0) : -1;
            CHECK(got > 0 && out >= 0 && write(out, buf, (size_t)got) == got);
            if (in >= 0)
                close(in);
            if (out >= 0)
                close(out);
        }
        struct ple_file f;
        memset(&f, 0x5a, sizeof f);
        int rc = ple_file_read(g, &f, &err);
        if (b == OK) {
            CHECK_EQ(rc, 0);
            CHECK(memcmp(&f.layout, &l, sizeof l) == 0);
            CHECK_EQ(f.layer, 1u);
            CHECK_EQ(f.conv_kernel, 4u);
            CHECK_EQ(f.width, W);
            CHECK(f.eps == 1e-6f);
            CHECK(f.table && f.table->dims[1] == l.rows && f.value && f.key && f.conv && f.norm_key &&
                  f.norm_query && f.norm_conv);
            /* the file's layout hashes as the generated one: SPEC's rule on
             * its own heads */
            const uint32_t seq[3] = {9707, 11, 220};
            uint32_t a[48], c[48];
            struct ple_history h1, h2;
            ple_history_start(&l, &h1);
            ple_history_start(&f.layout, &h2);
            CHECK_EQ(ple_hash(&l, seq, NULL, 3, &h1, a, NULL), 0);
            CHECK_EQ(ple_hash(&f.layout, seq, NULL, 3, &h2, c, NULL), 0);
            CHECK(memcmp(a, c, sizeof a) == 0);
        } else {
            CHECK_ERR(rc, err, b == ARCH ? -ENOTSUP : -EBADMSG, expect[b]);
            if (rc == 0)
                fprintf(stderr, "breakage %d accepted\n", b);
        }
        gguf_close(g);
    }
    tu_cleanup();
    return tu_finish("test_ple_file");
}
