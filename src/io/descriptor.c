/* descriptor.c - the table file's descriptor for reads (see descriptor.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "descriptor.h"
#include "format/model.h"
#include "common/util.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif

/* Alignment O_DIRECT needs on this file: statx(STATX_DIOALIGN) where the
 * kernel reports it, else 4096 (a safe multiple of every logical block). */
static uint32_t dio_alignment(int fd)
{
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0)
            return 0; /* the filesystem does not do direct I/O on this file */
        uint32_t a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                     : sx.stx_dio_mem_align;
        return a;
    }
#endif
    return 4096;
}

static enum io_drop probe_dontcache(int fd, uint64_t off)
{
    const char *force = getenv("ENGRAM_IO_DROP");
    if (force && !strcmp(force, "fadvise"))
        return DROP_FADVISE;
    char b[16];
    struct iovec iov = {b, sizeof b};
    ssize_t r = preadv2(fd, &iov, 1, (off_t)off, RWF_DONTCACHE);
    return r >= 0 ? DROP_DONTCACHE : DROP_FADVISE;
}

/*
 * Opens the very file the model validated, with `flags` added: through the
 * model's descriptor (/proc/self/fd/N), so a file renamed over the path in
 * the meantime is not the one read.  Where /proc is not mounted the path is
 * opened and must still name the same file (device and inode), else
 * -ESTALE.  Returns the descriptor or -errno (err filled for -ESTALE only).
 */
static int reopen_model(const engram_model *m, const char *path, int flags, engram_error *err)
{
    int mfd = model_fd(m);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", mfd);
    int fd = open(proc, O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
        fd = open(path, O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0)
        return -errno;
    struct stat a, b;
    if (fstat(fd, &a) < 0 || fstat(mfd, &b) < 0) {
        int e = -errno;
        close(fd);
        return err_set(err, e, ENGRAM_NO_OFFSET, "cannot stat '%s': %s", path, strerror(-e));
    }
    if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(fd);
        return err_set(err, -ESTALE, ENGRAM_NO_OFFSET,
                       "'%s' is no longer the file the model opened (replaced since; device/inode "
                       "differ, and /proc is not there to reach the original): reopen the model",
                       path);
    }
    return fd;
}

/* Tries O_DIRECT: 1 if *d now reads through it, 0 if not (note says why),
 * <0 on an error that must end the open. */
static int try_direct(const engram_model *m, const engram_model_info *info,
                      struct io_descriptor *d, char *note, size_t note_len, engram_error *err)
{
    int fd = reopen_model(m, info->path, O_DIRECT, err);
    if (fd == -ESTALE)
        return fd;
    if (fd < 0) {
        snprintf(note, note_len, "O_DIRECT refused (%s); buffered fallback", strerror(-fd));
        return 0;
    }
    uint32_t a = dio_alignment(fd);
    if (a == 0) {
        snprintf(note, note_len, "no direct I/O on this filesystem; buffered fallback");
    } else if ((uint64_t)io_slot_bytes(a, info->family.row_bytes) * MIN_DIRECT_DEPTH > IO_BUFFER_BUDGET) {
        snprintf(note, note_len,
                 "DIO alignment %u B leaves fewer than %u reads in the %u KiB buffer budget; "
                 "buffered fallback", a, MIN_DIRECT_DEPTH, IO_BUFFER_BUDGET >> 10);
    } else {
        /* Probe one aligned read: some filesystems accept the flag and
         * refuse the read. */
        void *probe = NULL;
        if (posix_memalign(&probe, a < 4096 ? 4096 : a, a) != 0) {
            close(fd);
            return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        }
        ssize_t got = pread(fd, probe, a, (off_t)(info->table[0].offset / a * a));
        int e = errno;
        free(probe);
        if (got > 0) {
            d->fd = fd;
            d->align = a;
            d->direct = 1;
            d->drop = DROP_NONE;
            return 1;
        }
        snprintf(note, note_len, "O_DIRECT read refused (%s); buffered fallback",
                 got < 0 ? strerror(e) : "short read");
    }
    close(fd);
    return 0;
}

int io_descriptor_open(const engram_model *m, engram_io_engine want, struct io_descriptor *out,
                       char *note, size_t note_len, engram_error *err)
{
    engram_model_info info;
    engram_model_get_info(m, &info);
    struct io_descriptor d = {.fd = -1};
    if (want != ENGRAM_IO_BUFFERED) {
        int rc = try_direct(m, &info, &d, note, note_len, err);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            *out = d;
            return 0;
        }
        /* A forced engine is a request for direct reads through it: say
         * so rather than quietly reading through the page cache. */
        if (want != ENGRAM_IO_AUTO)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                           "the %s engine needs O_DIRECT, which this file does not allow here "
                           "(%s); use the automatic or the buffered engine",
                           want == ENGRAM_IO_URING ? "io_uring" : "thread-pool", note);
    }
    int fd = reopen_model(m, info.path, 0, err);
    if (fd == -ESTALE)
        return fd;
    if (fd < 0)
        return err_set(err, fd, ENGRAM_NO_OFFSET, "cannot open '%s': %s", info.path,
                       strerror(-fd));
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    d.fd = fd;
    d.direct = 0;
    d.align = 1;
    d.drop = probe_dontcache(fd, info.table[0].offset);
    *out = d;
    return 0;
}
