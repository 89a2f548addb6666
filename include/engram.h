/*
 * engram.h - the public interface of libengram.
 *
 * Engram is the on-disk hashed n-gram memory of DeepSeek V4.1 Flash: for every
 * token the last 4 tokens are hashed (through a compressed vocabulary) into 24
 * rows of each of two tables; the 264-byte rows are read from the SSD and
 * decoded from E4M3 + E8M0 to BF16.  This header covers the runtime library
 * (libengram: the model file, the layout, the hash, the row codec and the
 * uncached table reader), which depends on liburing and libpthread only.
 * The tools that make or convert models (token map, layout generator,
 * quantizer, model builder) are in libengram-tools, engram_tools.h.
 * include/README.md is the guide (lifecycles, threads, memory, a whole
 * example); this header is the contract, each function's at its
 * declaration, which is why it is one long file rather than several.
 *
 * Which API is yours:
 *  - An inference engine serving sequences (one or many, decode and
 *    prefill): open the model, one pool (engram_pool_open) and a session per
 *    sequence.  Begin a step when a token is known, wait for table 0 before
 *    layer 1 and table 1 before layer 14, commit; prefill prompts through
 *    engram_prefill_*.  The pool reads for every session on its own thread,
 *    merges their reads and keeps each session's contract under any
 *    interleaving of threads.  Apply with engram_apply_strided (the rows as
 *    a step delivers them) or on a GPU with engram_cuda.h.  ("sessions")
 *  - A tool that reads rows (a verifier, a converter, a benchmark) on one
 *    thread: engram_reader_open and its batch calls, or engram_model_read_*
 *    for a few rows.  ("reader")
 *  - Hashing alone (to precompute row ids, or to check another
 *    implementation): engram_hasher_* / engram_hash_tokens.
 *
 * Conventions (they hold for every function below):
 *  - Functions that can fail return 0 on success or a negative errno value;
 *    engram_strerror() turns it into text.  Those that take an engram_error *
 *    (which may be NULL) also fill it with a message naming the field, tensor,
 *    token or row that failed and, for file errors, the byte offset.
 *  - A failed call leaves every output and every piece of caller state
 *    (history, buffers) exactly as it was: inputs are validated first.  The
 *    one exception is data that only reading can validate: a call that fails
 *    on a row read from disk (engram_model_read_raw, a reader batch or step)
 *    may have written other rows of its output (said again at each).
 *  - NULL, one rule: a pointer argument the call needs (an object, an
 *    input, an output) that is NULL is refused before anything is read or
 *    written: -EINVAL, err filled when given.  A function that cannot fail
 *    does nothing instead (_close, _free, abort, cancel, release, reset,
 *    the getters: their output is left as it was), and an accessor
 *    returns NULL or 0.  Free to be NULL: err; an array whose count is 0;
 *    opts (the defaults); and what a declaration calls optional (mask:
 *    nothing masked; an optional output: not written; a callback's ctx:
 *    passed on as it is).  tests/test_null.c calls every function so.
 *  - The library never exits, aborts or prints.
 *  - Every buffer is owned by the caller unless a comment says otherwise.
 *  - Opaque handles come from engram_*_open / _new and are released by the
 *    matching _close / _free, which accept NULL.
 *  - Getters are engram_<object>_get_<what>(object, out) (get_info,
 *    get_stats): they fill a caller-owned struct and cannot fail; strings
 *    in it are static or owned by the object, valid until its close.
 *
 * Error codes used:
 *   -EINVAL  bad argument (token >= vocab, history id out of range, bad table
 *            index, ...)
 *   -EBADMSG malformed or inconsistent file (GGUF structure or Engram layout)
 *   -EDOM    a table row that decodes to NaN or a non-finite value
 *   -EIO     short read (file shorter than the header promises) or device error
 *   -ENOMEM  allocation failed
 *   -ENOTSUP a valid GGUF that is not an Engram model of the supported dialect
 *   -ESTALE  the model's file was replaced and cannot be reached again
 *   -ECANCELED  a step or prefill ended (abort, cancel, its session closed)
 *            while it was waited for, or before it was complete
 *   -EBUSY   a session already has a step or prefill in progress
 *   -EAGAIN  a poll: not yet
 *   -ETIMEDOUT  a timed wait ran out (nothing lost: wait again)
 *   -EDEADLK a prefill wait that could never return (see engram_prefill_wait)
 *   -ESHUTDOWN  the session's pool was closed
 *   other    errno from the system call that failed (open, pread, ...)
 */
#ifndef ENGRAM_H
#define ENGRAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is exported from libengram.so; the rest of the
 * library is built with hidden visibility. */
#pragma GCC visibility push(default)

/* The version of these headers: MAJOR.MINOR.PATCH, the string being the
 * three numbers joined by dots.  engram_version() gives the library's. */
#define ENGRAM_VERSION_MAJOR 0
#define ENGRAM_VERSION_MINOR 2
#define ENGRAM_VERSION_PATCH 0
#define ENGRAM_VERSION "0.2.0"

/* ENGRAM_VERSION of the library actually loaded (a shared library may be
 * newer than the headers a program was built with); a static string. */
const char *engram_version(void);

/* DeepSeek V4.1 Flash geometry (SPEC.md section 2). */
#define ENGRAM_TABLES 2        /* table 0 = model layer 1, table 1 = layer 14 */
#define ENGRAM_NGRAM 4         /* current token + 3 previous                  */
#define ENGRAM_HEADS 8         /* hash heads per n-gram order                 */
#define ENGRAM_COLUMNS 24      /* (NGRAM - 1) * HEADS rows per token per table */
#define ENGRAM_ROWS_PER_TOKEN 48 /* TABLES * COLUMNS                          */
#define ENGRAM_ROW_VALUES 256
#define ENGRAM_ROW_BYTES 264   /* 256 E4M3FN codes + 8 E8M0 scales            */
#define ENGRAM_HISTORY 3
#define ENGRAM_DEAD (-1)       /* history entry before the start / masked     */
#define ENGRAM_K (ENGRAM_COLUMNS * ENGRAM_ROW_VALUES) /* 6144: e of one token   */
#define ENGRAM_MAX_WIDTH (1u << 16)   /* W accepted from a model's shapes      */
#define ENGRAM_MAX_STREAMS 16u        /* S accepted                             */

#define ENGRAM_NO_OFFSET UINT64_MAX
#define ENGRAM_NO_ROW UINT64_MAX

/* ------------------------------------------------------------------ errors */

typedef struct engram_error {
    int code;          /* the negative errno the call returned              */
    uint64_t offset;   /* byte offset in the file, or ENGRAM_NO_OFFSET      */
    uint64_t row;      /* table-local row that failed (the row codec's
                          functions: the row's index within the call), or
                          ENGRAM_NO_ROW                                     */
    char msg[256];     /* one line, no trailing newline                     */
} engram_error;

/* Text for a code returned by this library (negative errno); never NULL. */
const char *engram_strerror(int code);

/* ------------------------------------------------------------------ layout */

/*
 * The hashing layout carried by the deepseek41.engram.* keys.  Small and
 * transparent; token_map points into memory owned by whoever produced the
 * layout (the model, or the caller when building one).
 */
typedef struct engram_layout {
    uint32_t vocab;              /* token_map length (raw vocabulary size)   */
    uint32_t compressed_vocab;   /* V'                                       */
    uint32_t pad_id;             /* compressed pad id, < V'                  */
    uint32_t rows[ENGRAM_TABLES];                   /* = sum of the primes  */
    uint32_t primes[ENGRAM_TABLES][ENGRAM_COLUMNS];  /* column order         */
    uint64_t multipliers[ENGRAM_TABLES][ENGRAM_NGRAM]; /* lag 0 first        */
    const uint32_t *token_map;   /* [vocab] raw id -> compressed id          */
} engram_layout;

/*
 * Checks every rule of SPEC.md section 3 that does not need the file:
 * multipliers odd and <= INT64_MAX / V', primes >= 2, sum of primes = rows,
 * token_map entries and pad_id < V'.  0 or -EBADMSG with err naming the rule.
 */
int engram_layout_validate(const engram_layout *layout, engram_error *err);

/* ------------------------------------------------------------------ hash */

/* Rolling hash state of one sequence: 3 compressed ids, newest first,
 * ENGRAM_DEAD before the start or after a masked position.  Copying the
 * struct snapshots the whole hash state. */
typedef struct engram_history {
    int32_t id[ENGRAM_HISTORY];
} engram_history;

void engram_history_reset(engram_history *h);

/* Opaque: the layout plus precomputed reduction constants and its own copy of
 * the token map (vocab * 4 bytes; nothing else grows with the input). */
typedef struct engram_hasher engram_hasher;

/* Validates the layout (as engram_layout_validate) and copies what it needs:
 * the hasher does not keep pointers into *layout. */
int engram_hasher_new(const engram_layout *layout, engram_hasher **out,
                      engram_error *err);
void engram_hasher_free(engram_hasher *h);

/*
 * Hashes n tokens (SPEC.md section 6).  rows receives n * 48 table-local row
 * ids, per token table 0's 24 columns then table 1's (order-major: orders
 * 2,3,4 x 8 heads).  mask may be NULL (nothing masked); mask[i] == 0 masks
 * token i (it hashes as all pad and becomes a dead history entry).  Tokens
 * and history are validated before anything is written: on -EINVAL (token >=
 * vocab, or a history entry neither ENGRAM_DEAD nor < V'), rows and *hist
 * are unchanged and err names the token position.  No heap memory.
 */
int engram_hash_tokens(const engram_hasher *h, engram_history *hist,
                       const uint32_t *tokens, const uint8_t *mask, size_t n,
                       uint32_t *rows, engram_error *err);

