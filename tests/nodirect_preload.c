/*
 * nodirect_preload.c - LD_PRELOAD shim that makes every open with O_DIRECT
 * fail with EINVAL, as a filesystem without O_DIRECT support does (tmpfs
 * before Linux 6.6, some FUSE and network filesystems).  Used by
 * tests/test_fallback.sh; ENGRAM_NODIRECT_LOG=FILE appends one line per
 * refusal so the test can see the shim was active.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

static void note(const char *path)
{
    const char *log = getenv("ENGRAM_NODIRECT_LOG");
    if (!log)
        return;
    FILE *f = fopen(log, "a");
    if (f) {
        fprintf(f, "O_DIRECT refused: %s\n", path);
        fclose(f);
    }
}

#define SHIM(name, proto_args, call_args, path)                                              \
    int name proto_args                                                                       \
    {                                                                                         \
        mode_t mode = 0;                                                                      \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                  \
            va_list ap;                                                                       \
            va_start(ap, flags);                                                              \
            mode = (mode_t)va_arg(ap, int);                                                   \
            va_end(ap);                                                                       \
        }                                                                                     \
        if (flags & O_DIRECT) {                                                               \
            note(path);                                                                       \
            errno = EINVAL;                                                                   \
            return -1;                                                                        \
        }                                                                                     \
        static int (*real) proto_args;                                                        \
        if (!real)                                                                            \
            real = (int (*) proto_args)dlsym(RTLD_NEXT, #name);                               \
        return real call_args;                                                                \
    }

SHIM(open, (const char *p, int flags, ...), (p, flags, mode), p)
SHIM(open64, (const char *p, int flags, ...), (p, flags, mode), p)
SHIM(openat, (int d, const char *p, int flags, ...), (d, p, flags, mode), p)
SHIM(openat64, (int d, const char *p, int flags, ...), (d, p, flags, mode), p)
