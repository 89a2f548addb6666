/*
 * ext.h - what the files of engram's Python module (engram._engram) share.
 *
 * The module is written against CPython's limited API of 3.8 (one abi3
 * build for every Python >= 3.8).  Types are heap types (PyType_FromSpec);
 * their objects and the exceptions are module globals (single-phase init:
 * one interpreter).
 *
 * Arrays come in two ways, never copied when the library writes into them:
 *  - the buffer protocol (NumPy arrays, bytearray, array.array, memoryview):
 *    PyObject_GetBuffer / PyBuffer_Release and Py_buffer joined the limited
 *    API in 3.11; their ABI has not changed since 3.3, so for 3.8-3.10 this
 *    file declares them itself (the functions are exported by every
 *    libpython 3).
 *  - DLPack (`__dlpack__`, `__dlpack_device__`: PyTorch, CuPy, JAX, NumPy):
 *    the capsule is held for the duration of the call and never consumed,
 *    so its producer's destructor frees it.
 */
#ifndef ENGRAM_PY_EXT_H
#define ENGRAM_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03080000
#endif
#include <Python.h>

#include <stdint.h>

#include "engram.h"

#if Py_LIMITED_API + 0 < 0x030b0000
typedef struct {
    void *buf;
    PyObject *obj;
    Py_ssize_t len;
    Py_ssize_t itemsize;
    int readonly;
    int ndim;
    char *format;
    Py_ssize_t *shape;
    Py_ssize_t *strides;
    Py_ssize_t *suboffsets;
    void *internal;
} Py_buffer;
PyAPI_FUNC(int) PyObject_GetBuffer(PyObject *obj, Py_buffer *view, int flags);
PyAPI_FUNC(void) PyBuffer_Release(Py_buffer *view);
#define PyBUF_WRITABLE 0x0001
#define PyBUF_FORMAT 0x0004
#define PyBUF_ND 0x0008
#define PyBUF_STRIDES (0x0010 | PyBUF_ND)
#define PyBUF_RECORDS_RO (PyBUF_STRIDES | PyBUF_FORMAT)
#endif

/* ------------------------------------------------------------- arrays */

/* Element kinds the module meets (EG_OTHER: anything else, refused). */
typedef enum eg_kind {
    EG_OTHER = 0,
    EG_BOOL,
    EG_I8, EG_U8, EG_I16, EG_U16, EG_I32, EG_U32, EG_I64, EG_U64,
    EG_F16, EG_BF16, EG_F32, EG_F64
} eg_kind;

/* Where an array's memory is (DLPack's device types; the buffer protocol is
 * host memory). */
enum { EG_DEV_CPU = 1, EG_DEV_CUDA = 2, EG_DEV_CUDA_HOST = 3, EG_DEV_CUDA_MANAGED = 13 };

#define EG_MAX_DIMS 8

/* An array borrowed from a Python object for the length of a call. */
typedef struct eg_array {
    void *data;                 /* first element                              */
    int ndim;
    int64_t shape[EG_MAX_DIMS];
    int64_t strides[EG_MAX_DIMS]; /* bytes                                    */
    eg_kind kind;
    int itemsize;
    int readonly;               /* 1 read-only; 0 writable (DLPack: no flag) */
    int device_type, device_id; /* EG_DEV_*                                  */
    const char *via;            /* "buffer" or "dlpack"                      */
    /* released by eg_array_release */
    Py_buffer view;
    int has_view;
    PyObject *capsule;
} eg_array;

/* Flags of eg_array_get. */
#define EG_WRITABLE 1u   /* the library writes into it: read-only refused     */
#define EG_CUDA 2u       /* device memory wanted (else host memory)           */

/* Borrows obj's memory as `arg` (the argument's name, for messages):
 * buffer protocol first, then __dlpack__ (with `stream`, for CUDA: a
 * cudaStream_t as an integer, or NULL).  Refuses (TypeError / ValueError
 * naming arg) objects that export neither, read-only memory when
 * EG_WRITABLE, memory on the wrong device.  0, or -1 with an exception. */
int eg_array_get(PyObject *obj, const char *arg, unsigned flags, PyObject *stream, eg_array *a);
void eg_array_release(eg_array *a);
/* 1 if the array is C-contiguous (row-major, no gaps) */
int eg_array_contiguous(const eg_array *a);
/* 1 if dims [from, ndim) are C-contiguous */
int eg_array_inner_contiguous(const eg_array *a, int from);
/* "float32", "bfloat16", ... */
const char *eg_kind_name(eg_kind k);
/* Describes the array's shape as "(2, 4, 64)" into buf. */
const char *eg_shape_str(const eg_array *a, char *buf, size_t len);

