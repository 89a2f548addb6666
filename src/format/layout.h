/* layout.h - the Engram layout carried by deepseek41.engram.* keys. */
#ifndef ENGRAM_LAYOUT_H
#define ENGRAM_LAYOUT_H

#include "engram.h"
#include "gguf.h"

#define ENGRAM_ARCH "deepseek41"
#define ENGRAM_ENCODING "e4m3_e8m0_32_row264"
#define ENGRAM_MAX_VOCAB (1u << 24)   /* bounds the token map's memory */

/* Model layer of each table. */
static const int engram_table_layer[ENGRAM_TABLES] = {1, 14};

/* Reads and validates the layout keys.  On success *map_out is a new array
 * of layout->vocab entries (owned by the caller) and layout->token_map points
 * to it. */
int layout_from_gguf(const gguf_file *g, engram_layout *layout, uint32_t **map_out,
                     engram_error *err);

#endif
