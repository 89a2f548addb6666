/* apply_seq_pending.h - TEMPORARY (branch sess): engram_apply_seq is being
 * added to engram.h on main; until this branch merges it, the session code
 * is written against its announced signature, and apply_seq_stub.c answers
 * -ENOTSUP.  Both files go at the merge. */
#ifndef ENGRAM_APPLY_SEQ_PENDING_H
#define ENGRAM_APPLY_SEQ_PENDING_H
#include "engram.h"
int engram_apply_seq(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                     engram_dtype resid_dtype, const uint8_t *mask, size_t n, float *state,
                     engram_error *err);
#endif
