/*
 * engram_mpi.c - libengram-mpi: the shares of a sharded pool combined over
 * MPI (include/engram_mpi.h has the contract).  The only file of the
 * project that includes mpi.h; libengram stays free of MPI.
 */
#include "engram_mpi.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIECE_DEFAULT ((size_t)1 << 30)

struct engram_mpi {
    MPI_Comm comm;               /* our duplicate, MPI_ERRORS_RETURN       */
    int rank, world, thread_level;
    size_t piece;
    pthread_mutex_t lock;        /* the parked list                         */
    engram_mpi_op *parked;       /* cancelled ops MPI still holds           */
};

enum { OP_RUNNING, OP_DONE, OP_FAILED };

struct engram_mpi_op {
    engram_mpi *m;
    int state, cancelled;
    int code;                    /* result once not running                 */
    char msg[256];
    MPI_Datatype rowtype;        /* the gather's row type, or MPI_DATATYPE_NULL */
    /* the gather's scatter at completion */
    uint8_t *buf, *sendbuf, *recvbuf;
    size_t row_bytes, n;
    uint32_t *owner;             /* copy, only for the gather               */
    size_t *first;               /* per rank: its first row in recvbuf       */
    engram_mpi_op *next;         /* in m->parked                            */
    int nreq;
    MPI_Request req[];
};

static int fail(engram_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(engram_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        memset(err, 0, sizeof *err);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        err->offset = ENGRAM_NO_OFFSET;
        err->row = ENGRAM_NO_ROW;
    }
    return code;
}

/* MPI's error code as -EIO with MPI's text, into msg (msg of 256). */
static void mpi_text(char *msg, size_t n, const char *call, int rc)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS || len <= 0)
        snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(msg, n, "%s: %.200s", call, s);
}

