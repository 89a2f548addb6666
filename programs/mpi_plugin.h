/* mpi_plugin.h - the interface between `engram run --shard` (run_shard.c)
 * and its MPI plugin (mpi/run_mpi.c -> engram-mpi.so, built where mpicc is
 * found, linked with libengram-mpi and MPI), loaded with dlopen only for
 * --shard: the command itself links no MPI library.  Every call is made
 * from the engine's thread (MPI_THREAD_FUNNELED).  The collective calls
 * (init, same, combine_begin, gather_u64, exchange_begin, allgather,
 * finalize) are made by every rank
 * in the same order. */
#ifndef ENGRAM_MPI_PLUGIN_H
#define ENGRAM_MPI_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define RUN_MPI_PLUGIN_VERSION 3

struct run_mpi_plugin {
    int version;
    /* MPI_Init_thread (FUNNELED), the rank and world of MPI_COMM_WORLD, and
     * libengram-mpi opened on it.  0 or -errno with err filled. */
    int (*init)(int *rank, int *world, engram_error *err);
    /* Whether every rank passed the same v (*same 1 or 0): a collective. */
    int (*same)(uint64_t v, int *same, engram_error *err);
    /* recv[bytes] = the bitwise OR of every rank's send[bytes], non-blocking
     * (engram_mpi_combine_begin_into); *op freed by combine_free. */
    int (*combine_begin)(const void *send, void *recv, size_t bytes, void **op, engram_error *err);
    /* 0 complete, -EAGAIN not yet (progresses it), or the error. */
    int (*combine_poll)(void *op, engram_error *err);
    /* 0, -ETIMEDOUT after timeout_ns (nothing lost), or the error. */
    int (*combine_wait)(void *op, uint64_t timeout_ns, engram_error *err);
    void (*combine_free)(void *op);
    /* buf[n][row_bytes]: every rank's owned positions (owner[i] == its
     * rank) sent to the others, received in place; non-blocking
     * (engram_mpi_gather_begin); its op waited for and freed as a
     * combine's.  owner is only read during the call. */
    int (*gather_begin)(void *buf, size_t row_bytes, const uint32_t *owner, size_t n, void **op,
                        engram_error *err);
    /* The rank owning table-local row id of a table of `rows` rows
     * (engram_mpi_owner): the sharded pools' blocks. */
    uint32_t (*owner)(uint64_t rows, uint32_t id, unsigned world);
    /* all[world][n] on rank 0 = every rank's mine[n] (MPI_Gather; all is
     * only written on rank 0). */
    int (*gather_u64)(const uint64_t *mine, size_t n, uint64_t *all, engram_error *err);
    /* Point to point, for the DP checksum's chain (blocking). */
    int (*send_u64)(uint64_t v, int to, engram_error *err);
    int (*recv_u64)(uint64_t *v, int from, engram_error *err);
    /* --dp on shard files (version 2): the DP exchange
     * (engram_mpi_exchange_begin: a collective), its op waited for, polled
     * and freed with combine_wait / combine_poll / combine_free; what it
     * moved: moved[4] = rows asked, rows from other ranks, rows served,
     * rows sent to other ranks (engram_mpi_exchange_get_info). */
    int (*exchange_begin)(const engram_model *m, engram_reader *r, const uint32_t *ids, const uint8_t *mask,
                          size_t n, engram_dtype dtype, void *out, void **op, engram_error *err);
    void (*exchange_moved)(const void *op, uint64_t moved[4]);
    /* all[world][bytes] on every rank = every rank's mine[bytes]
     * (MPI_Allgather; version 2). */
    int (*allgather)(const void *mine, size_t bytes, void *all, engram_error *err);
    /* failed 0: closes libengram-mpi and MPI_Finalize (collective); failed
     * 1: MPI_Abort, ending every rank (a peer may be blocked in a
     * collective this rank will never join). */
    void (*finalize)(int failed);
};

typedef const struct run_mpi_plugin *(*run_mpi_plugin_fn)(void);
const struct run_mpi_plugin *engram_cli_mpi_plugin(void);
#define RUN_MPI_PLUGIN_SYMBOL "engram_cli_mpi_plugin"

#endif
