/*
 * ple_apply.h - the output stage of the family's second member, Qwen3.8's
 * per-layer embedding (SPEC.md section 10, "Consumption"), on the CPU.
 * The public face is engram.h's layer and applier (engram_layer_open on a
 * PLE model, engram_apply_seq); this is the machinery behind it.
 *
 * Per token: e = the 16 BF16 rows of the token concatenated (K = 2560
 * values); x = the residual, S = 4 streams of W values (C = 4W channels,
 * channel c = stream c / W, index c % W).  The layer's weights: W_k [4W][K]
 * and W_v [W][K] (output-major, as the file stores them), the norms
 * gamma_k, gamma_q, gamma_conv [C] (stored as 1 + w, used as stored), the
 * depthwise convolution w_conv [C][T] (T = conv_kernel taps, 4) and eps.
 * Per sequence: the last F = 3 (T - 1) frames of n (9 x C floats), owned by
 * the caller (see ple_state_floats).
 *
 * Arithmetic, exactly as computed here (F32 throughout, round to nearest
 * even, no contraction: every fused multiply-add named below is one fmaf,
 * every other operation rounds once; r(y) = 1 / sqrtf(y), a correctly
 * rounded square root then division; expf is the C library's).  Every
 * kernel, scalar or SIMD, gives these bits; no reduction order depends on
 * the number of tokens in a call, a token's position in it, the blocking
 * or the number of threads.  Sum16 over i = 0..W-1 of t_i means: 16
 * partial sums from +0, term i added to partial i mod 16 in order of i,
 * then p[l] += p[l + 8] for l < 8, then +4, +2, +1, the result p[0].
 *  1. Projection.  For each output o of W_k (4W) and of W_v (W):
 *     p_o = fma(e_2559, w_o,2559, ... fma(e_1, w_o,1, fma(e_0, w_o,0, +0))),
 *     one chain in input order.  k_c = p_c of W_k (channel c's key),
 *     v_i = p_i of W_v.  Nothing is rounded to BF16.  (A BF16 row value times
 *     a BF16 or F16 weight is exact in F32, so with 16-bit weights this is an
 *     F32 sum of exact products.)
 *  2. Gate, per stream j, c = jW + i (both RMSNorms over one stream's W
 *     values, gamma's piece j for stream j):
 *     Skk_j = Sum16 fma(k_c, k_c, .), Sxx_j = Sum16 fma(x_c, x_c, .);
 *     rk_j = r(Skk_j / W + eps), rq_j = r(Sxx_j / W + eps)   (W as F32);
 *     kh_i = (k_c * rk_j) * gamma_k[c], qh_i = (x_c * rq_j) * gamma_q[c];
 *     D_j = Sum16 fma(kh_i, qh_i, .);  s_j = D_j / sqrtf(W);
 *     z_j = s_j == 0 ? +0 : copysignf(sqrtf(fmaxf(|s_j|, 1e-6)), s_j)
 *     (sign(0) = 0: s = +0 or -0 gives alpha = 0.5, unlike V4.1);
 *     alpha_j = 1 / (1 + expf(-z_j)).
 *  3. g_c = alpha_j * v_i (one product, the same bits wherever g is used).
 *     G_j = Sum16 fma(g_c, g_c, .) over stream j's i, Sgg = ((G_0 + G_1) +
 *     G_2) + G_3, rn = r(Sgg / C + eps), n_c = (g_c * rn) * gamma_conv[c].
 *  4. Convolution (causal, depthwise, dilation 3, no bias), frame t:
 *     a_c = fma(w[c][T-1], n_t,c, ... fma(w[c][1], n_t-3(T-2),c,
 *           fma(w[c][0], n_t-3(T-1),c, +0)))  (oldest tap first; the file's
 *     tap k multiplies the frame 3 (T - 1 - k) back: SPEC's c_t =
 *     sum_k w_k n_t-(3-k)3, which is PyTorch's Conv1d weight [C][1][T] with
 *     left padding 3 (T - 1), squeezed to [C][T] and so GGUF shape [T, C]);
 *     frames before the call come from the state;
 *     y_c = a_c / (1 + expf(-a_c))  (SiLU).
 *  5. out_c = (x_c + g_c) + y_c.  An F32 residual keeps the F32 value (no
 *     rounding to BF16, unlike V4.1: llama.cpp keeps this layer in F32, and
 *     there is no canonical order to match anyway); a BF16 residual is read
 *     as its F32 value and stores bf16(out_c) (round to nearest even).
 *
 * Masked tokens (mask[t] == 0, padding; SPEC: "their gated value and
 * convolution input are zero"): nothing of theirs is read (rows and
 * residual may hold anything), their residual stays bit for bit as it was,
 * and they still take their place in time: their frame n_t is all +0 and
 * enters the convolution of later tokens and the state, as a padding
 * position's zero input does in HF's convolution over the padded sequence.
 * (Their own would-be output y_t, built from earlier frames alone, is not
 * added anywhere: a padding position's residual is dead.)  So the state
 * after a call is the last F frames of the call's positions, masked or not
 * (fewer than F positions: the older frames shift along).
 *
 * Non-finite values: the rows (BF16 with an all-ones exponent) and residual
 * of unmasked tokens and the state are checked first; a NaN or infinity
 * gives -EDOM naming the token, stream and index (or the state's frame and
 * channel), and nothing is written.  A token whose computed Skk, Sxx, D,
 * Sgg, frame n or outputs are not finite (F32 overflow from extreme inputs)
 * also gives -EDOM naming it; then the tokens before it have been updated,
 * the state is the one after them, and it and the tokens after it are
 * untouched.
 */
