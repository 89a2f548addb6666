/* applier.h - what the session pool needs of an applier (serve/: the
 * step's and prefill's apply calls check the applier's layer against the
 * step: its table, width and streams). */
#ifndef ENGRAM_APPLIER_H
#define ENGRAM_APPLIER_H

#include "engram.h"

/* The layer the applier was made for (not NULL for a valid applier). */
const engram_layer *applier_layer(const engram_applier *a);

/* engram_apply_seqs's input checks alone on a PLE applier (nothing
 * written): 0 or -EDOM, *bad the sequence that failed. */
int applier_seqs_check(engram_applier *a, size_t n, const void *const *rows, void *const *residuals,
                       engram_dtype resid_dtype, const uint8_t *mask, float *const *states, size_t *bad,
                       engram_error *err);
/* engram_apply_seqs on a PLE applier, saying in *done how many sequences
 * (from the first) were applied whole, also when it fails. */
int applier_seqs_done(engram_applier *a, size_t n, const void *const *rows, void *const *residuals,
                      engram_dtype resid_dtype, const uint8_t *mask, float *const *states, size_t *done,
                      engram_error *err);

#endif