/* One decode step: the same as engram_hash_tokens with n = 1. */
int engram_hash_token(const engram_hasher *h, engram_history *hist,
                      uint32_t token, int masked,
                      uint32_t rows[ENGRAM_ROWS_PER_TOKEN]);

/* Rebuilds the history from the last min(n, 3) tokens of a sequence (all
 * unmasked) through the token map, as a restored session would.  -EINVAL on
 * a token >= vocab (history unchanged). */
int engram_history_from_tokens(const engram_hasher *h, engram_history *hist,
                               const uint32_t *tokens, size_t n);

/* The layout the hasher was built from (token_map points into the hasher). */
const engram_layout *engram_hasher_layout(const engram_hasher *h);

/* ------------------------------------------------------------------ rows */

typedef enum engram_simd {
    ENGRAM_SIMD_AUTO = 0,   /* the best one this CPU has (chosen once)     */
    ENGRAM_SIMD_SCALAR,     /* portable reference                          */
    ENGRAM_SIMD_AVX2,
    ENGRAM_SIMD_AVX512
} engram_simd;

/* 1 if this CPU (and build) can run the given implementation. */
int engram_simd_supported(engram_simd s);
/* The implementation ENGRAM_SIMD_AUTO resolves to; honours the environment
 * variable ENGRAM_SIMD=scalar|avx2|avx512 (read once). */
engram_simd engram_simd_selected(void);
const char *engram_simd_name(engram_simd s);

/*
 * The row functions below share one error contract.  raw is caller-owned,
 * n * 264 bytes, read only during the call.  Every row is checked before
 * anything is written.  On failure the return value is a negative errno
 * and err (if not NULL) holds:
 *   -EDOM   a row does not decode: err->row = the index within raw (0 ..
 *           n - 1; not a table row id) of the first invalid row, err->msg =
 *           "row <i>, value <j>: <reason>" (j: the value 0..255 whose code
 *           is NaN or overflows) or "row <i>, scale <b>: <reason>" (b: the
 *           NaN scale byte 0..7), the reason being one of "NaN code (E4M3
 *           0x7F/0xFF)", "NaN scale (E8M0 0xFF)", "value overflows float32
 *           (non-finite)" (the text after the first ": ").
 *   -EINVAL a bad argument; err->row = ENGRAM_NO_ROW.
 * err->code = the return value and err->offset = ENGRAM_NO_OFFSET either
 * way; on success err is not touched.  Nothing is formatted unless a row
 * fails and err is not NULL: passing err costs nothing on success.
 */

/*
 * Decode n raw rows (SPEC.md section 7) into out: n * 256 BF16 values
 * (uint16 bit patterns) or float32 values (each exactly a BF16), caller-
 * owned.  If a row is invalid the call returns -EDOM and writes nothing to
 * out.  -EINVAL if s is not supported here, or raw or out is NULL with n >
 * 0.  No heap memory.
 */
int engram_rows_decode_bf16(engram_simd s, const uint8_t *raw, size_t n,
                            uint16_t *out, engram_error *err);
int engram_rows_decode_f32(engram_simd s, const uint8_t *raw, size_t n,
                           float *out, engram_error *err);

/* Checks n raw rows: 0 if all decode, else -EDOM naming the first invalid
 * one (-EINVAL: raw NULL with n > 0).  Uses the selected SIMD kernels' fast
 * check.  No heap memory. */
int engram_rows_check(const uint8_t *raw, size_t n, engram_error *err);

/* One row: 0 if it decodes, -EDOM if not (NaN code, NaN scale or overflow),
 * with err->row = 0 and the reason in err->msg as above. */
int engram_row_check(const uint8_t raw[ENGRAM_ROW_BYTES], engram_error *err);

/* ------------------------------------------------------------------ model */

typedef struct engram_model engram_model;

typedef struct engram_table_info {
    const char *name;     /* tensor name, e.g. "blk.1.engram_embd.weight"   */
    int layer;            /* model layer index (1 or 14)                    */
    uint64_t rows;        /* the table's rows R (a shard file: the whole
                             table's, of which it holds a block)           */
    uint64_t offset;      /* absolute byte offset in the file of the first
                             row it holds (row 0; a shard: its first_row)  */
    uint64_t bytes;       /* bytes of rows it holds: rows * 264 (a shard:
                             its block's rows * 264)                       */
    int has_projection;   /* this layer's engram_kv / q_norm / k_norm exist */
} engram_table_info;

/*
 * Row-block shard files (issue #24, docs/shards.md): `engram shard` writes
 * rank r of N a V4.1 file whose tables hold only rows [first_row, first_row
 * + rows) of each, first_row = floor(r R / N) and first_row + rows =
 * floor((r + 1) R / N), the block a pool with shard_rank r and shard_world
 * N reads.  Row ids stay table-global everywhere: reading row g of such a
 * file reads its local row g - first_row, and an id outside the block is
 * -EINVAL naming the block (engram_model_read_*, the reader, the pool).
 */
#define ENGRAM_SHARD_ID_HEX 64  /* hex digits of a model identity (SHA-256) */
typedef struct engram_shard_info {
    uint32_t rank, world;               /* world 0: not a shard file        */
    uint64_t first_row[ENGRAM_TABLES];  /* table-global id of the first row
                                           held (0 for an unsharded file)  */
    uint64_t rows[ENGRAM_TABLES];       /* rows held (the whole R unsharded) */
    uint64_t total_rows[ENGRAM_TABLES]; /* the unsharded table's R          */
    /* The identity of the unsharded model the shard was cut from (SHA-256
     * over its layout, tensor shapes and the first and last rows of each
     * table, docs/shards.md), lowercase hex; "" for an unsharded file. */
    char model_id[ENGRAM_SHARD_ID_HEX + 1];
} engram_shard_info;

/*
 * The family.  engram serves the hashed n-gram memories of a family of
 * models from one machinery; a model file says which member it is:
 *   - ENGRAM_MEMBER_V41: DeepSeek V4.1 Engram (ds4 dialect, SPEC.md 3-9):
 *     two tables of 264-byte E4M3 + E8M0 rows, 4-grams through a
 *     compressed vocabulary, 24 rows per table and token, layers 1 and 14.
 *     Every function of this header serves it; the ENGRAM_* constants
 *     above are its numbers.
 *   - ENGRAM_MEMBER_PLE: Qwen3.8's per-layer embedding (GGUF arch
 *     qwen4exp, SPEC.md 10): one table of 320-byte BF16 rows, 3-grams of
 *     raw ids, 16 rows per token, one layer, a per-sequence convolution
 *     state.  Served: engram_model_open, _get_info,
 *     _read_raw/_f32/_bf16, _dup_fd, engram_ple_hash, the reader (batch,
 *     stream, step: 16 rows per token, table 0), engram_layer_open (t = 0)
 *     with its appliers and engram_apply_seq (the per-sequence convolution
 *     state), and the pool with its sessions, steps (begin, _many, _batch,
 *     waits, commit, engram_step_apply), prefills (engram_prefill_apply)
 *     and snapshots (engram_session_save / _load), in the family's numbers:
 *     one table (t = 0; table 1 is -EINVAL), 16 rows of 160 values a token
 *     (a step's out is [k][16] rows), the session masks of ENGRAM_MASK_*;
 *     the V4.1 hasher and layout calls answer NULL for it.
 * What differs between members is in engram_family (engram_model_info).
 */
typedef enum engram_member {
    ENGRAM_MEMBER_V41 = 0,
    ENGRAM_MEMBER_PLE = 1
} engram_member;

typedef enum engram_row_encoding {
    ENGRAM_ROWS_E4M3_E8M0 = 0, /* 256 E4M3 values + 8 E8M0 block scales */
    ENGRAM_ROWS_BF16 = 1       /* the values as BF16, nothing to decode  */
} engram_row_encoding;

typedef struct engram_family {
    engram_member member;
    const char *name;          /* "deepseek-v4.1-engram", "qwen3.8-ple"     */
    uint32_t ngram;            /* order: 4 (V4.1), 3 (PLE)                  */
    uint32_t heads;            /* heads per order: 8, 8                     */
    uint32_t tables;           /* 2, 1                                      */
    uint32_t rows_per_token;   /* per table: 24, 16                         */
    uint32_t row_bytes;        /* 264, 320                                  */
    uint32_t row_values;       /* 256, 160                                  */
    engram_row_encoding encoding;
    int raw_ids;               /* 0: hashed through the compressed vocabulary
                                  (V4.1), 1: raw token ids (PLE)           */
    uint32_t history;          /* ids carried between calls: 3, 2           */
    uint32_t vocab;            /* raw vocabulary                            */
    uint32_t eos;              /* PLE: the EOS id (lags behind it read it)  */
    uint32_t layers[2];        /* 0-based layers fed by table 0, 1: {1, 14},
                                  PLE {its layer, 0}                       */
    uint32_t state_floats;     /* per-sequence state beyond the ids: 0;
                                  PLE 3 (kernel - 1) frames x 4 W floats   */
} engram_family;

typedef struct engram_model_info {
    const char *path;
    const char *architecture;   /* general.architecture, "" if absent       */
    uint32_t gguf_version;
    uint64_t file_bytes;
    uint64_t n_tensors, n_kv;
    uint32_t alignment;
    engram_table_info table[ENGRAM_TABLES];
    int has_projection;         /* both layers have their projection weights */
    uint32_t width;             /* hidden width W from the norms, 0 if absent */
    uint32_t streams;           /* hyper-connection streams S (V4.1: 4)      */
    /* Placement rule of the reference engine: the two tables are the last
     * tensors of the file, table 0 first, table 0 at a page-aligned offset. */
    int tables_last, table0_page_aligned;
    engram_family family;       /* which member, and its numbers            */
    engram_shard_info shard;    /* a shard file's block (world 0: the whole) */
} engram_model_info;

