/*
 * fuzz_tokmap.c - fuzz target for the tokenizer side of the model tools:
 * engram_tokmap_from_json on the input as a tokenizer.json (JSON syntax,
 * structure checks, byte-level decoding, normalization, the key table), and
 * engram_text_normalize on the raw input bytes.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined it is a libFuzzer
 * target; built without (FUZZ_REPLAY) it replays the files named on its
 * command line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engram.h"
#include "engram_tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *norm = NULL;
    size_t n = 0;
    if (engram_text_normalize((const char *)data, size, &norm, &n) == 0) {
        /* The output is valid UTF-8, so normalizing it again must work. */
        char *again = NULL;
        size_t m = 0;
        if (engram_text_normalize(norm, n, &again, &m) != 0)
            abort();
        free(again);
        free(norm);
    }
    int fd = memfd_create("tokenizer.json", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    engram_tokmap tm;
    engram_error err;
    if (engram_tokmap_from_json(path, &tm, &err) == 0) {
        /* Every raw id maps below V', and the groups add up to vocab. */
        uint64_t total = 0;
        for (uint32_t i = 0; i < tm.vocab; i++)
            if (tm.map[i] >= tm.compressed_vocab)
                abort();
        for (uint32_t k = 0; k < tm.compressed_vocab; k++)
            total += tm.group[k];
        if (total != tm.vocab)
            abort();
        engram_tokmap_free(&tm);
    }
    close(fd);
    return 0;
}

#ifdef FUZZ_REPLAY
#define FUZZ_NAME "fuzz_tokmap"
#include "replay_main.h"
#endif
