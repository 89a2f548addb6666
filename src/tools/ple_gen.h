/*
 * ple_gen.h - the PLE member's layout from its generators (SPEC.md section
 * 10): head h's size is the (16 i + h + 1)-th prime after `base` (i = the
 * PLE layer's index; Qwen3.8 uses base 19,999,999), offsets the running
 * sum, rows padded to a multiple of 128; multiplier j = 2 (splitmix64(1234
 * + 10007 i + gamma (j + 1)) mod half) + 1 with half = ((2^63 - 1) //
 * vocab) // 2 and splitmix64(x) the generator's output for state x (x +
 * gamma, mixed).  Internal for now (issue #22).
 */
#ifndef ENGRAM_PLE_GEN_H
#define ENGRAM_PLE_GEN_H

#include <stdint.h>

#include "hash/ple.h"

/* Fills *out (eos and image as given); 0, or -EINVAL when the heads would
 * not fit int32 or vocab < 2. */
int ple_layout_generate(unsigned ple_index, uint32_t base, uint32_t vocab, uint32_t eos,
                        uint32_t image, struct ple_layout *out, engram_error *err);

#endif
