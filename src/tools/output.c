/*
 * output.c - the one writer behind every file engram writes (engram_tools.h,
 * RELIABILITY.md "Files").  A regular file or a new name is written under a
 * fresh temporary in the same folder, created exclusively and never
 * through a link, and renamed over the name only when all of it is on
 * disk; a character device or a FIFO is written in place; a symbolic link,
 * a folder, a block device or a socket is refused before anything is
 * written.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "engram_tools.h"

#define TMP_TRIES 64

/* What may be written at path, from its lstat; 0 or -errno with err set.
 * *exists: 0 (a new name), 1 (a regular file), 2 (written in place). */
static int classify(const char *path, unsigned flags, struct stat *st, int *exists,
                    engram_error *err)
{
    if (!path || !*path)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "an output needs a name");
    if (lstat(path, st) < 0) {
        if (errno != ENOENT)
            return err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                           engram_strerror(-errno));
        *exists = 0;
        return 0;
    }
    const char *kind = S_ISLNK(st->st_mode)    ? "a symbolic link"
                       : S_ISDIR(st->st_mode)  ? "a directory"
                       : S_ISBLK(st->st_mode)  ? "a block device"
                       : S_ISSOCK(st->st_mode) ? "a socket"
                                               : NULL;
    if (S_ISLNK(st->st_mode))
        return err_set(err, -ELOOP, ENGRAM_NO_OFFSET,
                       "'%s' is a symbolic link: outputs are never written through a "
                       "link (name its target)", path);
    if (kind)
        return err_set(err, S_ISDIR(st->st_mode) ? -EISDIR : -ENOTSUP, ENGRAM_NO_OFFSET,
                       "'%s' is %s: not an output engram writes", path, kind);
    if (S_ISREG(st->st_mode)) {
        *exists = 1;
        return 0;
    }
    if ((S_ISCHR(st->st_mode) || S_ISFIFO(st->st_mode)) && !(flags & ENGRAM_OUTPUT_SEEKABLE)) {
        *exists = 2;
        return 0;
    }
    return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                   "'%s' is %s: this output is written at offsets, so it must be a regular "
                   "file or a new name", path,
                   S_ISCHR(st->st_mode) ? "a character device" : S_ISFIFO(st->st_mode)
                                                                   ? "a FIFO" : "not a file");
}

int engram_output_check(const char *path, unsigned flags, engram_error *err)
{
    struct stat st;
    int exists;
    return classify(path, flags, &st, &exists, err);
}

/* 12 letters that no one can guess: getrandom, or (where the kernel has
 * none) the clock and a counter; safety does not rest on them (the name is
 * created with O_EXCL | O_NOFOLLOW), only the odds of a collision. */
static void random_name(char *out)
{
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint8_t b[12];
    if (getrandom(b, sizeof b, GRND_NONBLOCK) != (ssize_t)sizeof b) {
        static _Atomic uint64_t n;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48)
                     ^ (n++ * 0x9e3779b97f4a7c15ull);
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (uint8_t)(splitmix64(&s) >> 56);
    }
    for (size_t i = 0; i < sizeof b; i++)
        out[i] = abc[b[i] % (sizeof abc - 1)];
    out[sizeof b] = '\0';
}

/* A new file under a fresh name in path's folder: PATH.tmp.XXXXXXXXXXXX,
 * or FOLDER/.engram.tmp.XXXXXXXXXXXX when the name would be too long. */
static int create_temp(engram_output *o, engram_error *err)
{
    size_t plen = strlen(o->path);
    const char *slash = strrchr(o->path, '/');
    size_t dlen = slash ? (size_t)(slash - o->path) + 1 : 0;
    int short_form = plen - dlen + 17 > NAME_MAX;
    size_t cap = plen + 32;
    o->tmp = malloc(cap);
    if (!o->tmp)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    for (int i = 0; i < TMP_TRIES; i++) {
        char r[13];
        random_name(r);
        if (short_form)
            snprintf(o->tmp, cap, "%.*s.engram.tmp.%s", (int)dlen, o->path, r);
        else
            snprintf(o->tmp, cap, "%s.tmp.%s", o->path, r);
        /* 0666 less the umask, as for any new file; a replaced file keeps
         * its mode (engram_output_open) */
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (o->fd >= 0)
            return 0;
        if (errno != EEXIST)
            break;
    }
    int rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s (creating a temporary "
                     "beside it)", o->path, engram_strerror(-errno));
    free(o->tmp);
    o->tmp = NULL;
    return rc;
}