/*
 * Opens a model of the family: a ds4-dialect DeepSeek V4.1 Engram GGUF
 * (validated against SPEC.md section 3) or a qwen4exp PLE file (SPEC.md
 * section 10: every key and tensor checked, a quantized table refused
 * naming its type), chosen by general.architecture.  Parses the header
 * through a bounds-checked cursor and keeps a read-only descriptor for row
 * reads.  The tables are never
 * mapped or read whole.  Memory: the token map (vocab * 4 bytes) plus
 * metadata bookkeeping, independent of table size.  -EBADMSG / -ENOTSUP /
 * -EIO / errno with err naming the key or tensor and the byte offset.
 */
int engram_model_open(const char *path, engram_model **out, engram_error *err);
void engram_model_close(engram_model *m);

/*
 * Whether n shard files' infos (engram_model_info.shard, e.g. gathered
 * from every rank) form one whole set: every one a shard (world > 0) of the
 * same model identity, world and total rows, n == world, each rank exactly
 * once, and the blocks tiling every table's [0, R) with no overlap or gap.
 * 0, or -EINVAL with err naming the first shard (names[i] if names is not
 * NULL, else "shard i") and why.  No heap memory beyond n bytes.
 */
int engram_shard_set_check(const engram_shard_info *shards, size_t n, const char *const *names,
                           engram_error *err);

/* V4.1's layout and hasher; NULL for another member (and for NULL). */
const engram_layout *engram_model_layout(const engram_model *m);
const engram_hasher *engram_model_hasher(const engram_model *m);
void engram_model_get_info(const engram_model *m, engram_model_info *info);

/*
 * Reads n raw rows of table t (table-local ids) into raw (n * row_bytes:
 * 264, or 320 for PLE, whose one table is t = 0) with plain positional
 * reads.  Row ids are validated first (-EINVAL naming the
 * row, nothing read).  -EIO on a short read.  A read that fails leaves the
 * rows before it written and the rest of raw untouched (err names the row
 * and its file offset).  This is the exact single-row path; the batched
 * uncached engine is built on top of the same file.
 */
int engram_model_read_raw(const engram_model *m, int t, const uint32_t *rows,
                          size_t n, uint8_t *raw, engram_error *err);

/* Reads and decodes n rows (n * row_values outputs: 256, or 160 for PLE,
 * whose BF16 rows are copied or widened).  As read_raw, plus -EDOM naming
 * the first invalid row (out unchanged; PLE rows have no invalid values).
 * Temporary memory: n * row_bytes (the raw rows, so that out is written
 * only once all are valid). */
int engram_model_read_f32(const engram_model *m, int t, const uint32_t *rows,
                          size_t n, float *out, engram_error *err);
int engram_model_read_bf16(const engram_model *m, int t, const uint32_t *rows,
                           size_t n, uint16_t *out, engram_error *err);

/* Duplicates the model's table descriptor (O_CLOEXEC, read-only) for callers
 * that scan the table themselves (engram verify).  Caller closes it. */
int engram_model_dup_fd(const engram_model *m);

/*
 * The PLE member's hash (SPEC.md section 10), on a model whose member is
 * ENGRAM_MEMBER_PLE (-ENOTSUP otherwise).  tokens[n] raw ids (< vocab, or
 * -EINVAL naming the first, nothing written); kinds NULL (all text) or [n]
 * of ENGRAM_PLE_TEXT, _PAD (hashed as EOS: padding) or _IMAGE (hashed as
 * the image token, or EOS where the file has none); rows[n * 16]: each
 * token's 16 global row ids, head 0 first.  h carries the last 2 ids
 * between calls (engram_ple_history_reset: a sequence start), so a stream
 * cut anywhere hashes as one call.  Lags before the start, at or behind an
 * EOS read EOS.
 */
typedef struct engram_ple_history {
    uint32_t lag[2];           /* the previous id, the one before          */
} engram_ple_history;
enum { ENGRAM_PLE_TEXT = 0, ENGRAM_PLE_PAD = 1, ENGRAM_PLE_IMAGE = 2 };
#define ENGRAM_PLE_ROWS_PER_TOKEN 16
void engram_ple_history_reset(const engram_model *m, engram_ple_history *h);
int engram_ple_hash(const engram_model *m, engram_ple_history *h, const uint32_t *tokens,
                    const uint8_t *kinds, size_t n, uint32_t *rows, engram_error *err);

/* ------------------------------------------------------------------ apply */

/* Element type of decoded rows and of residuals: BF16 bit patterns (uint16)
 * or float32. */
typedef enum engram_dtype {
    ENGRAM_BF16 = 0,
    ENGRAM_F32 = 1,
    ENGRAM_RAW = 2      /* rows only (sessions, reader batches): the 264 bytes
                           as stored, checked to decode, for decoding elsewhere
                           (a GPU); out then holds [n][24][264] bytes */
} engram_dtype;

/*
 * Engram's output (SPEC.md section 8): for each token, the 24 decoded rows
 * of a table concatenated, e (K = 6144 values), are projected by the
 * layer's F16 weights into kv ((S+1) slices of W: S keys, then the value),
 * and each of the S residual streams x gets x += g * v, with g the cosine
 * gate of x against its key.
 *
 * Arithmetic, exactly as computed here (every kernel, scalar or SIMD, gives
 * the same bits; every reduction order is fixed, independent of the number
 * of tokens, of a token's position in a call, of blocking and of threads):
 *  - kv[o] = sum over i = 0..6143 of e[i] * w[o][i], one F32 fused
 *    multiply-add per term in index order from +0 (each product of a BF16
 *    row value and an F16 weight is exact in F32 unless it leaves F32's
 *    normal range, so this is an F32 sum of exact products).
 *  - k = bf16(kv[s*W + i]), v = bf16(kv[S*W + i]) (round to nearest even);
 *    wq = q_norm[s][i] * k_norm[s][i] (F32 product, once, at layer open).
 *  - D, Sxx, Skk: 16 partial sums, term i going to partial i mod 16 (in
 *    order of i), D's term fma(x*wq, k, .), Sxx's fma(x, x, .), Skk's
 *    fma(k, k, .); the partials are then added pairwise, p[j] += p[j+8],
 *    then +4, +2, +1.
 *  - d = ((D * r(Sxx/W + 1e-6)) * r(Skk/W + 1e-6)) * r(W) with r(y) =
 *    1/sqrtf(y) (the divisions and square roots of F32, correctly rounded);
 *    g = 1 / (1 + expf(-copysign(sqrtf(max(|d|, 1e-6)), d)))   (so d = +0
 *    gives sigmoid(0.001)).
 *  - out = bf16(fma(g, v, x)): the residual leaves as BF16 values (SPEC
 *    section 8 rounds the update to BF16, the precision the engine keeps its
 *    residual in).  With F32 residual buffers the BF16 value is stored as a
 *    float; inputs need not be BF16 values.
 *
 * Non-finite values (the policy): rows and residual entries of unmasked
 * tokens are checked first; a NaN or infinity gives -EDOM naming the token,
 * stream and index, and nothing is written.  A token whose computed kv,
 * D, Sxx, Skk or outputs are not finite (F32 overflow from extreme rows or
 * residuals) also gives -EDOM naming it; then the tokens before it have
 * been updated and it and the ones after are untouched.  Masked tokens
 * (mask[i] == 0) are neither checked nor computed nor written: their
 * residual stays bit for bit as it was.
 */

/* One Engram layer's weights, read once from the model file (the tables
 * stay unmapped), validated (no NaN or infinity: -EBADMSG naming the tensor
 * and element) and kept in the layout the kernels read.  Immutable after
 * open: any number of threads may use one layer through their own appliers.
 * Memory: (S+1)*W rounded up to 64, times 6144, times 2 bytes of weights
 * (315 MB at W = 5120, S = 4) plus S*W*4 bytes of norms. */
typedef struct engram_layer engram_layer;

typedef struct engram_layer_info {
    int table;            /* 0 or 1                                      */
    int layer;            /* model layer: 1 or 14                        */
    uint32_t width;       /* W                                           */
    uint32_t streams;     /* S                                           */
    uint64_t bytes;       /* memory the layer holds                      */
    engram_member member; /* the family member the layer belongs to      */
    size_t state_floats;  /* per-sequence state engram_apply_seq carries:
                             0 (V4.1), 3 (T - 1) x 4W (PLE: 92,160 at
                             W = 2560, T = 4)                            */
} engram_layer_info;

/* Loads the weights of table t's layer.  -ENOENT if the model has no
 * projection weights for it (err names the missing tensor), -EBADMSG,
 * -ENOMEM, -EIO or the errno of a read.  On a PLE model, t = 0 loads its
 * one layer (W_k, W_v in their file type, norms, convolution taps: see
 * engram_apply_seq for its arithmetic; memory (ceil(4W/64) + ceil(W/64)) x
 * 64 x 2560 x (2 or 4) bytes + (3 + T) x 4W x 4: 65.8 MB at W = 2560 in
 * BF16); engram_layer_export then copies nothing (the CUDA path has its
 * own: cuda/ple_cuda.h). */
int engram_layer_open(const engram_model *m, int table, engram_layer **out, engram_error *err);
void engram_layer_close(engram_layer *L);
void engram_layer_get_info(const engram_layer *L, engram_layer_info *info);
/* Copies the layer's weights out, for other backends (the CUDA path): w
 * [(S+1)W][6144] F16 bit patterns, output-major as in the file (may be
 * NULL), wq [S][W] = q_norm * k_norm as F32 (may be NULL). */
void engram_layer_export(const engram_layer *L, uint16_t *w, float *wq);

/* Fork-join hook of a caller's thread pool: run fn(arg, w) for every w in
 * 0 .. workers-1 (concurrently or not, on any threads, each exactly once)
 * and return when all have returned. */
typedef void (*engram_worker_fn)(void *arg, unsigned worker);
typedef void (*engram_fork_join)(void *ctx, unsigned workers, engram_worker_fn fn, void *arg);

