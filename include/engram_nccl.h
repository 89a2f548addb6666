/*
 * engram_nccl.h - libengram-nccl: a sharded pool's rows combined across GPU
 * ranks with NCCL, on device buffers (issue #24 item 3).
 *
 * With engram_pool_opts.shard_rank / shard_world a pool reads only its
 * rank's block of every table's rows and delivers the others as zero bytes
 * (whatever the dtype, ENGRAM_RAW's 264-byte rows too).  Each byte of the
 * one-process buffer is therefore held by one rank and is zero on all the
 * others, so the bitwise OR of the ranks' buffers is that buffer.  NCCL has
 * no bitwise OR; it has the maximum over unsigned bytes (ncclMax on
 * ncclUint8), and max(x, 0, ..., 0) = x = x | 0 | ... | 0 for every byte:
 * the same result, bit for bit, with no arithmetic that could round (a sum
 * over ncclUint8 would do too, the zeros adding nothing; the maximum is
 * chosen because it stays exact even if two ranks ever delivered the same
 * byte).  The rows the CUDA layer applies (engram_cuda_args.raw: 24 x 264
 * bytes per token) are combined that way after they are uploaded and
 * before engram_cuda_apply, on the same stream.
 *
 * NCCL is loaded at run time (dlopen of "libnccl.so.2", or of the path in
 * the environment variable ENGRAM_NCCL_LIBRARY), so this library builds and
 * links where NCCL is not installed, and says so when called: -ENOSYS with
 * the loader's message naming what is missing (the library, or a function
 * it lacks).  Once loaded, NCCL stays loaded until the process ends.  The
 * library needs the CUDA runtime; it has no kernels of its own.
 * libengram itself knows nothing of NCCL or MPI.
 *
 * Conventions: those of engram.h (0 or a negative errno, engram_error
 * filled when given; arguments checked before anything is done; NULL
 * refused with -EINVAL; _close accepts NULL; nothing printed, no exit).
 * NCCL's errors: ncclInvalidArgument and ncclInvalidUsage (two ranks of
 * one communicator on one GPU: "Duplicate GPU detected") are -EINVAL,
 * ncclRemoteError -ECONNRESET, the others -EIO; err->msg names the NCCL
 * call and gives ncclGetErrorString's text and ncclGetLastError's.  CUDA
 * errors are -EIO (no usable device: -ENODEV), named.
 *
 * Ownership and memory: every buffer given to a combine is device memory
 * of the communicator's GPU (cudaMalloc'd by the caller, at least `bytes`
 * long), owned by the caller; from the call until the stream has run the
 * collective (engram_nccl_wait returned 0, or any later work on the stream
 * is ordered after it) it is NCCL's: not written by the caller, and read
 * only by work enqueued later on the same stream.  This library allocates
 * nothing on the device; on the host a handle of a few hundred bytes.
 * NCCL itself takes device and host memory per communicator (its buffers
 * and channels: tens to hundreds of MiB on the device, NCCL_BUFFSIZE and
 * the channel count decide).
 *
 * Asynchrony: engram_nccl_combine enqueues an all-reduce on the caller's
 * stream and returns: the host does not wait, so the collective overlaps
 * host work (reads, hashing, the layers before 1 and 14) and runs on the
 * device in stream order: upload rows, combine, engram_cuda_apply, all on
 * one stream, need no synchronization between them.  engram_nccl_wait is
 * for a caller that must know the collective finished (or must not hang
 * when a peer died): it polls the stream and NCCL's asynchronous error,
 * and gives up after a timeout.
 *
 * Dead peers: an NCCL collective whose peer never joins spins on the GPU
 * for ever, and a stream behind it never drains.  A communicator opened
 * here is non-blocking (ncclCommInitRankConfig, blocking = 0, NCCL 2.14 and
 * later): its open and its timed waits poll, and on a timeout or an
 * asynchronous error they abort it (ncclCommAbort), which makes its
 * kernels return, so the stream drains; then every later call on it fails
 * (-EIO "aborted") and the device buffers of the combine in flight hold
 * undefined bytes.  A wrapped communicator (the caller's own) is never
 * aborted here: a timed wait returns -ETIMEDOUT and leaves the decision
 * (ncclCommAbort) to its owner.
 *
 * Collective rules (NCCL's): every rank of the communicator calls
 * engram_nccl_open with the same id and world, and then every combine, in
 * the same order with the same bytes; the buffers differ.  Calls on one
 * engram_nccl are not made concurrently (one thread at a time; NCCL's rule
 * for a communicator).  One rank per GPU: NCCL refuses two ranks of one
 * communicator on one device.
 *
 * Which method.  The combine is an all-reduce: each GPU receives about
 * 2 (N-1)/N x B bytes for a buffer of B bytes over N ranks (ring), no
 * packing, no owner array, in place.  The gather method of libengram-mpi
 * (only owned rows move: (N-1)/N x B) is not built for NCCL: on NVLink a
 * decode step (k x 48 x 264 bytes: 12.7 KB at k = 1) costs the
 * collective's latency, not bandwidth, and a prefill chunk of one table
 * (2,048 x 24 x 264 = 13 MB) takes tens of microseconds at NVLink's
 * bandwidth, less than the kernels that would pack the owned rows and
 * scatter the received ones would add in launches; and an all-reduce of a
 * fixed size needs no owner array on the device.  Over a slower network
 * between nodes the halved bytes would matter: not done.
 *
 * What ran (bench/results/2026-12-02-nccl/, one H200, NCCL 2.28.3 and
 * 2.28.9; cuda/test_nccl.c): a communicator of one; a sharded pool's RAW
 * rows of world 1 combined on the device equal the unsharded pool's; NCCL's
 * failures injected through a stub library (every mapping and abort
 * above); timeouts of open and wait.  Two ranks on the one GPU are refused
 * by NCCL ("Duplicate GPU detected": -EINVAL on each rank).  Not run: the
 * combine across two or more GPUs (no multi-GPU machine was lent), a peer
 * dying with a collective in flight, and the wait's abort of a collective
 * that spins on the GPU (NCCL documents that abort ends it; not seen here).
 * ncclCommAbort itself waited for the work queued ahead of the collective
 * on the stream (1.2 s of a host function, seen once): a timed wait returns
 * after the timeout plus that.
 */