int engram_output_open(engram_output *o, const char *path, unsigned flags, engram_error *err)
{
    if (!o)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    struct stat st;
    int exists;
    int rc = classify(path, flags, &st, &exists, err);
    if (rc < 0)
        return rc;
    engram_output n = {.fd = -1, .path = path};
    if (exists == 2) {
        /* in place: no O_CREAT (a node that vanished is not made a file),
         * no link followed; a FIFO waits here for its reader */
        do
            n.fd = open(path, O_WRONLY | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
        while (n.fd < 0 && errno == EINTR);
        if (n.fd < 0)
            return err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                           engram_strerror(-errno));
        struct stat now;
        if (fstat(n.fd, &now) < 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            close(n.fd);
            return err_set(err, -EAGAIN, ENGRAM_NO_OFFSET, "'%s' changed while it was opened",
                           path);
        }
        n.in_place = 1;
        *o = n;
        return 0;
    }
    rc = create_temp(&n, err);
    if (rc < 0)
        return rc;
    if (exists == 1) {
        /* a replaced file keeps its permissions and, where we may, its owner */
        if (fchown(n.fd, st.st_uid, st.st_gid) < 0) {
            /* not ours to give away: the file becomes ours, as with cp */
        }
        if (fchmod(n.fd, st.st_mode & 0777) < 0) {
            rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot set the mode of '%s': %s", n.tmp,
                         engram_strerror(-errno));
            close(n.fd);
            unlink(n.tmp);
            free(n.tmp);
            return rc;
        }
    }
    *o = n;
    return 0;
}

int engram_output_close(engram_output *o, int ok, engram_error *err)
{
    if (!o || o->fd < 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "not an open output");
    int rc = 0;
    if (o->in_place) {
        if (close(o->fd) < 0 && ok)
            rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->path,
                         engram_strerror(-errno));
        o->fd = -1;
        return rc;
    }
    /* on disk before it is renamed into place: a crash leaves the old file
     * or the new one, never a truncated new one */
    if (ok && fsync(o->fd) < 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->tmp,
                     engram_strerror(-errno));
    if (close(o->fd) < 0 && ok && rc == 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->tmp,
                     engram_strerror(-errno));
    o->fd = -1;
    if (ok && rc == 0) {
        /* what stands at the name now must still be what open saw a kind
         * of: a link or a node put there since is not replaced */
        struct stat st;
        int exists;
        engram_error e2 = {0};
        rc = classify(o->path, ENGRAM_OUTPUT_SEEKABLE, &st, &exists, &e2);
        if (rc < 0)
            err_set(err, rc, ENGRAM_NO_OFFSET, "%s (it changed while it was written)", e2.msg);
        else if (rename(o->tmp, o->path) < 0)
            rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot rename '%s' to '%s': %s", o->tmp,
                         o->path, engram_strerror(-errno));
    }
    if (ok && rc == 0)
        engram_sync_dir_of(o->path);
    else
        unlink(o->tmp);
    free(o->tmp);
    o->tmp = NULL;
    return rc;
}

/* PATH's folder resolved and its last name: "REALDIR/NAME" (malloc'd), or
 * NULL when the folder cannot be resolved. */
static char *canonical(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    char *real = dir ? realpath(dir, NULL) : NULL;
    char *out = NULL;
    if (real) {
        size_t n = strlen(real) + strlen(name) + 2;
        out = malloc(n);
        if (out)
            snprintf(out, n, "%s/%s", real, name);
    }
    free(dir);
    free(real);
    return out;
}

int engram_output_same(const char *a, const char *b)
{
    if (!a || !b)
        return 0;
    struct stat sa, sb;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !S_ISCHR(sa.st_mode);
    if (ea != eb)
        return 0;
    char *ca = canonical(a), *cb = canonical(b);
    int same = ca && cb ? !strcmp(ca, cb) : !strcmp(a, b);
    free(ca);
    free(cb);
    return same;
}

int engram_output_fopen(engram_output *o, const char *path, unsigned flags, FILE **f,
                        engram_error *err)
{
    if (!o || !f)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    engram_output n;
    int rc = engram_output_open(&n, path, flags, err);
    if (rc < 0)
        return rc;
    /* the stream has a descriptor of its own, so that fclose and
     * engram_output_close (fsync, rename) each close theirs */
    int fd = fcntl(n.fd, F_DUPFD_CLOEXEC, 3);
    FILE *s = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!s) {
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                     engram_strerror(-errno));
        if (fd >= 0)
            close(fd);
        engram_output_close(&n, 0, NULL);
        return rc;
    }
    *o = n;
    *f = s;
    return 0;
}

int engram_output_fclose(engram_output *o, FILE *f, int ok, engram_error *err)
{
    if (!o || !f)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = 0;
    /* a failed flush says why; an earlier failed write only that it failed */
    int e = fflush(f) != 0 ? errno : ferror(f) ? EIO : 0;
    if (e && ok)
        rc = err_set(err, -e, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->path,
                     engram_strerror(-e));
    if (fclose(f) != 0 && ok && rc == 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->path,
                     engram_strerror(-errno));
    int c = engram_output_close(o, ok && rc == 0, ok && rc == 0 ? err : NULL);
    return rc < 0 ? rc : c;
}
