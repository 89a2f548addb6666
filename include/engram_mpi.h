/*
 * engram_mpi.h - libengram-mpi: the ranks' shares of Engram rows combined
 * over the caller's MPI communicator (issue #24).
 *
 * With engram_pool_opts.shard_rank / shard_world a pool reads only its
 * rank's block of every table's rows and delivers the step's or prefill
 * chunk's other rows as zero bytes, so the bitwise OR of the world's
 * buffers is the one-process buffer bit for bit (every byte is held by one
 * rank and is zero on the others, whatever the encoding: BF16, F32 or the
 * raw 264 bytes).  This library does that OR as one non-blocking
 * collective per step or chunk, or moves only the owned rows
 * (engram_mpi_gather_begin), so that it overlaps the layers before 1 and
 * 14 as the reads do.  libengram itself knows nothing of MPI: this is a
 * separate library (libengram-mpi, pkg-config engram-mpi), built where
 * mpicc is found, linked with libengram and the MPI library mpicc names.
 *
 * Conventions: those of engram.h (0 or a negative errno, engram_error
 * filled when given; validation before anything is started; NULL refused
 * with -EINVAL; _close / _free accept NULL; nothing printed, no exit).
 * Errors of MPI itself are -EIO, err->msg naming the MPI call and giving
 * MPI_Error_string's text.
 *
 * Collective rules (MPI's): every rank of the communicator calls
 * engram_mpi_open, and every begin, in the same order with the same bytes
 * (or, for the gather, the same owner array and row_bytes); the buffers
 * differ.  A rank that does not join leaves the others' ops incomplete:
 * their timed waits return -ETIMEDOUT (nothing lost: wait again), and a
 * wait with ENGRAM_FOREVER blocks in MPI_Wait until it joins.  Open MPI
 * without fault tolerance cannot complete or cancel a collective whose
 * peer died: the survivors see timeouts (or an error, when the runtime
 * notices the death first) and are typically ended by mpirun; they never
 * see a wrong row, since a wait returns 0 only once MPI completed the op.
 *
 * Progress: Open MPI progresses non-blocking collectives only inside MPI
 * calls (no progress thread by default).  An engine that overlaps the
 * combine with layers calls engram_mpi_combine_poll between layers (each
 * call is one MPI_Testall: microseconds), or accepts that the collective
 * runs at the wait.
 *
 * Threads: the library calls MPI from the calling thread.  An engram_mpi
 * and its ops may be used from several threads only if MPI was initialized
 * with MPI_THREAD_MULTIPLE (engram_mpi_info.thread_level says); otherwise
 * the caller serializes every MPI call of the process, these included.
 * Calls on one op are never concurrent with each other.  The list of
 * abandoned ops an engram_mpi keeps is locked inside.
 *
 * Which method (bytes received per rank for a buffer of B bytes over N
 * ranks; a decode step of one token is B = 48 x 512 = 24,576 bytes in
 * BF16, a 2,048-token prefill chunk of one table B = 25,165,824):
 *  - combine (MPI_Iallreduce, MPI_BOR on bytes): about 2 (N-1)/N x B for
 *    the ring or Rabenseifner algorithms MPI uses on large buffers,
 *    log2(N) x B for recursive doubling on small ones; no packing, no
 *    temporary memory, in place; foreign rows must be zero.  The choice for
 *    decode steps: the buffer is small, the cost is latency, and one
 *    collective of a fixed size needs no owner array.
 *  - gather (MPI_Iallgatherv of the owned rows): (N-1)/N x B received per
 *    rank, half the allreduce's on large buffers, and masked positions
 *    move nothing; it packs and scatters (two copies of the rank's share,
 *    temporary memory of about B + B/N) and needs the owner of every
 *    position, which TP ranks know alike (they hash the same tokens).
 *    The choice for prefill chunks, where bandwidth is the cost.
 * Measured (tests/mpi/test_mpi_combine --bench, Open MPI 4.1.4 shared
 * memory, a 2-core VM, 4 ranks oversubscribed, blocking wait, p50): a step
 * 4.2 us combine / 3.0 us gather at 2 ranks; a chunk 15.8 / 15.6 ms at 2
 * ranks, 60 / 33 ms at 4.  One machine's shared memory: not a network.
 */
