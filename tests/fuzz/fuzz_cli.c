/*
 * fuzz_cli.c - fuzz target for the engram command's input parsers: the
 * token and mask files (parse_numbers), --history (parse_history) and the
 * .npy header (npy_parse), each with a property checked on its result:
 *  - numbers: every value <= max; written back in decimal and parsed again,
 *    the same values; an error names an item that exists;
 *  - history: 3 ids, each dead or <= INT32_MAX;
 *  - .npy: the values claimed fit in the file after the header.
 * The first input byte picks the parser's parameters, the rest is the input.
 * Built with clang -fsanitize=fuzzer,address,undefined it is a libFuzzer
 * target; built without (FUZZ_REPLAY) it replays the files named on its
 * command line.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../programs/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void numbers(const char *p, size_t n, uint64_t max)
{
    uint32_t *v = NULL;
    size_t count = 0, bad = SIZE_MAX;
    int rc = parse_numbers(p, n, max, &v, &count, &bad);
    if (rc == -EINVAL) {
        size_t items = 0; /* whitespace-separated items in the input */
        for (size_t i = 0; i < n;) {
            while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
                i++;
            if (i < n)
                items++;
            while (i < n && !(p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
                i++;
        }
        if (bad >= items)
            abort();
        return;
    }
    if (rc != 0)
        return; /* -ENOMEM */
    char *text = malloc(count * 12 + 1);
    if (!text)
        abort();
    size_t len = 0;
    for (size_t i = 0; i < count; i++) {
        if (v[i] > max)
            abort();
        len += (size_t)sprintf(text + len, "%" PRIu32 " ", v[i]);
    }
    uint32_t *w = NULL;
    size_t c2 = 0;
    if (parse_numbers(text, len, max, &w, &c2, &bad) != 0 || c2 != count ||
        (count && memcmp(v, w, count * sizeof *v) != 0))
        abort();
    free(w);
    free(text);
    free(v);
}

static void history(const char *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, p, n);
    s[n] = '\0';
    engram_history h;
    engram_history_reset(&h);
    if (parse_history(s, &h) == 0)
        for (int i = 0; i < ENGRAM_HISTORY; i++)
            if (h.id[i] != ENGRAM_DEAD && h.id[i] < 0)
                abort();
    free(s);
}

static void npy(const uint8_t *p, size_t n, uint64_t extra)
{
    struct npy_info ni;
    uint64_t file_size = n + extra; /* the file may be longer than what was read */
    if (npy_parse(p, n, file_size, &ni) == 0) {
        uint64_t es = ni.bf16 ? 2 : 4;
        if (ni.data_offset > n || ni.data_offset > file_size ||
            ni.count > (file_size - ni.data_offset) / es)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    static const uint64_t maxes[4] = {1, 255, UINT32_MAX, 99999};
    switch (sel % 3) {
    case 0:
        numbers((const char *)p, n, maxes[(sel >> 2) & 3]);
        break;
    case 1:
        history((const char *)p, n);
        break;
    default:
        npy(p, n, (uint64_t)(sel >> 2) * 1000);
        break;
    }
    return 0;
}

#ifdef FUZZ_REPLAY
#define FUZZ_NAME "fuzz_cli"
#include "replay_main.h"
#endif