#ifndef ENGRAM_NCCL_H
#define ENGRAM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

#define ENGRAM_NCCL_ID_BYTES 128 /* NCCL's unique id (ncclUniqueId) */

typedef struct engram_nccl engram_nccl;

/* 1 if NCCL loads and has every function this library calls (err not
 * touched; *version, if not NULL, = ncclGetVersion's code, e.g. 22703 for
 * 2.27.3); else 0, and err (if not NULL) holds -ENOSYS and why (the
 * loader's message naming the library or the missing function).  Needs
 * no GPU.  A predicate, not a 0-or-errno call. */
int engram_nccl_available(int *version, engram_error *err);

/* A new unique id (ncclGetUniqueId) into id[128]: one rank makes it and
 * hands it to the others (MPI_Bcast, a file, a socket: the caller's
 * business).  It names a bootstrap socket of this process: make a new one
 * for every communicator.  -EINVAL, -ENOSYS, -EIO. */
int engram_nccl_unique_id(uint8_t id[ENGRAM_NCCL_ID_BYTES], engram_error *err);

/*
 * Collective over the world's ranks: every rank calls it with the same id
 * and world, its own rank in [0, world) and its GPU (`device`, made the
 * calling thread's current device; left so, and restored on failure).  Waits until every rank has
 * joined, or timeout_ns (0 = 60 s; ENGRAM_FOREVER = no limit): -ETIMEDOUT
 * then, the half-made communicator aborted.  -EINVAL (arguments, or NCCL's
 * refusal: ranks sharing a GPU), -ENOSYS (no NCCL), -ENODEV (no such GPU),
 * -ECONNRESET, -EIO.  Nothing to free on failure.
 */
