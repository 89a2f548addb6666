/*
 * gguf.h - GGUF v2/v3 reader and writer (little-endian files).
 *
 * The reader parses the header through a bounds-checked cursor on a file
 * descriptor: metadata scalars and strings are loaded, arrays are recorded
 * by file offset and read on demand, tensor data is never read.  Every size
 * product is overflow-checked; errors name the key or tensor and the byte
 * offset.  Memory is bounded by GGUF_MAX_META_BYTES whatever the file says.
 */
#ifndef ENGRAM_GGUF_H
#define ENGRAM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4,
    GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8,
    GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
    GGUF_NTYPES
};

/* ggml tensor types this project names (ids from ggml). */
enum ggml_type_id {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q8_0 = 8, GGML_Q3_K = 11,
    GGML_I8 = 24, GGML_BF16 = 30
};

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_KEY 65535u              /* bytes in a key                   */
#define GGUF_MAX_NAME 255u               /* bytes in a tensor name           */
#define GGUF_MAX_META_BYTES (64u << 20)  /* loaded keys, strings, infos      */
#define GGUF_MAX_ITEMS (1u << 20)        /* keys, tensors                    */

typedef struct gguf_kv {
    char *key;
    uint32_t type;          /* enum gguf_vtype                                */
    uint64_t key_offset;    /* file offset where the key starts               */
    uint64_t value_offset;  /* file offset of the value (arrays: 1st element) */
    uint64_t u;             /* unsigned/bool scalars, zero-extended           */
    int64_t i;              /* signed scalars, sign-extended                  */
    double f;               /* float scalars                                  */
    char *str;              /* GGUF_STRING: NUL-terminated copy               */
    uint64_t str_len;
    uint32_t arr_type;      /* GGUF_ARRAY: element type and count             */
    uint64_t arr_count;
} gguf_kv;

typedef struct gguf_tensor {
    char *name;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS];  /* innermost first; unused dims are 1     */
    uint32_t type;                 /* ggml type id                           */
    uint64_t offset;               /* absolute file offset of the data       */
    uint64_t bytes;
    uint64_t info_offset;          /* file offset of the tensor info         */
} gguf_tensor;

typedef struct gguf_file {
    int fd;                 /* owned; O_RDONLY | O_CLOEXEC                   */
    uint64_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;   /* in file order of their infos                  */
} gguf_file;

int gguf_open(const char *path, gguf_file **out, engram_error *err);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);

/* Reads an array value into out (count elements of the given type, host
 * order).  -EBADMSG naming the key if its type or length differ. */
int gguf_read_array(const gguf_file *g, const gguf_kv *kv, uint32_t elem_type,
                    uint64_t count, void *out, engram_error *err);

const char *gguf_vtype_name(uint32_t t);
const char *ggml_type_name(uint32_t t);   /* NULL for unknown ids */

/* ---------------------------------------------------------------- writer */

/* Writes tensor data at [offset, offset + bytes) of fd; 0 or -errno. */
typedef int (*gguf_fill_fn)(void *ctx, int fd, uint64_t offset, uint64_t bytes);

typedef struct gguf_writer gguf_writer;

/* A low-level writer: it records what it is given (even duplicates or odd
 * types, which tests need) and lays the file out.  version is 2 or 3. */
gguf_writer *gguf_writer_new(uint32_t version, uint32_t alignment);
void gguf_writer_free(gguf_writer *w);

int gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* Any scalar type: v holds the value's bytes (little-endian), size by type. */
int gguf_w_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v);
/* An array of fixed-size elements (copied). */
int gguf_w_array(gguf_writer *w, const char *key, uint32_t elem_type,
                 const void *data, uint64_t count);

/* A key whose value is given as its serialized bytes (an array: its element
 * type, count and elements), copied as they are: for copying keys of one
 * file into another. */
int gguf_w_raw(gguf_writer *w, const char *key, uint32_t type, const void *value, size_t n);

int gguf_w_array_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t count);

/* A tensor; fill == NULL leaves its bytes as a hole (zeros).  align_to, if
 * larger than the file alignment, aligns this tensor's absolute offset. */
int gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type,
                  uint32_t n_dims, const uint64_t *dims, uint64_t align_to,
                  gguf_fill_fn fill, void *ctx);

/* Lays out and writes the whole file to fd (which must be empty). */
int gguf_w_write_fd(gguf_writer *w, int fd, engram_error *err);

/* Bytes of a tensor of this type and shape; -1 on unknown type/overflow. */
int ggml_tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *dims,
                      uint64_t *bytes);

#endif
