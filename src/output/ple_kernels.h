/*
 * ple_kernels.h - internals of the PLE output stage (ple_apply.h): the
 * layer's weights as the kernels read them and the kernels (scalar
 * reference in ple_kernels.c, AVX2+F16C+FMA and AVX-512 in
 * ple_kernels_x86.c), every one computing the order documented in
 * ple_apply.h, so every kernel gives the same bits.
 */
#ifndef ENGRAM_PLE_KERNELS_H
#define ENGRAM_PLE_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ple_apply.h"

#define PLE_PANEL 64u    /* outputs per weight panel                           */
#define PLE_KC 256u      /* K block of the projection (2560 = 10 blocks)       */
#define PLE_MR 6u        /* tokens per projection micro-tile                   */
#define PLE_LANES 16u    /* partial sums of the reductions (Sum16)             */

/* One projection matrix in panels: element (p * K + i) * 64 + j is output
 * 64 p + j, input i, of `type` (GGML_BF16 / GGML_F16 as uint16_t bits,
 * GGML_F32 as float); outputs past `rows` are zero.  64-byte aligned. */
struct ple_mat {
    uint32_t type;
    uint32_t rows;
    uint32_t panels;
    void *w;
    size_t bytes;
};

struct ple_layer {
    uint32_t W, C;          /* C = 4W channels                                 */
    uint32_t N;             /* 5W projection outputs: C keys, then W values    */
    uint32_t kernel;        /* T                                               */
    uint32_t frames;        /* F = 3 (T - 1)                                   */
    float eps;
    struct ple_mat m[2];    /* 0: W_k (C outputs), 1: W_v (W outputs)          */
    uint32_t panels;        /* m[0].panels + m[1].panels: global panel p < m[0].panels is
                               W_k's, writing outputs 64p..; the rest W_v's,
                               writing outputs C + 64 (p - m[0].panels)..       */
    float *gk, *gq, *gc;    /* [C]                                             */
    float *conv;            /* [T][C]: tap k of channel c at conv[k * C + c]   */
    uint64_t bytes;
};

/* Projection of nt tokens (nt >= 1; e[t] -> K F32 values) onto the outputs
 * of global panels [p0, p1): kv[t * ld + o].  wbuf: PLE_WBUF floats of the
 * calling worker's own, 64-byte aligned, where a kernel may widen a block
 * of 16-bit weights to F32 once for many tokens (the same values: the bits
 * do not change). */
#define PLE_WBUF (PLE_KC * PLE_PANEL)
typedef void (*ple_project_fn)(const struct ple_layer *L, const float *const *e, unsigned nt,
                               float *kv, size_t ld, unsigned p0, unsigned p1, float *wbuf);

/* Step 2's reductions of one stream: out = {Skk, Sxx, D} (D from kh, qh
 * built with rk, rq computed inside from Skk and Sxx). */
typedef void (*ple_gate_fn)(const float *k, const float *x, const float *gk, const float *gq,
                            uint32_t W, float eps, float out[3]);
/* G_j = Sum16 (alpha v_i)^2 over i < W. */
typedef float (*ple_sumsq_fn)(const float *v, float alpha, uint32_t W);
/* n_c = ((alpha v_i) * rn) * gc[i] for i < W; returns 1 if all are finite. */
typedef int (*ple_frame_fn)(const float *v, float alpha, float rn, const float *gc, uint32_t W,
                            float *n);
/* y_c = SiLU(sum over taps) for c < C; tap[k] -> frame t - 3 (T - 1 - k),
 * w = L->conv. */
typedef void (*ple_conv_fn)(const float *const *tap, const float *w, uint32_t T, uint32_t C,
                            float *y);
/* out_i = (x_i + alpha v_i) + y_i for i < W (out may be x); returns 1 if
 * all are finite. */
typedef int (*ple_update_fn)(const float *x, const float *v, float alpha, const float *y, uint32_t W,
                             float *out);

struct ple_kernels {
    const char *name;
    ple_project_fn project;
    ple_gate_fn gate;
    ple_sumsq_fn sumsq;
    ple_frame_fn frame;
    ple_conv_fn conv;
    ple_update_fn update;
};

extern const struct ple_kernels ple_kernels_scalar;
extern const struct ple_kernels ple_kernels_avx2;   /* NULL members: not built */
extern const struct ple_kernels ple_kernels_avx512;

/* The kernels for s, or NULL if this CPU (or build) cannot run them; AUTO:
 * the library's choice (common/cpu.h), else the scalar kernels. */
const struct ple_kernels *ple_kernels_for(engram_simd s);

/* Scalar pieces every kernel shares (ple_kernels.c): alpha from s (step
 * 2's last line), SiLU of one value, and r(y). */
float ple_alpha(float s);
float ple_silu(float a);
static inline float ple_rsqrt(float y)
{
    return 1.0f / sqrtf(y);
}

#endif
