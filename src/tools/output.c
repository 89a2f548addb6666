/*
 * output.c - the one writer behind every file engram writes (engram_tools.h,
 * RELIABILITY.md §8).  A regular file or a new name is written under a
 * fresh temporary in the same folder, created exclusively and never
 * through a link, and renamed over the name only when all of it is on
 * disk; a character device or a FIFO is written in place; a symbolic link,
 * a folder, a block device or a socket is refused before anything is
 * written.  Every step after the folder is opened is relative to its
 * descriptor (fstatat, openat, renameat, unlinkat), so the temporary and
 * the name are in one folder whatever is done to the path meanwhile.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
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
#define LIVE_SLOTS 16

/* The temporaries that exist now, for engram_output_abandon_all (a signal
 * handler): copies (the folder's descriptor, the temporary's name), not
 * pointers, so a close in another thread frees nothing the handler reads.
 * A slot is free (0), being filled (1), live (2) or taken by the handler
 * (3). */
static _Atomic int slot_state[LIVE_SLOTS];
static int slot_dir[LIVE_SLOTS];
static char slot_name[LIVE_SLOTS][NAME_MAX + 1];

static void live_add(engram_output *o)
{
    const char *slash = strrchr(o->tmp, '/');
    const char *name = slash ? slash + 1 : o->tmp;
    o->slot = -1;
    if (strlen(name) > NAME_MAX)
        return;
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int free_ = 0;
        if (atomic_compare_exchange_strong(&slot_state[i], &free_, 1)) {
            slot_dir[i] = o->dir;
            strcpy(slot_name[i], name);
            atomic_store(&slot_state[i], 2);
            o->slot = i;
            return;
        }
    }
    /* more than 16 at once: this one is not removed by a signal */
}

static void live_remove(engram_output *o)
{
    if (o->slot >= 0) {
        int live = 2;
        atomic_compare_exchange_strong(&slot_state[o->slot], &live, 0);
        o->slot = -1;
    }
}

void engram_output_abandon_all(void)
{
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int live = 2;
        if (atomic_compare_exchange_strong(&slot_state[i], &live, 3))
            (void)unlinkat(slot_dir[i], slot_name[i], 0);
    }
}

/* The folder of path (opened; links in it followed, as by every tool) and
 * its last name; 0 or -errno with err set. */
static int open_folder(const char *path, int *dir, const char **base, engram_error *err)
{
    if (!path || !*path)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "an output needs a name");
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
        return err_set(err, -EISDIR, ENGRAM_NO_OFFSET, "'%s' names a folder, not a file", path);
    char *folder = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!folder)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    /* O_PATH: a folder we may write but not read is still one we can
     * create, rename and remove names in */
    int fd = open(folder, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int e = errno;
    free(folder);
    if (fd < 0)
        return err_set(err, -e, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                       engram_strerror(-e));
    *dir = fd;
    *base = name;
    return 0;
}

/* What may be written at path, from fstatat in its folder (the last name
 * not followed); 0 or -errno with err set.  *exists: 0 (a new name), 1 (a
 * regular file), 2 (written in place). */
