/*
 * descriptor.h - how a reader reaches a table file: O_DIRECT where the file
 * system does direct I/O with an alignment that fits the buffer budget
 * (probed with one real read), else buffered reads whose pages are dropped
 * (RWF_DONTCACHE where the kernel has it, else fadvise).  The policy only:
 * it opens the descriptor and says what it got, as a small value.
 */
#ifndef ENGRAM_DESCRIPTOR_H
#define ENGRAM_DESCRIPTOR_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "io_engine.h"

/* The reader's slot buffers, all of them, fit in this many bytes. */
#define IO_BUFFER_BUDGET (512u << 10)
/* O_DIRECT is used only if at least this many reads fit in the buffer
 * budget (a DIO alignment of at most 32 KiB); larger alignments read so
 * much per row that the buffered fallback is the better path. */
#define MIN_DIRECT_DEPTH 8u

struct io_descriptor {
    int fd;             /* the table file, opened anew; the caller closes it */
    int direct;         /* 1: O_DIRECT                                       */
    uint32_t align;     /* offset, length and buffer alignment (1: buffered) */
    enum io_drop drop;  /* buffered reads: how their pages are dropped       */
};

/* Bytes of one read buffer for rows of row_bytes (the family's: 264 or
 * 320): a row spans at most two aligned blocks (at most
 * ceil((align - 1 + row_bytes) / align) of them). */
static inline uint32_t io_slot_bytes(uint32_t align, uint32_t row_bytes)
{
    return (uint32_t)(((uint64_t)align - 1 + row_bytes + align - 1) / align * align);
}

/* Opens m's file for table reads: O_DIRECT unless `want` is the buffered
 * engine or the file refuses it (then buffered, with `note` saying why; a
 * forced io_uring or thread engine refuses the fallback with -EINVAL).
 * The very file the model validated is opened (see descriptor.c), else
 * -ESTALE.  0 with *out set, or -errno with err filled. */
int io_descriptor_open(const engram_model *m, engram_io_engine want, struct io_descriptor *out,
                       char *note, size_t note_len, engram_error *err);

#endif