static int fail_mpi(engram_error *err, const char *call, int rc)
{
    char msg[256];
    mpi_text(msg, sizeof msg, call, rc);
    return fail(err, -EIO, "%s", msg);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int engram_mpi_open(MPI_Comm comm, const engram_mpi_opts *opts, engram_mpi **out, engram_error *err)
{
    if (!out)
        return fail(err, -EINVAL, "engram_mpi_open: out is NULL");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return fail(err, -EINVAL, "engram_mpi_open: MPI is not initialized (or already finalized)");
    if (comm == MPI_COMM_NULL)
        return fail(err, -EINVAL, "engram_mpi_open: comm is MPI_COMM_NULL");
    size_t piece = opts && opts->piece_bytes ? opts->piece_bytes : PIECE_DEFAULT;
    if (piece > INT_MAX)
        return fail(err, -EINVAL, "engram_mpi_open: piece_bytes %zu is above INT_MAX (MPI counts are int)",
                    piece);
    engram_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return fail(err, -ENOMEM, "engram_mpi_open: out of memory");
    /* the duplicate is collective: every rank gets here, so it returns everywhere */
    int rc = MPI_Comm_dup(comm, &m->comm);
    if (rc != MPI_SUCCESS) {
        free(m);
        return fail_mpi(err, "MPI_Comm_dup", rc);
    }
    if ((rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(m->comm, &m->rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(m->comm, &m->world)) != MPI_SUCCESS ||
        (rc = MPI_Query_thread(&m->thread_level)) != MPI_SUCCESS) {
        MPI_Comm_free(&m->comm);
        free(m);
        return fail_mpi(err, "engram_mpi_open", rc);
    }
    m->piece = piece;
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return 0;
}

static void op_release(engram_mpi_op *op)
{
    if (op->rowtype != MPI_DATATYPE_NULL)
        MPI_Type_free(&op->rowtype);
    free(op->sendbuf);
    free(op->recvbuf);
    free(op->owner);
    free(op->first);
    free(op);
}

/* Tests the parked ops, freeing those MPI has completed; m->lock held. */
static size_t reap_parked(engram_mpi *m)
{
    size_t left = 0;
    engram_mpi_op **pp = &m->parked;
    while (*pp) {
        engram_mpi_op *op = *pp;
        int done = 0;
        if (MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            done = 1; /* failed: MPI has let go of it */
        if (done) {
            *pp = op->next;
            op_release(op);
        } else {
            left++;
            pp = &op->next;
        }
    }
    return left;
}

void engram_mpi_close(engram_mpi *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    size_t left = reap_parked(m);
    pthread_mutex_unlock(&m->lock);
    /* Ops still incomplete are left to MPI, and so are the communicator
     * and this handle they use: freeing an active collective request is
     * erroneous, waiting for it could block for ever, and Open MPI frees
     * state a pending collective still reads when its communicator is
     * freed (a review reproduced the crash).  So the handle, the duplicate
     * and the parked ops are kept until the process ends (a few hundred
     * bytes each); only a handle with nothing pending is freed. */
    if (left > 0)
        return;
    MPI_Comm_free(&m->comm);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void engram_mpi_get_info(engram_mpi *m, engram_mpi_info *info)
{
    if (!m || !info)
        return;
    memset(info, 0, sizeof *info);
    info->rank = m->rank;
    info->world = m->world;
    info->thread_level = m->thread_level;
    info->piece_bytes = m->piece;
    pthread_mutex_lock(&m->lock);
    info->pending = reap_parked(m);
    pthread_mutex_unlock(&m->lock);
}

static engram_mpi_op *op_new(engram_mpi *m, int nreq)
{
    engram_mpi_op *op = calloc(1, sizeof *op + (size_t)nreq * sizeof(MPI_Request));
    if (!op)
        return NULL;
    op->m = m;
    op->rowtype = MPI_DATATYPE_NULL;
    op->state = OP_RUNNING;
    for (int i = 0; i < nreq; i++)
        op->req[i] = MPI_REQUEST_NULL;
    return op;
}

int engram_mpi_combine_begin_into(engram_mpi *m, const void *send, void *recv, size_t bytes,
                                  engram_mpi_op **out, engram_error *err)
{
    if (!m || !out || ((!send || !recv) && bytes))
        return fail(err, -EINVAL, "engram_mpi_combine_begin: %s is NULL",
                    !m ? "m" : !out ? "out" : !send ? "send" : "recv");
    const uint8_t *s = send;
    uint8_t *r = recv;
    int in_place = s == r;
    if (!in_place && bytes && s < r + bytes && r < s + bytes)
        return fail(err, -EINVAL, "engram_mpi_combine_begin_into: send and recv overlap (not the same buffer)");
    size_t pieces = bytes ? (bytes - 1) / m->piece + 1 : 0;
    if (pieces > INT_MAX)
        return fail(err, -EINVAL, "engram_mpi_combine_begin: %zu bytes are too many pieces", bytes);
    engram_mpi_op *op = op_new(m, (int)pieces);
    if (!op)
        return fail(err, -ENOMEM, "engram_mpi_combine_begin: out of memory");
    op->nreq = (int)pieces;
    for (size_t i = 0; i < pieces; i++) {
        size_t off = i * m->piece, len = bytes - off < m->piece ? bytes - off : m->piece;
        int rc = MPI_Iallreduce(in_place ? MPI_IN_PLACE : (const void *)(s + off), r + off, (int)len,
                                MPI_BYTE, MPI_BOR, m->comm, &op->req[i]);
        if (rc != MPI_SUCCESS) {
            /* the pieces started cannot be freed or cancelled: park the op */
            op->nreq = (int)i;
            int code = fail_mpi(err, "MPI_Iallreduce", rc);
            if (i == 0) {
                op_release(op);
            } else {
                engram_mpi_combine_free(op);
            }
            return code;
        }
    }
    if (!pieces)
        op->state = OP_DONE;
    *out = op;
    return 0;
}

int engram_mpi_combine_begin(engram_mpi *m, void *buf, size_t bytes, engram_mpi_op **out,
                             engram_error *err)
{
    if (!buf && bytes)
        return fail(err, -EINVAL, "engram_mpi_combine_begin: buf is NULL");
    return engram_mpi_combine_begin_into(m, buf, buf, bytes, out, err);
}

uint32_t engram_mpi_owner(uint64_t rows, uint32_t id, unsigned world)
{
    if (!world || id >= rows)
        return ENGRAM_MPI_NOBODY;
    /* the largest r with floor(r rows / world) <= id, i.e. r rows < (id + 1) world */
    /* (id + 1) world < 2^32 x 2^32: no overflow */
    return (uint32_t)((((uint64_t)id + 1) * world - 1) / rows);
}

int engram_mpi_owners(const uint64_t rows[ENGRAM_TABLES], const uint32_t *ids, const uint8_t *mask,
                      size_t n, unsigned world, uint32_t *owner, engram_error *err)
{
    if (!rows || (n && (!ids || !owner)))
        return fail(err, -EINVAL, "engram_mpi_owners: %s is NULL", !rows ? "rows" : !ids ? "ids" : "owner");
    if (!world)
        return fail(err, -EINVAL, "engram_mpi_owners: world is 0");
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i])
            continue;
        for (int c = 0; c < ENGRAM_ROWS_PER_TOKEN; c++) {
            int t = c / ENGRAM_COLUMNS;
            if (ids[i * ENGRAM_ROWS_PER_TOKEN + c] >= rows[t])
                return fail(err, -EINVAL, "engram_mpi_owners: token %zu column %d: row %u of table %d is "
                            "not below its %llu rows", i, c, ids[i * ENGRAM_ROWS_PER_TOKEN + c], t,
                            (unsigned long long)rows[t]);
        }
    }
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < ENGRAM_ROWS_PER_TOKEN; c++) {
            size_t p = i * ENGRAM_ROWS_PER_TOKEN + c;
            owner[p] = mask && !mask[i] ? ENGRAM_MPI_NOBODY
                                        : engram_mpi_owner(rows[c / ENGRAM_COLUMNS], ids[p], world);
        }
    return 0;
}

