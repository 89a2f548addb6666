/*
 * engram_tools.h - libengram-tools: what makes or converts Engram models
 * rather than running them.  The token map of a tokenizer.json (SPEC.md
 * section 4; needs jansson and utf8proc), the layout generator (section 5),
 * the row quantizer (section 7) and the model builder.  Engines link only
 * libengram (engram.h); this library sits on top of it and follows the same
 * conventions (see engram.h).
 */
#ifndef ENGRAM_TOOLS_H
#define ENGRAM_TOOLS_H

#include <stdio.h>

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* ------------------------------------------------------------------ layout */

/*
 * Bucket counts by the shared-`seen` allocation of SPEC.md section 5: for
 * each of n_layers layers, for each order 2..ngram, for each of heads heads,
 * the smallest prime above the previous one (starting at base - 1) that no
 * earlier column took.  Writes n_layers * (ngram - 1) * heads primes to out
 * (column order, layer-major).  0, or -EINVAL (bad sizes) / -ERANGE (a prime
 * would exceed UINT32_MAX).  Memory: O(n_layers * ngram * heads).
 */
int engram_layout_primes(uint32_t base, int n_layers, int ngram, int heads,
                         uint32_t *out, size_t out_len);

/*
 * Multipliers by SPEC.md section 5 for the table of model layer `layer`:
 * n values 2r + 1 with r drawn from [0, (INT64_MAX / V') / 2) by numpy's
 * default_rng(10007 * layer) (SeedSequence + PCG64 + bounded integers,
 * reproduced exactly without numpy); lag 0 first.  Each is odd and
 * <= INT64_MAX / V'.  -EINVAL if V' is 0 or above 2^24, or n not in 1..64.
 */
int engram_layout_multipliers(uint32_t compressed_vocab, uint32_t layer, int n, uint64_t *out);

/* ------------------------------------------------------------------ rows */

/*
 * Quantizes n rows of 256 values (float32, or BF16 bit patterns) into the
 * 264-byte encoding: per block of 32, the smallest E8M0 exponent (-127..127)
 * that brings the block's max |x| to <= 448 (a zero block gets 2^0), then
 * each value rounded to the nearest E4M3FN value, ties to even, sign kept
 * (-0 stays -0).  Every finite input is accepted: nothing is clipped except
 * values within half a step of FLT_MAX, whose nearest E4M3 value times the
 * scale would be 2^128 (not a float): they saturate to the largest finite
 * code, counted in *saturated (if not NULL; added to).  Values below the
 * smallest step of their block (2^-9 of its scale) round to zero.
 * in and out are caller-owned (n_rows * 256 inputs, n_rows * 264 bytes
 * out).  Policy for non-finite input: NaN or +-Inf is rejected before
 * anything is written: -EDOM, out untouched, and err (if not NULL) holds
 * row = the index within the call of the row holding the first such value
 * (not a table row id), offset = ENGRAM_NO_OFFSET and msg = "row <i>,
 * value <j>: NaN cannot be quantized" (or "infinity cannot be quantized"),
 * j = that value's index 0..255 in its row.  -EINVAL (err->row =
 * ENGRAM_NO_ROW): in or out NULL with n_rows > 0, or n_rows * 264 past
 * SIZE_MAX.  On success err is not touched.  Every row written decodes
 * (engram_rows_decode_*).  No heap memory.
 */
int engram_rows_quantize_f32(const float *in, size_t n_rows, uint8_t *out, uint64_t *saturated,
                             engram_error *err);
int engram_rows_quantize_bf16(const uint16_t *in, size_t n_rows, uint8_t *out,
                              uint64_t *saturated, engram_error *err);

/* ------------------------------------------------------------------ token map */

/*
 * The tokenizer compression of SPEC.md section 4, built from a Hugging Face
 * tokenizer.json with a byte-level BPE model (model.type "BPE", a ByteLevel
 * decoder) and its added tokens.  Every array is owned by the struct and
 * released by engram_tokmap_free.
 */
typedef struct engram_tokmap {
    uint32_t vocab;             /* raw ids: the largest id + 1                */
    uint32_t compressed_vocab;  /* V' = number of distinct keys               */
    uint32_t *map;              /* [vocab] raw id -> compressed id            */
    char **key;                 /* [V'] each compressed id's key, UTF-8, NUL-
                                   terminated (a key may also hold U+0000)    */
    uint32_t *key_len;          /* [V'] key length in bytes                   */
    uint32_t *group;            /* [V'] how many raw ids share the key        */
    uint32_t missing;           /* ids below vocab that name no token (key "") */
    uint32_t raw_keys;          /* tokens keyed by their raw string (U+FFFD)  */
    uint8_t sha256[32];         /* SHA-256 of map as little-endian u32        */
} engram_tokmap;

