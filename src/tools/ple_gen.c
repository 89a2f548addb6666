/* ple_gen.c - the PLE layout's generators (see ple_gen.h). */
#include <errno.h>
#include <string.h>

#include "ple_gen.h"
#include "common/util.h"

#define GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64(x) of SPEC 10: the generator's output for state x. */
static uint64_t splitmix64_at(uint64_t x)
{
    return splitmix64(&x);
}

int ple_layout_generate(unsigned ple_index, uint32_t base, uint32_t vocab, uint32_t eos,
                        uint32_t image, struct ple_layout *out, engram_error *err)
{
    if (!out || vocab < 2)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "bad argument");
    struct ple_layout l;
    memset(&l, 0, sizeof l);
    uint64_t p = base, skip = (uint64_t)PLE_HEADS * ple_index, at = 0;
    for (uint64_t found = 0; found < skip + PLE_HEADS;) {
        if (++p > (uint64_t)INT32_MAX)
            return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "sizes past int32");
        if (!util_is_prime_u32((uint32_t)p))
            continue;
        if (found >= skip) {
            int h = (int)(found - skip);
            l.sizes[h] = (uint32_t)p;
            l.offsets[h] = (uint32_t)at;
            at += p;
            if (at > (uint64_t)INT32_MAX)
                return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "heads past int32");
        }
        found++;
    }
    l.rows = (at + PLE_ROW_ALIGN - 1) / PLE_ROW_ALIGN * PLE_ROW_ALIGN;
    uint64_t half = (uint64_t)INT64_MAX / vocab / 2;
    for (int j = 0; j < PLE_NGRAM; j++)
        l.multipliers[j] =
            2 * (splitmix64_at(1234u + 10007ull * ple_index + GAMMA * (uint64_t)(j + 1)) % half) + 1;
    l.vocab = vocab;
    l.eos = eos;
    l.image = image;
    *out = l;
    return 0;
}
