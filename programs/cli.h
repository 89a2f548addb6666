/* cli.h - helpers shared by the engram command's source files. */
#ifndef ENGRAM_CLI_H
#define ENGRAM_CLI_H

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "engram_tools.h"

enum { EXIT_DATA = 1, EXIT_USAGE = 2, EXIT_SYSTEM = 3 };

extern const char *prog;

int fail_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int fail_lib(int rc, const engram_error *err, const char *what);
/* "engram: WHAT: out of memory (BYTES bytes)" (bytes 0: unsaid); EXIT_SYSTEM.
 * Every exit 3 names what failed. */
int fail_oom(const char *what, size_t bytes);
/* The reason of a row codec's -EDOM (engram.h: the text after the first
 * ": " of "row <i>, value <j>: <reason>"); the whole message otherwise. */
const char *row_reason(const engram_error *err);
double now_s(void);
/* Writes s (NULL: "") as a JSON string literal: '"' and '\\' escaped,
 * \b \f \n \r \t, other control characters as \u00XX; well-formed UTF-8
 * passed through as it is; every maximal ill-formed UTF-8 subpart (a stray
 * byte, a truncated, overlong or surrogate sequence, anything past
 * U+10FFFF) written as \ufffd, as Python's decode(errors='replace') reads
 * it, so the output is always valid UTF-8 JSON (a path that is not UTF-8
 * does not round-trip; the text output prints it as it is). */
void cli_json_string(FILE *f, const char *s);
int parse_u64(const char *s, uint64_t max, uint64_t *out);
int has_help(int argc, char **argv);
/* Opens MODEL (any member of the family), printing why not. */
int open_model_any(const char *path, engram_model **m);
void progress_bar(int t, uint64_t done, uint64_t total, double t0);

/* Reads a whole file (or "-" for stdin) of at most max bytes, never more
 * than max + 1 of them; the caller frees *buf (NUL-terminated).  0 or
 * -errno: -EISDIR for a directory, -EFBIG when it holds more than max. */
int slurp(const char *path, size_t max, char **buf, size_t *len);

/* Whether an input read by its size (apply's residual, quantize's and
 * dequantize's IN), whose fstat is *st, can be: 0 for a regular file; else
 * an exit code after printing why: EXIT_SYSTEM for a directory ("Is a
 * directory", as for any input that cannot be read), EXIT_DATA for a
 * device, FIFO or socket (its size does not give its length). */
int input_regular(const char *path, const struct stat *st);

/* A file of whitespace-separated decimal numbers read a buffer at a time:
 * whatever its length, memory is this struct (64 KiB).  An item is invalid
 * when it is not a decimal number <= max (a NUL byte makes its item
 * invalid: it is not an end); the reader stops at the first invalid item,
 * having read at most 64 KiB past its start (/dev/zero fails at once). */
struct numfile {
    int fd, own;           /* own: not the standard input                */
    const char *path, *what;
    uint64_t max;
    size_t items;          /* numbers returned so far: the next one's index */
    size_t at, len;        /* bytes read and not yet parsed: buf[at, len) */
    int eof;
    char buf[1 << 16];
};
/* Opens path ("-": the standard input) for numbers <= max; what names the
 * file in messages ("token", "mask", "row").  0, or EXIT_SYSTEM after
 * printing why not ("Is a directory" for a directory). */
int numfile_open(struct numfile *nf, const char *path, uint64_t max, const char *what);
/* The next numbers, up to cap, into out: *got < cap only at the end of the
 * file.  0, or an exit code after printing what is wrong: EXIT_DATA for an
 * invalid item (its index in the whole file), EXIT_SYSTEM for a failed read. */
int numfile_read(struct numfile *nf, uint32_t *out, size_t cap, size_t *got);
void numfile_close(struct numfile *nf);

/* The most numbers read_numbers returns: 2^24 (64 MiB of u32; 2^24 also
 * bounds a vocabulary and a token map), far past any prompt an engine
 * prefills at once.  A longer file is refused as it is read (EXIT_DATA
 * naming the file and the limit), after this many items and one more. */
#define CLI_MAX_ITEMS (1u << 24)
/* A whole file of numbers (numfile) into a new u32 array (the caller frees
 * *out), for a command that needs them all at once; 0, or an exit code
 * after printing what is wrong. */
int read_numbers(const char *path, uint64_t max, uint32_t **out, size_t *count, const char *what);

/* The parsing of numfile and read_numbers, on memory, without a limit: 0,
 * -EINVAL (*bad = index of the first invalid item), -ENOMEM. */
int parse_numbers(const char *text, size_t len, uint64_t max, uint32_t **out, size_t *count,
                  size_t *bad);

