/* util.h - small internal helpers shared by the library's modules. */
#ifndef ENGRAM_UTIL_H
#define ENGRAM_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engram.h"

/* Fills err (if not NULL) and returns code, so callers can `return err_set(...)`. */
int err_set(engram_error *err, int code, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, also naming a table-local row. */
int err_set_row(engram_error *err, int code, uint64_t row, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Same, naming both the row and its byte offset in the file. */
int err_set_at(engram_error *err, int code, uint64_t offset, uint64_t row, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* pread until n bytes arrive: retries EINTR, 0 bytes before n = -EIO.
 * Returns 0 or a negative errno. */
int util_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* pwrite until n bytes are written; 0 or a negative errno. */
int util_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);

/* Overflow-checked arithmetic: 0 on success, -1 on overflow. */
static inline int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* splitmix64: the deterministic generator behind seeded fills and tests. */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 1 if n is prime (Miller-Rabin, exact for every 32-bit n). */
int util_is_prime_u32(uint32_t n);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t util_now_ns(void);

/* pthread_create with a stack of `stack` bytes, or larger where the
 * process's static TLS needs more (tried x4 up to 8 MiB, then the default
 * size).  0 or -errno. */
int util_thread_start(pthread_t *t, size_t stack, void *(*fn)(void *), void *arg);

#endif