/* Largest tokenizer.json accepted.  Building a map holds the parsed JSON
 * (a few times the file size) plus O(vocab) arrays, all freed on return
 * except the result. */
#define ENGRAM_TOKENIZER_MAX_BYTES (256u << 20)

/*
 * Builds the map.  Raw ids run from 0 to the largest id in model.vocab or
 * added_tokens; an added token decodes to its content, a BPE token through
 * the byte-level alphabet.  Errors: errno of open/fstat, -EINVAL (not a
 * regular file), -EFBIG (over the limit), -EBADMSG (JSON syntax, with the byte offset; bad or duplicate
 * ids), -ENOTSUP (not byte-level BPE), -ENOMEM.  *out is written only on
 * success.
 */
int engram_tokmap_from_json(const char *path, engram_tokmap *out, engram_error *err);
void engram_tokmap_free(engram_tokmap *tm);

/*
 * normalize() of SPEC.md section 4 on len bytes of UTF-8: NFKC, NFD, drop
 * Mn, lowercase per code point (full mapping, no context rules), collapse
 * runs of ASCII space/tab/CR/LF, then strip White_Space at both ends unless
 * the result is exactly " ".  *out (malloc'ed, NUL-terminated, the caller
 * frees it) receives *out_len bytes.  -EILSEQ on invalid UTF-8, -EINVAL,
 * -ENOMEM.
 */
int engram_text_normalize(const char *text, size_t len, char **out, size_t *out_len);

/* ------------------------------------------------------------------ build */

typedef enum engram_fill {
    ENGRAM_FILL_ZERO = 0,  /* tables left as holes (sparse files, all zeros) */
    ENGRAM_FILL_RANDOM,    /* every row random valid bytes from the seed      */
    ENGRAM_FILL_SPARSE,    /* holes, with every 4096th row random             */
    ENGRAM_FILL_POOL,      /* every row one of 65,536 random rows, picked by a
                              hash of its index: valid and varied, written at
                              disk speed (large benchmark files)              */
    ENGRAM_FILL_NORMAL     /* every row 256 values of a normal-like distribution
                              (sigma 1) through the quantizer: rows as a
                              trained table's (realistic projections)       */
} engram_fill;