/* The residual of an apply, updated in place: (n, S, W) float32 or
 * bfloat16 (torch.bfloat16, or BF16 bit patterns as uint16), C-contiguous,
 * writable, borrowed as eg_array_get does (flags EG_WRITABLE is implied;
 * EG_CUDA for device memory, with `stream`).  n is the array's (*a's
 * shape[0]) unless n_want != SIZE_MAX, which it must then equal.  `noun`
 * names what is needed in the message ("array", "tensor").  0 with *a
 * held and *dt set, or -1 with an exception (TypeError for the dtype,
 * ValueError for the shape or layout) and nothing held. */
int eg_residual_arg(PyObject *o, unsigned flags, PyObject *stream, size_t n_want, unsigned S, unsigned W,
                    const char *noun, eg_array *a, engram_dtype *dt);

/* Token ids from a sequence of ints or any integer array (1-D), checked >= 0
 * and < 2^32, into a new uint32 buffer (PyMem_Free).  0 or -1 with an
 * exception naming arg. */
int eg_tokens(PyObject *obj, const char *arg, uint32_t **out, size_t *n);
/* An integer argument (an int or any object with __index__) into *v:
 * TypeError naming arg for anything else, ValueError naming arg when it
 * does not fit in [lo, hi] (huge ints included).  0 or -1. */
int eg_long_arg(PyObject *obj, const char *arg, long lo, long hi, long *v);
/* A mask: None (*out = NULL), or n bytes (bool or integer 0..255 arrays, or
 * a sequence of ints) into a new buffer (PyMem_Free). */
int eg_mask(PyObject *obj, const char *arg, size_t n, uint8_t **out);

/* A new NumPy array of the given shape and kind (numpy.empty), or NULL with
 * an exception (ImportError if NumPy is missing: pass out= instead). */
PyObject *eg_numpy_empty(int ndim, const int64_t *shape, eg_kind kind);
/* obj[index] for an int or a tuple of slices made from (start, stop) pairs
 * on the first axes: views, as NumPy and torch give them. */
PyObject *eg_slice_axis1(PyObject *obj, Py_ssize_t start, Py_ssize_t stop);

/* ------------------------------------------------------------- errors */

/* engram.Error (OSError) and its subclasses */
extern PyObject *eg_Error, *eg_ArgumentError, *eg_DataError, *eg_ModelError, *eg_NotFoundError,
    *eg_TimeoutError, *eg_CancelledError, *eg_ClosedError, *eg_BusyError;

/* Fills err as the library fills one (code, msg; no offset, no row) for a
 * failure found by the binding itself; returns code. */
int eg_set_err(engram_error *err, int code, const char *msg);

/* Raises the exception for a library error: the class by code, errno =
 * -code, strerror = err's message (or engram_strerror) prefixed by what,
 * and the attributes code, offset and row (None when the library has
 * none).  Returns NULL (for `return eg_raise(...)`). */
PyObject *eg_raise(int code, const engram_error *err, const char *what);
/* The same, returning -1. */
int eg_raise_int(int code, const engram_error *err, const char *what);

/* ------------------------------------------------------------- objects */

typedef struct eg_model {
    PyObject_HEAD
    engram_model *m;
    engram_model_info info;
    PyObject *path;
    int users;                  /* open Layers and Pools made from it         */
} eg_model;

typedef struct eg_history {
    PyObject_HEAD
    engram_member member;
    engram_history h;           /* V4.1                                       */
    engram_ple_history ph;      /* PLE                                        */
    uint32_t eos;               /* PLE: the reset value                       */
} eg_history;

extern PyObject *eg_ModelType, *eg_HistoryType, *eg_LayerType;

/* Model and History types (model.c), Layer (layer.c), the pool's types
 * (pool.c), each adding its types to the module: 0 or -1. */
int eg_model_init(PyObject *module);
int eg_layer_init(PyObject *module);
int eg_pool_init(PyObject *module);

/* A new History at a sequence start for model m. */
PyObject *eg_history_new(const eg_model *m);
/* obj is None or a History of m's member: *out = it or NULL.  0 / -1. */
int eg_history_arg(PyObject *obj, const eg_model *m, eg_history **out);

/* Dealloc for a heap type's object (frees and drops the type's reference). */
void eg_heap_free(PyObject *self);

#endif