static int classify(int dir, const char *base, const char *path, unsigned flags, struct stat *st,
                    int *exists, engram_error *err)
{
    if (fstatat(dir, base, st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT)
            return err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                           engram_strerror(-errno));
        *exists = 0;
        return 0;
    }
    if (S_ISLNK(st->st_mode)) {
        int std = !strncmp(path, "/dev/std", 8) || !strncmp(path, "/proc/self/fd/", 14) ||
                  !strncmp(path, "/dev/fd/", 8);
        return err_set(err, -ELOOP, ENGRAM_NO_OFFSET,
                       "'%s' is a symbolic link: outputs are never written through a link (%s)",
                       path, std ? "'-' is the standard output" : "name its target");
    }
    const char *kind = S_ISDIR(st->st_mode)    ? "a directory"
                       : S_ISBLK(st->st_mode)  ? "a block device"
                       : S_ISSOCK(st->st_mode) ? "a socket"
                                               : NULL;
    if (kind)
        return err_set(err, S_ISDIR(st->st_mode) ? -EISDIR : -ENOTSUP, ENGRAM_NO_OFFSET,
                       "'%s' is %s: not an output engram writes", path, kind);
    if (S_ISREG(st->st_mode)) {
        *exists = 1;
        return 0;
    }
    if (!S_ISCHR(st->st_mode) && !S_ISFIFO(st->st_mode))
        return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET, "'%s' is not a file engram writes", path);
    const char *what = S_ISCHR(st->st_mode) ? "a character device" : "a FIFO";
    if (flags & ENGRAM_OUTPUT_SEEKABLE)
        return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                       "'%s' is %s: this output is written at offsets, so it must be a "
                       "regular file or a new name", path, what);
    /* a node someone else put in a shared sticky folder (/tmp) is not
     * written: the kernel's protected_fifos rule, for devices too */
    struct stat ds;
    if (fstat(dir, &ds) == 0 && (ds.st_mode & S_ISVTX) && (ds.st_mode & S_IWOTH) &&
        st->st_uid != geteuid() && st->st_uid != ds.st_uid)
        return err_set(err, -EPERM, ENGRAM_NO_OFFSET,
                       "'%s' is %s of user %u in a shared sticky folder: not written",
                       path, what, (unsigned)st->st_uid);
    *exists = 2;
    return 0;
}

