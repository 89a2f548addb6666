/* model.h - what the library's other modules need of an open model. */
#ifndef ENGRAM_MODEL_H
#define ENGRAM_MODEL_H

#include "engram.h"

/* The descriptor the model validated the file through (the reader reopens
 * that very file through it; the model keeps ownership). */
int model_fd(const engram_model *m);

#endif