#ifndef ENGRAM_MPI_H
#define ENGRAM_MPI_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

typedef struct engram_mpi engram_mpi;       /* the library's communicator */
typedef struct engram_mpi_op engram_mpi_op; /* one collective in flight   */

typedef struct engram_mpi_opts {
    /* The most bytes one MPI call moves: a buffer larger than this (MPI
     * counts are int: at most INT_MAX) is combined as several collectives
     * started together, one op.  0 = 1 GiB.  Every rank must give the same
     * value (it shapes the collectives). */
    size_t piece_bytes;
} engram_mpi_opts;

/*
 * Collective over comm: every rank calls it.  Duplicates comm
 * (MPI_Comm_dup; the caller's comm and its error handler are untouched)
 * and sets MPI_ERRORS_RETURN on the duplicate, so that the library's MPI
 * errors come back as -EIO rather than aborting the job.  MPI must be
 * initialized (-EINVAL otherwise, said so); opts may be NULL.  Memory: the
 * handle (a few hundred bytes) and MPI's for the duplicate.
 */
int engram_mpi_open(MPI_Comm comm, const engram_mpi_opts *opts, engram_mpi **out, engram_error *err);
/* Frees the duplicate communicator (MPI_Comm_free: collective) and the
 * handle, and the ops it kept (see engram_mpi_combine_cancel).  Free every
 * op first (engram_mpi_combine_free).  If an op it kept is still
 * incomplete (a cancelled op some rank never joined), nothing is freed:
 * the handle, its communicator and that op stay MPI's until the process
 * ends (a few hundred bytes; freeing the communicator under a pending
 * collective crashes Open MPI), and the buffers the op names stay MPI's
 * too.  Call it before MPI_Finalize, with no other call on m or its ops
 * running. */
void engram_mpi_close(engram_mpi *m);

typedef struct engram_mpi_info {
    int rank, world;       /* in the communicator                        */
    int thread_level;      /* MPI_Query_thread at open                    */
    size_t piece_bytes;    /* as in force                                 */
    size_t pending;        /* cancelled ops MPI has not completed yet     */
} engram_mpi_info;
/* Fills *info; tests the cancelled ops first (frees those complete). */
void engram_mpi_get_info(engram_mpi *m, engram_mpi_info *info);

/*
 * Starts the combine of buf[bytes] (in place) across the communicator:
 * after the op's wait returns 0, every rank's buf holds the bitwise OR of
 * all ranks' buf (MPI_Iallreduce, MPI_BOR over MPI_BYTE, in pieces of
 * piece_bytes).  Exact for the sharded pool's shares, whatever the dtype.
 *  - A step: buf = the step's out, bytes = k x 48 x row bytes of its dtype
 *    (512 BF16, 1,024 F32, 264 RAW): the whole buffer, after both tables'
 *    waits returned 0 on this rank (or one table's 24 rows per token with
 *    a stride of 48: combine the whole buffer, it is one collective).
 *    Masked tokens' rows are not written by any pool, so after the OR they
 *    are the OR of what the ranks' buffers held there: unchanged only if
 *    every rank's buffer held the same bytes at those rows (zero them, or
 *    fill them alike, before the step).
 *  - A prefill chunk of one table: [n_tokens][24][row], the rows
 *    engram_prefill_wait gave; those are the pool's ring (const): use
 *    engram_mpi_combine_begin_into with send = those rows and recv a
 *    buffer of the caller's (or, with opts.ring_mem, the caller's own
 *    memory in place).
 * buf belongs to MPI until the op completes (a wait or poll returned 0 or
 * an error): not read or written by the caller meanwhile; after a failure
 * its contents are undefined.  bytes 0: an op that is complete at once (no
 * MPI call; every rank passes 0 alike).  Memory: the op (its requests,
 * one per piece).  Errors: -EINVAL, -ENOMEM, -EIO (MPI refused to start
 * a piece: the pieces before it may be in flight, handed to m as a
 * cancelled op (engram_mpi_get_info's pending counts them), so buf stays
 * MPI's until they complete; other ranks may have started: treat the
 * communicator as broken and shut down).
 */
