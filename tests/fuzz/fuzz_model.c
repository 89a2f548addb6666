/*
 * fuzz_model.c - fuzz target for everything that reads a model file: the
 * GGUF cursor, the layout keys and the table checks (engram_model_open),
 * then a hash and a row read when the file opens.
 *
 * The input is the start of a file; the harness extends it with zeros to
 * 2 MiB (a sparse memfd), so small inputs can still describe tables that
 * lie inside the file.  Built with clang -fsanitize=fuzzer,address,undefined
 * it is a libFuzzer target; built without (FUZZ_REPLAY) it is a standalone
 * program that replays the files named on its command line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) != (ssize_t)size || ftruncate(fd, 2 << 20) < 0) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    engram_model *m = NULL;
    engram_error err;
    if (engram_model_open(path, &m, &err) == 0) {
        engram_history h;
        engram_history_reset(&h);
        uint32_t tokens[4] = {0, 1, 2, 3}, rows[4 * ENGRAM_ROWS_PER_TOKEN];
        const engram_layout *l = engram_model_layout(m);
        for (int i = 0; i < 4; i++)
            tokens[i] %= l->vocab;
        if (engram_hash_tokens(engram_model_hasher(m), &h, tokens, NULL, 4, rows, &err) == 0) {
            float vals[ENGRAM_COLUMNS * ENGRAM_ROW_VALUES];
            engram_model_read_f32(m, 1, rows + ENGRAM_COLUMNS, ENGRAM_COLUMNS, vals, &err);
        }
        engram_model_close(m);
    }
    close(fd);
    return 0;
}

#ifdef FUZZ_REPLAY
#define FUZZ_NAME "fuzz_model"
#include "replay_main.h"
#endif
