/*
 * test_ple_layer.c - the PLE member's output stage through the public API
 * (issue #22): engram_layer_open on a qwen4exp model, engram_applier_new
 * (own threads or a caller's fork-join) and engram_apply_seq give the bits
 * of the output stage's machinery (ple_apply, whose arithmetic test_ple_apply
 * checks against a float64 reference) on rows read from the file, with the
 * state carried across calls cut anywhere; what carries no state refuses a
 * PLE applier.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "testutil.h"
#include "../src/format/model.h"
#include "../src/output/ple_apply.h"

#define W 64u
#define N 300u
#define K (16u * 160u)

static void serial_fork_join(void *ctx, unsigned workers, engram_worker_fn fn, void *arg)
{
    (*(unsigned *)ctx)++;
    for (unsigned w = workers; w-- > 0;) /* any order: run them backwards */
        fn(arg, w);
}

int main(void)
{
    char path[512];
    tu_path(path, sizeof path, "ple.gguf");
    engram_ple_build_opts bo = {.base = 2003, .width = W, .fill = ENGRAM_FILL_NORMAL, .seed = 9};
    engram_error err;
    CHECK_EQ(engram_build_ple_model(path, &bo, &err), 0);
    engram_model *m = tu_open_model(path);

    /* rows of a hashed random text, residual random, a few tokens masked */
    uint64_t seed = 21;
    uint32_t tok[N], *ids = malloc((size_t)N * 16 * sizeof *ids);
    for (unsigned i = 0; i < N; i++)
        tok[i] = (uint32_t)(tu_rand(&seed) % 5000);
    engram_ple_history h;
    engram_ple_history_reset(m, &h);
    CHECK_EQ(engram_ple_hash(m, &h, tok, NULL, N, ids, &err), 0);
    uint16_t *rows = malloc((size_t)N * K * 2);
    CHECK_EQ(engram_model_read_bf16(m, 0, ids, (size_t)N * 16, rows, &err), 0);
    float *x0 = malloc((size_t)N * 4 * W * 4);
    for (size_t i = 0; i < (size_t)N * 4 * W; i++)
        x0[i] = (float)((double)(tu_rand(&seed) % 20001) / 10000.0 - 1.0);
    uint8_t mask[N];
    for (unsigned i = 0; i < N; i++)
        mask[i] = tu_rand(&seed) % 9 != 0;

    engram_layer *L = NULL;
    CHECK_ERR(engram_layer_open(m, 1, &L, &err), err, -EINVAL, "one table");
    CHECK_EQ(engram_layer_open(m, 0, &L, &err), 0);
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    engram_model_info mi;
    engram_model_get_info(m, &mi);
    CHECK_EQ(li.member, ENGRAM_MEMBER_PLE);
    CHECK_EQ(li.width, W);
    CHECK_EQ(li.streams, 4);
    CHECK_EQ(li.table, 0);
    CHECK_EQ((uint32_t)li.layer, mi.family.layers[0]);
    CHECK_EQ(li.state_floats, (size_t)mi.family.state_floats);
    CHECK_EQ(li.state_floats, (size_t)9 * 4 * W); /* 3 (T - 1) frames of 4W, T = 4 */
    CHECK(li.bytes > (size_t)5 * W * K * 2);

    /* the reference: the machinery itself, one call */
    struct ple_layer *PL;
    CHECK_EQ(ple_layer_open(model_gguf(m), model_ple(m), &PL, &err), 0);
    struct ple_applier *pa;
    struct ple_apply_opts po = {1, ENGRAM_SIMD_AUTO, 0, NULL, NULL};
    CHECK_EQ(ple_applier_new(PL, &po, &pa, &err), 0);
    float *want = malloc((size_t)N * 4 * W * 4), *got = malloc((size_t)N * 4 * W * 4);
    float *want_state = calloc(li.state_floats, 4), *state = calloc(li.state_floats, 4);
    memcpy(want, x0, (size_t)N * 4 * W * 4);
    CHECK_EQ(ple_apply(pa, rows, want, ENGRAM_F32, mask, N, want_state, &err), 0);
    size_t changed = 0;
    for (size_t i = 0; i < (size_t)N * 4 * W; i++)
        changed += want[i] != x0[i];
    CHECK(changed > (size_t)N * 4 * W / 2);

    /* the public API: own threads (1, 2, 3) and a caller's fork-join; the
     * sequence cut into calls at random points, the state carried */
    for (int variant = 0; variant < 4; variant++) {
        unsigned calls = 0;
        engram_apply_opts o = {.threads = variant < 3 ? (unsigned)variant + 1 : 3,
                               .block_tokens = variant == 2 ? 7 : 0};
        if (variant == 3) {
            o.fork_join = serial_fork_join;
            o.fork_join_ctx = &calls;
        }
        engram_applier *a;
        CHECK_EQ(engram_applier_new(L, &o, &a, &err), 0);
        CHECK(engram_applier_bytes(a) > 0);
        memcpy(got, x0, (size_t)N * 4 * W * 4);
        memset(state, 0, li.state_floats * 4);
        for (size_t at = 0; at < N;) {
            size_t n = 1 + tu_rand(&seed) % 40;
            if (n > N - at)
                n = N - at;
            CHECK_EQ(engram_apply_seq(a, rows + at * K, ENGRAM_BF16, got + at * 4 * W, ENGRAM_F32,
                                      mask + at, n, state, &err), 0);
            at += n;
        }
        CHECK(memcmp(got, want, (size_t)N * 4 * W * 4) == 0);
        CHECK(memcmp(state, want_state, li.state_floats * 4) == 0);
        CHECK(variant != 3 || calls > 0);

        /* refused: what carries no state, rows not BF16, no state */
        CHECK_ERR(engram_apply(a, rows, ENGRAM_BF16, got, ENGRAM_F32, NULL, 1, &err), err, -EINVAL,
                  "engram_apply_seq");
        CHECK_ERR(engram_apply_strided(a, rows, ENGRAM_BF16, K * 2, got, ENGRAM_F32, 4 * W * 4, NULL,
                                       1, &err), err, -EINVAL, "engram_apply_seq");
        float kv[8];
        CHECK_ERR(engram_project(a, rows, ENGRAM_BF16, 1, kv, &err), err, -EINVAL, "engram_apply_seq");
        CHECK_ERR(engram_apply_seq(a, rows, ENGRAM_F32, got, ENGRAM_F32, NULL, 1, state, &err), err,
                  -EINVAL, "BF16");
        CHECK_EQ(engram_apply_seq(a, rows, ENGRAM_BF16, got, ENGRAM_F32, NULL, 1, NULL, &err), -EINVAL);
        CHECK_EQ(engram_apply_seq(NULL, rows, ENGRAM_BF16, got, ENGRAM_F32, NULL, 1, state, &err), -EINVAL);
        engram_applier_free(a);
    }
    /* a BF16 residual through the public API equals the machinery's */
    {
        uint16_t *xb = malloc((size_t)N * 4 * W * 2), *xw = malloc((size_t)N * 4 * W * 2);
        for (size_t i = 0; i < (size_t)N * 4 * W; i++) {
            uint32_t u;
            memcpy(&u, &x0[i], 4);
            xb[i] = xw[i] = (uint16_t)(u >> 16);
        }
        memset(want_state, 0, li.state_floats * 4);
        memset(state, 0, li.state_floats * 4);
        CHECK_EQ(ple_apply(pa, rows, xw, ENGRAM_BF16, mask, N, want_state, &err), 0);
        engram_applier *a;
        engram_apply_opts o = {.threads = 2};
        CHECK_EQ(engram_applier_new(L, &o, &a, &err), 0);
        CHECK_EQ(engram_apply_seq(a, rows, ENGRAM_BF16, xb, ENGRAM_BF16, mask, N, state, &err), 0);
        CHECK(memcmp(xb, xw, (size_t)N * 4 * W * 2) == 0);
        CHECK(memcmp(state, want_state, li.state_floats * 4) == 0);
        engram_applier_free(a);
        free(xb);
        free(xw);
    }
    /* batched decode across sequences: one position of each of 20 sequences
     * (each with its own state, a few masked) in one call = each alone */
    {
        enum { NS = 20 };
        size_t nf = li.state_floats;
        float *sa = malloc(NS * nf * 4), *sb = malloc(NS * nf * 4);
        float *xa = malloc(NS * 4 * W * 4), *xb = malloc(NS * 4 * W * 4);
        const void *rv[NS];
        void *xv[NS];
        float *sv[NS];
        uint8_t ms[NS];
        for (unsigned i = 0; i < NS; i++) {
            for (size_t f = 0; f < nf; f++) /* distinct states, as after different histories */
                sa[i * nf + f] = sb[i * nf + f] = (float)((double)(tu_rand(&seed) % 2001) / 1000.0 - 1.0);
            memcpy(xa + i * 4 * W, x0 + (size_t)i * 7 * 4 * W, 4 * W * 4);
            memcpy(xb + i * 4 * W, x0 + (size_t)i * 7 * 4 * W, 4 * W * 4);
            ms[i] = i % 6 != 5;
        }
        for (int variant = 0; variant < 3; variant++) {
            engram_apply_opts o = {.threads = variant == 0 ? 1 : 2, .block_tokens = variant == 2 ? 7 : 0};
            engram_applier *a;
            CHECK_EQ(engram_applier_new(L, &o, &a, &err), 0);
            for (unsigned i = 0; i < NS; i++) {
                rv[i] = rows + (size_t)(i * 13 % N) * K;
                xv[i] = xa + i * 4 * W;
                sv[i] = sa + i * nf;
                CHECK_EQ(engram_apply_seq(a, rv[i], ENGRAM_BF16, xb + i * 4 * W, ENGRAM_F32, ms + i, 1,
                                          sb + i * nf, &err), 0);
            }
            CHECK_EQ(engram_apply_seqs(a, NS, rv, ENGRAM_BF16, xv, ENGRAM_F32, ms, sv, &err), 0);
            CHECK(memcmp(xa, xb, NS * 4 * W * 4) == 0);
            CHECK(memcmp(sa, sb, NS * nf * 4) == 0);
            /* refused: a non-finite residual of sequence 3 (nothing written), NULL state */
            float keep = xa[3 * 4 * W + 5];
            xa[3 * 4 * W + 5] = NAN;
            memcpy(xb, xa, NS * 4 * W * 4);
            memcpy(sb, sa, NS * nf * 4);
            CHECK_ERR(engram_apply_seqs(a, NS, rv, ENGRAM_BF16, xv, ENGRAM_F32, ms, sv, &err), err, -EDOM,
                      "sequence 3 stream 0 index 5");
            CHECK(memcmp(xa, xb, NS * 4 * W * 4) == 0 && memcmp(sa, sb, NS * nf * 4) == 0);
            xa[3 * 4 * W + 5] = keep;
            memcpy(xb, xa, NS * 4 * W * 4);
            sv[4] = NULL;
            CHECK_ERR(engram_apply_seqs(a, NS, rv, ENGRAM_BF16, xv, ENGRAM_F32, ms, sv, &err), err, -EINVAL,
                      "sequence 4: NULL state");
            CHECK_ERR(engram_apply_seqs(a, NS, rv, ENGRAM_F32, xv, ENGRAM_F32, ms, sv, &err), err, -EINVAL,
                      "BF16");
            engram_applier_free(a);
        }
        free(sa), free(sb), free(xa), free(xb);
    }
    /* export copies nothing for PLE (the CUDA path has its own) */
    uint16_t sentinel = 0x1234;
    engram_layer_export(L, &sentinel, NULL);
    CHECK_EQ(sentinel, 0x1234);

    ple_applier_free(pa);
    ple_layer_free(PL);
    engram_layer_close(L);
    engram_model_close(m);
    free(ids), free(rows), free(x0), free(want), free(got), free(want_state), free(state);
    tu_cleanup();
    return tu_finish("test_ple_layer");
}
