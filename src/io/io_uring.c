/*
 * io_uring.c - the io_uring engine: one ring per reader, the table file
 * registered as fixed file 0, the reader's buffer arena registered as fixed
 * buffer 0, reads queued in batches and submitted with one system call.
 */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io_engine.h"

struct uring_engine {
    struct io_engine base;
    struct io_uring ring;
    int fd;
    int fixed_file, fixed_buf;
    /* wake(): an eventfd whose read sits in the ring (wakeable engines) */
    int efd;
    int wake_armed;       /* its read is queued or in flight */
    uint64_t efd_buf;
};

/* Tags of the engine's own requests, whose completions reap() drops (read
 * completions carry their slot number, always < ENGRAM_READER_MAX_DEPTH). */
#define CANCEL_TAG UINT64_MAX
#define WAKE_TAG (UINT64_MAX - 1)

/* Queues the eventfd read if it is not in the ring; goes with the next
 * submission. */
static void arm_wake(struct uring_engine *u)
{
    if (u->efd < 0 || u->wake_armed)
        return;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe)
        return; /* the ring is full: armed at the next reap */
    io_uring_prep_read(sqe, u->efd, &u->efd_buf, sizeof u->efd_buf, 0);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
    u->wake_armed = 1;
}

static int u_submit(struct io_engine *e)
{
    struct uring_engine *u = (struct uring_engine *)e;
    int rc;
    do
        rc = io_uring_submit(&u->ring);
    while (rc == -EINTR);
    /* -EAGAIN / -EBUSY: the kernel wants completions reaped first; the
     * entries stay in the submission ring and go with the next call. */
    return rc < 0 ? rc : 0;
}

/* A free submission entry, submitting what the ring holds if it is full:
 * 0 with *out set, or -errno (-EBUSY: still full). */
static int get_sqe(struct io_engine *e, struct io_uring_sqe **out)
{
    struct uring_engine *u = (struct uring_engine *)e;
    if ((*out = io_uring_get_sqe(&u->ring)))
        return 0;
    int rc = u_submit(e);
    if (rc < 0)
        return rc;
    return (*out = io_uring_get_sqe(&u->ring)) ? 0 : -EBUSY;
}

static int u_queue(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off)
{
    struct uring_engine *u = (struct uring_engine *)e;
    struct io_uring_sqe *sqe;
    int rc = get_sqe(e, &sqe);
    if (rc < 0)
        return rc;
    int fd = u->fixed_file ? 0 : u->fd;
    if (u->fixed_buf)
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, 0);
    else
        io_uring_prep_read(sqe, fd, buf, len, off);
    if (u->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, slot);
    return 0;
}

static int u_reap(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min)
{
    struct uring_engine *u = (struct uring_engine *)e;
    int wait_rc = 0;
    if (min > 0 || io_uring_sq_ready(&u->ring) > 0) {
        do
            wait_rc = io_uring_submit_and_wait(&u->ring, min);
        while (wait_rc == -EINTR);
        /* Transient refusals (-EAGAIN, -EBUSY) still leave the completion
         * ring readable: take what is there, report the error only if
         * there is nothing.  Hard errors are reported at once. */
        if (wait_rc < 0 && !io_transient(wait_rc))
            return wait_rc;
    }
    struct io_uring_cqe *batch[64];
    unsigned got = 0;
    while (got < max) {
        unsigned want = max - got < 64 ? max - got : 64;
        unsigned n = io_uring_peek_batch_cqe(&u->ring, batch, want);
        if (n == 0)
            break;
        for (unsigned i = 0; i < n; i++) {
            uint64_t tag = io_uring_cqe_get_data64(batch[i]);
            if (tag == WAKE_TAG)
                u->wake_armed = 0;
            if (tag == CANCEL_TAG || tag == WAKE_TAG)
                continue;
            out[got].slot = (unsigned)tag;
            out[got].res = batch[i]->res;
            got++;
        }
        io_uring_cq_advance(&u->ring, n);
    }
    arm_wake(u);
    if (got == 0 && wait_rc < 0)
        return wait_rc;
    return (int)got;
}

