/*
 * rowcache.h - a bounded cache of raw table rows for one reader.
 *
 * Rows repeat across batches and decode steps (frequent 2-grams above all),
 * and without the page cache each repeat would be another device read.  The
 * cache keeps raw rows (264 bytes for V4.1, 320 for PLE), already validated by a decode, in memory
 * whose size the caller fixes at creation; nothing grows afterwards.
 *
 * 8-way set associative with 2-bit re-reference interval prediction
 * (SRRIP): a new row enters with a "distant" prediction and is the first
 * to go unless it is hit again, so the stream of rows read once (most
 * 4-gram rows) does not wash out the rows that keep coming back.
 * Not thread-safe: one cache per reader, like the reader itself.
 */
#ifndef ENGRAM_ROWCACHE_H
#define ENGRAM_ROWCACHE_H

#include <stdint.h>

#include "engram.h"

#define ROWCACHE_WAYS 8
/* Bytes per cached row: the row, its tag and its 1-byte prediction (V4.1's
 * rows; row_bytes + 9 for a cache of other rows). */
#define ROWCACHE_ENTRY_BYTES (ENGRAM_ROW_BYTES + 8 + 1)

struct rowcache;

/* A cache using at most `bytes` (arrays included); -EINVAL if that is less
 * than one set, -ENOMEM if the allocation fails. */
int rowcache_new(uint64_t bytes, struct rowcache **out);
/* The same for rows of row_bytes (1 .. 4096: -EINVAL otherwise). */
int rowcache_new_sized(uint64_t bytes, size_t row_bytes, struct rowcache **out);
void rowcache_free(struct rowcache *c);

/* The cached raw row, or NULL; a hit refreshes the row's prediction.  The
 * pointer is valid until the next rowcache_put. */
const uint8_t *rowcache_get(struct rowcache *c, int table, uint32_t row);
/* Stores a copy of raw (which must be a valid row) unless already there. */
void rowcache_put(struct rowcache *c, int table, uint32_t row, const uint8_t *raw);

uint64_t rowcache_rows(const struct rowcache *c);   /* capacity in rows      */
uint64_t rowcache_bytes(const struct rowcache *c);  /* memory held           */

#endif