#define ENGRAM_APPLY_BLOCK 128u      /* tokens projected together (default) */
#define ENGRAM_APPLY_MAX_THREADS 256u

/* The applier's default number of workers: the CPUs this process may run
 * on (its affinity mask, as sched_getaffinity reports it, on machines of
 * any size; the online CPUs where that call fails), at least 1 and at most
 * ENGRAM_APPLY_MAX_THREADS.  Read at each call (taskset and cgroup cpusets
 * change it).  A CPU quota is not read (cgroup cpu.max, docker --cpus: the
 * mask still lists every CPU), nor what other processes use: ranks that
 * share a node unbound (mpirun --bind-to none) or a container with a quota
 * should give engram_apply_opts.threads themselves. */
unsigned engram_default_threads(void);

typedef struct engram_apply_opts {
    /* workers, the caller's thread included; 0 = engram_default_threads()
     * at creation (a token's decode streams the layer's weights, which one
     * core often cannot read at the memory's speed).  Results do not depend
     * on it. */
    unsigned threads;
    /* The caller's pool (NULL: the applier starts threads - 1 threads of its
     * own at creation, each with a 256 KiB stack). */
    engram_fork_join fork_join;
    void *fork_join_ctx;
    engram_simd simd;      /* kernels; AUTO = the best this CPU has          */
    unsigned block_tokens; /* tokens per projection block; 0 = ENGRAM_APPLY_BLOCK */
} engram_apply_opts;

/* Bytes an applier holds at most for a layer of width W and S streams: the
 * projection block (block_tokens x (S+1)W F32), the rows of a block as F32
 * (block_tokens x 6144 x 4), a gate value per token and stream, 24 bytes of
 * bookkeeping per token and 1 KiB besides (worker threads' stacks, if the
 * applier starts its own, are not counted: 256 KiB each).  At W = 5120,
 * S = 4 and 128 tokens: 16.4 MB, whatever n a call is given. */
#define ENGRAM_APPLY_WORKSPACE(W, S, block_tokens)                                      \
    ((uint64_t)(block_tokens) * ((uint64_t)((S) + 1) * (W) * 4u + (uint64_t)ENGRAM_K * 4u + \
                                 (uint64_t)(S) * 4u + 24u) + 1024u)

/* What one thread (or session) applies with: the workspace, allocated once
 * at creation (nothing is allocated per call), and its threads.  One call at
 * a time per applier; many appliers may share a layer.  The layer must
 * outlive its appliers.  -EINVAL (options; simd not supported here),
 * -ENOMEM, -EAGAIN (a thread could not be started). */
typedef struct engram_applier engram_applier;
int engram_applier_new(const engram_layer *L, const engram_apply_opts *opts,
                       engram_applier **out, engram_error *err);
void engram_applier_free(engram_applier *a);
/* Memory the applier holds (the workspace and bookkeeping). */
uint64_t engram_applier_bytes(const engram_applier *a);

/*
 * Applies the layer to n tokens: rows [n][24][256] (rows_dtype: BF16 bit
 * patterns or F32, as the reader writes them; read only), residual
 * [n][S][W] (resid_dtype: BF16 bit patterns or F32; updated in place), mask
 * NULL or [n] (0 = masked: untouched).  n may be anything: the tokens are
 * processed in blocks, and the result for a token is the same bits whatever
 * n, its position and the thread count.  Errors: -EINVAL (arguments), -EDOM
 * (see the policy above).
 */
int engram_apply(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                 engram_dtype resid_dtype, const uint8_t *mask, size_t n, engram_error *err);

/*
 * engram_apply with the tokens where the caller keeps them: token t's 24
 * rows (24 x 256 values of rows_dtype, contiguous) start at rows + t *
 * rows_stride bytes, its residual (S x W values of resid_dtype, contiguous)
 * at residual + t * resid_stride bytes.  For instance a decode step's
 * output [k][48][256] BF16 is applied in place: table t's rows start at
 * out + t * 24 * 256 * 2 with rows_stride 48 * 256 * 2.  The bytes between
 * tokens are neither read nor written; the residuals must not overlap the
 * rows.  engram_apply is the dense case (rows_stride 24 * 256 * elem,
 * resid_stride S * W * elem), and a token's result is the same bits
 * whatever its strides.  Strides are checked first, whatever n:
 * -EINVAL naming rows_stride or resid_stride if it is less than one
 * token's bytes, not a multiple of the element size, or if n tokens of it
 * would run past the end of the address space.  Otherwise as engram_apply.
 */
int engram_apply_strided(engram_applier *a, const void *rows, engram_dtype rows_dtype,
                         size_t rows_stride, void *residual, engram_dtype resid_dtype,
                         size_t resid_stride, const uint8_t *mask, size_t n, engram_error *err);

/*
 * The family's apply: the layer's output stage over n consecutive positions
 * of one sequence, carrying the sequence's state across calls.
 *  - V4.1 (state_floats 0): engram_apply; state is not used (NULL is fine).
 *  - PLE: rows [n][16][160] BF16 bit patterns (rows_dtype ENGRAM_BF16, as
 *    the reader delivers them; -EINVAL otherwise), residual [n][4][W] F32
 *    or BF16 updated in place, mask NULL or [n] (0: a padding position:
 *    nothing of it is read or written, its convolution frame is +0 and
 *    still takes its place in time), state [state_floats] read and
 *    advanced (3 (T - 1) frames of 4W, oldest first; a sequence starts all
 *    +0).  The arithmetic (projections W_k, W_v; the three RMSNorms; the
 *    gate with sign(0) = 0; the dilated causal depthwise convolution, SiLU;
 *    x <- (x + g) + y) and its fixed reduction order are documented in
 *    src/output/ple_apply.h: every kernel gives the same bits, and cutting
 *    a sequence into calls anywhere, state carried, gives the same bits of
 *    residual and state as one call, whatever the thread count.
 *    Non-finite rows, residual or state: -EDOM naming the token (nothing
 *    written); a computed overflow: -EDOM naming the token, the tokens
 *    before it updated and the state after them.  The applier's workspace:
 *    B x (2560 + 9W + 4) + (B + F) x 4W + threads x (8W + 16384) floats
 *    (19 MB at W = 2560, B = 128, 2 threads), allocated at creation.
 * engram_apply, _strided and engram_project on a PLE applier are -EINVAL
 * (they carry no state).
 */
int engram_apply_seq(engram_applier *a, const void *rows, engram_dtype rows_dtype, void *residual,
                     engram_dtype resid_dtype, const uint8_t *mask, size_t n, float *state,
                     engram_error *err);

/*
 * Batched decode across sequences: one position of each of n sequences in
 * one pass over the weights.  Sequence i: rows[i] (PLE: [16][160] BF16),
 * residuals[i] [S][W] updated in place, mask NULL or [n] (0: padding),
 * states[i] (PLE: state_floats, advanced by one frame; the states must not
 * overlap).  Each sequence's result is the bits engram_apply_seq(a,
 * rows[i], ., residuals[i], ., &mask[i], 1, states[i]) gives, whatever n
 * and the threads.  PLE errors name the sequence: NULLs and non-finite
 * inputs of every sequence are checked first (-EINVAL / -EDOM, nothing
 * written); a computed overflow leaves the sequences before it updated
 * (residual and state), it and the later ones untouched.  V4.1: one
 * engram_apply per sequence in order (states unused; engram_apply_strided
 * is the one-pass call for V4.1, whose sequences carry no state).  No
 * memory allocated.
 */
int engram_apply_seqs(engram_applier *a, size_t n, const void *const *rows, engram_dtype rows_dtype,
                      void *const *residuals, engram_dtype resid_dtype, const uint8_t *mask,
                      float *const *states, engram_error *err);

/* The projection alone: kv [n][(S+1)W] as F32 for n tokens (no mask, no
 * gate; for engines that gate elsewhere, and for tests).  -EINVAL, -EDOM
 * (non-finite rows, nothing written). */
int engram_project(engram_applier *a, const void *rows, engram_dtype rows_dtype, size_t n,
                   float *kv, engram_error *err);

/* ------------------------------------------------------------------ reader */

/*
 * Page-cache-free concurrent row reads.  A reader owns its own descriptor on
 * the very file the model validated (reopened through the model's
 * descriptor, so a file renamed over the path since is never read: where
 * /proc is missing the path is reopened and must name the same device and
 * inode, else -ESTALE), with O_DIRECT where the filesystem allows it
 * (alignment from statx; at least 8 reads must fit in the buffer budget);
 * otherwise buffered reads that drop what they read (RWF_DONTCACHE where the
 * kernel has it, else posix_fadvise(DONTNEED)).  It owns one I/O engine and
 * all its buffers, allocated at open: ENGRAM_READER_MAX_BYTES at most,
 * whatever the batch, prompt or table size.  One reader per thread/session;
 * many readers may share one model (from any threads).
 *
 * Reads in flight: every call returns with no read of its own in flight,
 * except step_submit, whose reads are collected by step_wait / step_poll /
 * step_cancel / reader_close.  Each of these reaps (after cancelling, where
 * the call ends early) every read before its buffer is reused or freed.
 * Transient failures are retried inside the call: -EINTR, -EAGAIN and
 * -EBUSY from the kernel ring (bounded: about 0.1 s of refusals in a row),
 * reads that come back short or with -EAGAIN (resubmitted for what is
 * missing, at most 8 times a read).  After any failure the reader is
 * exactly as usable as before, with one exception: if the engine itself
 * stops returning completions (its reap fails 8 times in a row while reads
 * are in flight), the reader is marked broken (stats.broken; every call
 * then fails with -EIO saying so) and close() never frees its buffers,
 * since the kernel may still write into them.
 */
