/*
 * alloc_shim.h - the tests' one allocation interposer (tests/alloc_shim.c),
 * linked into every test that counts or fails allocations (test_apply,
 * test_tools, test_parsers, the test_faults_* programs).  Two tools:
 *
 *  - A counter of every allocation, libc's own included.  glibc lets a
 *    program replace malloc, and its internal calls (qsort's among them) go
 *    through the replacement.  Plain builds only: the sanitizers replace
 *    malloc themselves (SANITIZED, testutil.h), and there nothing is
 *    counted.  Set alloc_counting to 1 to count into alloc_counted.
 *
 *  - The N-th allocation failing (lib_alloc), for calls from the objects a
 *    test links with --wrap=malloc (and --wrap=calloc, realloc, strdup,
 *    posix_memalign, mmap: each test wraps the calls it needs, see the
 *    Makefile; an anonymous mmap counts as an allocation).  Shared
 *    libraries' own calls (libc's, utf8proc's) are not wrapped.
 */
#ifndef ENGRAM_ALLOC_SHIM_H
#define ENGRAM_ALLOC_SHIM_H

/* The N-th call of a kind fails while armed; calls are counted while armed.
 * fail_at 0: none fails (the calls are only counted).  Also the plan of
 * fault_shim.h's system calls. */
struct fail_plan {
    long calls, fail_at;
    int armed;
};

/* 1 if this call is to fail (and counts it). */
static inline int plan_fails(struct fail_plan *p)
{
    if (!p->armed)
        return 0;
    return ++p->calls == p->fail_at;
}

extern struct fail_plan lib_alloc;    /* malloc, calloc, realloc, strdup, posix_memalign, mmap */

extern volatile long alloc_counted;   /* allocations counted (plain builds) */
extern volatile int alloc_counting;   /* 1: count them                      */

#endif