#ifndef ENGRAM_PLE_APPLY_H
#define ENGRAM_PLE_APPLY_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "format/gguf.h"
#include "format/ple_file.h"

#define PLE_K (PLE_HEADS * PLE_ROW_VALUES)  /* 2560 inputs per token            */
#define PLE_DILATION 3u                     /* frames between convolution taps  */
#define PLE_MAX_KERNEL 16u                  /* as ple_file accepts              */
#define PLE_APPLY_BLOCK 128u                /* positions per block (default)    */
#define PLE_APPLY_MAX_THREADS 256u

/* The weights as a file stores them, for ple_layer_new: key [4W][K] and
 * value [W][K] output-major, each GGML_BF16, GGML_F16 or GGML_F32 (its own
 * type); norms [4W] F32 (1 + w); conv [4W][kernel] F32, tap k of channel c
 * at conv[c * kernel + k] (the GGUF shape [kernel, 4W]). */
struct ple_weights {
    uint32_t width;      /* W, 1 .. ENGRAM_MAX_WIDTH                 */
    uint32_t kernel;     /* T, 1 .. PLE_MAX_KERNEL                   */
    float eps;           /* > 0                                      */
    uint32_t key_type, value_type;
    const void *key, *value;
    const float *norm_key, *norm_query, *norm_conv;
    const float *conv;
};

/* One PLE layer's weights in the layout the kernels read, immutable after
 * creation: any number of appliers (threads) may share it.  W_k and W_v
 * keep their file type (16-bit weights stay 16-bit: the values, and so
 * the arithmetic above, are the same whatever the storage; F32 weights
 * stay F32), rearranged into panels of 64 outputs.  Memory: (ceil(4W/64) +
 * ceil(W/64)) * 64 * K * (2 or 4) bytes of projection weights (65.5 MB at
 * W = 2560 in BF16 or F16, 131 MB in F32) plus (3 + T) * 4W * 4 bytes of
 * norms and taps (0.3 MB). */
struct ple_layer;

/* Validates the weights (every value finite: -EBADMSG naming the tensor
 * and element; types and sizes: -EINVAL) and copies them.  -ENOMEM. */
int ple_layer_new(const struct ple_weights *w, struct ple_layer **out, engram_error *err);
/* The same from a parsed qwen4exp file (format/ple_file.h), read with
 * pread from g->fd; -EIO or a read's errno, -EBADMSG naming the tensor,
 * element and offset. */
int ple_layer_open(const gguf_file *g, const struct ple_file *f, struct ple_layer **out,
                   engram_error *err);
void ple_layer_free(struct ple_layer *L);
uint32_t ple_layer_width(const struct ple_layer *L);
uint64_t ple_layer_bytes(const struct ple_layer *L);

/* For an upload elsewhere (the GPU path, cuda/ple_cuda.h): *w gets the
 * layer's width, taps, eps and the two matrices' types, its pointers NULL;
 * ple_layer_export copies the weights back into the layout struct
 * ple_weights describes (key [4W][K] and value [W][K] output-major in their
 * own types, 2 or 4 bytes a value; norms [4W]; conv [4W][T], tap k of
 * channel c at conv[c * T + k]), the same values as given; a NULL
 * destination is skipped. */
