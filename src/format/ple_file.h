/*
 * ple_file.h - the PLE member's keys and tensors in a GGUF file (arch
 * `qwen4exp`, llama.cpp's dialect, which ds4 reads too; SPEC.md section
 * 10), validated as strictly as the ds4 dialect: every key's type and
 * range, the layout's rules (hash/ple.h), the tensors' names, types and
 * shapes cross-checked.  Errors name the key or tensor and its offset.
 * Internal for now (issue #22): the model open does not dispatch to it yet.
 */
#ifndef ENGRAM_PLE_FILE_H
#define ENGRAM_PLE_FILE_H

#include <stdint.h>

#include "gguf.h"
#include "hash/ple.h"

#define PLE_ARCH "qwen4exp"
#define PLE_STREAMS 4u

struct ple_file {
    struct ple_layout layout;
    uint32_t layer;            /* the PLE layer, 0-based (qwen4exp.ple.layers[0]) */
    uint32_t conv_kernel;      /* taps of the depthwise convolution (4)         */
    uint32_t width;            /* W: one stream of the residual (2560)          */
    float eps;                 /* RMSNorm epsilon                               */
    /* the tensors, in g (valid while g is open) */
    const gguf_tensor *table;  /* per_layer_token_embd.weight [160, rows] BF16   */
    const gguf_tensor *key;    /* blk.L.ple_key.weight [2560, 4 W]             */
    const gguf_tensor *value;  /* blk.L.ple_value.weight [2560, W]             */
    const gguf_tensor *norm_key, *norm_query, *norm_conv; /* [4 W], F32, 1 + w  */
    const gguf_tensor *conv;   /* blk.L.ple_conv1d.weight [kernel, 4 W], F32    */
};

/* 0 with *out filled, or -ENOTSUP (not a qwen4exp file), -EBADMSG (a key
 * or tensor breaks a rule; a quantized table is refused naming its type). */
int ple_file_read(const gguf_file *g, struct ple_file *out, engram_error *err);

#endif
