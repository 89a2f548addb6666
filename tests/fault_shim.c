/*
 * fault_shim.c - the wrapped system and library calls of fault_shim.h:
 * each passes through to the real call unless its control says to fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "fault_shim.h"

struct fault_sys sys;
struct fail_plan preads, preadv2s, pwrites;
int pread_errno = EIO;
int pwrite_zero;
struct fault_setup setup;
int uring_submit_mode;

int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & O_CREAT) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int e = sys.open_errno;
    if (!e && sys.direct_errno && (flags & O_DIRECT))
        e = sys.direct_errno;
    if (!e && sys.proc_errno && strncmp(path, "/proc/self/fd/", 14) == 0)
        e = sys.proc_errno;
    if (e) {
        errno = e;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __real_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx);
int __wrap_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx);
int __wrap_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx)
{
    int rc = __real_statx(dirfd, path, flags, mask, sx);
    if (rc == 0 && sys.dio_align) {
        sx->stx_mask |= STATX_DIOALIGN;
        sx->stx_dio_offset_align = sys.dio_align;
        sx->stx_dio_mem_align = sys.dio_align;
    }
    return rc;
}

ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (plan_fails(&preads)) {
        errno = pread_errno;
        return -1;
    }
    return __real_pread(fd, buf, n, off);
}

ssize_t __real_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __wrap_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __wrap_preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
    if (plan_fails(&preadv2s)) {
        errno = pread_errno;
        return -1;
    }
    return __real_preadv2(fd, iov, n, off, flags);
}

ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (plan_fails(&pwrites)) {
        if (pwrite_zero)
            return 0;
        errno = EIO;
        return -1;
    }
    return __real_pwrite(fd, buf, n, off);
}

struct io_uring;
struct io_uring_params;
int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
    return setup.queue_init ? setup.queue_init : __real_io_uring_queue_init_params(entries, ring, p);
}
int __real_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n);
int __wrap_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n);
int __wrap_io_uring_register_files(struct io_uring *ring, const int *files, unsigned n)
{
    return setup.register_files ? setup.register_files : __real_io_uring_register_files(ring, files, n);
}
int __real_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n)
{
    return setup.register_buffers ? setup.register_buffers
                                  : __real_io_uring_register_buffers(ring, iov, n);
}
int __real_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring)
{
    if (uring_submit_mode == 1)
        return -EAGAIN;
    if (uring_submit_mode == 2)
        return 0;
    return __real_io_uring_submit(ring);
}

int __real_pthread_attr_init(pthread_attr_t *a);
int __wrap_pthread_attr_init(pthread_attr_t *a);
int __wrap_pthread_attr_init(pthread_attr_t *a)
{
    return setup.attr_fail ? ENOMEM : __real_pthread_attr_init(a);
}
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    if (setup.thread_fail_at && ++setup.thread_calls == setup.thread_fail_at)
        return EAGAIN;
    return __real_pthread_create(t, a, fn, arg);
}
