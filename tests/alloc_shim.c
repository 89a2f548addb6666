/*
 * alloc_shim.c - the allocation interposer of alloc_shim.h: the failing
 * --wrap'ed calls and, in plain builds, the counting replacement of libc's
 * allocator.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "alloc_shim.h"
#include "testutil.h" /* SANITIZED */

struct fail_plan lib_alloc;
volatile long alloc_counted;
volatile int alloc_counting;

/* ------------------------------------------------ the N-th allocation failing
 * Each test wraps only the calls it needs: the __real_ functions are weak,
 * so that one it does not wrap stays unresolved (and its __wrap_ is never
 * called) instead of failing the link. */
#define WEAK __attribute__((weak))
void *__real_malloc(size_t n) WEAK;
void *__real_calloc(size_t a, size_t b) WEAK;
void *__real_realloc(void *p, size_t n) WEAK;
char *__real_strdup(const char *s) WEAK;
int __real_posix_memalign(void **p, size_t a, size_t n) WEAK;
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) WEAK;

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

void *__wrap_malloc(size_t n) { return plan_fails(&lib_alloc) ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { return plan_fails(&lib_alloc) ? NULL : __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { return plan_fails(&lib_alloc) ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return plan_fails(&lib_alloc) ? NULL : __real_strdup(s); }
int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    return plan_fails(&lib_alloc) ? ENOMEM : __real_posix_memalign(p, a, n);
}

/* Anonymous mappings (a layer's weights) count as allocations too. */
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if ((flags & MAP_ANONYMOUS) && plan_fails(&lib_alloc)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

/* ------------------------------------------------ the counter (plain builds) */
#if !SANITIZED
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
/* Default visibility: the build hides symbols, and libc only calls a
 * replacement it can see in the dynamic symbol table. */
#define EXPORT __attribute__((visibility("default")))
#define COUNT() (alloc_counting ? (void)__atomic_add_fetch(&alloc_counted, 1, __ATOMIC_RELAXED) : (void)0)
EXPORT void *malloc(size_t n) { COUNT(); return __libc_malloc(n); }
EXPORT void *calloc(size_t a, size_t b) { COUNT(); return __libc_calloc(a, b); }
EXPORT void *realloc(void *p, size_t n) { COUNT(); return __libc_realloc(p, n); }
EXPORT void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n);
EXPORT void *memalign(size_t a, size_t n) { COUNT(); return __libc_memalign(a, n); }
EXPORT void *aligned_alloc(size_t a, size_t n) { COUNT(); return __libc_memalign(a, n); }
EXPORT int posix_memalign(void **p, size_t a, size_t n)
{
    COUNT();
    void *q = __libc_memalign(a, n);
    if (!q)
        return ENOMEM;
    *p = q;
    return 0;
}
#endif