typedef enum engram_io_engine {
    ENGRAM_IO_AUTO = 0,   /* io_uring where the kernel allows it, else threads;
                             the buffered fallback where O_DIRECT is refused   */
    ENGRAM_IO_URING,      /* io_uring: registered file, fixed buffers, batched;
                             needs O_DIRECT (else open fails with -EINVAL)     */
    ENGRAM_IO_THREADS,    /* a pool of pread threads on the O_DIRECT descriptor
                             (likewise -EINVAL without O_DIRECT)               */
    ENGRAM_IO_BUFFERED    /* the fallback, forced: cached fd, drop-behind reads */
} engram_io_engine;


#define ENGRAM_BATCH_TOKENS 2048     /* tokens per de-duplicated chunk          */
#define ENGRAM_READER_MAX_DEPTH 512
/* Everything a reader allocates besides its optional row cache (which is
 * exactly the size the caller asks for): the request array of one chunk
 * (2048 x 24 x 8 bytes = 384 KiB), I/O buffers (<= 512 KiB: in-flight reads
 * are capped at 512 KiB / (2 x DIO alignment)), the engine's rings and
 * bookkeeping, and a batch's rows between their arrival and their delivery
 * (up to 64 rows with their records, 24 KiB; fewer where the rest leaves
 * less of this bound).  The thread-pool engines also start
 * ENGRAM_READER_THREADS(depth) threads (<= 256), each with a 64 KiB stack. */
#define ENGRAM_READER_MAX_BYTES (1u << 20)
/* The threads a thread-pool reader (ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED,
 * or AUTO where io_uring is refused) runs for `depth` slots: one per two.
 * Each blocks in one read at a time, so the device sees this many at once;
 * the other slots' reads wait queued and go to the first thread free, which
 * then needs no wake-up from the reader (measured on 2 cores: more reads/s
 * than a thread per slot at depths 32, 64 and 128, and shorter decode steps
 * at 64; BENCHMARKS.md).  Where more reads at the device pay, a larger
 * depth gives more threads. */
#define ENGRAM_READER_THREADS(depth) (((depth) + 1u) / 2u)

/*
 * Host-memory hooks, for callers that move rows on to an accelerator: reg
 * is called once for each buffer that reads land in or rows are delivered
 * into and that the library allocates itself (a reader's I/O buffers at
 * open, where O_DIRECT reads are written by the device; a prefill's rings
 * at begin when the caller gives none), before its first use; unreg with
 * the same pointer and length before it is freed.  For a GPU: page-lock
 * it (cudaHostRegister; engram_cuda_host_hooks in engram_cuda.h fills
 * these), so copies from it to the device are asynchronous DMA.  A reg
 * that returns < 0 is not an error: the buffer is used unregistered (and
 * unreg is not called for it).  Called from the thread that opens or
 * begins; the hooks must not call back into the library.
 */
typedef struct engram_host_hooks {
    int (*reg)(void *ctx, void *p, size_t len);
    void (*unreg)(void *ctx, void *p, size_t len);
    void *ctx;
} engram_host_hooks;

typedef struct engram_reader_opts {
    engram_io_engine engine;  /* AUTO honours ENGRAM_IO=uring|threads|buffered */
    unsigned depth;           /* reads in flight (io_uring's queue depth; a
                                 thread pool's slots, ENGRAM_READER_THREADS
                                 of them at the device at once); 0 = 64 */
    /* Row cache: 0 = none (the default).  Otherwise the reader keeps up to
     * cache_bytes of raw rows it has read and validated (about 273 bytes a
     * row, whole cache included) and serves repeats from memory: rows that
     * recur across batches and steps (frequent n-grams) cost no device read.
     * Allocated at open, fixed afterwards, owned by the reader, not shared
     * between readers; at least ENGRAM_READER_MIN_CACHE when not 0. */
    uint64_t cache_bytes;
    engram_host_hooks host;   /* optional (all NULL: none), see above        */
} engram_reader_opts;

#define ENGRAM_READER_MIN_CACHE (64u << 10)

typedef struct engram_io_stats {
    const char *engine;       /* "io_uring", "threads" or "buffered"           */
    const char *note;         /* why a fallback was taken, or ""               */
    int direct;               /* 1 if reads bypass the page cache (O_DIRECT)   */
    const char *drop;         /* buffered: "RWF_DONTCACHE" or "fadvise", else "" */
    uint32_t align;           /* read alignment in bytes (1 when buffered)     */
    unsigned depth;           /* effective depth (opts.depth within the buffers' budget) */
    uint64_t reserved_bytes;  /* memory the reader holds (<= READER_MAX_BYTES) */
    uint64_t rows_requested;  /* rows asked for (with duplicates)              */
    uint64_t rows_read;       /* distinct rows actually read                   */
    uint64_t bytes_read;      /* bytes transferred from the file               */
    uint64_t batches;
    uint64_t steps;           /* decode steps completed successfully           */
    uint64_t steps_cancelled; /* by engram_reader_step_cancel                  */
    uint64_t retries;         /* transient refusals retried and reads
                                 resubmitted (short, -EAGAIN, -EINTR)          */
    unsigned in_flight;       /* reads queued and not yet reaped (0 between
                                 calls unless a step is in flight)             */
    int broken;               /* 1: the engine failed for good (see above)     */
    /* Row cache (all 0 without one): its memory (besides reserved_bytes),
     * capacity in rows, and rows served from it (counted in rows_requested,
     * not in rows_read). */
    uint64_t cache_bytes, cache_rows, cache_hits;
    /* Bytes of the reader's I/O buffers that the host hooks registered (0
     * without hooks, or if reg refused). */
    uint64_t host_registered;
    /* Decode-step latency (submit to completion of all 48 rows), ns. */
    uint64_t step_p50_ns, step_p99_ns, step_p999_ns, step_max_ns;
} engram_io_stats;

typedef struct engram_reader engram_reader;

/* opts may be NULL (defaults).  Errors: errno of open/io_uring setup,
 * -EINVAL for a forced engine that cannot run on this file, -ESTALE (see
 * above), -ENOMEM; err says what failed.  Nothing is left open on failure.
 * The model must outlive the reader. */
int engram_reader_open(const engram_model *m, const engram_reader_opts *opts,
                       engram_reader **out, engram_error *err);
void engram_reader_close(engram_reader *r);

/*
 * The reader serves every member of the family; what V4.1 says below in
 * its numbers (2 tables, 24 rows per table and token, 48 per token, rows
 * of 256 values, 264 bytes raw), the PLE member says in its own (family:
 * 1 table, 16 rows per token, rows of 160 BF16 values, 320 bytes raw: RAW
 * and BF16 are then the same bytes, F32 the values widened exactly; its
 * rows are all valid, so -EDOM never comes from a PLE row).
 *
 * Batch read of table t for n tokens.  rows points at the first token's 48
 * row ids as engram_hash_tokens writes them (stride = 48 uint32 per token;
 * the table's 24 columns are taken from it; PLE: 16 per token as
 * engram_ple_hash writes them, t = 0).  out receives [n][24][256]
 * values of dtype.  The batch is processed in ENGRAM_BATCH_TOKENS-token
 * chunks; within a chunk the requests are sorted and each distinct row is
 * read once (or taken from the row cache).  Row ids are validated before
 * any read (-EINVAL naming the token, nothing written).  Read errors: -EIO
 * (short read: the file ends inside the row) or the errno of the read, and
 * -EDOM for a row that does not decode, with err naming the row and its
 * file offset; out is then partly written.  No heap memory is allocated
 * (the requests are sorted in place in the reader's own buffers).
 */
int engram_reader_batch(engram_reader *r, int t, const uint32_t *rows, size_t n,
                        engram_dtype dtype, void *out, engram_error *err);

/*
 * The same for prompts of any length with bounded caller memory: the output
 * goes to `window` ([window_tokens][24][256] of dtype, caller-owned) one
 * chunk of min(window_tokens, ENGRAM_BATCH_TOKENS) tokens at a time, and
 * sink(ctx, first_token, n_tokens, window) is called after each chunk; a
 * non-zero return from sink stops the batch and is returned.
 */
typedef int (*engram_batch_sink)(void *ctx, size_t first_token, size_t n_tokens,
                                 const void *window);
int engram_reader_batch_stream(engram_reader *r, int t, const uint32_t *rows, size_t n,
                               engram_dtype dtype, void *window, size_t window_tokens,
                               engram_batch_sink sink, void *ctx, engram_error *err);

/* Decode step: starts reading one token's 48 rows (both tables; rows[48])
 * into out ([48][256] of dtype: table 0's 24 rows, then table 1's; PLE:
 * rows[16], out [16][160]) and returns at once.  One step may be in flight per reader (-EBUSY otherwise; batches
 * also answer -EBUSY meanwhile).  out must stay valid until wait, poll or
 * cancel has ended the step (or the reader is closed).  If submit fails,
 * no step is in flight and nothing of it is left reading.  No heap memory. */
int engram_reader_step_submit(engram_reader *r, const uint32_t *rows,
                              engram_dtype dtype, void *out, engram_error *err);
/* Waits for the step; 0 when all 48 rows are decoded, or the error (out
 * then partly written).  Either way the step is over. */
int engram_reader_step_wait(engram_reader *r, engram_error *err);
/* Completes what has arrived without blocking: 0 done, -EAGAIN pending, or
 * the step's error once its other reads are collected (until then -EAGAIN). */
int engram_reader_step_poll(engram_reader *r, engram_error *err);
/* Abandons the step in flight: cancels its reads, waits for those the
 * device already has, and returns; out is then partly written and no
 * longer touched.  0, or -EINVAL if no step is in flight.  Closing a reader
 * with a step in flight does the same. */
int engram_reader_step_cancel(engram_reader *r);

