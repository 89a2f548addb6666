/*
 * fixed_random_preload.c - LD_PRELOAD for test_files.sh: getrandom() fills
 * its call number k's buffer with the byte k (0, 1, 2, ...), so the writer's
 * temporary names are known in advance (engram_output: the k-th try is
 * NAME.tmp. followed by 12 times letter k of its alphabet) and a test can
 * plant links and files at exactly those names.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/types.h>

ssize_t getrandom(void *buf, size_t len, unsigned int flags);

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    static unsigned calls;
    (void)flags;
    memset(buf, (int)(calls++ & 0xff), len);
    return (ssize_t)len;
}
