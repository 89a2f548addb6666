/*
 * fuzz_residual.c - fuzz target for the residual an engine (or `engram
 * apply --residual-in`) hands to the output stage: the input bytes are a
 * residual of up to 4 tokens (F32 or BF16, byte 0 picks the mask and the
 * type) for a real layer (a W = 16 model built once at start-up, its rows
 * read for fixed tokens), applied with engram_apply.  The NaN/Inf policy of
 * engram.h is checked on every input:
 *  - the result is 0 or -EDOM;
 *  - masked tokens stay bit for bit;
 *  - a non-finite value in an unmasked token's input: -EDOM, nothing written;
 *  - on 0, every unmasked output is a finite BF16 value;
 *  - on -EDOM otherwise, every value is its input or a finite BF16 value;
 *  - the same input gives the same output (no uninitialized reads; on the
 *    inputs with bit 6 of byte 0 set).
 * Built with clang -fsanitize=fuzzer,address,undefined it is a libFuzzer
 * target; built without (FUZZ_REPLAY) it replays the files named on its
 * command line.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"
#include "../testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXN 4
/* kept for the whole process (reachable: not leaks) */
static engram_model *M;
static engram_layer *L;
static engram_applier *A;
static uint16_t rows[MAXN * ENGRAM_COLUMNS * ENGRAM_ROW_VALUES];
static size_t per; /* S x W */

static void setup(void)
{
    static uint32_t map[3000];
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    if (tu_layout(&o.layout, map, 3000, 2000, 3000) < 0)
        abort();
    o.width = 16; /* small: more executions per second */
    o.fill = ENGRAM_FILL_NORMAL;
    o.seed = 9;
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_residual.%ld.gguf", (long)getpid());
    engram_error err;
    if (engram_build_model(path, &o, &err) < 0 || engram_model_open(path, &M, &err) < 0) {
        fprintf(stderr, "fuzz_residual: %s\n", err.msg);
        abort();
    }
    unlink(path); /* the model keeps its descriptor */
    if (engram_layer_open(M, 0, &L, &err) < 0 || engram_applier_new(L, NULL, &A, &err) < 0)
        abort();
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    per = (size_t)li.streams * li.width;
    engram_history h;
    engram_history_reset(&h);
    uint32_t tok[MAXN] = {11, 222, 1333, 2444}, ids[MAXN * ENGRAM_ROWS_PER_TOKEN];
    if (engram_hash_tokens(engram_model_hasher(M), &h, tok, NULL, MAXN, ids, NULL) < 0)
        abort();
    for (int t = 0; t < MAXN; t++)
        if (engram_model_read_bf16(M, 0, ids + t * ENGRAM_ROWS_PER_TOKEN, ENGRAM_COLUMNS,
                                   rows + (size_t)t * ENGRAM_COLUMNS * ENGRAM_ROW_VALUES, &err) < 0)
            abort();
}

static float val(const void *x, int bf16, size_t i)
{
    if (bf16) {
        uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)x)[i];
}

static int is_bf16_value(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0xffffu) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!A)
        setup();
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    int bf16 = sel >> 7;
    size_t es = bf16 ? 2 : 4, tokb = per * es;
    size_t n = (size - 1) / tokb;
    if (n == 0)
        return 0;
    if (n > MAXN)
        n = MAXN;
    uint8_t mask[MAXN];
    for (size_t t = 0; t < n; t++)
        mask[t] = (sel >> t) & 1;
    uint8_t *in = malloc(n * tokb), *x = malloc(n * tokb), *y = malloc(n * tokb);
    if (!in || !x || !y)
        abort();
    memcpy(in, data + 1, n * tokb);
    memcpy(x, in, n * tokb);
    memcpy(y, in, n * tokb);
    engram_dtype dt = bf16 ? ENGRAM_BF16 : ENGRAM_F32;
    engram_error err;
    int rc = engram_apply(A, rows, ENGRAM_BF16, x, dt, mask, n, &err);
    if (rc != 0 && rc != -EDOM)
        abort();
    if (sel & 0x40) { /* on half the inputs: again, the same bits */
        int rc2 = engram_apply(A, rows, ENGRAM_BF16, y, dt, mask, n, &err);
        if (rc2 != rc || memcmp(x, y, n * tokb) != 0)
            abort();
    }
    int bad_input = 0;
    for (size_t t = 0; t < n; t++) {
        if (!mask[t]) {
            if (memcmp(x + t * tokb, in + t * tokb, tokb) != 0)
                abort(); /* masked: untouched */
            continue;
        }
        for (size_t i = 0; i < per; i++)
            bad_input |= !isfinite(val(in + t * tokb, bf16, i));
    }
    if (bad_input && (rc != -EDOM || memcmp(x, in, n * tokb) != 0))
        abort(); /* checked first, nothing written */
    for (size_t t = 0; t < n; t++) {
        if (!mask[t])
            continue;
        for (size_t i = 0; i < per; i++) {
            float got = val(x + t * tokb, bf16, i), was = val(in + t * tokb, bf16, i);
            int fine = isfinite(got) && is_bf16_value(got);
            if (rc == 0 && !fine)
                abort();
            if (rc == -EDOM && !fine && memcmp(&got, &was, sizeof got) != 0)
                abort();
        }
    }
    free(in);
    free(x);
    free(y);
    return 0;
}

#ifdef FUZZ_REPLAY
#define FUZZ_NAME "fuzz_residual"
#include "replay_main.h"
#endif
