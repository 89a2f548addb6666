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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error_fill.h"

#define PIECE_DEFAULT ((size_t)1 << 30)

struct engram_mpi {
    MPI_Comm comm;               /* our duplicate, MPI_ERRORS_RETURN       */
    int rank, world, thread_level;
    size_t piece;
    pthread_mutex_t lock;        /* the parked list                         */
    engram_mpi_op *parked;       /* cancelled ops MPI still holds           */
    int xbusy;                   /* an exchange is between its phases: no
                                    other collective may start on comm      */
};

struct xchg; /* an exchange's state (below) */

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
    struct xchg *xc;             /* an exchange's phases, or NULL           */
    int nreq;
    MPI_Request req[];
};

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
    return err_fail(err, -EIO, "%s", msg);
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
        return err_fail(err, -EINVAL, "engram_mpi_open: out is NULL");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return err_fail(err, -EINVAL, "engram_mpi_open: MPI is not initialized (or already finalized)");
    if (comm == MPI_COMM_NULL)
        return err_fail(err, -EINVAL, "engram_mpi_open: comm is MPI_COMM_NULL");
    size_t piece = opts && opts->piece_bytes ? opts->piece_bytes : PIECE_DEFAULT;
    if (piece > INT_MAX)
        return err_fail(err, -EINVAL, "engram_mpi_open: piece_bytes %zu is above INT_MAX (MPI counts are int)",
                        piece);
    engram_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return err_fail(err, -ENOMEM, "engram_mpi_open: out of memory");
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

static void xchg_free(struct xchg *x);

static void op_release(engram_mpi_op *op)
{
    if (op->rowtype != MPI_DATATYPE_NULL)
        MPI_Type_free(&op->rowtype);
    free(op->sendbuf);
    free(op->recvbuf);
    free(op->owner);
    free(op->first);
    xchg_free(op->xc);
    free(op);
}

/* Whether MPI still holds any of the op's requests (and so its buffers),
 * after one MPI_Testall has completed and freed what it could: a request
 * MPI let go of reads MPI_REQUEST_NULL, whatever the op's state (a failed
 * op may still have a piece in flight: a later collective refused to
 * start, or MPI_ERR_IN_STATUS with others pending).  Nothing is released
 * while this is 1. */
static int op_active(engram_mpi_op *op)
{
    int done = 0;
    if (op->nreq > 0)
        (void)MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
    for (int i = 0; i < op->nreq; i++)
        if (op->req[i] != MPI_REQUEST_NULL)
            return 1;
    return 0;
}

