/*
 * error_fill.h - filling an engram_error, header-only so that one piece
 * serves libengram's err_set family (util.c) and the side libraries built
 * from this tree (libengram-mpi, libengram-nccl), which cannot call
 * libengram's hidden symbols (and libengram-nccl does not link libengram).
 */
#ifndef ENGRAM_ERROR_FILL_H
#define ENGRAM_ERROR_FILL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engram.h"

/* Fills err (if not NULL: every byte, the message formatted from fmt) and
 * returns code, so callers can `return err_vfill(...)`.  fmt's arguments
 * must not point into *err. */
__attribute__((format(printf, 5, 0)))
static inline int err_vfill(engram_error *err, int code, uint64_t offset, uint64_t row,
                            const char *fmt, va_list ap)
{
    if (err) {
        memset(err, 0, sizeof *err);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        err->code = code;
        err->offset = offset;
        err->row = row;
    }
    return code;
}

/* err_vfill with no offset and no row: the side libraries' errors. */
__attribute__((format(printf, 3, 4)))
static inline int err_fail(engram_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vfill(err, code, ENGRAM_NO_OFFSET, ENGRAM_NO_ROW, fmt, ap);
    va_end(ap);
    return code;
}

#endif