int engram_mpi_gather_begin(engram_mpi *m, void *buf, size_t row_bytes, const uint32_t *owner,
                            size_t n, engram_mpi_op **out, engram_error *err)
{
    if (!m || !out || (n && (!buf || !owner)))
        return fail(err, -EINVAL, "engram_mpi_gather_begin: %s is NULL",
                    !m ? "m" : !out ? "out" : !buf ? "buf" : "owner");
    if (n && (row_bytes == 0 || row_bytes > INT_MAX))
        return fail(err, -EINVAL, "engram_mpi_gather_begin: row_bytes %zu is not in 1..INT_MAX", row_bytes);
    if (n > INT_MAX)
        return fail(err, -EINVAL, "engram_mpi_gather_begin: %zu positions (at most INT_MAX)", n);
    size_t w = (size_t)m->world;
    for (size_t i = 0; i < n; i++)
        if (owner[i] != ENGRAM_MPI_NOBODY && owner[i] >= w)
            return fail(err, -EINVAL, "engram_mpi_gather_begin: position %zu: owner %u is not below the "
                        "world's %zu ranks", i, owner[i], w);
    engram_mpi_op *op = op_new(m, 1);
    int *counts = calloc(w, sizeof *counts), *displs = calloc(w, sizeof *displs);
    if (!op || !counts || !displs)
        goto oom;
    op->nreq = 1;
    op->buf = buf;
    op->row_bytes = row_bytes;
    op->n = n;
    op->first = calloc(w + 1, sizeof *op->first);
    op->owner = n ? malloc(n * sizeof *op->owner) : NULL;
    if (!op->first || (n && !op->owner))
        goto oom;
    if (n)
        memcpy(op->owner, owner, n * sizeof *owner);
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (owner[i] != ENGRAM_MPI_NOBODY)
            counts[owner[i]]++, total++;
    for (size_t r = 0; r < w; r++) {
        op->first[r + 1] = op->first[r] + (size_t)counts[r];
        displs[r] = (int)op->first[r];
    }
    size_t mine = (size_t)counts[m->rank];
    op->sendbuf = malloc(mine ? mine * row_bytes : 1);
    op->recvbuf = malloc(total ? total * row_bytes : 1);
    if (!op->sendbuf || !op->recvbuf)
        goto oom;
    uint8_t *b = buf;
    for (size_t i = 0, j = 0; i < n; i++)
        if (owner[i] == (uint32_t)m->rank)
            memcpy(op->sendbuf + j++ * row_bytes, b + i * row_bytes, row_bytes);
    /* counts in rows of a contiguous type: a chunk's bytes may pass INT_MAX */
    int rc = MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &op->rowtype);
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&op->rowtype)) != MPI_SUCCESS)
        MPI_Type_free(&op->rowtype);
    if (rc != MPI_SUCCESS) {
        op->rowtype = MPI_DATATYPE_NULL;
        free(counts);
        free(displs);
        op_release(op);
        return fail_mpi(err, "MPI_Type_contiguous", rc);
    }
    rc = MPI_Iallgatherv(op->sendbuf, (int)mine, op->rowtype, op->recvbuf, counts, displs, op->rowtype,
                         m->comm, &op->req[0]);
    /* Open MPI's libnbc copies counts and displs into its schedule at the start */
    free(counts);
    free(displs);
    if (rc != MPI_SUCCESS) {
        op_release(op);
        return fail_mpi(err, "MPI_Iallgatherv", rc);
    }
    *out = op;
    return 0;
