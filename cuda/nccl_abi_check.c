/*
 * nccl_abi_check.c - cuda/nccl_abi.h against the real nccl.h, at compile
 * time: every constant, the id's size and the config prefix's layout.
 * Built only where nccl.h exists (`make nccl-abi-check NCCL_INC=DIR`, on
 * the GPU machine); compiling is the check, and the program prints the
 * header's version so the log says which nccl.h was checked.
 */
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>

#include "nccl_abi.h"

_Static_assert((int)ENG_NCCL_SUCCESS == (int)ncclSuccess, "ncclSuccess");
_Static_assert((int)ENG_NCCL_UNHANDLED_CUDA_ERROR == (int)ncclUnhandledCudaError, "ncclUnhandledCudaError");
_Static_assert((int)ENG_NCCL_SYSTEM_ERROR == (int)ncclSystemError, "ncclSystemError");
_Static_assert((int)ENG_NCCL_INTERNAL_ERROR == (int)ncclInternalError, "ncclInternalError");
_Static_assert((int)ENG_NCCL_INVALID_ARGUMENT == (int)ncclInvalidArgument, "ncclInvalidArgument");
_Static_assert((int)ENG_NCCL_INVALID_USAGE == (int)ncclInvalidUsage, "ncclInvalidUsage");
_Static_assert((int)ENG_NCCL_REMOTE_ERROR == (int)ncclRemoteError, "ncclRemoteError");
_Static_assert((int)ENG_NCCL_IN_PROGRESS == (int)ncclInProgress, "ncclInProgress");
_Static_assert((int)ENG_NCCL_UINT8 == (int)ncclUint8, "ncclUint8");
_Static_assert((int)ENG_NCCL_MAX == (int)ncclMax, "ncclMax");
_Static_assert(ENG_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
_Static_assert(sizeof(eng_nccl_id) == sizeof(ncclUniqueId), "ncclUniqueId size");
_Static_assert(sizeof(eng_nccl_comm) == sizeof(ncclComm_t), "ncclComm_t size");
_Static_assert(ENG_NCCL_VERSION(2, 14, 0) == NCCL_VERSION(2, 14, 0), "NCCL_VERSION");
_Static_assert(offsetof(eng_nccl_config, size) == offsetof(ncclConfig_t, size), "config.size");
_Static_assert(offsetof(eng_nccl_config, magic) == offsetof(ncclConfig_t, magic), "config.magic");
_Static_assert(offsetof(eng_nccl_config, version) == offsetof(ncclConfig_t, version), "config.version");
_Static_assert(offsetof(eng_nccl_config, blocking) == offsetof(ncclConfig_t, blocking), "config.blocking");
_Static_assert(sizeof(eng_nccl_config) <= sizeof(ncclConfig_t), "config prefix");

int main(void)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    int ok = init.magic == ENG_NCCL_CONFIG_MAGIC; /* the initializer's magic is a value, not a constant */
    printf("nccl_abi_check: nccl.h %d.%d.%d (NCCL_VERSION_CODE %d): constants, id and config prefix match; "
           "config magic %s\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE, ok ? "matches" : "DIFFERS");
    return ok ? 0 : 1;
}
