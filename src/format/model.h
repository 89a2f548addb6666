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

/* The member (engram_member) the file is, and the PLE member's keys and
 * tensors (NULL for V4.1). */
int model_member(const engram_model *m);
struct ple_file;
const struct ple_file *model_ple(const engram_model *m);
/* The parsed file (its descriptor and tensors), owned by the model. */
const gguf_file *model_gguf(const engram_model *m);

/* -ENOTSUP with err naming the member and what refuses it, unless m is
 * V4.1's (0); for the functions that serve only V4.1 so far. */
int model_v41_only(const engram_model *m, const char *what, engram_error *err);

/* Whether row `row` of table t is one the file holds (in range and, in a
 * shard file, in its block): 0, or -EINVAL with err naming the row and the
 * block.  t must be a valid table. */
int model_row_check(const engram_model_info *in, int t, uint32_t row, engram_error *err);

/* The shard files' keys (docs/shards.md). */
#define ENGRAM_SHARD_KEY "deepseek41.engram.shard."
#define ENGRAM_SHARD_MAX_WORLD 65536u

#endif