/* Fills *st with the reader's facts and its counters since open or the
 * last engram_reader_reset_stats (which zeroes them and the step latency
 * histogram).  Its strings (engine, note, drop) are static or owned by the
 * reader.  Like every call on a reader, not concurrent with its others. */
void engram_reader_get_stats(const engram_reader *r, engram_io_stats *st);
void engram_reader_reset_stats(engram_reader *r);

/* ------------------------------------------------------------------ sessions */

/*
 * Many sequences of one model, each a session, share one pool: the pool
 * owns the I/O machinery (one uncached reader with its engine, slots and
 * buffers) and one I/O thread that issues every session's reads, merges
 * reads of the same row wanted by several sessions at once, decodes rows
 * into the sessions' buffers and wakes whoever waits for them.  A session
 * is its hash history and the state of its current step or prefill:
 * sizeof(struct) <= ENGRAM_SESSION_MAX_BYTES besides the caller's buffers;
 * a PLE session holds besides its convolution state twice (committed and
 * tentative): 2 x family.state_floats x 4 bytes (720 KiB at W = 2560,
 * T = 4; a model whose state has fewer than ENGRAM_MAX_DRAFT frames adds
 * 8 frames of 4W floats to the tentative one), allocated at open.
 *
 * Members: what is said below in V4.1's numbers (2 tables, 24 rows per
 * table and token, 48 per token, rows of 256 values or 264 bytes) holds
 * for a PLE model in its own (engram_family: 1 table, 16 rows per token,
 * rows of 160 BF16 values or 320 bytes: RAW and BF16 are the same bytes,
 * F32 the values widened).  Masks (mask NULL or [n] of the tokens): V4.1
 * reads mask[i] == 0 as masked (a dead history entry, nothing read),
 * anything else as a token.  PLE: ENGRAM_MASK_PAD (0: padding, hashed as
 * EOS, nothing read, its rows in out untouched, a zero frame for the
 * convolution), ENGRAM_MASK_TEXT (1) or ENGRAM_MASK_IMAGE (2: hashed as
 * the image token, or EOS where the file has none; its rows are read);
 * any other value is -EINVAL naming its position.  Every token is checked
 * against the vocabulary, padding included.  History (engram_history):
 * PLE id[0] = the previous id as the hash reads it (lag 1), id[1] = the
 * one before (lag 2), id[2] = -1; a new session is at a sequence start
 * (both lags EOS, as engram_ple_history_reset).
 *
 * Order of service: decode steps before prefill chunks; among steps, the
 * oldest first, and every waiting step's table-0 rows (needed at layer 1)
 * before any step's table-1 rows (needed at layer 14); prefills share the
 * slots the steps leave (less a reserve of 8 for steps arriving meanwhile)
 * in equal turns, so a prompt's first chunk waits for its share of the
 * device, not for the prompts begun before it to finish.  Prompts with
 * reads to do always keep a few slots (prefill_min_slots, an eighth of the
 * depth by default), so a decode load that would take every slot slows
 * them down but cannot stop them.
 *
 * Threads: the pool's functions may be called from any threads.  Calls on
 * one session that start or end something (begin, commit, abort, close,
 * set_history, restore, engram_session_load / _save, engram_step_apply,
 * prefill begin/end/cancel; engram_prefill_apply on the prefill) must not run concurrently
 * with any other call on that session; its waits, polls and getters may run
 * concurrently with each other from several threads (an engine whose
 * pipeline stages wait for layer 1's rows and layer 14's rows on two
 * threads: one stage waits for table 0, the other for table 1, and one of
 * them commits after both waits have returned).  A wait that is in progress
 * when its step ends (commit or abort on another thread) returns
 * -ECANCELED; close must not run while any other call on the session does
 * (it frees the session).  Different sessions may be used concurrently from
 * any number of threads.
 *
 * Decode: engram_step_begin() validates and hashes the step's tokens
 * (1, or up to ENGRAM_MAX_DRAFT draft tokens for speculative decoding),
 * queues their reads and returns at once; engram_step_wait(s, t) blocks
 * until table t's rows of every token of the step are in `out` (table 0
 * before layer 1, table 1 before layer 14); then the caller applies, and
 * ends the step with commit(j) (the history takes the first j tokens, j <=
 * k) or abort (history unchanged).  The history changes only in a commit
 * after a step whose reads all succeeded, and a wait returns 0 only once
 * every row of that table of the step was written into `out` (each row
 * request is answered exactly once).  Masked tokens read nothing (their
 * rows in `out` are left as they were).
 *
 * Lifetimes: closing a session never waits for the device: a read still in
 * flight for it is collected by the pool, which frees the session's memory
 * when the read is back (nothing is written into the caller's buffers after
 * close returns).  Closing the pool with sessions or prefills still open is
 * allowed: every step and prefill in progress fails with -ESHUTDOWN (a
 * step whose reads had all come in before the close keeps its rows: its
 * waits return them), every read is collected, and the handles stay
 * valid: every later begin fails
 * with -ESHUTDOWN, waits return their step's or prefill's error, and close,
 * end and cancel release them (the last one frees what is left of the
 * pool).  The model must outlive the pool and all its sessions.
 */
typedef struct engram_pool engram_pool;
typedef struct engram_session engram_session;

#define ENGRAM_MAX_DRAFT 8u               /* tokens of one step             */
#define ENGRAM_SESSION_MAX_BYTES 4096u    /* a session's own memory (V4.1; PLE
                                             adds its state, see above)     */
#define ENGRAM_MASK_PAD 0u                /* session masks: padding / masked */
#define ENGRAM_MASK_TEXT 1u               /* a token                         */
#define ENGRAM_MASK_IMAGE 2u              /* PLE: an image position          */
#define ENGRAM_ROUND_TOKENS 512u          /* tokens the I/O thread merges into one round of reads */
#define ENGRAM_FOREVER UINT64_MAX         /* timeout_ns: no limit           */
#define ENGRAM_RING_CACHE_DEFAULT (256ull << 20) /* bytes of free prefill rings a pool keeps */
#define ENGRAM_MAX_SHARDS 65536u          /* shard_world accepted            */

typedef struct engram_pool_opts {
    engram_reader_opts reader;   /* engine, depth, row cache of the pool's reader */
    /* Prefill rings the pool allocates (prompts given no opts.ring_mem) are
     * kept when their prefill ends, up to 4 rings totalling at most this
     * many bytes (0 = ENGRAM_RING_CACHE_DEFAULT), and reused by later
     * prompts that fit: host hooks (a GPU's page-locking) run once per
     * ring, not once per prompt.  Freed at engram_pool_close. */
    uint64_t ring_cache_bytes;
    /* Reads in flight prompts keep while they have reads to do, whatever
     * the steps want (0 = an eighth of the reader's depth, at least 1):
     * steps come first, but a decode load that would take every slot
     * cannot starve a prompt's first chunk. */
    unsigned prefill_min_slots;
    /* Row-block shards (issue #24): with shard_world > 1 this pool serves
     * rank shard_rank's block of every table: of a table's R rows it reads
     * only rows [floor(rank * R / world), floor((rank + 1) * R / world))
     * (the reference's ParallelEngramEmbedding partition), and a step's or
     * prefill chunk's other rows are delivered as zero bytes (BF16 +0, F32
     * +0, RAW all-zero 264/320 bytes): the bitwise OR (or the sum) of the
     * world's outputs is the unsharded output, bit for bit.  0 or 1: the
     * whole table.  shard_rank < shard_world <= 65536 (-EINVAL otherwise).
     * What changes with shards: a step (begin, _many, _batch) requests only
     * its block's rows, and begin writes the zeros of the others into out
     * before anything is queued (under the pool's lock: nothing of a step
     * is written after it ends, as unsharded); a wait for table t returns
     * once the block's rows of t are in (a step with none is ready at
     * once), and engram_step_info.rows counts them.  A prefill's chunks:
     * the same in the ring, each chunk de-duplicated as unsharded.  Masked
     * tokens (PLE: padding) stay untouched.  Rows are checked to decode
     * (RAW too) as unsharded, the block's only.  The pool's counters
     * (engram_pool_stats) count this rank's requests and reads: over the
     * world they add up to the unsharded pool's for the same work, each
     * distinct row being one rank's.  engram_step_apply, _apply_batch and
     * engram_prefill_apply refuse a sharded pool (-EINVAL: partial rows):
     * combine the ranks' rows first (libengram-mpi), then apply them with
     * engram_apply_strided / engram_apply_seq.  Memory: none more.
     * On a shard file (engram_model_info.shard.world > 1, `engram shard`)
     * shard_rank and shard_world must be the file's (-EINVAL naming both
     * otherwise): the pool then reads the file's block, the very rows a
     * pool of that rank reads of the whole file. */
    unsigned shard_rank, shard_world;
} engram_pool_opts;

/* Failures: a read that fails fails only the step or prefill chunk that
 * needed it (the error names the row); the pool goes on.  If the pool's
 * reader breaks (its engine stops answering, see the reader), every step
 * and prefill in progress fails at once with -EIO (histories unchanged,
 * their buffers no longer written), every later begin is refused with
 * -EIO, and engram_pool_get_stats reports io.broken = 1: close the
 * sessions and the pool and open another.  Closing does not wait for the
 * dead engine's reads (their memory is kept, as for the reader).
 *
 * Opens the pool (its reader, the I/O thread).  Memory: the reader's
 * (ENGRAM_READER_MAX_BYTES + its cache) + 4 rounds of ENGRAM_ROUND_TOKENS
 * tokens' requests (about 1.2 MiB) + a 256 KiB stack + the ring cache
 * (above).  The model must outlive the pool.  Errors: -EINVAL naming
 * shard_rank or shard_world (checked first, nothing opened), as
 * engram_reader_open, -ENOMEM, -EAGAIN (thread). */
int engram_pool_open(const engram_model *m, const engram_pool_opts *opts, engram_pool **out,
                     engram_error *err);