int engram_mpi_combine_begin(engram_mpi *m, void *buf, size_t bytes, engram_mpi_op **out,
                             engram_error *err);
/* The same out of place: recv[bytes] = the OR of every rank's send[bytes];
 * send is only read (it may be const memory such as a prefill ring), and
 * must not be written until the op completes.  send == recv is the
 * in-place combine; otherwise the two must not overlap (-EINVAL). */
int engram_mpi_combine_begin_into(engram_mpi *m, const void *send, void *recv, size_t bytes,
                                  engram_mpi_op **out, engram_error *err);

/*
 * Waits for the op: 0 (the result is in the buffer), -EIO (MPI's error,
 * named), -ECANCELED (cancelled), -ETIMEDOUT after timeout_ns with nothing
 * lost (the op goes on; wait or poll again).  ENGRAM_FOREVER: one blocking
 * MPI_Waitall (which may never return if a rank never joins).  A timed
 * wait polls MPI_Testall, yielding the CPU between polls (oversubscribed
 * ranks make progress): it keeps a core busy, as MPI_Wait does.  Once
 * complete, later waits and polls return the same result at once.
 */
int engram_mpi_combine_wait(engram_mpi_op *op, uint64_t timeout_ns, engram_error *err);
/* One MPI_Testall: 0 (complete), -EAGAIN (not yet; progresses the op),
 * or the error as the wait gives it. */
int engram_mpi_combine_poll(engram_mpi_op *op, engram_error *err);
/*
 * Gives up waiting for an incomplete op: later waits and polls return
 * -ECANCELED.  MPI cannot cancel a collective (MPI_Cancel and
 * MPI_Request_free on one are erroneous), so the collective itself goes on
 * inside MPI and its buffers stay MPI's until it completes, which needs
 * every rank to join; free then hands it to its engram_mpi, which tests it
 * at every engram_mpi_get_info (pending counts them) and at close.  A rank
 * that cancels has left the collective sequence of its peers in an
 * unknown state: use it to shut down, not to go on.  No-op on a complete
 * op (its result stays) and on NULL.
 */
void engram_mpi_combine_cancel(engram_mpi_op *op);
/* Frees the op; an incomplete op is cancelled first (above). */
void engram_mpi_combine_free(engram_mpi_op *op);

/*
 * The gather method: each rank sends only the rows it owns, and every rank
 * receives the others' into their positions.  buf is [n][row_bytes] (a
 * step's out: n = k x 48 positions; a prefill chunk of one table:
 * n_tokens x 24), and owner[n] names the rank that holds position i's row
 * (engram_mpi_owner below), or ENGRAM_MPI_NOBODY for a position nobody
 * sends (a masked token: left as it is on every rank).  Every rank passes
 * the same owner[] and row_bytes (TP ranks hash the same tokens); the
 * positions a rank owns must hold its rows when begin is called (they are
 * packed then; the rest of buf is not read and may hold anything: no
 * zeroing needed).  buf's other owned positions are written only when the
 * op completes (at the wait or poll that returns 0), so a timed-out or
 * failed gather leaves buf as it was.  owner is only read during begin.
 * Memory: (own rows + all sent rows) x row_bytes, allocated at begin,
 * freed with the op.  Errors: those of combine_begin, and -EINVAL for an
 * owner >= world (naming the position).
 */
