/*
 * rowcache.c - bounded set-associative cache of raw rows (see rowcache.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rowcache.h"

#define RRPV_MAX 3u    /* "distant": evict first             */
#ifndef RRPV_NEW
#define RRPV_NEW 2u    /* a row enters here                  */
#endif

struct rowcache {
    uint64_t sets;
    size_t row_bytes;  /* 264 (V4.1) or 320 (PLE)                          */
    uint64_t *tag;     /* [sets][WAYS]: (table << 32 | row) + 1, 0 = empty */
    uint8_t *rrpv;     /* [sets][WAYS]                                      */
    uint8_t *data;     /* [sets][WAYS][row_bytes]                           */
};

static uint64_t key_of(int table, uint32_t row)
{
    return ((uint64_t)(unsigned)table << 32 | row) + 1;
}

static uint64_t set_of(const struct rowcache *c, uint64_t key)
{
    uint64_t z = key * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 32;
    return z % c->sets;
}

int rowcache_new(uint64_t bytes, struct rowcache **out)
{
    return rowcache_new_sized(bytes, ENGRAM_ROW_BYTES, out);
}

int rowcache_new_sized(uint64_t bytes, size_t row_bytes, struct rowcache **out)
{
    if (row_bytes == 0 || row_bytes > 4096)
        return -EINVAL;
    uint64_t sets = (bytes > sizeof(struct rowcache) ? bytes - sizeof(struct rowcache) : 0) /
                    ((uint64_t)ROWCACHE_WAYS * (row_bytes + 9));
    if (sets == 0)
        return -EINVAL;
    if (sets > SIZE_MAX / ((size_t)ROWCACHE_WAYS * row_bytes))
        return -ENOMEM;
    struct rowcache *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    size_t n = (size_t)sets * ROWCACHE_WAYS;
    c->sets = sets;
    c->row_bytes = row_bytes;
    c->tag = calloc(n, sizeof *c->tag);
    c->rrpv = malloc(n);
    c->data = malloc(n * row_bytes);
    if (!c->tag || !c->rrpv || !c->data) {
        rowcache_free(c);
        return -ENOMEM;
    }
    memset(c->rrpv, RRPV_MAX, n);
    *out = c;
    return 0;
}

void rowcache_free(struct rowcache *c)
{
    if (!c)
        return;
    free(c->tag);
    free(c->rrpv);
    free(c->data);
    free(c);
}

const uint8_t *rowcache_get(struct rowcache *c, int table, uint32_t row)
{
    uint64_t key = key_of(table, row);
    size_t base = (size_t)set_of(c, key) * ROWCACHE_WAYS;
    for (unsigned w = 0; w < ROWCACHE_WAYS; w++)
        if (c->tag[base + w] == key) {
            c->rrpv[base + w] = 0;
            return c->data + (base + w) * c->row_bytes;
        }
    return NULL;
}

void rowcache_put(struct rowcache *c, int table, uint32_t row, const uint8_t *raw)
{
    uint64_t key = key_of(table, row);
    size_t base = (size_t)set_of(c, key) * ROWCACHE_WAYS;
    for (unsigned w = 0; w < ROWCACHE_WAYS; w++)
        if (c->tag[base + w] == key)
            return;
    /* The first way predicted "distant" goes (empty ways are); if none is,
     * every way ages one step and the search repeats (at most 3 times). */
    for (;;) {
        for (unsigned w = 0; w < ROWCACHE_WAYS; w++)
            if (c->rrpv[base + w] == RRPV_MAX) {
                c->tag[base + w] = key;
                c->rrpv[base + w] = RRPV_NEW;
                memcpy(c->data + (base + w) * c->row_bytes, raw, c->row_bytes);
                return;
            }
        for (unsigned w = 0; w < ROWCACHE_WAYS; w++)
            c->rrpv[base + w]++;
    }
}

uint64_t rowcache_rows(const struct rowcache *c)
{
    return c ? c->sets * ROWCACHE_WAYS : 0;
}

uint64_t rowcache_bytes(const struct rowcache *c)
{
    return c ? sizeof *c + c->sets * ROWCACHE_WAYS * (uint64_t)(c->row_bytes + 9) : 0;
}
