/* sha256.h - SHA-256 (FIPS 180-4), for the checksums tools print (token map). */
#ifndef ENGRAM_SHA256_H
#define ENGRAM_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t n);
void sha256_final(struct sha256 *s, uint8_t out[32]);

#endif