/* Tests the parked ops, freeing those MPI has let go of; m->lock held. */
static size_t reap_parked(engram_mpi *m)
{
    size_t left = 0;
    engram_mpi_op **pp = &m->parked;
    while (*pp) {
        engram_mpi_op *op = *pp;
        int done = !op_active(op);
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
        return err_fail(err, -EINVAL, "engram_mpi_combine_begin: %s is NULL",
                        !m ? "m" : !out ? "out" : !send ? "send" : "recv");
    if (m->xbusy)
        return err_fail(err, -EBUSY, "engram_mpi_combine_begin: an exchange is in progress on this engram_mpi "
                        "(its phases start collectives as it goes: wait for it first)");
    const uint8_t *s = send;
    uint8_t *r = recv;
    int in_place = s == r;
    if (!in_place && bytes && s < r + bytes && r < s + bytes)
        return err_fail(err, -EINVAL, "engram_mpi_combine_begin_into: send and recv overlap (not the same buffer)");
    size_t pieces = bytes ? (bytes - 1) / m->piece + 1 : 0;
    if (pieces > INT_MAX)
        return err_fail(err, -EINVAL, "engram_mpi_combine_begin: %zu bytes are too many pieces", bytes);
    engram_mpi_op *op = op_new(m, (int)pieces);
    if (!op)
        return err_fail(err, -ENOMEM, "engram_mpi_combine_begin: out of memory");
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
        return err_fail(err, -EINVAL, "engram_mpi_combine_begin: buf is NULL");
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
        return err_fail(err, -EINVAL, "engram_mpi_owners: %s is NULL", !rows ? "rows" : !ids ? "ids" : "owner");
    if (!world)
        return err_fail(err, -EINVAL, "engram_mpi_owners: world is 0");
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i])
            continue;
        for (int c = 0; c < ENGRAM_ROWS_PER_TOKEN; c++) {
            int t = c / ENGRAM_COLUMNS;
            if (ids[i * ENGRAM_ROWS_PER_TOKEN + c] >= rows[t])
                return err_fail(err, -EINVAL, "engram_mpi_owners: token %zu column %d: row %u of table %d is "
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
        return err_fail(err, -EINVAL, "engram_mpi_gather_begin: %s is NULL",
                        !m ? "m" : !out ? "out" : !buf ? "buf" : "owner");
    if (n && (row_bytes == 0 || row_bytes > INT_MAX))
        return err_fail(err, -EINVAL, "engram_mpi_gather_begin: row_bytes %zu is not in 1..INT_MAX", row_bytes);
    if (n > INT_MAX)
        return err_fail(err, -EINVAL, "engram_mpi_gather_begin: %zu positions (at most INT_MAX)", n);
    if (m->xbusy)
        return err_fail(err, -EBUSY, "engram_mpi_gather_begin: an exchange is in progress on this engram_mpi "
                        "(its phases start collectives as it goes: wait for it first)");
    size_t w = (size_t)m->world;
    for (size_t i = 0; i < n; i++)
        if (owner[i] != ENGRAM_MPI_NOBODY && owner[i] >= w)
            return err_fail(err, -EINVAL, "engram_mpi_gather_begin: position %zu: owner %u is not below the "
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
    return err_fail(err, -ENOMEM, "engram_mpi_gather_begin: out of memory");
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

static void xchg_progress(engram_mpi_op *op, int block);

static int op_result(const engram_mpi_op *op, engram_error *err)
{
    if (op->cancelled && op->state == OP_RUNNING)
        return err_fail(err, -ECANCELED, "engram_mpi: the op was cancelled");
    if (op->state == OP_FAILED)
        return err_fail(err, op->code, "%s", op->msg);
    return 0;
}

int engram_mpi_combine_poll(engram_mpi_op *op, engram_error *err)
{
    if (!op)
        return err_fail(err, -EINVAL, "engram_mpi_combine_poll: op is NULL");
    if (op->state != OP_RUNNING || op->cancelled)
        return op_result(op, err);
    if (op->xc) {
        xchg_progress(op, 0);
        if (op->state == OP_RUNNING)
            return err_fail(err, -EAGAIN, "engram_mpi_combine_poll: not yet");
        return op_result(op, err);
    }
    int done = 0;
    int rc = MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || done)
        op_finish(op, rc, "MPI_Testall");
    if (op->state == OP_RUNNING)
        return err_fail(err, -EAGAIN, "engram_mpi_combine_poll: not yet");
    return op_result(op, err);
}

int engram_mpi_combine_wait(engram_mpi_op *op, uint64_t timeout_ns, engram_error *err)
{
    if (!op)
        return err_fail(err, -EINVAL, "engram_mpi_combine_wait: op is NULL");
    if (op->state != OP_RUNNING || op->cancelled)
        return op_result(op, err);
    if (timeout_ns == ENGRAM_FOREVER && op->xc) {
        xchg_progress(op, 1);
        return op_result(op, err);
    }
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
            return err_fail(err, -ETIMEDOUT, "engram_mpi_combine_wait: not complete after %llu ns (a rank has "
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
    /* whatever its state: a failed op may still have a collective in
     * flight over its buffers (a review reproduced the use after free) */
    if (op_active(op)) {
        engram_mpi *m = op->m;
        if (op->state == OP_RUNNING)
            op->cancelled = 1;
        pthread_mutex_lock(&m->lock);
        op->next = m->parked;
        m->parked = op;
        pthread_mutex_unlock(&m->lock);
        return;
    }
    op_release(op);
}

/* ------------------------------------------------------------ the exchange */

/* Requests are uint32: table t's row id in the low 31 bits, t in the top. */
#define XREQ(t, id) ((uint32_t)(t) << 31 | (uint32_t)(id))
#define XREQ_T(q) ((int)((q) >> 31))
#define XREQ_ID(q) ((q) & 0x7fffffffu)
/* The owner's reads: this many tokens' ids a reader batch (48 KiB of ids) */
#define XPIECE_TOKENS 256u

enum { XP_COUNTS = 1, XP_REQUESTS, XP_ROWS };

struct xchg {
    engram_reader *r;
    engram_dtype dtype;
    size_t rb;              /* bytes of a row of dtype                      */
    uint64_t rows[ENGRAM_TABLES];
    uint8_t *out;           /* the caller's [n][48][rb]                     */
    size_t npos;            /* n x 48                                       */
    uint32_t *slot;         /* [npos]: the position's row in rows_in, or NOBODY */
    int phase;
    size_t d;               /* distinct rows this rank asks for             */
    size_t incoming;        /* rows the others (and this rank) ask of it    */
    int *scount, *sdispl, *rcount, *rdispl; /* [world] each, in rows        */
    uint32_t *sreq;         /* [d]: by owner, then table, then id           */
    uint32_t *rreq;         /* [incoming]: by asking rank, then as sent     */
    uint8_t *reply;         /* [incoming][rb]: the rows this rank sends     */
    uint8_t *rows_in;       /* [d][rb]: the rows it receives                */
    int *sstat, *rstat;     /* [world]: status sent to / got from each rank */
    int served_rc;          /* this rank's first read error (0: none)       */
    char served_msg[200];
    engram_mpi_exchange_info info;
};

static void xchg_free(struct xchg *x)
{
    if (!x)
        return;
    free(x->slot);
    free(x->scount);
    free(x->sdispl);
    free(x->rcount);
    free(x->rdispl);
    free(x->sreq);
    free(x->rreq);
    free(x->reply);
    free(x->rows_in);
    free(x->sstat);
    free(x->rstat);
    free(x);
}

static int cmp_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The positions of an exchange's ids (token p / 48, column p % 48) whose
 * token is not masked, in order: *p moved to the first such position at or
 * after it, with its table in *t and its row in *id; 0 when none is left. */
static int xnext(const uint32_t *ids, const uint8_t *mask, size_t n, size_t *p, int *t, uint32_t *id)
{
    while (*p < n * ENGRAM_ROWS_PER_TOKEN && mask && !mask[*p / ENGRAM_ROWS_PER_TOKEN])
        *p = (*p / ENGRAM_ROWS_PER_TOKEN + 1) * ENGRAM_ROWS_PER_TOKEN;
    if (*p >= n * ENGRAM_ROWS_PER_TOKEN)
        return 0;
    *t = (int)(*p % ENGRAM_ROWS_PER_TOKEN) / ENGRAM_COLUMNS;
    *id = ids[*p];
    return 1;
}

/* A row's sort key, by owner, table and id: owner << 32 | request. */
static uint64_t xkey(const uint64_t rows[ENGRAM_TABLES], unsigned world, int t, uint32_t id)
{
    return (uint64_t)engram_mpi_owner(rows[t], id, world) << 32 | XREQ(t, id);
}

static size_t xrow_bytes(engram_dtype d)
{
    return d == ENGRAM_F32 ? ENGRAM_ROW_VALUES * 4 : d == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2;
}

/* The op is over: the busy mark of m is lifted (the ranks' sequences of
 * collectives agree again: every phase was started everywhere). */
static void xchg_end(engram_mpi_op *op, int code, const char *msg)
{
    op->m->xbusy = 0;
    op->state = code ? OP_FAILED : OP_DONE;
    op->code = code;
    if (code)
        snprintf(op->msg, sizeof op->msg, "%.255s", msg);
}

static void xchg_mpi_fail(engram_mpi_op *op, const char *call, int rc)
{
    char msg[256];
    mpi_text(msg, sizeof msg, call, rc);
    /* m stays busy: the peers' phases and ours no longer agree */
    op->state = OP_FAILED;
    op->code = -EIO;
    snprintf(op->msg, sizeof op->msg, "%s", msg);
}

#define XPIECE_ROWS (XPIECE_TOKENS * ENGRAM_COLUMNS)

/* The owner's reads of table t's rows in one piece: ids[] (its 24 columns
 * of each token filled, the last token padded with a row already asked
 * for), read into tmp and copied to their places in reply (at[]); a
 * failed read fails every asking rank with a row in the piece (in[]). */
static void xchg_piece(struct xchg *x, int t, size_t cnt, uint32_t *ids, const uint32_t *at, uint8_t *tmp,
                       const uint8_t *in, int w)
{
    size_t k = (cnt + ENGRAM_COLUMNS - 1) / ENGRAM_COLUMNS;
    for (size_t j = cnt; j < k * ENGRAM_COLUMNS; j++)
        ids[j / ENGRAM_COLUMNS * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + j % ENGRAM_COLUMNS] =
            ids[(size_t)t * ENGRAM_COLUMNS];
    engram_error e = {0};
    int rc = engram_reader_batch(x->r, t, ids, k, x->dtype, tmp, &e);
    if (rc == 0) {
        for (size_t j = 0; j < cnt; j++)
            memcpy(x->reply + (size_t)at[j] * x->rb, tmp + j * x->rb, x->rb);
        return;
    }
    for (int s = 0; s < w; s++)
        if (in[s] && x->sstat[s] == 0)
            x->sstat[s] = rc;
    if (!x->served_rc) {
        x->served_rc = rc;
        snprintf(x->served_msg, sizeof x->served_msg, "%.190s", e.msg);
    }
}

/* Phase 2 done: the rows every rank asked of this one, read into reply
 * (per table, the asking ranks' rows together, in pieces of 6,144 rows:
 * one reader batch each, so a row two ranks asked for is read once), with
 * a status per asking rank; a failed rank's rows are sent as zeros. */
static int xchg_serve(engram_mpi_op *op)
{
    struct xchg *x = op->xc;
    int w = op->m->world;
    /* a piece never holds more than what was asked (a decode step: a few rows) */
    size_t toks = x->incoming / ENGRAM_COLUMNS + 1;
    toks = toks < XPIECE_TOKENS ? toks : XPIECE_TOKENS;
    uint32_t *ids = malloc(toks * ENGRAM_ROWS_PER_TOKEN * sizeof *ids);
    uint32_t *at = malloc(toks * ENGRAM_COLUMNS * sizeof *at);
    uint8_t *tmp = malloc(toks * ENGRAM_COLUMNS * x->rb), *in = calloc((size_t)w, 1);
    if (!ids || !at || !tmp || !in) {
        free(ids), free(at), free(tmp), free(in);
        return -ENOMEM;
    }
    for (int s = 0; s < w; s++) {
        size_t a = (size_t)x->rdispl[s], b = a + (size_t)x->rcount[s];
        for (size_t i = a; i < b && x->sstat[s] == 0; i++) {
            uint32_t q = x->rreq[i];
            engram_error e = {0};
            if (XREQ_ID(q) >= x->rows[XREQ_T(q)])
                x->sstat[s] = err_fail(&e, -EINVAL, "row %u of table %d asked by rank %d is not below its %llu rows",
                                       XREQ_ID(q), XREQ_T(q), s, (unsigned long long)x->rows[XREQ_T(q)]);
            else if (i > a && x->rreq[i - 1] >= q)
                x->sstat[s] = err_fail(&e, -EINVAL, "the requests of rank %d are not sorted and distinct", s);
            if (x->sstat[s] && !x->served_rc) {
                x->served_rc = x->sstat[s];
                snprintf(x->served_msg, sizeof x->served_msg, "%.190s", e.msg);
            }
        }
    }
    for (int t = 0; t < ENGRAM_TABLES; t++) {
        size_t cnt = 0;
        memset(in, 0, (size_t)w);
        for (int s = 0; s < w; s++) {
            size_t a = (size_t)x->rdispl[s], b = a + (size_t)x->rcount[s];
            for (size_t i = a; i < b && x->sstat[s] == 0; i++) {
                if (XREQ_T(x->rreq[i]) != t)
                    continue;
                ids[cnt / ENGRAM_COLUMNS * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS + cnt % ENGRAM_COLUMNS] =
                    XREQ_ID(x->rreq[i]);
                at[cnt++] = (uint32_t)i;
                in[s] = 1;
                if (cnt == XPIECE_ROWS) {
                    xchg_piece(x, t, cnt, ids, at, tmp, in, w);
                    cnt = 0;
                    memset(in, 0, (size_t)w);
                }
            }
        }
        if (cnt)
            xchg_piece(x, t, cnt, ids, at, tmp, in, w);
    }
    for (int s = 0; s < w; s++) {
        x->info.rows_served += (size_t)x->rcount[s];
        if (x->sstat[s])
            memset(x->reply + (size_t)x->rdispl[s] * x->rb, 0, (size_t)x->rcount[s] * x->rb);
    }
    free(ids), free(at), free(tmp), free(in);
    return 0;
}

/* Moves the exchange on: tests (block: waits for) the phase in flight and
 * starts the next; at the end scatters the rows or records the error. */
static void xchg_progress(engram_mpi_op *op, int block)
{
    struct xchg *x = op->xc;
    engram_mpi *m = op->m;
    int w = m->world;
    while (op->state == OP_RUNNING) {
        int done = 0, rc;
        if (block) {
            rc = MPI_Waitall(op->nreq, op->req, MPI_STATUSES_IGNORE);
            done = 1;
        } else {
            rc = MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
        }
        if (rc != MPI_SUCCESS) {
            xchg_mpi_fail(op, block ? "MPI_Waitall" : "MPI_Testall", rc);
            return;
        }
        if (!done)
            return;
        if (x->phase == XP_COUNTS) {
            size_t total = 0;
            for (int s = 0; s < w; s++) {
                if (x->rcount[s] < 0 || total + (size_t)x->rcount[s] > INT_MAX) {
                    /* every rank refuses more than INT_MAX / world at begin */
                    xchg_mpi_fail(op, "engram_mpi_exchange", MPI_ERR_COUNT);
                    return;
                }
                x->rdispl[s] = (int)total;
                total += (size_t)x->rcount[s];
            }
            x->incoming = total;
            x->rreq = malloc(total ? total * sizeof *x->rreq : 1);
            x->reply = malloc(total ? total * x->rb : 1);
            if (!x->rreq || !x->reply) {
                /* the peers wait for our requests: nothing we can send */
                xchg_mpi_fail(op, "engram_mpi_exchange (out of memory for the requests of the others)",
                              MPI_ERR_NO_MEM);
                return;
            }
            x->phase = XP_REQUESTS;
            op->nreq = 1;
            rc = MPI_Ialltoallv(x->sreq, x->scount, x->sdispl, MPI_UINT32_T, x->rreq, x->rcount, x->rdispl,
                                MPI_UINT32_T, m->comm, &op->req[0]);
            if (rc != MPI_SUCCESS) {
                op->nreq = 0;
                xchg_mpi_fail(op, "MPI_Ialltoallv (requests)", rc);
                return;
            }
        } else if (x->phase == XP_REQUESTS) {
            if (xchg_serve(op) < 0) {
                xchg_mpi_fail(op, "engram_mpi_exchange (out of memory for the reads)", MPI_ERR_NO_MEM);
                return;
            }
            x->info.rows_sent = x->incoming - (size_t)x->rcount[m->rank];
            x->phase = XP_ROWS;
            op->nreq = 2;
            rc = MPI_Ialltoall(x->sstat, 1, MPI_INT, x->rstat, 1, MPI_INT, m->comm, &op->req[0]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Ialltoallv(x->reply, x->rcount, x->rdispl, op->rowtype, x->rows_in, x->scount,
                                    x->sdispl, op->rowtype, m->comm, &op->req[1]);
            if (rc != MPI_SUCCESS) {
                op->nreq = op->req[0] == MPI_REQUEST_NULL ? 0 : 1;
                xchg_mpi_fail(op, "MPI_Ialltoall / MPI_Ialltoallv (rows)", rc);
                return;
            }
        } else {
            /* an owner that could not read our rows, or our own reads for another */
            char msg[512];
            for (int o = 0; o < w; o++)
                if (x->scount[o] > 0 && x->rstat[o] != 0) {
                    snprintf(msg, sizeof msg, "engram_mpi_exchange: rank %d could not read the %d rows this "
                             "rank asked of it (%s)%s%.80s", o, x->scount[o], strerror(-x->rstat[o]),
                             o == m->rank ? ": " : "", o == m->rank ? x->served_msg : "");
                    xchg_end(op, x->rstat[o], msg);
                    return;
                }
            if (x->served_rc) {
                snprintf(msg, sizeof msg, "engram_mpi_exchange: this rank (%d) could not read rows other "
                         "ranks asked of it: %.190s", m->rank, x->served_msg);
                xchg_end(op, x->served_rc, msg);
                return;
            }
            for (size_t p = 0; p < x->npos; p++)
                if (x->slot[p] != ENGRAM_MPI_NOBODY)
                    memcpy(x->out + p * x->rb, x->rows_in + (size_t)x->slot[p] * x->rb, x->rb);
            xchg_end(op, 0, "");
            return;
        }
    }
}

int engram_mpi_exchange_begin(engram_mpi *m, const engram_model *model, engram_reader *r,
                              const uint32_t *ids, const uint8_t *mask, size_t n, engram_dtype dtype,
                              void *out, engram_mpi_op **opp, engram_error *err)
{
    if (!m || !model || !r || !opp || (n && (!ids || !out)))
        return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: %s is NULL",
                        !m ? "m" : !model ? "model" : !r ? "r" : !opp ? "op" : !ids ? "ids" : "out");
    if (dtype != ENGRAM_BF16 && dtype != ENGRAM_F32 && dtype != ENGRAM_RAW)
        return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: dtype %d is not BF16, F32 or RAW", (int)dtype);
    if (m->xbusy)
        return err_fail(err, -EBUSY, "engram_mpi_exchange_begin: an exchange is in progress on this engram_mpi "
                        "(wait for it first)");
    engram_model_info mi;
    engram_model_get_info(model, &mi);
    if (mi.family.member != ENGRAM_MEMBER_V41)
        return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: the model is not V4.1 (%s): the exchange "
                        "moves V4.1's 48 rows a token", mi.family.name);
    if (mi.shard.world > 1 && (mi.shard.world != (uint32_t)m->world || mi.shard.rank != (uint32_t)m->rank))
        return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: the model is shard %u of %u, this rank is %d "
                        "of %d (each rank reads its own block)", mi.shard.rank, mi.shard.world, m->rank, m->world);
    size_t npos = n * ENGRAM_ROWS_PER_TOKEN;
    if (n > (size_t)INT_MAX / ENGRAM_ROWS_PER_TOKEN / (size_t)m->world)
        return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: %zu tokens (at most INT_MAX / 48 / world: "
                        "the others' requests of one rank must fit MPI's int counts)", n);
    size_t want = 0;
    int t;
    uint32_t id;
    for (size_t p = 0; xnext(ids, mask, n, &p, &t, &id); p++, want++)
        if (id >= mi.table[t].rows || id > 0x7fffffffu)
            return err_fail(err, -EINVAL, "engram_mpi_exchange_begin: token %zu column %d: row %u of table %d "
                            "is not below its %llu rows (and 2^31)", p / ENGRAM_ROWS_PER_TOKEN,
                            (int)(p % ENGRAM_ROWS_PER_TOKEN), id, t, (unsigned long long)mi.table[t].rows);
    size_t w = (size_t)m->world;
    engram_mpi_op *op = op_new(m, 2);
    struct xchg *x = calloc(1, sizeof *x);
    uint64_t *keys = malloc(want ? want * sizeof *keys : 1);
    if (!op || !x || !keys)
        goto oom;
    op->xc = x;
    x->r = r;
    x->dtype = dtype;
    x->rb = xrow_bytes(dtype);
    x->rows[0] = mi.table[0].rows;
    x->rows[1] = mi.table[1].rows;
    x->out = out;
    x->npos = npos;
    x->slot = malloc(npos ? npos * sizeof *x->slot : 1);
    x->scount = calloc(w, sizeof(int));
    x->sdispl = calloc(w, sizeof(int));
    x->rcount = calloc(w, sizeof(int));
    x->rdispl = calloc(w, sizeof(int));
    x->sstat = calloc(w, sizeof(int));
    x->rstat = calloc(w, sizeof(int));
    if (!x->slot || !x->scount || !x->sdispl || !x->rcount || !x->rdispl || !x->sstat || !x->rstat)
        goto oom;
    /* the distinct rows, in key order */
    size_t k = 0;
    for (size_t p = 0; xnext(ids, mask, n, &p, &t, &id); p++)
        keys[k++] = xkey(x->rows, (unsigned)w, t, id);
    qsort(keys, k, sizeof *keys, cmp_key);
    size_t d = 0;
    for (size_t i = 0; i < k; i++)
        if (d == 0 || keys[i] != keys[d - 1])
            keys[d++] = keys[i];
    x->d = d;
    x->sreq = malloc(d ? d * sizeof *x->sreq : 1);
    x->rows_in = malloc(d ? d * x->rb : 1);
    if (!x->sreq || !x->rows_in)
        goto oom;
    for (size_t j = 0; j < d; j++) {
        x->sreq[j] = (uint32_t)keys[j];
        x->scount[keys[j] >> 32]++;
    }
    for (size_t o = 1; o < w; o++)
        x->sdispl[o] = x->sdispl[o - 1] + x->scount[o - 1];
    for (size_t p = 0; p < npos; p++)
        x->slot[p] = ENGRAM_MPI_NOBODY;
    for (size_t p = 0; xnext(ids, mask, n, &p, &t, &id); p++) {
        uint64_t key = xkey(x->rows, (unsigned)w, t, id);
        const uint64_t *hit = bsearch(&key, keys, d, sizeof *keys, cmp_key);
        x->slot[p] = (uint32_t)(hit - keys);
    }
    free(keys);
    keys = NULL;
    x->info.rows_asked = d;
    x->info.rows_remote = d - (size_t)x->scount[m->rank];
    int rc = MPI_Type_contiguous((int)x->rb, MPI_BYTE, &op->rowtype);
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&op->rowtype)) != MPI_SUCCESS)
        MPI_Type_free(&op->rowtype);
    if (rc != MPI_SUCCESS) {
        op->rowtype = MPI_DATATYPE_NULL;
        op_release(op);
        return fail_mpi(err, "MPI_Type_contiguous", rc);
    }
    x->phase = XP_COUNTS;
    op->nreq = 1;
    rc = MPI_Ialltoall(x->scount, 1, MPI_INT, x->rcount, 1, MPI_INT, m->comm, &op->req[0]);
    if (rc != MPI_SUCCESS) {
        op_release(op);
        return fail_mpi(err, "MPI_Ialltoall (counts)", rc);
    }
    m->xbusy = 1;
    *opp = op;
    return 0;
oom:
    free(keys);
    if (op && !op->xc)
        xchg_free(x);
    if (op)
        op_release(op);
    else
        xchg_free(x);
    return err_fail(err, -ENOMEM, "engram_mpi_exchange_begin: out of memory");
}

void engram_mpi_exchange_get_info(const engram_mpi_op *op, engram_mpi_exchange_info *info)
{
    if (!info)
        return;
    memset(info, 0, sizeof *info);
    if (op && op->xc) {
        *info = op->xc->info;
        info->row_bytes = op->xc->rb;
    }
}