/* A .npy header (v1-3, C order or one long axis, '<f4', or '<u2'/'<i2' for
 * bf16 bit patterns) from the first avail bytes of a file of file_size
 * bytes.  0; -ENOENT: no .npy magic; -ENOTSUP: another dtype; -EDOM:
 * Fortran order; -EBADMSG: malformed, truncated or more values claimed
 * than the file holds. */
#define NPY_MAX_HEADER 65536
struct npy_info {
    uint64_t count;        /* values                          */
    uint64_t data_offset;  /* of the first value               */
    int bf16;              /* 2-byte values                    */
};
int npy_parse(const uint8_t *p, size_t avail, uint64_t file_size, struct npy_info *o);

/* pread until n bytes arrive (EINTR retried); 0 or -errno (-EIO at end of file). */
int pread_all(int fd, void *buf, size_t n, uint64_t off);

/* Pages of the file's bytes [lo, hi) in the page cache (mincore on
 * read-only mappings of fd, a GiB at a time), or -errno when they cannot be
 * counted.  [lo, hi) must lie inside the file. */
int64_t resident_pages(int fd, uint64_t lo, uint64_t hi);

/* "A,B,C": the 3 compressed history ids, newest first, -1 = dead. 0 or -1. */
int parse_history(const char *s, engram_history *h);

/* An output of the engram command, written by the one writer of
 * engram_tools.h (engram_output: a regular file or new name through a
 * fresh temporary renamed into place by fout_close(ok = 1) and removed when
 * not ok; a character device or FIFO in place; links, folders, block
 * devices and sockets refused).  "-" is the standard output: the data takes
 * it and the command's report moves to the standard error.  0 or an exit
 * code after printing why (EXIT_USAGE for a refused kind of file). */
struct fout {
    FILE *f;
    engram_output out; /* out.fd -1 for "-" */
    const char *path;
};
int fout_open(struct fout *o, const char *path);
int fout_close(struct fout *o, int ok);
/* Before a command reads anything: whether path may take an output (flags:
 * ENGRAM_OUTPUT_SEEKABLE for one written at offsets, which refuses "-",
 * devices and FIFOs).  0, or EXIT_USAGE after printing why. */
int fout_check(const char *path, unsigned flags);
/* paths[0, n_outputs) are outputs, the rest inputs (NULL entries skipped),
 * names[] what each is called in the message ("--kv-out").  EXIT_USAGE
 * after printing the pair when an output names the same file as another
 * output or an input (engram_output_same; "-" twice among outputs); 0
 * otherwise. */
int fout_distinct(const char *const *paths, const char *const *names, int n, int n_outputs);

/* Where a layer is applied (device.c): "cpu" or "cuda". */
struct dev;
int dev_open(const char *name, const engram_layer *L, unsigned threads, size_t max_tokens,
             struct dev **out, engram_error *err);
void dev_close(struct dev *d);
/* ENGRAM_BF16 (CPU) or ENGRAM_RAW (CUDA): how the device wants its rows. */
int dev_rows_dtype(const struct dev *d);
/* 1 for cpu, cuda, cuda-fma (whether or not this build or machine has CUDA). */
int dev_name_ok(const char *name);
/* The CPU device's applier (NULL for another device): for the calls that
 * carry a session's state (engram_step_apply, engram_prefill_apply). */
engram_applier *dev_cpu_applier(struct dev *d);
/* Page-locks a host buffer the caller passes to dev_apply (CUDA: faster,
 * asynchronous copies; unregistered by dev_close).  1 if pinned, 0 if not
 * (CPU device, the limit reached or the driver refused: still usable). */
int dev_pin(struct dev *d, void *p, size_t len);
/* Unregisters p (pinned by dev_pin) before its memory is freed. */
void dev_unpin(struct dev *d, void *p);
/* Host-memory hooks that pin and unpin through d (engram.h): for a pool, so
 * the reader's I/O buffers and prefill rings it allocates are page-locked
 * for d's copies.  All NULL for the CPU device. */
void dev_host_hooks(struct dev *d, engram_host_hooks *h);
int dev_apply(struct dev *d, const void *rows, size_t stride, float *x, const uint8_t *mask,
              size_t n, float *kv_out, engram_error *err);

/* The seed:N residual of engram apply and engram run: element e of the
 * stream is a function of (N, e) alone, a BF16 value in [-4, 4]. */
void cli_seeded_resid(uint64_t seed, uint64_t first, size_t count, float *out);

int cmd_build(int argc, char **argv);
int cmd_apply(int argc, char **argv);
int cmd_run(int argc, char **argv);

/* The bundled real-text token stream (data/gpl3.tok), compiled in. */
extern const uint32_t engram_bundled_tokens[];
extern const size_t engram_bundled_tokens_n;
/* tokmap, layout, quantize, dequantize; -1 if name is none of them. */
int cmd_tools(const char *name, int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
/* programs/shard.c: `engram shard` (row-block shard files, docs/shards.md) */
int cmd_shard(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