/* Stops the I/O thread after collecting every read in flight (see
 * "Lifetimes" above for sessions and prefills still open). */
void engram_pool_close(engram_pool *p);

typedef struct engram_pool_stats {
    engram_io_stats io;          /* the reader's facts at open and broken;
                                    rows_requested counts every request,
                                    rows_read the distinct rows read       */
    uint64_t steps;              /* steps begun                              */
    uint64_t rounds;             /* rounds of merged step reads              */
    uint64_t step_rows_requested, step_rows_read; /* of steps: requested vs distinct reads */
    uint64_t prefill_chunks;     /* chunk reads of prefills finished         */
    uint64_t prefill_rows_requested, prefill_rows_read;
    uint64_t prefill_rings_allocated; /* rings the pool allocated (and passed to reg) */
    uint64_t prefill_rings_reused;    /* prefills served by a kept ring     */
    uint64_t prefill_ring_bytes;      /* bytes of rings held now, in use or kept */
    int closed;                  /* engram_pool_close has begun              */
} engram_pool_stats;
/* Fills *st (caller-owned) with the pool's counters since open; may be
 * called from any thread at any time (it takes the pool's lock briefly).
 * st->io's strings are owned by the pool, valid until engram_pool_close. */
void engram_pool_get_stats(engram_pool *p, engram_pool_stats *st);

/* A session at a sequence's start, idle: V4.1's history all dead; PLE's
 * lags both EOS and its convolution state all +0.  -ENOMEM, -ESHUTDOWN. */
int engram_session_open(engram_pool *p, engram_session **out, engram_error *err);
/* Ends a step in progress (as abort), cancels a prefill in progress and
 * lets go of it (the prefill's handle stays valid: its waits for chunks not
 * yet read return -ECANCELED, end returns -ECANCELED, and end or cancel
 * must still be called to free it), and releases the session.  Returns at
 * once: nothing is written into the step's buffer afterwards. */
void engram_session_close(engram_session *s);
/* The committed history (3 ints; for V4.1 a copy is the whole state; a
 * PLE session also has its convolution state: engram_session_save takes
 * both). */
void engram_session_history(const engram_session *s, engram_history *h);
/* Restore from a snapshot (validated: -EINVAL, unchanged) or rebuild from
 * the last min(n, 3) tokens of a sequence through the token map, mask as
 * in engram_hash_tokens (a masked token is a dead entry); PLE: from the
 * last 2 raw ids by its own rules (ENGRAM_MASK_*), the convolution state
 * left as it is (it depends on residuals, not only tokens:
 * engram_session_load restores it).  -EBUSY while a step or prefill is in
 * progress. */
int engram_session_set_history(engram_session *s, const engram_history *h, engram_error *err);
int engram_session_restore(engram_session *s, const uint32_t *tokens, const uint8_t *mask,
                           size_t n, engram_error *err);

/* Starts a step of k tokens (1 .. ENGRAM_MAX_DRAFT; mask NULL or [k]).  out:
 * [k][48][256] of dtype (BF16 / F32), or [k][48][264] bytes (ENGRAM_RAW);
 * per token table 0's 24 rows then table 1's (a table's rows of a step are
 * then tokens 48 rows apart: engram_apply_strided takes them as they are).
 * out must stay valid until the step ends (commit, abort, close).  Tokens
 * are validated and hashed first (-EINVAL naming the token, nothing
 * queued); -EBUSY if a step or prefill is in progress; -ESHUTDOWN after
 * engram_pool_close; -EIO with a broken pool.  No heap memory. */
int engram_step_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, unsigned k,
                      engram_dtype dtype, void *out, engram_error *err);

/* Steps of several sessions at once (continuous batching, with up to
 * ENGRAM_MAX_DRAFT draft tokens each for speculative decoding): validated
 * as a whole first (nothing is queued unless every session can begin; a
 * bad token is named by its position in the requests' tokens taken in
 * order), then queued together, so rows wanted by several of them are read
 * once.  Each request as engram_step_begin. */
typedef struct engram_step_req {
    engram_session *s;
    const uint32_t *tokens;      /* [k]                                      */
    const uint8_t *mask;         /* NULL or [k]                              */
    unsigned k;                  /* 1 .. ENGRAM_MAX_DRAFT                    */
    void *out;                   /* [k][48] rows of dtype                    */
} engram_step_req;
int engram_step_begin_many(const engram_step_req *reqs, size_t n, engram_dtype dtype,
                           engram_error *err);
/* The same with one token for each of n sessions: mask NULL or [n], outs[i]
 * as for engram_step_begin with k = 1. */
int engram_step_begin_batch(engram_session *const *s, const uint32_t *tokens, const uint8_t *mask,
                            size_t n, engram_dtype dtype, void *const *outs, engram_error *err);
/* Blocks until table t's rows of the step are in out: 0, or the error of a
 * read or a row that does not decode (err names the row), -ECANCELED (the
 * step ended meanwhile), -EINVAL (no step).  Timed: at most timeout_ns
 * (ENGRAM_FOREVER: no limit), then -ETIMEDOUT with nothing lost (the step
 * goes on; wait again).  Poll: 0, -EAGAIN (not yet) or the error. */
int engram_step_wait(engram_session *s, int table, engram_error *err);
int engram_step_wait_timed(engram_session *s, int table, uint64_t timeout_ns, engram_error *err);
int engram_step_poll(engram_session *s, int table, engram_error *err);
/* Ends the step keeping the history of its first j tokens (0 <= j <= k):
 * waits for the step's reads first (returning as soon as one failed).  If a
 * read failed: the error, history unchanged.  Either way the step is over. */
int engram_step_commit(engram_session *s, unsigned j, engram_error *err);
/* Ends the step without changing the history; returns at once: no row is
 * written into out after it returns.  No-op when no step is in progress. */
void engram_step_abort(engram_session *s);

typedef struct engram_step_info {
    unsigned k;                  /* tokens of the step                      */
    uint64_t begin_ns;           /* CLOCK_MONOTONIC at begin                */
    uint64_t ready_ns[ENGRAM_TABLES]; /* when each table's rows were all in (0: not yet) */
    unsigned rows[ENGRAM_TABLES];     /* rows the step asked for per table    */
} engram_step_info;
void engram_step_get_info(const engram_session *s, engram_step_info *info);

/*
 * Applies the step's rows of the table of a's layer to residual [k][S][W]
 * of resid_dtype (the step's k tokens; updated in place), with the step's
 * mask (masked / padding tokens untouched), after a wait for that table
 * returned 0 in this step (-EINVAL otherwise, naming the table).
 *  - V4.1: engram_apply_strided over the step's out (table t's rows of
 *    token i at row i * 48 + t * 24); the step's dtype BF16 or F32 (RAW:
 *    -EINVAL).  Call it once per table (layers 1 and 14).
 *  - PLE: engram_apply_seq over the step's BF16 rows (dtype BF16 or RAW,
 *    the same bytes; F32: -EINVAL), starting from the session's committed
 *    convolution state, into a tentative state (the session's; nothing
 *    allocated).  engram_step_commit(j) then makes the committed state the
 *    one after the step's first j tokens; abort, close, a commit of 0
 *    tokens or a failed step leave it as it was.  A commit without a
 *    step_apply in the step leaves the state unchanged (an engine that
 *    applies elsewhere, a GPU, keeps its own state).  Applying again in the
 *    same step starts again from the committed state (the residual is the
 *    caller's: pass the original).  The result is the same bits as one
 *    engram_apply_seq over the committed tokens (the batch invariance).
 * Errors: -EINVAL (a sharded pool, see engram_pool_opts; no step, a
 * table not waited for, a layer of another width or streams, dtypes),
 * engram_apply_strided's / engram_apply_seq's
 * (-EDOM: residuals of the tokens before the failing one updated; the
 * state is then not committed by this step).  Threads: a call that
 * starts or ends something (see "Threads" above): not concurrently with
 * other such calls on the session, nor with another apply on it.  Memory:
 * none allocated; the applier's workspace.
 */
int engram_step_apply(engram_session *s, engram_applier *a, void *residual, engram_dtype resid_dtype,
                      engram_error *err);

/*
 * engram_step_apply for n sessions whose steps have one token each
 * (batched decode), residuals[i] [S][W] the token of session ss[i].
 * PLE: one pass over the weights for all (engram_apply_seqs), each session
 * from its own committed state into its tentative one; each session's
 * residual, and its state at commit, are the bits engram_step_apply gives
 * it alone.  Every request is checked first (NULLs, sessions of one pool,
 * each once, a step of one token whose table 0 was waited for, BF16/RAW
 * rows; -EINVAL naming the request), then every request's inputs (rows,
 * residual and committed state finite: -EDOM naming the request); a
 * refused batch touches nothing (an earlier engram_step_apply of a session
 * stays in force).  A computed overflow (-EDOM, F32 overflow from extreme
 * inputs) leaves the requests before the failing one applied (they commit
 * as after engram_step_apply) and it and every later one not applied
 * (their residuals untouched; an earlier apply of theirs discarded).  V4.1:
 * engram_step_apply per session in order.  Threads: as engram_step_apply,
 * for every session named.  No memory allocated.
 */
int engram_step_apply_batch(engram_session *const *ss, size_t n, engram_applier *a,
                            void *const *residuals, engram_dtype resid_dtype, engram_error *err);

/*
 * A session's whole per-sequence state (its committed history, and for PLE
 * its committed convolution state), as bytes: a header (magic "ENGS",
 * version 1, member, state floats, width; host byte order: for this
 * machine's processes, not an interchange format), the 3 history ints,
 * then the state's floats (PLE: family.state_floats).  Size:
 * engram_session_state_bytes (40 bytes for V4.1; 40 + 4 x state_floats
 * for PLE, 368,680 at W = 2560, T = 4; 0 for NULL).
 * save: buf of at least that many bytes (-EINVAL otherwise); -EBUSY
 * during a step or prefill.  load: validated as a whole first (the size
 * exactly, magic, version, member, state floats and width of this pool's
 * model, the history as engram_session_set_history, every float finite:
 * -EINVAL naming what), then -EBUSY during a step or prefill; on any
 * error the session is unchanged.  Neither allocates.  A session loaded
 * from another's snapshot continues bit for bit as the other would.
 */
