/*
 * kernels.h - internals of Engram's output stage (SPEC.md section 8): the
 * layer's weights as the kernels read them, and the projection and gate
 * kernels (scalar reference, AVX2+F16C+FMA, AVX-512), all computing the
 * canonical order documented in engram.h, so every kernel gives the same
 * bits.
 */
#ifndef ENGRAM_KERNELS_H
#define ENGRAM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define PANEL 64u        /* outputs per weight panel                        */
#define KC 256u          /* K block of the projection (6144 = 24 blocks)    */
#define MR 6u            /* tokens per projection micro-tile                */
#define GATE_LANES 16u   /* partial sums of the gate's reductions           */

struct ple_layer;
struct engram_layer {
    /* The PLE member's layer (engram_layer_open on a PLE model): then only
     * ple, table, layer, W, S and bytes are set (the rest is V4.1's). */
    struct ple_layer *ple;
    int table, layer;
    uint32_t W, S, N;    /* N = (S+1) W outputs                             */
    uint32_t panels;     /* ceil(N / 64)                                    */
    /* Weights in panels: w[(p * K + i) * 64 + j] is output 64p + j, input i,
     * as F16 bits; outputs past N are zero.  Aligned to 64 bytes. */
    uint16_t *w;
    float *wq;           /* [S][W] q_norm * k_norm                          */
    uint64_t bytes;
};

/* Projection of nt tokens (nt >= 1, e[t] -> K F32 values) onto the outputs
 * of panels [p0, p1): kv[t * ld + o] for o in 64p0 .. min(64p1, N). */
typedef void (*project_fn)(const struct engram_layer *L, const float *const *e, unsigned nt,
                           float *kv, size_t ld, unsigned p0, unsigned p1);

/* The gate's reductions of one stream: out = {D, Sxx, Skk} over W values;
 * x is F32 or BF16 (x_bf16), k = bf16(kv_s[i]). */
typedef void (*gate_reduce_fn)(const void *x, int x_bf16, const float *kv_s, const float *wq_s,
                               uint32_t W, float out[3]);
/* The update of one stream: y_i = bf16(fma(g, bf16(kv_v[i]), x_i)).  With
 * out NULL only checks; else writes y to out (F32 or BF16; out may be x).
 * Returns 1 if every y is finite (then, and only then, out was written
 * whole; on 0 nothing is promised about out, so callers check first). */
typedef int (*gate_update_fn)(const void *x, int x_bf16, const float *kv_v, float g, uint32_t W,
                              void *out, int out_bf16);

struct apply_kernels {
    project_fn project;
    gate_reduce_fn reduce;
    gate_update_fn update;
};

extern const struct apply_kernels apply_kernels_scalar;
extern const struct apply_kernels apply_kernels_avx2;   /* NULL members: not built */
extern const struct apply_kernels apply_kernels_avx512;

/* The kernels for s, or NULL if this CPU (or build) cannot run them; AUTO:
 * the library's choice (common/cpu.h), falling back to the scalar kernels
 * where the CPU lacks F16C or FMA, so never NULL. */
const struct apply_kernels *apply_kernels_for(engram_simd s);

/* g from the reductions (scalar, shared by every kernel). */
float gate_value(float D, float sxx, float skk, uint32_t W);

/* Exact conversions (f16_to_f32 in kernels.c) and BF16 rounding (round to
 * nearest even). */
float f16_to_f32(uint16_t h);
static inline float bf16_to_f32(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}
static inline uint16_t f32_to_bf16_bits(float f)
{
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float bf16_round(float f)
{
    return bf16_to_f32(f32_to_bf16_bits(f));
}

#endif
