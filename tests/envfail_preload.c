/*
 * envfail_preload.c - LD_PRELOAD shim that fails chosen calls of the CLI's
 * own process: the environment failures that a test program linking the
 * code with wrapped calls cannot reach (tests/test_envfail.sh).  Each is off
 * unless its variable is set:
 *
 *   ENGRAM_FAIL_OPEN=PATH      opens of exactly PATH fail with EACCES, after
 *   ENGRAM_FAIL_OPEN_SKIP=N    the first N (default 0), which succeed
 *   ENGRAM_FAIL_ODIRECT=1      every open with O_DIRECT fails with EINVAL, as
 *                              on a filesystem without O_DIRECT (tmpfs
 *                              before Linux 6.6, some FUSE and network
 *                              filesystems; tests/test_fallback.sh)
 *   ENGRAM_FAIL_MMAP=PATH      shared mappings of PATH (its inode) fail with
 *                              ENODEV, as on a filesystem without mmap
 *   ENGRAM_FAIL_PREAD=PATH     preads of PATH's file (its inode) fail with EIO,
 *                              as on a failing disk
 *   ENGRAM_FAIL_READLINK=PATH  readlink of exactly PATH fails with ENOENT, as
 *                              in a process without /proc
 *   ENGRAM_FAIL_ALLOC=SIZE     malloc and realloc of exactly SIZE bytes fail
 *                              with ENOMEM
 *   ENGRAM_ENVFAIL_LOG=FILE    one line appended per failure injected, so a
 *                              test can see that the shim was active
 *
 * Built without sanitizers (their runtime must come first in the process);
 * the tests that use it run the release build.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_realloc(void *p, size_t size);

/* Appends "what: detail" to the log.  Allocates nothing and opens through
 * the system call (the callers are malloc and open themselves). */
static void note(const char *what, const char *detail)
{
    const char *log = getenv("ENGRAM_ENVFAIL_LOG");
    if (!log)
        return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[512];
    int k = snprintf(line, sizeof line, "%s: %s\n", what, detail);
    if (k > 0)
        (void)!write(fd, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1);
    close(fd);
}

/* ------------------------------------------------------------ open */

static int open_fails(const char *path, int flags)
{
    static long seen;
    if ((flags & O_DIRECT) && getenv("ENGRAM_FAIL_ODIRECT")) {
        note("O_DIRECT refused", path ? path : "(null)");
        errno = EINVAL;
        return 1;
    }
    const char *want = getenv("ENGRAM_FAIL_OPEN");
    if (!want || !path || strcmp(want, path) != 0)
        return 0;
    const char *skip = getenv("ENGRAM_FAIL_OPEN_SKIP");
    if (__atomic_fetch_add(&seen, 1, __ATOMIC_RELAXED) < (skip ? atol(skip) : 0))
        return 0;
    note("open refused", path);
    errno = EACCES;
    return 1;
}

#define OPEN_SHIM(name, proto_args, call_args, path)                                         \
    int name proto_args                                                                       \
    {                                                                                         \
        mode_t mode = 0;                                                                      \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                  \
            va_list ap;                                                                       \
            va_start(ap, flags);                                                              \
            mode = (mode_t)va_arg(ap, int);                                                   \
            va_end(ap);                                                                       \
        }                                                                                     \
        if (open_fails(path, flags))                                                          \
            return -1;                                                                        \
        static int (*real) proto_args;                                                        \
        if (!real)                                                                            \
            real = (int (*) proto_args)dlsym(RTLD_NEXT, #name);                               \
        return real call_args;                                                                \
    }

OPEN_SHIM(open, (const char *p, int flags, ...), (p, flags, mode), p)
OPEN_SHIM(open64, (const char *p, int flags, ...), (p, flags, mode), p)
OPEN_SHIM(openat, (int d, const char *p, int flags, ...), (d, p, flags, mode), p)
OPEN_SHIM(openat64, (int d, const char *p, int flags, ...), (d, p, flags, mode), p)

/* ------------------------------------------------------------ mmap */

static int same_file(int fd, const char *path)
{
    struct stat a, b;
    return fd >= 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

static int mmap_fails(int flags, int fd)
{
    const char *want = getenv("ENGRAM_FAIL_MMAP");
    if (!want || !(flags & MAP_SHARED) || !same_file(fd, want))
        return 0;
    note("mmap refused", want);
    errno = ENODEV;
    return 1;
}

#define MMAP_SHIM(name)                                                                       \
    void *name(void *addr, size_t len, int prot, int flags, int fd, off_t off)                \
    {                                                                                         \
        if (mmap_fails(flags, fd))                                                            \
            return MAP_FAILED;                                                                \
        static void *(*real)(void *, size_t, int, int, int, off_t);                           \
        if (!real)                                                                            \
            real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, #name);  \
        return real(addr, len, prot, flags, fd, off);                                         \
    }

MMAP_SHIM(mmap)
MMAP_SHIM(mmap64)

/* ------------------------------------------------------------ pread */

#define PREAD_SHIM(name)                                                                      \
    ssize_t name(int fd, void *buf, size_t n, off_t off)                                      \
    {                                                                                         \
        const char *want = getenv("ENGRAM_FAIL_PREAD");                                       \
        if (want && same_file(fd, want)) {                                                    \
            note("pread refused", want);                                                      \
            errno = EIO;                                                                      \
            return -1;                                                                        \
        }                                                                                     \
        static ssize_t (*real)(int, void *, size_t, off_t);                                   \
        if (!real)                                                                            \
            real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, #name);          \
        return real(fd, buf, n, off);                                                         \
    }

PREAD_SHIM(pread)
PREAD_SHIM(pread64)

/* ------------------------------------------------------------ readlink */

ssize_t readlink(const char *restrict path, char *restrict buf, size_t n)
{
    const char *want = getenv("ENGRAM_FAIL_READLINK");
    if (want && strcmp(want, path) == 0) {
        note("readlink refused", path);
        errno = ENOENT;
        return -1;
    }
    static ssize_t (*real)(const char *restrict, char *restrict, size_t);
    if (!real)
        real = (ssize_t (*)(const char *restrict, char *restrict, size_t))dlsym(RTLD_NEXT, "readlink");
    return real(path, buf, n);
}

/* ------------------------------------------------------------ allocation */

static int alloc_fails(size_t size)
{
    const char *want = getenv("ENGRAM_FAIL_ALLOC");
    if (!want || strtoull(want, NULL, 10) != size)
        return 0;
    note("allocation refused", want);
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t size)
{
    return alloc_fails(size) ? NULL : __libc_malloc(size);
}

void *realloc(void *p, size_t size)
{
    return alloc_fails(size) ? NULL : __libc_realloc(p, size);
}
