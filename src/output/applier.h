/* applier.h - what the session pool needs of an applier (serve/: the
 * step's and prefill's apply calls check the applier's layer against the
 * step: its table, width and streams). */
#ifndef ENGRAM_APPLIER_H
#define ENGRAM_APPLIER_H

#include "engram.h"

/* The layer the applier was made for (not NULL for a valid applier). */
const engram_layer *applier_layer(const engram_applier *a);

#endif
