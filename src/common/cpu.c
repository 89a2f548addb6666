/* cpu.c - the CPU's features and the library's choice of kernels (see cpu.h). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"

#if ENGRAM_X86_KERNELS
#include <cpuid.h>
#endif

int engram_simd_supported(engram_simd s)
{
    if (s == ENGRAM_SIMD_AUTO || s == ENGRAM_SIMD_SCALAR)
        return 1;
#if ENGRAM_X86_KERNELS
    __builtin_cpu_init();
    if (s == ENGRAM_SIMD_AVX2)
        return __builtin_cpu_supports("avx2") != 0;
    if (s == ENGRAM_SIMD_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    return 0;
}

int cpu_has_f16c_fma(void)
{
#if ENGRAM_X86_KERNELS
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d))
        return (c >> 29 & 1) && (c >> 12 & 1);
#endif
    return 0;
}

const char *engram_simd_name(engram_simd s)
{
    switch (s) {
    case ENGRAM_SIMD_AUTO: return "auto";
    case ENGRAM_SIMD_SCALAR: return "scalar";
    case ENGRAM_SIMD_AVX2: return "avx2";
    case ENGRAM_SIMD_AVX512: return "avx512";
    }
    return "unknown";
}

static engram_simd selected = ENGRAM_SIMD_SCALAR;
static pthread_once_t select_once = PTHREAD_ONCE_INIT;

static void select_simd(void)
{
    const char *env = getenv("ENGRAM_SIMD");
    engram_simd want = ENGRAM_SIMD_AUTO;
    if (env) {
        if (strcmp(env, "scalar") == 0)
            want = ENGRAM_SIMD_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            want = ENGRAM_SIMD_AVX2;
        else if (strcmp(env, "avx512") == 0)
            want = ENGRAM_SIMD_AVX512;
    }
    if (want != ENGRAM_SIMD_AUTO && engram_simd_supported(want)) {
        selected = want;
        return;
    }
    if (engram_simd_supported(ENGRAM_SIMD_AVX512))
        selected = ENGRAM_SIMD_AVX512;
    else if (engram_simd_supported(ENGRAM_SIMD_AVX2))
        selected = ENGRAM_SIMD_AVX2;
    else
        selected = ENGRAM_SIMD_SCALAR;
}

engram_simd engram_simd_selected(void)
{
    pthread_once(&select_once, select_simd);
    return selected;
}

unsigned engram_default_threads(void)
{
    long n = 0;
    /* a set sized for the machine: a fixed cpu_set_t holds 1,024 CPUs, and
     * the call fails (EINVAL) where the kernel has more possible CPUs */
    for (int ncpu = 1024; n == 0 && ncpu <= (1 << 20); ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC((size_t)ncpu);
        if (!set)
            break;
        size_t bytes = CPU_ALLOC_SIZE((size_t)ncpu);
        CPU_ZERO_S(bytes, set);
        int rc = sched_getaffinity(0, bytes, set);
        if (rc == 0)
            n = CPU_COUNT_S(bytes, set);
        CPU_FREE(set);
        if (rc != 0 && errno != EINVAL)
            break;
    }
    if (n < 1) /* no affinity call */
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : n > (long)ENGRAM_APPLY_MAX_THREADS ? ENGRAM_APPLY_MAX_THREADS : (unsigned)n;
}
