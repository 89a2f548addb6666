/*
 * fixed_random_preload.c - LD_PRELOAD for test_files.sh:
 *  - getrandom() fills its call number k's buffer with the byte k (0, 1,
 *    2, ...), so the writer's temporary names are known in advance
 *    (engram_output: the k-th try is NAME.tmp. followed by 12 times letter
 *    k of its alphabet) and a test can plant links and files at them;
 *  - with PRELOAD_FSYNC_SLEEP_MS=N, fsync() sleeps N ms first, so that a
 *    signal can be sent while an output is being finished.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

ssize_t getrandom(void *buf, size_t len, unsigned int flags);
int fsync(int fd);

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    static unsigned calls;
    (void)flags;
    memset(buf, (int)(calls++ & 0xff), len);
    return (ssize_t)len;
}

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    const char *ms = getenv("PRELOAD_FSYNC_SLEEP_MS");
    if (ms) {
        long v = atol(ms);
        struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return real(fd);
}
