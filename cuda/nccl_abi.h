/*
 * nccl_abi.h - the part of NCCL's binary interface that cuda/engram_nccl.c
 * calls through dlopen/dlsym (internal; not installed).  Written here, not
 * taken from nccl.h: the build machines of CI have no NCCL, and the library
 * must build and refuse cleanly there.  Every value below is one of NCCL's
 * stable ABI values (enums passed by value, a struct passed by value):
 * NCCL keeps them across 2.x releases so that programs built against an
 * older nccl.h run on a newer libnccl.so.2.  cuda/nccl_abi_check.c checks
 * each one, and the layout of the structs, against the real nccl.h where
 * one exists (`make nccl-abi-check NCCL_INC=...`, run on the GPU machine).
 */
#ifndef ENGRAM_NCCL_ABI_H
#define ENGRAM_NCCL_ABI_H

#include <stddef.h>

/* ncclResult_t */
enum {
    ENG_NCCL_SUCCESS = 0,
    ENG_NCCL_UNHANDLED_CUDA_ERROR = 1,
    ENG_NCCL_SYSTEM_ERROR = 2,
    ENG_NCCL_INTERNAL_ERROR = 3,
    ENG_NCCL_INVALID_ARGUMENT = 4,
    ENG_NCCL_INVALID_USAGE = 5,
    ENG_NCCL_REMOTE_ERROR = 6,
    ENG_NCCL_IN_PROGRESS = 7,
};
/* ncclDataType_t: one byte, unsigned */
enum { ENG_NCCL_UINT8 = 1 };
/* ncclRedOp_t: the element-wise maximum */
enum { ENG_NCCL_MAX = 2 };

/* NCCL_UNIQUE_ID_BYTES: the opaque id every rank of a communicator gets */
#define ENG_NCCL_ID_BYTES 128
typedef struct {
    char internal[ENG_NCCL_ID_BYTES];
} eng_nccl_id;

typedef void *eng_nccl_comm; /* ncclComm_t: a pointer to NCCL's own struct */

/* NCCL_VERSION(major, minor, patch) for 2.9 and later */
#define ENG_NCCL_VERSION(x, y, z) ((x) * 10000 + (y) * 100 + (z))

/*
 * The first fields of ncclConfig_t, which NCCL reads according to the
 * size and version written in them (a program built against 2.14's header
 * passes exactly these): a config of version 2.14.0 asks only for
 * `blocking`, and NCCL gives every later field its default.  magic is
 * NCCL's check that the struct was initialized.
 */
#define ENG_NCCL_CONFIG_MAGIC 0xcafebeefu
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
} eng_nccl_config;

#endif
