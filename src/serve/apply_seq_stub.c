/* apply_seq_stub.c - TEMPORARY (see apply_seq_pending.h). */
#include <errno.h>

#include "apply_seq_pending.h"
#include "common/util.h"

int engram_apply_seq(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                     engram_dtype resid_dtype, const uint8_t *mask, size_t n, float *state,
                     engram_error *err)
{
    (void)a, (void)rows, (void)rows_dtype, (void)residual, (void)resid_dtype, (void)mask, (void)n,
        (void)state;
    return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET, "engram_apply_seq: not on this branch yet");
}