size_t engram_session_state_bytes(const engram_session *s);
int engram_session_save(const engram_session *s, void *buf, size_t len, engram_error *err);
int engram_session_load(engram_session *s, const void *buf, size_t len, engram_error *err);

/*
 * Prefill with prefetch: the prompt's tokens are validated first, then the
 * pool's I/O thread hashes and reads them chunk by chunk (chunk_tokens, each
 * chunk de-duplicated) into a ring of ring_chunks chunk buffers per table,
 * publishing each finished chunk (engram_prefill_ready, an atomic count);
 * the consumer waits per chunk and releases it, which frees its buffer for
 * a later chunk.  Table 1's reads start table1_delay_ns after the prefill
 * began, or at engram_prefill_start_table1() (its layer signal).  Memory:
 * the ring, 2 x ring_chunks x chunk_tokens x 24 rows of dtype, sized by the
 * prompt (a prompt shorter than a chunk gets a chunk of its length, and
 * the ring never has more chunks than the prompt: a 16-token prompt's BF16
 * ring is 393,216 bytes; at most 2 x 2 x 2048 x 24 x 512 B = 100 MB with
 * the defaults; engram_prefill_ring_bytes_for), taken from the pool's ring
 * cache or allocated at begin, given back at end or cancel (none with
 * opts.ring_mem) + 2 x chunk_tokens x 24 x 12 bytes of requests, whatever
 * the prompt's length.  Masked tokens read nothing.  The session's history
 * becomes that after the prompt at engram_prefill_end, if every chunk of
 * both tables was read.
 *
 * Two threads may wait for and release chunks of the two tables
 * concurrently (one per table); a table's chunks are waited for and
 * released in order by one thread.  With ENGRAM_PREFILL_MANUAL, call
 * engram_prefill_start_table1 (from either thread) before the first wait
 * for table 1: a wait for table 1 before it returns -EDEADLK at once (in a
 * pipelined engine the signal, at a layer before 14, comes before the
 * stage that waits for table 1 gets the chunk).
 */
typedef struct engram_prefill engram_prefill;

#define ENGRAM_PREFILL_MANUAL UINT64_MAX  /* table1_delay_ns: wait for start_table1 */

typedef struct engram_prefill_opts {
    unsigned chunk_tokens;       /* 0 = ENGRAM_BATCH_TOKENS                 */
    unsigned ring_chunks;        /* chunk buffers per table; 0 = 2          */
    engram_dtype dtype;          /* BF16, F32 or RAW                        */
    uint64_t table1_delay_ns;    /* 0: at once; ENGRAM_PREFILL_MANUAL        */
    /* Optional caller-owned memory for both tables' rings (for instance
     * page-locked once for a GPU and reused for every prompt): at least
     * engram_prefill_ring_bytes_for(opts, n) bytes (engram_prefill_ring_bytes
     * (opts) fits every prompt), 64-byte aligned, not touched by the caller
     * until end or cancel returns.  NULL: the ring comes from the pool. */
    void *ring_mem;
    size_t ring_bytes;
} engram_prefill_opts;

/* Bytes of ring memory a prefill with these options uses (both tables) for
 * a prompt of n_tokens, or for any prompt; 0 for options begin would
 * refuse. */
size_t engram_prefill_ring_bytes_for(const engram_prefill_opts *opts, size_t n_tokens);
size_t engram_prefill_ring_bytes(const engram_prefill_opts *opts);
/* The same for the prompts of a pool, in its model's numbers (the two
 * above are V4.1's, an upper bound for every member: a PLE ring is
 * smaller).  0 for NULL or options begin would refuse. */
size_t engram_pool_prefill_ring_bytes(const engram_pool *p, const engram_prefill_opts *opts,
                                      size_t n_tokens);

/* tokens and mask (NULL or [n]) must stay valid until end or cancel.
 * -EINVAL (a bad token, naming its position; options), -EBUSY, -ENOMEM,
 * -ESHUTDOWN, -EIO (a broken pool). */
int engram_prefill_begin(engram_session *s, const uint32_t *tokens, const uint8_t *mask, size_t n,
                         const engram_prefill_opts *opts, engram_prefill **out, engram_error *err);
size_t engram_prefill_chunks(const engram_prefill *pf);
/* Chunks of table t read so far (acquire load of the progress counter). */
size_t engram_prefill_ready(const engram_prefill *pf, int table);
/* Blocks until chunk c of table t is read: *rows -> [n_tokens][24][row]
 * (row: 256 values of dtype, or 264 bytes), tokens first .. first+n-1 of
 * the prompt; valid until engram_prefill_release(pf, t, c).  rows, first
 * and n_tokens are optional outputs (each may be NULL).  Errors: a
 * read's (err names the row), -ECANCELED (cancelled, or its session was
 * closed), -ESHUTDOWN (the pool closed), and for waits that could only
 * return a wrong buffer or never return: -EINVAL for a chunk already
 * released (or c >= chunks), -EDEADLK for a chunk beyond the ring (chunk c
 * needs chunk c - ring_chunks released first) and for table 1 before
 * engram_prefill_start_table1 with ENGRAM_PREFILL_MANUAL.  Timed: at most
 * timeout_ns, then -ETIMEDOUT with nothing lost (wait again). */
int engram_prefill_wait(engram_prefill *pf, int table, size_t c, const void **rows,
                        size_t *first, size_t *n_tokens, engram_error *err);
int engram_prefill_wait_timed(engram_prefill *pf, int table, size_t c, uint64_t timeout_ns,
                              const void **rows, size_t *first, size_t *n_tokens, engram_error *err);
void engram_prefill_release(engram_prefill *pf, int table, size_t c);
void engram_prefill_start_table1(engram_prefill *pf);

/*
 * Applies chunk c's rows of the table of a's layer (after a wait for it
 * returned 0, before its release: -EINVAL otherwise; a sharded pool's
 * prefill: -EINVAL, see engram_pool_opts) to that chunk's
 * residual [chunk tokens][S][W] of resid_dtype, with the prompt's mask.
 * A table's chunks are applied in order from 0 (-EINVAL naming the next
 * one otherwise), by the thread that waits for them.  V4.1: engram_apply
 * (the prefill's dtype BF16 or F32).  PLE: engram_apply_seq (dtype BF16
 * or RAW) carrying a prefill-local convolution state (see Memory below)
 * that starts from the session's committed
 * state; at engram_prefill_end the session's state becomes it if the
 * history is committed and every chunk was applied.  If no chunk was
 * applied the state is unchanged (an engine applying elsewhere); if some
 * were (engram_prefill_info.chunks_applied tells, before end), end
 * commits the history and leaves the state unchanged.  A failed apply
 * (any error: a refusal, or -EDOM as engram_apply_seq gives it) leaves the
 * prefill's state and its next chunk as they were, so the chunk may be
 * applied again (from its original residual: a computed overflow has
 * updated the tokens before the failing one).  Memory: the PLE state twice
 * (8 x state_floats bytes), allocated at begin.
 */
int engram_prefill_apply(engram_prefill *pf, size_t c, engram_applier *a, void *residual,
                         engram_dtype resid_dtype, engram_error *err);

typedef struct engram_prefill_info {
    size_t chunks;               /* of the prompt                            */
    unsigned chunk_tokens, ring_chunks; /* as sized for the prompt           */
    size_t ring_bytes;           /* both tables' rings                       */
    uint64_t begin_ns;           /* CLOCK_MONOTONIC at begin                 */
    size_t ready[ENGRAM_TABLES]; /* chunks read per table                    */
    size_t chunks_applied[ENGRAM_TABLES]; /* by engram_prefill_apply       */
    /* when each table's first chunk, and its latest, were published (0: none) */
    uint64_t first_ready_ns[ENGRAM_TABLES], last_ready_ns[ENGRAM_TABLES];
} engram_prefill_info;
void engram_prefill_get_info(const engram_prefill *pf, engram_prefill_info *info);

/* Ends the prefill: stops what is left, waits until the pool holds no read
 * of it, commits the history if every chunk of both tables was read and
 * its session is open (0), else returns the first error or -ECANCELED
 * (history unchanged).  Frees pf.  Timed: at most timeout_ns for the reads
 * in flight, then -ETIMEDOUT with pf still valid and stopping (call end,
 * end_timed or cancel again). */
int engram_prefill_end(engram_prefill *pf, engram_error *err);
int engram_prefill_end_timed(engram_prefill *pf, uint64_t timeout_ns, engram_error *err);
/* Stops the prefill, waits until the pool holds no read of it, frees it;
 * the history is unchanged.  No buffer of it is written after this
 * returns. */
void engram_prefill_cancel(engram_prefill *pf);

/* ------------------------------------------------------------------ old names */

/* Earlier names kept for one release as inline wrappers (nothing exported):
 * using one draws a deprecation warning; they go in the next release. */
#if defined(__GNUC__) || defined(__clang__)
#define ENGRAM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define ENGRAM_DEPRECATED(msg)
#endif

ENGRAM_DEPRECATED("use engram_reader_get_stats")
static inline void engram_reader_stats(const engram_reader *r, engram_io_stats *st)
{
    engram_reader_get_stats(r, st);
}

ENGRAM_DEPRECATED("use engram_pool_get_stats")
static inline void engram_pool_stats_get(engram_pool *p, engram_pool_stats *st)
{
    engram_pool_get_stats(p, st);
}

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_H */
