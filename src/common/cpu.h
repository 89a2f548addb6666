/*
 * cpu.h - what this CPU runs: the one place that asks it (CPUID), and the
 * one choice of kernels for the whole library (the best this CPU has, or
 * ENGRAM_SIMD=scalar|avx2|avx512 where supported).  The public
 * engram_simd_supported, engram_simd_selected and engram_simd_name are
 * cpu.c's; the hash, the row codec and the output stage each map the
 * choice to their kernels.
 */
#ifndef ENGRAM_CPU_H
#define ENGRAM_CPU_H

#include "engram.h"

/* The x86 kernels (hash_x86.c, rowcodec_x86.c, kernels_x86.c) are built,
 * and counted as supported where the CPU has them, under this condition
 * alone. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENGRAM_X86_KERNELS 1
#else
#define ENGRAM_X86_KERNELS 0
#endif

/* 1 if the CPU has F16C and FMA (CPUID leaf 1, ECX bits 29 and 12): the
 * output stage's AVX2 and AVX-512 kernels convert F16 weights with them. */
int cpu_has_f16c_fma(void);

#endif
