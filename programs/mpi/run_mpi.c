/*
 * run_mpi.c - the MPI plugin of `engram run --shard` (engram-mpi.so): the
 * few collectives the command needs, on MPI_COMM_WORLD through
 * libengram-mpi (the combine) and plain MPI (the agreement, the gather of
 * the ranks' figures, the DP checksum's chain).  MPI errors come back as
 * -EIO naming the call (MPI_ERRORS_RETURN on the world: the command says
 * why and ends the job rather than MPI aborting it under its feet).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "../mpi_plugin.h"
#include "engram_mpi.h"

static engram_mpi *comm;

static int mpi_fail(int mrc, const char *call, engram_error *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "error %d", mrc);
    snprintf(err->msg, sizeof err->msg, "%.40s: %.200s", call, s);
    return err->code = -EIO;
}

static int p_init(int *rank, int *world, engram_error *err)
{
    int inited = 0, provided = 0, mrc;
    MPI_Initialized(&inited);
    if (!inited && (mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
        return mpi_fail(mrc, "MPI_Init_thread", err);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    return engram_mpi_open(MPI_COMM_WORLD, NULL, &comm, err);
}

static int p_same(uint64_t v, int *same, engram_error *err)
{
    uint64_t in[2] = {v, ~v}, out[2];
    int mrc = MPI_Allreduce(in, out, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS)
        return mpi_fail(mrc, "MPI_Allreduce", err);
    *same = out[0] == v && out[1] == ~v; /* the max of v and of ~v: v is everyone's */
    return 0;
}

static int p_combine_begin(const void *send, void *recv, size_t bytes, void **op, engram_error *err)
{
    engram_mpi_op *o = NULL;
    int rc = engram_mpi_combine_begin_into(comm, send, recv, bytes, &o, err);
    *op = o;
    return rc;
}

static int p_combine_poll(void *op, engram_error *err)
{
    return engram_mpi_combine_poll(op, err);
}

static int p_combine_wait(void *op, uint64_t timeout_ns, engram_error *err)
{
    return engram_mpi_combine_wait(op, timeout_ns, err);
}

static void p_combine_free(void *op)
{
    engram_mpi_combine_free(op);
}

static int p_gather_begin(void *buf, size_t row_bytes, const uint32_t *owner, size_t n, void **op,
                          engram_error *err)
{
    engram_mpi_op *o = NULL;
    int rc = engram_mpi_gather_begin(comm, buf, row_bytes, owner, n, &o, err);
    *op = o;
    return rc;
}

static int p_exchange_begin(const engram_model *m, engram_reader *r, const uint32_t *ids, const uint8_t *mask,
                            size_t n, engram_dtype dtype, void *out, void **op, engram_error *err)
{
    engram_mpi_op *o = NULL;
    int rc = engram_mpi_exchange_begin(comm, m, r, ids, mask, n, dtype, out, &o, err);
    *op = o;
    return rc;
}

static void p_exchange_moved(const void *op, uint64_t moved[4])
{
    engram_mpi_exchange_info xi;
    engram_mpi_exchange_get_info(op, &xi);
    moved[0] = xi.rows_asked;
    moved[1] = xi.rows_remote;
    moved[2] = xi.rows_served;
    moved[3] = xi.rows_sent;
}

static int p_allgather(const void *mine, size_t bytes, void *all, engram_error *err)
{
    if (bytes > INT_MAX) {
        snprintf(err->msg, sizeof err->msg, "MPI_Allgather: %zu bytes", bytes);
        return err->code = -EINVAL;
    }
    int mrc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    return mrc == MPI_SUCCESS ? 0 : mpi_fail(mrc, "MPI_Allgather", err);
}

static int p_gather_u64(const uint64_t *mine, size_t n, uint64_t *all, engram_error *err)
{
    int mrc = MPI_Gather(mine, (int)n, MPI_UINT64_T, all, (int)n, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    return mrc == MPI_SUCCESS ? 0 : mpi_fail(mrc, "MPI_Gather", err);
}

static int p_send_u64(uint64_t v, int to, engram_error *err)
{
    int mrc = MPI_Send(&v, 1, MPI_UINT64_T, to, 24, MPI_COMM_WORLD);
    return mrc == MPI_SUCCESS ? 0 : mpi_fail(mrc, "MPI_Send", err);
}

static int p_recv_u64(uint64_t *v, int from, engram_error *err)
{
    int mrc = MPI_Recv(v, 1, MPI_UINT64_T, from, 24, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return mrc == MPI_SUCCESS ? 0 : mpi_fail(mrc, "MPI_Recv", err);
}

static void p_finalize(int failed)
{
    if (failed)
        MPI_Abort(MPI_COMM_WORLD, 1);
    engram_mpi_close(comm);
    comm = NULL;
    MPI_Finalize();
}

static const struct run_mpi_plugin plugin = {
    .version = RUN_MPI_PLUGIN_VERSION,
    .init = p_init,
    .same = p_same,
    .combine_begin = p_combine_begin,
    .combine_poll = p_combine_poll,
    .combine_wait = p_combine_wait,
    .combine_free = p_combine_free,
    .gather_begin = p_gather_begin,
    .owner = engram_mpi_owner,
    .gather_u64 = p_gather_u64,
    .send_u64 = p_send_u64,
    .exchange_begin = p_exchange_begin,
    .exchange_moved = p_exchange_moved,
    .allgather = p_allgather,
    .recv_u64 = p_recv_u64,
    .finalize = p_finalize,
};

__attribute__((visibility("default"))) const struct run_mpi_plugin *engram_cli_mpi_plugin(void)
{
    return &plugin;
}