oom:
    free(counts);
    free(displs);
    if (op)
        op_release(op);
    return fail(err, -ENOMEM, "engram_mpi_gather_begin: out of memory");
}

/* The op's collectives completed (rc: MPI's result): scatter a gather's
 * rows into place and record the result. */
static void op_finish(engram_mpi_op *op, int rc, const char *call)
{
    if (rc != MPI_SUCCESS) {
        op->state = OP_FAILED;
        op->code = -EIO;
        mpi_text(op->msg, sizeof op->msg, call, rc);
        return;
    }
    if (op->owner) {
        uint32_t me = (uint32_t)op->m->rank;
        size_t w = (size_t)op->m->world;
        size_t *next = op->first; /* reused as a cursor: nothing reads it after */
        (void)w;
        for (size_t i = 0; i < op->n; i++) {
            uint32_t o = op->owner[i];
            if (o == ENGRAM_MPI_NOBODY)
                continue;
            const uint8_t *src = op->recvbuf + next[o]++ * op->row_bytes;
            if (o != me)
                memcpy(op->buf + i * op->row_bytes, src, op->row_bytes);
        }
    }
    op->state = OP_DONE;
    op->code = 0;
}

static int op_result(const engram_mpi_op *op, engram_error *err)
{
    if (op->cancelled && op->state == OP_RUNNING)
        return fail(err, -ECANCELED, "engram_mpi: the op was cancelled");
    if (op->state == OP_FAILED)
        return fail(err, op->code, "%s", op->msg);
    return 0;
}

int engram_mpi_combine_poll(engram_mpi_op *op, engram_error *err)
{
    if (!op)
        return fail(err, -EINVAL, "engram_mpi_combine_poll: op is NULL");
    if (op->state != OP_RUNNING || op->cancelled)
        return op_result(op, err);
    int done = 0;
    int rc = MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || done)
        op_finish(op, rc, "MPI_Testall");
    if (op->state == OP_RUNNING)
        return fail(err, -EAGAIN, "engram_mpi_combine_poll: not yet");
    return op_result(op, err);
}

int engram_mpi_combine_wait(engram_mpi_op *op, uint64_t timeout_ns, engram_error *err)
{
    if (!op)
        return fail(err, -EINVAL, "engram_mpi_combine_wait: op is NULL");
    if (op->state != OP_RUNNING || op->cancelled)
        return op_result(op, err);
    if (timeout_ns == ENGRAM_FOREVER) {
        int rc = MPI_Waitall(op->nreq, op->req, MPI_STATUSES_IGNORE);
        op_finish(op, rc, "MPI_Waitall");
        return op_result(op, err);
    }
    uint64_t t0 = now_ns(), deadline = t0 + timeout_ns < t0 ? UINT64_MAX : t0 + timeout_ns;
    /* Tests drive libnbc's schedule, one round per test: between them only
     * a yield (oversubscribed ranks are the peers we wait for).  Sleeping
     * instead tripled the time of a 25 MB combine (measured: 33 -> 102 ms
     * at 2 ranks), each round waiting out a nap. */
    for (;;) {
        int rc = engram_mpi_combine_poll(op, err);
        if (rc != -EAGAIN)
            return rc;
        if (now_ns() >= deadline)
            return fail(err, -ETIMEDOUT, "engram_mpi_combine_wait: not complete after %llu ns (a rank has "
                        "not joined the collective; nothing lost: wait again)", (unsigned long long)timeout_ns);
        sched_yield();
    }
}

void engram_mpi_combine_cancel(engram_mpi_op *op)
{
    if (!op || op->state != OP_RUNNING)
        return;
    op->cancelled = 1;
}

void engram_mpi_combine_free(engram_mpi_op *op)
{
    if (!op)
        return;
    if (op->state == OP_RUNNING) {
        int done = 0;
        if (MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            done = 1;
        if (!done) {
            engram_mpi *m = op->m;
            op->cancelled = 1;
            pthread_mutex_lock(&m->lock);
            op->next = m->parked;
            m->parked = op;
            pthread_mutex_unlock(&m->lock);
            return;
        }
    }
    op_release(op);
}
