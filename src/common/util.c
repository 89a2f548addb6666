/* util.c - internal helpers shared by libengram and libengram-tools:
 * filling engram_error, and positional I/O loops that retry EINTR/EAGAIN.
 * Hidden symbols only (libengram-tools carries its own copy). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "error_fill.h"

int err_set(engram_error *err, int code, uint64_t offset, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vfill(err, code, offset, ENGRAM_NO_ROW, fmt, ap);
    va_end(ap);
    return code;
}

int err_set_row(engram_error *err, int code, uint64_t row, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vfill(err, code, ENGRAM_NO_OFFSET, row, fmt, ap);
    va_end(ap);
    return code;
}

int err_set_at(engram_error *err, int code, uint64_t offset, uint64_t row, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vfill(err, code, offset, row, fmt, ap);
    va_end(ap);
    return code;
}

int util_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (got == 0)
            return -EIO;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

int util_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t put = pwrite(fd, p, n, (off_t)off);
        if (put < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (put == 0)
            return -EIO;
        p += put;
        n -= (size_t)put;
        off += (uint64_t)put;
    }
    return 0;
}

int util_thread_start(pthread_t *t, size_t stack, void *(*fn)(void *), void *arg)
{
    for (size_t s = stack;; s *= 4) {
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) != 0)
            return -ENOMEM;
        int e = s <= ((size_t)8 << 20) ? pthread_attr_setstacksize(&attr, s) : 0;
        if (e == 0)
            e = pthread_create(t, &attr, fn, arg);
        pthread_attr_destroy(&attr);
        /* EINVAL: the stack cannot hold this process's static TLS (a CUDA
         * runtime linked in has a large one); past 8 MiB, the default */
        if (e != EINVAL || s > ((size_t)8 << 20))
            return -e;
    }
}

uint64_t util_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t powmod_u32(uint32_t b, uint32_t e, uint32_t m)
{
    uint64_t r = 1, x = b % m;
    for (; e; e >>= 1) {
        if (e & 1)
            r = r * x % m;
        x = x * x % m;
    }
    return (uint32_t)r;
}

/* Miller-Rabin with bases 2, 7, 61 is exact below 4,759,123,141. */
int util_is_prime_u32(uint32_t n)
{
    if (n < 2)
        return 0;
    static const uint32_t small[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 61};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        if (n == small[i])
            return 1;
        if (n % small[i] == 0)
            return 0;
    }
    uint32_t d = n - 1;
    int s = 0;
    while ((d & 1) == 0) {
        d >>= 1;
        s++;
    }
    static const uint32_t bases[] = {2, 7, 61};
    for (int i = 0; i < 3; i++) {
        uint64_t x = powmod_u32(bases[i], d, n);
        if (x == 1 || x == n - 1)
            continue;
        int composite = 1;
        for (int r = 1; r < s; r++) {
            x = x * x % n;
            if (x == n - 1) {
                composite = 0;
                break;
            }
        }
        if (composite)
            return 0;
    }
    return 1;
}