void ple_layer_describe(const struct ple_layer *L, struct ple_weights *w);
void ple_layer_export(const struct ple_layer *L, void *key, void *value, float *norm_key,
                      float *norm_query, float *norm_conv, float *conv);

/* Floats of a sequence's state: 3 (T - 1) frames of 4W, oldest first
 * (frame f, channel c at state[f * 4W + c]); 92,160 floats (360 KiB) at
 * W = 2560, T = 4.  A sequence starts with every float +0 (memset 0). */
size_t ple_state_floats(const struct ple_layer *L);

struct ple_apply_opts {
    unsigned threads;      /* workers; 0 = 1.  Results do not depend on it.     */
    engram_simd simd;      /* kernels; AUTO = the library's choice (cpu.h)      */
    unsigned block_tokens; /* positions per block; 0 = PLE_APPLY_BLOCK.  Results
                              do not depend on it.                              */
    engram_fork_join fork_join; /* the caller's pool (NULL: threads - 1 own)    */
    void *fork_join_ctx;
};

/* An applier: a layer, kernels, threads - 1 worker threads (256 KiB stacks)
 * and a workspace allocated once; one call at a time (a call allocates
 * nothing).  Workspace with B = block_tokens: B x (K + 5W + 4W + 4) floats
 * of rows, projections, outputs and gates, (B + F) x 4W floats of frames,
 * threads x (2 x 4W + 16384) floats of scratch (19 MB at W = 2560, B = 128,
 * 2 threads; ple_applier_bytes), whatever n a call is given.  -EINVAL
 * (options, kernels this CPU lacks), -ENOMEM, -EAGAIN. */
struct ple_applier;
int ple_applier_new(const struct ple_layer *L, const struct ple_apply_opts *opts,
                    struct ple_applier **out, engram_error *err);
void ple_applier_free(struct ple_applier *a);
uint64_t ple_applier_bytes(const struct ple_applier *a);

/* Applies the layer to n consecutive positions of one sequence:
 * rows [n][K] BF16 bit patterns, residual [n][4][W] of resid_dtype
 * (ENGRAM_F32 or ENGRAM_BF16), updated in place; mask [n] (NULL: all
 * tokens); state as ple_state_floats, read and advanced over the n
 * positions.  Cutting a sequence into calls anywhere, the state carried,
 * gives the same bits of residual and state as one call.  0, -EINVAL
 * (NULL, type), -EDOM (see above). */
int ple_apply(struct ple_applier *a, const uint16_t *rows, void *residual, engram_dtype resid_dtype,
              const uint8_t *mask, size_t n, float *state, engram_error *err);

/* One position each of n sequences (batched decode: one pass over the
 * weights for all): sequence i's rows rows[i] [K] BF16, residual
 * residual[i] [4][W] of resid_dtype, mask NULL or [n], state state[i] (as
 * ple_state_floats, advanced by one frame).  Sequence i's result is the
 * bits ple_apply(a, rows[i], residual[i], ., &mask[i], 1, state[i]) gives
 * (the batch invariance): its taps read its own state's frames.  The
 * states must not overlap.  Errors as ple_apply, naming the sequence: the
 * inputs are checked first (nothing written); a computed overflow leaves
 * the sequences before it updated (residual and state), it and the later
 * ones untouched. */
int ple_apply_many(struct ple_applier *a, size_t n, const uint16_t *const *rows, void *const *residual,
                   engram_dtype resid_dtype, const uint8_t *mask, float *const *state, engram_error *err);
/* ple_apply_many's input checks alone (states, and the unmasked
 * sequences' rows and residuals finite; nothing written): 0, or -EDOM
 * naming the sequence, *bad its index. */
int ple_check_many(const struct ple_applier *a, size_t n, const uint16_t *const *rows,
                   void *const *residual, engram_dtype resid_dtype, const uint8_t *mask,
                   float *const *state, size_t *bad, engram_error *err);
/* The same, with *done (if not NULL) = the sequences applied whole. */
int ple_apply_many_done(struct ple_applier *a, size_t n, const uint16_t *const *rows,
                        void *const *residual, engram_dtype resid_dtype, const uint8_t *mask,
                        float *const *state, size_t *done, engram_error *err);

#endif
