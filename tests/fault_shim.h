/*
 * fault_shim.h - the system and library calls of the test_faults_* programs
 * failed on demand (tests/fault_shim.c).  The programs link the library with
 * those calls wrapped (FAULT_WRAP in the Makefile: test builds only, the
 * shipped library carries no hook).  The other two seams of the same
 * programs: the reader's I/O engines (fault_engine.h) and allocations
 * (alloc_shim.h: lib_alloc, the same struct fail_plan as below).
 */
#ifndef ENGRAM_FAULT_SHIM_H
#define ENGRAM_FAULT_SHIM_H

#include <stdint.h>

#include "alloc_shim.h"

/* open and statx */
struct fault_sys {
    int direct_errno;   /* open with O_DIRECT fails with this errno      */
    int proc_errno;     /* open of /proc/self/fd/... fails with this     */
    int open_errno;     /* every open fails with this                    */
    uint32_t dio_align; /* statx reports this DIO alignment (0: real)    */
};
extern struct fault_sys sys;

/* pread (the GGUF reader's and the model's row reads; the reader's
 * buffered engine) and preadv2 (the thread engine's reads with
 * RWF_DONTCACHE): the N-th call while armed fails with pread_errno (EIO;
 * EINTR: to be retried). */
extern struct fail_plan preads, preadv2s;
extern int pread_errno;

/* pwrite (the model builder's table and weight fillers, the GGUF writer):
 * the N-th call while armed fails with EIO, or with pwrite_zero writes
 * nothing (returns 0). */
extern struct fail_plan pwrites;
extern int pwrite_zero;

/* liburing set-up calls and thread creation, failed on demand. */
struct fault_setup {
    int queue_init, register_files, register_buffers; /* negative errno to return */
    long thread_fail_at, thread_calls;                /* N-th pthread_create fails */
    int attr_fail;                                    /* pthread_attr_init fails */
};
extern struct fault_setup setup;

/* io_uring_submit: 0 the real one, 1 fails with -EAGAIN (the kernel wants
 * completions reaped first), 2 takes nothing (returns 0, the entries stay). */
extern int uring_submit_mode;

#endif
