/* ple_kernels_x86.c - placeholder */
#include "ple_kernels.h"
const struct ple_kernels ple_kernels_avx2 = {0};
const struct ple_kernels ple_kernels_avx512 = {0};