typedef struct engram_build_opts {
    engram_layout layout;  /* validated; token_map is read, not kept        */
    uint32_t width;        /* hidden width for engram_kv / norms; 0 = none  */
    engram_fill fill;
    uint64_t seed;
    int gguf_version;      /* 3 (default when 0) or 2                       */
    /* Progress callback for long writes (may be NULL): done/total bytes. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} engram_build_opts;

/*
 * Writes a complete ds4-dialect model: the layout keys, the projection
 * weights when width > 0, and the two tables last, table 0 page aligned.
 * Deterministic for a seed.  Zero-filled tables are holes, so a full-size
 * V4.1 model (2 x ~101 GB apparent) costs almost no disk.  The file is
 * written to a temporary name and renamed into place on success.
 */
int engram_build_model(const char *path, const engram_build_opts *opts,
                       engram_error *err);

/* Qwen3.8's PLE (the family's second member, SPEC.md section 10). */
#define ENGRAM_PLE_BASE 19999999u   /* the real sizes: 320,001,536 rows (95.37 GiB) */
#define ENGRAM_PLE_DEMO_BASE 20011u /* a demo: 321,408 rows (103 MB)                */
#define ENGRAM_PLE_WIDTH 2560u      /* W, one of the 4 residual streams             */

typedef struct engram_ple_build_opts {
    uint32_t base;         /* head h's size: the (h + 1)-th prime after base;
                              0 = ENGRAM_PLE_BASE                             */
    uint32_t width;        /* W, 1..ENGRAM_MAX_WIDTH; 0 = ENGRAM_PLE_WIDTH      */
    engram_fill fill;      /* ENGRAM_FILL_ZERO (the table a hole) or
                              ENGRAM_FILL_NORMAL; others are refused          */
    uint64_t seed;
    /* Progress callback for long writes (may be NULL): done/total bytes. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} engram_ple_build_opts;

/*
 * Writes a complete qwen4exp model (llama.cpp's dialect, which ds4 reads
 * too): general.architecture "qwen4exp", qwen4exp.vocab_size 248,320 (u32),
 * embedding_length_per_layer_input 160, attention.layer_norm_rms_epsilon
 * 1e-6 (F32), ple.layers [1] (u32 array), ple.ngram_size 3,
 * ple.heads_per_ngram 8, ple.conv_kernel 4, ple.eos_token_id 248,044 (u32;
 * no image_token_id), ple.layer_multipliers [3], ple.head_offsets [16] and
 * ple.head_vocab_sizes [16] (u64 arrays).  The multipliers are Qwen3.8's
 * (generated for the vocabulary, SPEC section 10); the 16 sizes are the
 * primes after base, offsets their running sum, rows padded to a multiple
 * of 128.  Tensors, in this order: per_layer_token_embd.weight [160, rows]
 * BF16, page aligned; blk.1.ple_key.weight [2560, 4W] and
 * blk.1.ple_value.weight [2560, W] BF16; blk.1.ple_norm_{key,query,conv}.
 * weight [4W] F32; blk.1.ple_conv1d.weight [4, 4W] F32.  Values are
 * normal-like (a bell of sigma 1 on [-3.46, 3.46]) times a scale: table
 * rows 0.05 (BF16, round to nearest even; as a trained table's rows look),
 * W_k and W_v 0.02 (about 1 / sqrt(2560)), norms 1 + 0.05 x, taps 0.1 x;
 * with ENGRAM_FILL_ZERO the table is a hole (all zeros: the full-size file,
 * 95.37 GiB apparent, costs the weights' 65 MB at W = 2560).  Deterministic
 * for a seed: each value depends on the seed, its tensor and its index
 * only.  Written through engram_output (ENGRAM_OUTPUT_SEEKABLE): a
 * temporary renamed into place on success, so path holds the whole file or
 * what it held before.  0; -EINVAL (NULL, a fill other than zero or normal,
 * width above ENGRAM_MAX_WIDTH, a base whose heads pass int32: nothing
 * opened or written); -ENOMEM; an output's or a write's -errno (err names
 * the path or the tensor).  Memory: 4 MiB of buffer plus the header.
 */
int engram_build_ple_model(const char *path, const engram_ple_build_opts *opts,
                           engram_error *err);

/* ------------------------------------------------------------------ shards */

/*
 * The identity of a V4.1 model that its shard files carry
 * (deepseek41.engram.shard.model_id, docs/shards.md): SHA-256 over the
 * layout (V', pad id, rows, primes, multipliers, token map), every
 * tensor's name, type and shape, the first 4 KiB of every non-table tensor
 * and the first and last rows of each table, as 64 lowercase hex digits
 * and a NUL.  Reads those few bytes only.  0, or engram_model_open's
 * errors, -ENOTSUP (a PLE model), -EINVAL (a shard file, or NULL).
 */
int engram_model_identity(const char *path, char out[ENGRAM_SHARD_ID_HEX + 1], engram_error *err);

typedef struct engram_shard_write_opts {
    /* Progress callback (may be NULL): bytes of tensor data done / total. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} engram_shard_write_opts;

/*
 * Writes rank `rank` of `world` of the V4.1 model at path `model` to `out`
 * (docs/shards.md): every key of the model copied as it is plus the five
 * shard keys, every non-table tensor whole in its order, then each table's
 * block of rows [floor(rank R / world), floor((rank + 1) R / world)), last,
 * table 0 page aligned.  model_id: the model's identity as
 * engram_model_identity gives it (to compute it once for a set), or NULL
 * to compute it here.  Rows are copied with plain reads, 4.3 MB at a time
 * (memory: that chunk, the metadata and the header); all-zero chunks stay
 * holes.  Written through engram_output (temporary + rename): out holds
 * the whole shard or what it held before.  0; -EINVAL (rank >= world,
 * world 0 or above 65536, a world larger than a table, the model already a
 * shard, a malformed model_id: nothing written); -ENOTSUP (a PLE model);
 * engram_model_open's errors; -ENOMEM; an output's or a read's or write's
 * -errno (err names the path or the tensor).
 */
int engram_shard_write(const char *model, const char *model_id, unsigned rank, unsigned world,
                       const char *out, const engram_shard_write_opts *opts, engram_error *err);

/* After renaming a finished file into place: fsyncs the directory that
 * holds path, so the new name survives a power cut too.  Best effort (some
 * filesystems refuse fsync on a directory; the file is complete under its
 * name either way); used by engram_build_model and every output of the
 * engram command. */
void engram_sync_dir_of(const char *path);

/*
 * The one writer behind every file engram writes (engram_build_model, each
 * output of the engram command, the benchmarks' CSV files).  The folder of
 * path is opened once (links among its folders are followed, as by every
 * tool: the kernel's protected_symlinks guards shared sticky folders) and
 * every later step is relative to it.  The rule by what stands at the last
 * name (not followed):
 *   - nothing, or a regular file: written to a fresh temporary in the same
 *     folder (NAME.tmp.XXXXXXXXXXXX, 12 random letters; .engram.tmp.
 *     XXXXXXXXXXXX when that name is too long), created O_CREAT | O_EXCL |
 *     O_NOFOLLOW (a planted link or file at that name makes it pick
 *     another, never write through it).  A new name, or a file of another
 *     user's (one planted where we write), gives a new file of the
 *     caller's, 0666 less the umask; a file of the caller's keeps its mode
 *     and group (the group's and others' rights dropped where the group
 *     cannot be kept), and its temporary is 0600 until then.  Hard links
 *     of a replaced file keep the old contents.  close(ok = 1) fsyncs it,
 *     renames it over the name and fsyncs the folder; close(ok = 0), a
 *     failure, or engram_output_abandon_all removes it, so the name holds
 *     the old file or the whole new one, never a part;
 *   - a character device or a FIFO: opened in place (no O_CREAT, no link
 *     followed; a FIFO blocks until a reader opens it), written through,
 *     never replaced; one of another user's in a shared sticky folder
 *     (/tmp) is refused with -EPERM (the kernel's protected_fifos rule);
 *     ENGRAM_OUTPUT_SEEKABLE (an output written at offsets, as a model is)
 *     refuses them with -ENOTSUP;
 *   - a symbolic link: refused with -ELOOP (name its target); a folder, or
 *     a name ending in '/', '.' or '..': -EISDIR; a block device or a
 *     socket: -ENOTSUP.  A missing folder: -ENOENT.
 * Nothing is created or changed by a refusal.  Before close renames, the
 * name is classified again: a link or node put there meanwhile is refused,
 * not replaced (a window of one rename remains, in which a link planted
 * would itself be replaced, its target untouched).
 */
enum { ENGRAM_OUTPUT_SEEKABLE = 1 };

typedef struct engram_output {
    int fd;            /* write here (pwrite allowed unless in_place)      */
    int in_place;      /* 1: a character device or FIFO, written in place  */
    char *tmp;         /* owned: the temporary's name (NULL when in place)  */
    const char *path;  /* the caller's; must outlive the output            */
    int dir;           /* owned: the folder (-1 when in place)             */
    int mode, gid;     /* given at close (-1: as created)                  */
    int slot;          /* engram_output_abandon_all's record (-1: none)    */
} engram_output;

/* Whether path may be written under the rule above, with nothing opened:
 * 0 or the refusal's -errno (err names the path and why).  For checking
 * every output of a command before it reads anything. */
int engram_output_check(const char *path, unsigned flags, engram_error *err);

/* Opens path for writing under the rule; 0 or -errno (err set), o unchanged
 * on failure.  Each successful open needs one engram_output_close. */
int engram_output_open(engram_output *o, const char *path, unsigned flags,
                       engram_error *err);

/* Finishes an open output: ok = 1 puts it in place (0, or -errno with the
 * temporary removed and path untouched); ok = 0 removes the temporary (an
 * in-place output keeps what was written).  Frees what open allocated. */
int engram_output_close(engram_output *o, int ok, engram_error *err);

/* The same as a stdio stream (text outputs, the benchmarks' CSV files):
 * *f writes through a descriptor of its own; engram_output_fclose flushes
 * and closes it, then finishes o as engram_output_close (ok = 0 or a
 * failed write: the temporary removed).  0 or -errno (err set). */
int engram_output_fopen(engram_output *o, const char *path, unsigned flags, FILE **f,
                        engram_error *err);
int engram_output_fclose(engram_output *o, FILE *f, int ok, engram_error *err);

/* Removes the temporary of every output open now in this process (at most
 * 16 at once are known), leaving their names as they were; async-signal-
 * safe, for a SIGINT or SIGTERM handler that then re-raises the signal.
 * Those outputs' later close(ok = 1) fails. */
void engram_output_abandon_all(void);

/* 1 when a and b name one file that is not a character device: the same
 * inode, or, when neither exists, the same name in the same resolved
 * folder.  For refusing two outputs (or an output and an input) that would
 * overwrite each other. */
int engram_output_same(const char *a, const char *b);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_TOOLS_H */