int engram_nccl_open(const uint8_t id[ENGRAM_NCCL_ID_BYTES], int rank, int world, int device,
                     uint64_t timeout_ns, engram_nccl **out, engram_error *err);

/* Uses the caller's communicator (an ncclComm_t, passed as void *: this
 * header needs no nccl.h): the engine's own, as issue #24 asks.  It stays
 * the caller's: close does not destroy it, and no wait aborts it.  The
 * caller keeps it alive until engram_nccl_close.  -EINVAL, -ENOSYS, -EIO. */
int engram_nccl_wrap(void *nccl_comm, engram_nccl **out, engram_error *err);

/* Destroys the communicator opened here (ncclCommDestroy; after a failure
 * or a timeout, already aborted), or only the handle of a wrapped one.
 * The caller has waited for its combines (or given up on them: an aborted
 * communicator's kernels have returned).  Accepts NULL. */
void engram_nccl_close(engram_nccl *c);

typedef struct engram_nccl_info {
    int rank, world, device;   /* in the communicator; the GPU             */
    int version;               /* ncclGetVersion                           */
    int wrapped;               /* 1: the caller's communicator             */
    int aborted;               /* 1: aborted after an error or timeout     */
} engram_nccl_info;
/* Fills *info (zeroed for NULL c). */
void engram_nccl_get_info(const engram_nccl *c, engram_nccl_info *info);

/*
 * Enqueues the combine of buf[bytes] (device memory, in place) on `stream`
 * (a cudaStream_t; NULL = the default stream) and returns at once: when
 * the stream has run it, every rank's buf holds the bitwise OR of all
 * ranks' buf (ncclAllReduce, ncclMax over ncclUint8: the same bytes, see
 * above).  One collective whatever the size (NCCL's counts are size_t).
 *  - A step: buf = the step's rows uploaded (k x 48 x 264 bytes RAW), the
 *    whole buffer; masked tokens' rows are not written by any pool: after the
 *    combine they hold the OR of what the ranks' buffers held there
 *    (zero them on every rank before the step to keep them zero).
 *  - A prefill chunk of one table: [n_tokens][24][264] rows uploaded.
 * bytes 0: nothing enqueued, 0.  -EINVAL, -EIO (NCCL refused to enqueue;
 * the message says whether the communicator was aborted), -ETIMEDOUT (a
 * non-blocking communicator did not finish enqueuing within 60 s: aborted).
 */
int engram_nccl_combine(engram_nccl *c, void *buf, size_t bytes, void *stream, engram_error *err);
/* The same out of place: recv[bytes] = the OR of every rank's send[bytes];
 * send is only read.  send == recv is the in-place combine; otherwise the
 * two must not overlap (-EINVAL). */
int engram_nccl_combine_into(engram_nccl *c, const void *send, void *recv, size_t bytes,
                             void *stream, engram_error *err);

/*
 * Waits until `stream` has run everything enqueued on it (the combines
 * included), polling cudaStreamQuery and ncclCommGetAsyncError (yielding
 * the CPU between polls), for at most timeout_ns (ENGRAM_FOREVER: no
 * limit).  0: done, the buffers hold the combined rows.  -EIO: NCCL's
 * asynchronous error or a CUDA error, named (a communicator opened here is
 * aborted).  -ETIMEDOUT: not done in time (a peer that never joined, or
 * died): a communicator opened here is aborted (its kernels return, the
 * stream drains; the buffers' bytes are undefined; close it); a wrapped
 * one is left as it is, still running (its owner decides).  timeout_ns 0
 * is a poll: one look, -EAGAIN if the stream has not finished, nothing
 * aborted (an asynchronous error is still reported, and aborts, as above).
 */
int engram_nccl_wait(engram_nccl *c, void *stream, uint64_t timeout_ns, engram_error *err);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