int engram_output_check(const char *path, unsigned flags, engram_error *err)
{
    int dir;
    const char *base;
    int rc = open_folder(path, &dir, &base, err);
    if (rc < 0)
        return rc;
    struct stat st;
    int exists;
    rc = classify(dir, base, path, flags, &st, &exists, err);
    close(dir);
    return rc;
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

/* A new file under a fresh name in the folder: BASE.tmp.XXXXXXXXXXXX, or
 * .engram.tmp.XXXXXXXXXXXX when that name is too long.  mode: as open(2)'s
 * (the umask applies). */
static int create_temp(engram_output *o, const char *base, mode_t mode, engram_error *err)
{
    size_t plen = strlen(o->path), blen = strlen(base), dlen = plen - blen;
    int short_form = blen + 17 > NAME_MAX;
    size_t cap = plen + 32;
    o->tmp = malloc(cap);
    if (!o->tmp)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int e = EEXIST;
    for (int i = 0; i < TMP_TRIES; i++) {
        char r[13];
        random_name(r);
        if (short_form)
            snprintf(o->tmp, cap, "%.*s.engram.tmp.%s", (int)dlen, o->path, r);
        else
            snprintf(o->tmp, cap, "%s.tmp.%s", o->path, r);
        o->fd = openat(o->dir, o->tmp + dlen, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       mode);
        if (o->fd >= 0)
            return 0;
        e = errno;
        if (e == ENAMETOOLONG && !short_form) {
            short_form = 1; /* a filesystem with shorter names */
            continue;
        }
        if (e != EEXIST)
            break;
    }
    int rc = err_set(err, -e, ENGRAM_NO_OFFSET, "cannot write '%s': %s (creating a temporary "
                     "beside it)", o->path, engram_strerror(-e));
    free(o->tmp);
    o->tmp = NULL;
    return rc;
}

/* engram_output_open into *o, not yet known to engram_output_abandon_all. */
static int open_output(engram_output *o, const char *path, unsigned flags, engram_error *err)
{
    engram_output n = {.fd = -1, .dir = -1, .path = path, .mode = -1, .gid = -1, .slot = -1};
    const char *base;
    int rc = open_folder(path, &n.dir, &base, err);
    if (rc < 0)
        return rc;
    struct stat st;
    int exists;
    rc = classify(n.dir, base, path, flags, &st, &exists, err);
    if (rc < 0) {
        close(n.dir);
        return rc;
    }
    if (exists == 2) {
        /* in place: no O_CREAT (a node that vanished is not made a file),
         * no link followed; a FIFO waits here for its reader */
        do
            n.fd = openat(n.dir, base, O_WRONLY | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC);
        while (n.fd < 0 && errno == EINTR);
        int e = errno;
        close(n.dir);
        if (n.fd < 0)
            return err_set(err, -e, ENGRAM_NO_OFFSET, "cannot write '%s': %s", path,
                           engram_strerror(-e));
        struct stat now;
        if (fstat(n.fd, &now) < 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            close(n.fd);
            return err_set(err, -EAGAIN, ENGRAM_NO_OFFSET, "'%s' changed while it was opened",
                           path);
        }
        n.dir = -1;
        n.in_place = 1;
        *o = n;
        return 0;
    }
    /* A file of ours that is replaced keeps its mode and group: the
     * temporary is 0600 until close gives them, so no one can open it
     * meanwhile under wider rights than the old file had.  A file of
     * someone else's (one planted where we write) gives nothing: the
     * output is a new file of ours, 0666 less the umask. */
    int keep = exists == 1 && st.st_uid == geteuid();
    rc = create_temp(&n, base, keep ? 0600 : 0666, err);
    if (rc < 0) {
        close(n.dir);
        return rc;
    }
    if (keep) {
        n.mode = (int)(st.st_mode & 0777);
        n.gid = (int)st.st_gid;
    }
    *o = n;
    return 0;
}

int engram_output_open(engram_output *o, const char *path, unsigned flags, engram_error *err)
{
    if (!o)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    int rc = open_output(o, path, flags, err);
    if (rc == 0 && !o->in_place)
        live_add(o);
    return rc;
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
    const char *tbase = strrchr(o->tmp, '/') ? strrchr(o->tmp, '/') + 1 : o->tmp;
    const char *base = strrchr(o->path, '/') ? strrchr(o->path, '/') + 1 : o->path;
    if (ok) {
        int mode = o->mode;
        /* the old group where we may give it; else no rights for group and
         * others (they were the old group's) */
        if (o->gid >= 0 && fchown(o->fd, (uid_t)-1, (gid_t)o->gid) < 0)
            mode &= 0700;
        if (mode >= 0 && fchmod(o->fd, (mode_t)mode) < 0)
            rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot set the mode of '%s': %s",
                         o->tmp, engram_strerror(-errno));
    }
    /* on disk before it is renamed into place: a crash leaves the old file
     * or the new one, never a truncated new one */
    if (ok && rc == 0 && fsync(o->fd) < 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->tmp,
                     engram_strerror(-errno));
    if (close(o->fd) < 0 && ok && rc == 0)
        rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot write '%s': %s", o->tmp,
                     engram_strerror(-errno));
    o->fd = -1;
    if (ok && rc == 0) {
        /* what stands at the name now must still be a kind open accepted:
         * a link or node put there since is not replaced */
        struct stat st;
        int exists;
        engram_error e2 = {0};
        rc = classify(o->dir, base, o->path, 0, &st, &exists, &e2);
        if (rc < 0)
            err_set(err, rc, ENGRAM_NO_OFFSET, "%s (it changed while it was written)", e2.msg);
        else if (exists == 2)
            rc = err_set(err, -EEXIST, ENGRAM_NO_OFFSET, "a %s now stands at '%s': not replaced",
                         S_ISFIFO(st.st_mode) ? "FIFO" : "device", o->path);
        else if (renameat(o->dir, tbase, o->dir, base) < 0)
            rc = err_set(err, -errno, ENGRAM_NO_OFFSET, "cannot rename '%s' to '%s': %s", o->tmp,
                         o->path, engram_strerror(-errno));
    }
    if (ok && rc == 0) {
        /* the new name survives a power cut too (best effort: a folder we
         * cannot read is not synced) */
        int sd = openat(o->dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (sd >= 0) {
            (void)fsync(sd);
            close(sd);
        }
    } else {
        (void)unlinkat(o->dir, tbase, 0);
    }
    /* only now: a signal until here still finds the temporary to remove */
    live_remove(o);
    close(o->dir);
    o->dir = -1;
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
    int rc = open_output(&n, path, flags, err);
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
    if (!o->in_place)
        live_add(o);
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
