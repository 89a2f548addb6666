/*
 * fuzz_ple.c - fuzz target for the qwen4exp file's PLE keys and tensors
 * (format/ple_file.c over the GGUF cursor), then the PLE hash on the
 * layout when the file passes (issue #22).
 *
 * The input is the start of a file; the harness extends it with zeros to
 * 8 MiB (a sparse memfd) so that a small input can describe a scaled table
 * inside the file.  Built with clang -fsanitize=fuzzer,address,undefined
 * it is a libFuzzer target; built without (FUZZ_REPLAY) it replays the
 * files named on its command line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../src/format/gguf.h"
#include "../../src/format/ple_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) != (ssize_t)size || ftruncate(fd, 8 << 20) < 0) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    gguf_file *g = NULL;
    engram_error err;
    if (gguf_open(path, &g, &err) == 0) {
        struct ple_file f;
        if (ple_file_read(g, &f, &err) == 0) {
            uint32_t tokens[5] = {0, 1, f.layout.eos, 3, 4}, rows[5 * PLE_HEADS];
            const uint8_t kind[5] = {PLE_TEXT, PLE_IMAGE, PLE_TEXT, PLE_PAD, PLE_TEXT};
            for (int i = 0; i < 5; i++)
                tokens[i] %= f.layout.vocab;
            struct ple_history h;
            ple_history_start(&f.layout, &h);
            if (ple_hash(&f.layout, tokens, kind, 5, &h, rows, &err) == 0)
                for (int i = 0; i < 5 * PLE_HEADS; i++)
                    if (rows[i] >= f.layout.rows)
                        abort(); /* a row past the table: the checks let a bad layout through */
        }
        gguf_close(g);
    }
    close(fd);
    return 0;
}

#ifdef FUZZ_REPLAY
#define FUZZ_NAME "fuzz_ple"
#include "replay_main.h"
#endif