#define ENGRAM_MPI_NOBODY UINT32_MAX
int engram_mpi_gather_begin(engram_mpi *m, void *buf, size_t row_bytes, const uint32_t *owner,
                            size_t n, engram_mpi_op **out, engram_error *err);

/* The rank owning table-local row id of a table of `rows` rows in a world
 * of `world` ranks: the r with floor(r x rows / world) <= id <
 * floor((r + 1) x rows / world), the sharded pool's blocks.  world 0 or
 * id >= rows: ENGRAM_MPI_NOBODY. */
uint32_t engram_mpi_owner(uint64_t rows, uint32_t id, unsigned world);
/* owner[k x 48] for a step (or any n tokens) of V4.1 rows as
 * engram_hash_tokens writes them ([n][48]: table 0's 24, table 1's 24),
 * tables of rows[0] and rows[1] rows; masked tokens (mask[i] == 0; mask
 * optional) get ENGRAM_MPI_NOBODY.  -EINVAL for a NULL, world 0, or an id
 * out of its table (naming it; owner untouched). */
int engram_mpi_owners(const uint64_t rows[ENGRAM_TABLES], const uint32_t *ids, const uint8_t *mask,
                      size_t n, unsigned world, uint32_t *owner, engram_error *err);

/*
 * The data-parallel exchange: "requests out, rows back".  DP ranks hash
 * different tokens; each holds only its row block of every table (a shard
 * file of `engram shard`, or its block of the one whole file: any rows of
 * the whole file read the same), so a rank asks each row's owner
 * (engram_mpi_owner) for it and gets the row back.  Collective: every rank
 * of m calls it, in the same order relative to m's other begins, each with
 * its own ids and n (n may differ between ranks, and be 0: the rank still
 * takes part, serving the others).
 *
 *  - model, r: this rank's model and a reader on it (engram_reader_open):
 *    the whole file, or the shard file of this rank (rank and world those
 *    of m: -EINVAL otherwise).  The reader reads, for the others and for
 *    this rank, the rows asked of this rank; it is used only inside this
 *    op's poll and wait calls (engram_reader_batch: not concurrent with
 *    any other call on r; no decode step in flight on it).
 *  - ids: [n][48] as engram_hash_tokens writes them (table 0's 24 row ids,
 *    then table 1's), read only during begin; each below its table's rows
 *    (engram_model_info.table[t].rows: the whole table's, for a shard) and
 *    below 2^31 (the request carries the table in its top bit): -EINVAL
 *    naming the token, nothing started.  mask (optional): tokens with
 *    mask[i] == 0 ask for nothing, and their rows of out are not written.
 *  - out: [n][48][row] of dtype (row: 512 bytes BF16, 1,024 F32, 264 RAW),
 *    written only by the poll or wait that returns 0, then holding exactly
 *    the bytes engram_model_read_* (or a one-process reader on the whole
 *    file) gives for those ids.  A failed, timed-out or cancelled exchange
 *    leaves out as it was.  out must stay valid until the op ends.
 *
 * Phases (each started by the poll or wait that finds the one before it
 * complete, so the op moves only inside poll and wait calls):
 *  1. this rank's distinct rows (dedupe within the call), sorted by owner,
 *     table and id; their counts per owner, MPI_Ialltoall;
 *  2. the requests (uint32: table << 31 | id), MPI_Ialltoallv;
 *  3. every owner reads the rows asked of it with r, in the call that sees
 *     phase 2 complete (a poll may then block for these reads: at most the
 *     rows the world asked of this rank), per table the asking ranks' rows
 *     together, one engram_reader_batch per piece of 6,144 rows (a row two
 *     ranks asked for is read once; the last token padded with a row
 *     already asked for); then the rows go back, MPI_Ialltoallv of rows,
 *     with one status per (owner, asking rank), MPI_Ialltoall;
 *  4. the wait or poll that sees them in copies each position's row to out.
 * A read error on an owner (-EIO, -EDOM, -EINVAL from the reader: a short
 * or corrupt shard file) does not stop its part: it sends zeros for the
 * rows of every rank with a row in the failed piece, with that read's
 * status, so no peer hangs.  Every rank that asked that owner for rows (it included) sees its
 * op fail with the owner's error code, err naming the owner rank (the
 * owner's own err has the reader's text); a rank that asked it nothing
 * gets its rows (0).  out is not written by a failed op.  After such an
 * error the ranks' collectives still agree: m can go on.
 *
 * One exchange at a time per engram_mpi, and no other begin on m while it
 * runs: its later phases are collectives started at poll / wait, which
 * must come in the same order on every rank, so begins of m (combine,
 * gather, exchange) return -EBUSY from the exchange's begin until the op
 * ends (a wait or poll returned 0 or an error other than -EAGAIN,
 * -ETIMEDOUT); ops begun before it may still be in flight.  Use a second
 * engram_mpi (its own communicator) to overlap an exchange with combines.
 *
 * Waits, polls, cancel and free are the combine's (engram_mpi_combine_*):
 * a timed wait that returns -ETIMEDOUT leaves the op going (a rank has
 * not joined a phase yet; nothing lost: wait again); ENGRAM_FOREVER waits
 * (MPI_Waitall) phase by phase.  MPI cannot cancel a collective: a
 * cancelled exchange stops at its phase in flight (parked on m until MPI
 * completes that phase), so its peers, which go on to the next phase, wait
 * for this rank for ever (their timed waits time out): a rank that cancels
 * an exchange is shutting down, and m refuses every later begin (-EBUSY).
 * An MPI error in a phase is -EIO (the ranks' sequences no longer agree:
 * shut down; m refuses later begins).
 *
 * Memory (the op's, freed with it; d: distinct rows this rank asks for,
 * at most 48 n; q: rows the world asks of this rank; w: ranks):
 *   4 B x 48 n (each position's row) + d x (4 B + row) (requests, rows
 *   received) + q x (4 B + row) (requests received, rows sent) + 24 B x w;
 *   during begin 8 B x 48 n more (the sort); during the reads, for a piece
 *   of p = min(6,144, about q) rows, 12 B + a row each (8 B of ids for
 *   both tables' slots, 4 B of position: at most 3.1 MiB in BF16, 6.1 MiB
 *   in F32).  E.g. a decode step of 64 tokens in BF16 asks at most
 *   3,072 rows: under 1.6 MiB + q x 516 B; a 2,048-token prefill chunk at
 *   most 98,304: 51 MiB + q x 516 B (chunk the prompt to bound it).
 * Moved per rank: 4 B a row it asks of another rank and a row's bytes
 * back (the rows it owns itself go through MPI's copy to self), plus 8 B
 * of counts and statuses per pair of ranks.
 * Errors at begin: -EINVAL, -EBUSY, -ENOMEM, -EIO (MPI refused phase 1:
 * nothing started).  n at most INT_MAX / 48 / world.
 */
int engram_mpi_exchange_begin(engram_mpi *m, const engram_model *model, engram_reader *r,
                              const uint32_t *ids, const uint8_t *mask, size_t n, engram_dtype dtype,
                              void *out, engram_mpi_op **op, engram_error *err);

/* What an exchange moved (complete or not: what it knows so far). */
typedef struct engram_mpi_exchange_info {
    size_t rows_asked;   /* distinct rows this rank asked for (its own included) */
    size_t rows_remote;  /* of those, owned by other ranks (received over MPI)   */
    size_t rows_served;  /* rows the world asked of this rank (read by it)       */
    size_t rows_sent;    /* of those, for other ranks                            */
    size_t row_bytes;    /* of the dtype                                         */
} engram_mpi_exchange_info;
/* Fills *info (zeros for NULL or an op that is not an exchange). */
void engram_mpi_exchange_get_info(const engram_mpi_op *op, engram_mpi_exchange_info *info);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_MPI_H */