static void u_wake(struct io_engine *e)
{
    struct uring_engine *u = (struct uring_engine *)e;
    if (u->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(u->efd, &one, sizeof one); /* EAGAIN: a wake-up is pending anyway */
        (void)w;
    }
}

static int u_cancel(struct io_engine *e)
{
    struct io_uring_sqe *sqe;
    int rc = get_sqe(e, &sqe);
    if (rc < 0)
        return rc;
    /* Everything of this ring (ANY matches all requests).  Reads the device
     * already has finish normally; the caller reaps them either way.  A
     * kernel without CANCEL_ANY answers -EINVAL in the cancel's completion,
     * which is dropped: the reads then simply run to their end. */
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    io_uring_sqe_set_data64(sqe, CANCEL_TAG);
    return u_submit(e);
}

static void u_destroy(struct io_engine *e)
{
    struct uring_engine *u = (struct uring_engine *)e;
    if (u->efd >= 0 && u->wake_armed) {
        /* The eventfd read targets efd_buf inside this struct: make it
         * complete (a write does that) and reap it before freeing. */
        u_wake(e);
        io_uring_submit(&u->ring);
        for (int tries = 0; u->wake_armed && tries < 1000; tries++) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&u->ring, &cqe) == 0) {
                if (io_uring_cqe_get_data64(cqe) == WAKE_TAG)
                    u->wake_armed = 0;
                io_uring_cqe_seen(&u->ring, cqe);
            }
        }
    }
    io_uring_queue_exit(&u->ring);
    if (u->efd >= 0)
        close(u->efd);
    free(u);
}

static size_t page_up(size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t p = pg > 0 ? (size_t)pg : 4096;
    return (n + p - 1) / p * p;
}

static const struct io_engine_ops uring_ops = {u_queue, u_submit, u_reap, u_cancel, u_wake, u_destroy};

int io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                        struct io_engine **out, char *note, size_t note_len)
{
    struct uring_engine *u = calloc(1, sizeof *u);
    if (!u)
        return -ENOMEM;
    u->efd = -1;
    if (wakeable && (u->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        int e = -errno;
        free(u);
        return e;
    }
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE;
    /* reads in flight (<= depth), a cancel's completion or two, the eventfd
     * read (the kernel rounds it up to a power of two; an overflow would be
     * kept by the kernel, not lost) */
    p.cq_entries = depth + 8;
    /* depth SQ entries for a wakeable engine too: the eventfd read needs an
     * entry only until it is submitted, and a queue() that finds the SQ
     * full submits first (depth + 1 would double the SQ at depth 512) */
    int rc = io_uring_queue_init_params(depth, &u->ring, &p);
    if (rc < 0) {
        if (u->efd >= 0)
            close(u->efd);
        free(u);
        return rc;
    }
    u->fd = fd;
    note[0] = '\0';
    rc = io_uring_register_files(&u->ring, &fd, 1);
    u->fixed_file = rc == 0;
    if (rc < 0)
        snprintf(note, note_len, "no fixed file (%s)", strerror(-rc));
    struct iovec iov = {arena, arena_len};
    rc = io_uring_register_buffers(&u->ring, &iov, 1);
    u->fixed_buf = rc == 0;
    if (rc < 0) {
        size_t k = strlen(note);
        snprintf(note + k, note_len - k, "%sno fixed buffers (%s)", k ? "; " : "", strerror(-rc));
    }
    u->base.ops = &uring_ops;
    u->base.name = "io_uring";
    arm_wake(u);
    /* The rings as the kernel made them (entries rounded up to powers of
     * two, mappings to whole pages): the SQ and CQ rings (one mapping where
     * the kernel shares it) and the SQ entries. */
    size_t rings = p.features & IORING_FEAT_SINGLE_MMAP
                       ? page_up(u->ring.sq.ring_sz > u->ring.cq.ring_sz ? u->ring.sq.ring_sz
                                                                         : u->ring.cq.ring_sz)
                       : page_up(u->ring.sq.ring_sz) + page_up(u->ring.cq.ring_sz);
    u->base.bytes = sizeof *u + rings +
                    page_up((size_t)u->ring.sq.ring_entries * sizeof(struct io_uring_sqe));
    *out = &u->base;
    return 0;
}
