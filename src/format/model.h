/* model.h - what the library's other modules need of an open model. */
#ifndef ENGRAM_MODEL_H
#define ENGRAM_MODEL_H

#include "engram.h"
#include "gguf.h"

/* The descriptor the model validated the file through (the reader reopens
 * that very file through it; the model keeps ownership). */
int model_fd(const engram_model *m);

/* The validated projection tensors of a table (part 0 engram_kv, 1
 * engram_q_norm, 2 engram_k_norm), or NULL if the layer has none. */
const gguf_tensor *model_weight(const engram_model *m, int table, int part);

#endif
