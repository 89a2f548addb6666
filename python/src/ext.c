/*
 * ext.c - engram._engram: the module, its exceptions, and the borrowing of
 * arrays (buffer protocol, DLPack) that every call shares.
 */
#include "ext.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

PyObject *eg_Error, *eg_ArgumentError, *eg_DataError, *eg_ModelError, *eg_NotFoundError,
    *eg_TimeoutError, *eg_CancelledError, *eg_ClosedError, *eg_BusyError;

void eg_heap_free(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------- errors */

static PyObject *error_class(int code)
{
    switch (code) {
    case -EINVAL: case -ERANGE: case -E2BIG: return eg_ArgumentError;
    case -EDOM: return eg_DataError;
    case -EBADMSG: case -ENOTSUP: case -ESTALE: return eg_ModelError;
    case -ENOENT: return eg_NotFoundError;
    case -ETIMEDOUT: return eg_TimeoutError;
    case -ECANCELED: return eg_CancelledError;
    case -ESHUTDOWN: case -EBADF: return eg_ClosedError;
    case -EBUSY: return eg_BusyError;
    default: return eg_Error;
    }
}

static int set_attrs(PyObject *e, int code, const engram_error *err)
{
    PyObject *c = PyLong_FromLong(code);
    PyObject *off = err && err->offset != ENGRAM_NO_OFFSET ? PyLong_FromUnsignedLongLong(err->offset)
                                                            : (Py_INCREF(Py_None), Py_None);
    PyObject *row = err && err->row != ENGRAM_NO_ROW ? PyLong_FromUnsignedLongLong(err->row)
                                                      : (Py_INCREF(Py_None), Py_None);
    int rc = c && off && row && PyObject_SetAttrString(e, "code", c) == 0 &&
                     PyObject_SetAttrString(e, "offset", off) == 0 &&
                     PyObject_SetAttrString(e, "row", row) == 0
                 ? 0 : -1;
    Py_XDECREF(c);
    Py_XDECREF(off);
    Py_XDECREF(row);
    return rc;
}

int eg_set_err(engram_error *err, int code, const char *msg)
{
    memset(err, 0, sizeof *err);
    err->code = code;
    err->offset = ENGRAM_NO_OFFSET;
    err->row = ENGRAM_NO_ROW;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return code;
}

PyObject *eg_raise(int code, const engram_error *err, const char *what)
{
    if (code >= 0)
        code = -EIO;
    char msg[400];
    const char *text = err && err->code == code && err->msg[0] ? err->msg : engram_strerror(code);
    if (what && *what)
        snprintf(msg, sizeof msg, "%s: %s", what, text);
    else
        snprintf(msg, sizeof msg, "%s", text);
    PyObject *cls = error_class(code);
    /* paths in messages are bytes, and snprintf may cut a character: never
     * let the message's decoding replace the error */
    PyObject *m = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (!m)
        return NULL;
    PyObject *e = PyObject_CallFunction(cls, "iO", -code, m);
    Py_DECREF(m);
    if (!e)
        return NULL;
    if (set_attrs(e, code, err) == 0)
        PyErr_SetObject(cls, e);
    Py_DECREF(e);
    return NULL;
}

int eg_raise_int(int code, const engram_error *err, const char *what)
{
    eg_raise(code, err, what);
    return -1;
}

/* ------------------------------------------------------------- DLPack ABI */

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

static eg_kind dl_kind(DLDataType t)
{
    if (t.lanes != 1)
        return EG_OTHER;
    switch (t.code) {
    case kDLInt: return t.bits == 8 ? EG_I8 : t.bits == 16 ? EG_I16 : t.bits == 32 ? EG_I32
                      : t.bits == 64 ? EG_I64 : EG_OTHER;
    case kDLUInt: return t.bits == 8 ? EG_U8 : t.bits == 16 ? EG_U16 : t.bits == 32 ? EG_U32
                       : t.bits == 64 ? EG_U64 : EG_OTHER;
    case kDLFloat: return t.bits == 16 ? EG_F16 : t.bits == 32 ? EG_F32 : t.bits == 64 ? EG_F64
                        : EG_OTHER;
    case kDLBfloat: return t.bits == 16 ? EG_BF16 : EG_OTHER;
    case kDLBool: return t.bits == 8 ? EG_BOOL : EG_OTHER;
    default: return EG_OTHER;
    }
}

static const char *device_name(int type)
{
    switch (type) {
    case EG_DEV_CPU: return "cpu";
    case EG_DEV_CUDA: return "cuda";
    case EG_DEV_CUDA_HOST: return "cuda_host (page-locked host)";
    case EG_DEV_CUDA_MANAGED: return "cuda_managed";
    default: return "an unsupported device";
    }
}

const char *eg_kind_name(eg_kind k)
{
    static const char *const names[] = {"an unsupported type", "bool", "int8", "uint8", "int16",
                                        "uint16", "int32", "uint32", "int64", "uint64", "float16",
                                        "bfloat16", "float32", "float64"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : names[0];
}

static int kind_size(eg_kind k)
{
    switch (k) {
    case EG_BOOL: case EG_I8: case EG_U8: return 1;
    case EG_I16: case EG_U16: case EG_F16: case EG_BF16: return 2;
    case EG_I32: case EG_U32: case EG_F32: return 4;
    case EG_I64: case EG_U64: case EG_F64: return 8;
    default: return 0;
    }
}

/* struct-module format of the buffer protocol (native byte order and size) */
static eg_kind format_kind(const char *f, Py_ssize_t itemsize)
{
    if (!f)
        return itemsize == 1 ? EG_U8 : EG_OTHER;
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (f[0] == 0 || f[1] != 0)
        return EG_OTHER;
    eg_kind k;
    switch (f[0]) {
    case '?': k = EG_BOOL; break;
    case 'b': k = EG_I8; break;
    case 'B': k = EG_U8; break;
    case 'h': k = EG_I16; break;
    case 'H': k = EG_U16; break;
    case 'i': case 'l': case 'q': case 'n':
        k = itemsize == 4 ? EG_I32 : itemsize == 8 ? EG_I64 : EG_OTHER; break;
    case 'I': case 'L': case 'Q': case 'N':
        k = itemsize == 4 ? EG_U32 : itemsize == 8 ? EG_U64 : EG_OTHER; break;
    case 'e': k = EG_F16; break;
    case 'f': k = EG_F32; break;
    case 'd': k = EG_F64; break;
    default: k = EG_OTHER;
    }
    return k != EG_OTHER && kind_size(k) == itemsize ? k : EG_OTHER;
}

void eg_array_release(eg_array *a)
{
    if (a->has_view) {
        PyBuffer_Release(&a->view);
        a->has_view = 0;
    }
    Py_CLEAR(a->capsule);
}

/* Replaces the pending exception by cls("arg: what: <its message>"). */
static void rename_error(PyObject *cls, const char *arg, const char *what)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *s = v ? PyObject_Str(v) : NULL;
    PyObject *u = s ? PyUnicode_AsEncodedString(s, "utf-8", "replace") : NULL;
    const char *txt = u ? PyBytes_AsString(u) : NULL;
    PyErr_Format(cls, "%s: %s: %s", arg, what, txt ? txt : "(no message)");
    Py_XDECREF(u);
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static int from_buffer(PyObject *obj, const char *arg, unsigned flags, eg_array *a)
{
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) < 0) {
        /* NumPy refuses some dtypes (datetime64, ...) with a ValueError
         * or BufferError: name the argument (TypeError: no buffer, try
         * DLPack) */
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_BufferError))
            rename_error(PyExc_ValueError, arg, "its buffer export failed");
        return -1;
    }
    a->has_view = 1;
    a->via = "buffer";
    Py_buffer *v = &a->view;
    if (v->suboffsets) {
        PyErr_Format(PyExc_TypeError, "%s: an indirect (suboffsets) buffer is not supported", arg);
        return -1;
    }
    if (v->ndim > EG_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions (at most %d)", arg, v->ndim, EG_MAX_DIMS);
        return -1;
    }
    a->data = v->buf;
    a->ndim = v->ndim;
    a->itemsize = (int)v->itemsize;
    a->kind = format_kind(v->format, v->itemsize);
    a->readonly = v->readonly ? 1 : 0;
    a->device_type = EG_DEV_CPU;
    a->device_id = 0;
    if (v->ndim == 0) {
        a->ndim = 0;
    }
    for (int i = 0; i < v->ndim; i++) {
        a->shape[i] = v->shape ? v->shape[i] : (int64_t)(v->len / (v->itemsize ? v->itemsize : 1));
        a->strides[i] = v->strides ? v->strides[i] : (int64_t)v->itemsize;
    }
    if (!v->strides && v->ndim > 1) { /* C-contiguous by definition */
        int64_t s = v->itemsize;
        for (int i = v->ndim - 1; i >= 0; i--) {
            a->strides[i] = s;
            s *= a->shape[i];
        }
    }
    (void)flags;
    return 0;
}

/* obj.__dlpack_device__() -> (type, id); 0, 1 if obj has none, -1 on error */
static int dl_device(PyObject *obj, int *type, int *id)
{
    PyObject *f = PyObject_GetAttrString(obj, "__dlpack_device__");
    if (!f) {
        PyErr_Clear();
        return 1;
    }
    PyObject *r = PyObject_CallObject(f, NULL);
    Py_DECREF(f);
    if (!r)
        return -1;
    long t = -1, i = -1;
    if (PyTuple_Check(r) && PyTuple_Size(r) == 2) {
        t = PyLong_AsLong(PyTuple_GetItem(r, 0));
        i = PyLong_AsLong(PyTuple_GetItem(r, 1));
    }
    Py_DECREF(r);
    if (PyErr_Occurred())
        return -1;
    *type = (int)t;
    *id = (int)i;
    return 0;
}

static int from_dlpack(PyObject *obj, const char *arg, unsigned flags, PyObject *stream, eg_array *a)
{
    int dt = 0, did = 0;
    int r = dl_device(obj, &dt, &did);
    if (r < 0)
        return -1;
    if (r > 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s: a %s exports neither the buffer protocol nor __dlpack__ "
                     "(pass a NumPy array, a torch tensor or another DLPack producer)",
                     arg, Py_TYPE(obj) ? "object of this type" : "object");
        return -1;
    }
    int want_cuda = (flags & EG_CUDA) != 0;
    int host_ok = dt == EG_DEV_CPU || dt == EG_DEV_CUDA_HOST;
    if (want_cuda ? dt != EG_DEV_CUDA : !host_ok) {
        PyErr_Format(PyExc_ValueError, "%s: the tensor is on %s:%d; %s", arg, device_name(dt), did,
                     want_cuda ? "engram.cuda takes CUDA device memory"
                               : "this call takes host memory (engram.cuda applies on the GPU)");
        return -1;
    }
    PyObject *f = PyObject_GetAttrString(obj, "__dlpack__");
    if (!f)
        return -1;
    PyObject *cap;
    if (stream && stream != Py_None) {
        PyObject *args = PyTuple_New(0);
        PyObject *kw = Py_BuildValue("{sO}", "stream", stream);
        cap = args && kw ? PyObject_Call(f, args, kw) : NULL;
        Py_XDECREF(args);
        Py_XDECREF(kw);
    } else {
        cap = PyObject_CallObject(f, NULL);
    }
    Py_DECREF(f);
    if (!cap) {
        /* NumPy refuses to export read-only arrays, torch tensors that
         * require grad: name the argument */
        rename_error(PyExc_ValueError, arg, "its __dlpack__ refused the export");
        return -1;
    }
    DLManagedTensor *mt = PyCapsule_IsValid(cap, "dltensor")
                              ? (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (!mt) {
        Py_DECREF(cap);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__ did not return a 'dltensor' capsule", arg);
        return -1;
    }
    a->capsule = cap; /* never renamed "used_dltensor": its destructor frees mt */
    a->via = "dlpack";
    DLTensor *t = &mt->dl_tensor;
    if (t->ndim < 0 || t->ndim > EG_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions (at most %d)", arg, (int)t->ndim, EG_MAX_DIMS);
        return -1;
    }
    a->kind = dl_kind(t->dtype);
    a->itemsize = a->kind != EG_OTHER ? kind_size(a->kind) : (t->dtype.bits * t->dtype.lanes + 7) / 8;
    a->ndim = t->ndim;
    a->data = (char *)t->data + t->byte_offset;
    a->readonly = 0;
    a->device_type = t->device.device_type;
    a->device_id = t->device.device_id;
    int64_t s = a->itemsize;
    for (int i = t->ndim - 1; i >= 0; i--) {
        a->shape[i] = t->shape[i];
        if (t->strides) {
            a->strides[i] = t->strides[i] * a->itemsize;
        } else {
            a->strides[i] = s;
            s *= t->shape[i];
        }
    }
    return 0;
}

int eg_array_get(PyObject *obj, const char *arg, unsigned flags, PyObject *stream, eg_array *a)
{
    memset(a, 0, sizeof *a);
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: None (an array is needed)", arg);
        return -1;
    }
    int rc;
    if (!(flags & EG_CUDA) && PyObject_HasAttrString(obj, "__array_interface__") == 0 &&
        PyObject_HasAttrString(obj, "__dlpack__")) {
        rc = from_dlpack(obj, arg, flags, stream, a); /* torch and others: no buffer protocol */
    } else if (!(flags & EG_CUDA)) {
        rc = from_buffer(obj, arg, flags, a);
        if (rc < 0 && PyErr_ExceptionMatches(PyExc_TypeError) && !a->has_view) {
            PyErr_Clear();
            eg_array_release(a);
            memset(a, 0, sizeof *a);
            rc = from_dlpack(obj, arg, flags, stream, a);
        }
    } else {
        rc = from_dlpack(obj, arg, flags, stream, a);
    }
    if (rc == 0 && (flags & EG_WRITABLE) && a->readonly) {
        PyErr_Format(PyExc_ValueError, "%s: the array is read-only (the call writes into it in place)",
                     arg);
        rc = -1;
    }
    if (rc == 0) {
        for (int i = 0; i < a->ndim; i++) {
            if (a->shape[i] < 0) {
                PyErr_Format(PyExc_ValueError, "%s: a negative dimension", arg);
                rc = -1;
                break;
            }
        }
    }
    if (rc < 0)
        eg_array_release(a);
    return rc;
}

int eg_array_inner_contiguous(const eg_array *a, int from)
{
    int64_t s = a->itemsize;
    for (int i = a->ndim - 1; i >= from; i--) {
        if (a->shape[i] != 1 && a->strides[i] != s)
            return 0;
        s *= a->shape[i];
    }
    return 1;
}

int eg_residual_arg(PyObject *o, unsigned flags, PyObject *stream, size_t n_want, unsigned S, unsigned W,
                    const char *noun, eg_array *a, engram_dtype *dt)
{
    char b[128];
    if (eg_array_get(o, "residual", flags | EG_WRITABLE, stream, a) < 0)
        return -1;
    if (a->kind == EG_F32 || a->kind == EG_BF16 || a->kind == EG_U16) {
        *dt = a->kind == EG_F32 ? ENGRAM_F32 : ENGRAM_BF16;
    } else {
        PyErr_Format(PyExc_TypeError,
                     "residual: %s; float32 or bfloat16 (torch.bfloat16, or BF16 bit patterns as uint16) is needed",
                     eg_kind_name(a->kind));
        goto fail;
    }
    if (a->ndim != 3 || (n_want != SIZE_MAX && (size_t)a->shape[0] != n_want) || (size_t)a->shape[1] != S ||
        (size_t)a->shape[2] != W) {
        if (n_want != SIZE_MAX)
            PyErr_Format(PyExc_ValueError, "residual: shape %s; (%zu, %u, %u) is needed", eg_shape_str(a, b, sizeof b),
                         n_want, S, W);
        else
            PyErr_Format(PyExc_ValueError, "residual: shape %s; (n, %u, %u) is needed", eg_shape_str(a, b, sizeof b),
                         S, W);
        goto fail;
    }
    if (!eg_array_contiguous(a)) {
        PyErr_Format(PyExc_ValueError, "residual: not contiguous (updated in place: a C-contiguous %s is needed, "
                                       "it is never copied)", noun);
        goto fail;
    }
    return 0;
fail:
    eg_array_release(a);
    return -1;
}

int eg_array_contiguous(const eg_array *a)
{
    return eg_array_inner_contiguous(a, 0);
}

const char *eg_shape_str(const eg_array *a, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, len - at, "(");
    for (int i = 0; i < a->ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, i ? ", %lld" : "%lld", (long long)a->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, a->ndim == 1 ? ",)" : ")");
    return buf;
}

/* ------------------------------------------------------------- tokens, masks */

static int int_at(const eg_array *a, size_t i, int64_t *v)
{
    const char *p = (const char *)a->data + (int64_t)i * (a->ndim ? a->strides[0] : 0);
    switch (a->kind) {
    case EG_I8: *v = *(const int8_t *)p; return 0;
    case EG_U8: *v = *(const uint8_t *)p; return 0;
    case EG_BOOL: *v = *(const uint8_t *)p != 0; return 0;
    case EG_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case EG_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case EG_I32: { int32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case EG_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case EG_I64: { int64_t x; memcpy(&x, p, 8); *v = x; return 0; }
    case EG_U64: { uint64_t x; memcpy(&x, p, 8); *v = x > INT64_MAX ? -1 : (int64_t)x; return 0; }
    default: return -1;
    }
}

/* The values of obj (an integer array of one dimension, or a sequence of
 * ints) as int64, into a new buffer; lo..hi checked. */
static int int_values(PyObject *obj, const char *arg, int64_t lo, int64_t hi, int64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: None", arg);
        return -1;
    }
    if (PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: a sequence or 1-D array of ints is needed, not an int", arg);
        return -1;
    }
    eg_array a;
    int have = 0;
    if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
        if (eg_array_get(obj, arg, 0, NULL, &a) == 0) {
            have = 1;
        } else if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear(); /* perhaps a sequence */
        } else {
            return -1;
        }
    }
    if (have) {
        if (a.ndim != 1) {
            char b[128];
            PyErr_Format(PyExc_ValueError, "%s: shape %s; one dimension needed", arg,
                         eg_shape_str(&a, b, sizeof b));
            eg_array_release(&a);
            return -1;
        }
        if (a.kind == EG_OTHER || a.kind >= EG_F16) {
            PyErr_Format(PyExc_TypeError, "%s: %s values; integers needed", arg, eg_kind_name(a.kind));
            eg_array_release(&a);
            return -1;
        }
        size_t k = (size_t)a.shape[0];
        int64_t *v = PyMem_Malloc((k ? k : 1) * sizeof *v);
        if (!v) {
            eg_array_release(&a);
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < k; i++) {
            int_at(&a, i, &v[i]);
            if (v[i] < lo || v[i] > hi) {
                PyErr_Format(PyExc_ValueError, "%s[%zu] = %lld is out of range %lld..%lld", arg, i,
                             (long long)v[i], (long long)lo, (long long)hi);
                PyMem_Free(v);
                eg_array_release(&a);
                return -1;
            }
        }
        eg_array_release(&a);
        *out = v;
        *n = k;
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, "");
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: a sequence or 1-D array of ints is needed", arg);
        return -1;
    }
    Py_ssize_t k = PySequence_Size(seq);
    int64_t *v = PyMem_Malloc((size_t)(k > 0 ? k : 1) * sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        if (!it)
            goto fail;
        /* ints and what stands for one (NumPy's integer scalars:
         * list(np_array)); not floats or bools' look-alikes of other kinds */
        PyObject *iv = PyNumber_Index(it);
        Py_DECREF(it);
        if (!iv) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s[%zd]: an int is needed", arg, i);
            goto fail;
        }
        int ovf = 0;
        long long x = PyLong_AsLongLongAndOverflow(iv, &ovf);
        Py_DECREF(iv);
        if (x == -1 && PyErr_Occurred())
            goto fail;
        if (ovf || x < lo || x > hi) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is out of range %lld..%lld", arg, i, (long long)lo,
                         (long long)hi);
            goto fail;
        }
        v[i] = x;
    }
    Py_DECREF(seq);
    *out = v;
    *n = (size_t)k;
    return 0;
fail:
    Py_DECREF(seq);
    PyMem_Free(v);
    return -1;
}

int eg_long_arg(PyObject *obj, const char *arg, long lo, long hi, long *v)
{
    PyObject *i = PyNumber_Index(obj);
    if (!i) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: an int is needed", arg);
        }
        return -1;
    }
    int ovf = 0;
    long x = PyLong_AsLongAndOverflow(i, &ovf);
    Py_DECREF(i);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (ovf || x < lo || x > hi) {
        if (ovf)
            PyErr_Format(PyExc_ValueError, "%s: out of range %ld .. %ld", arg, lo, hi);
        else
            PyErr_Format(PyExc_ValueError, "%s: %ld; %ld .. %ld", arg, x, lo, hi);
        return -1;
    }
    *v = x;
    return 0;
}

int eg_tokens(PyObject *obj, const char *arg, uint32_t **out, size_t *n)
{
    int64_t *v;
    if (int_values(obj, arg, 0, UINT32_MAX, &v, n) < 0)
        return -1;
    uint32_t *t = PyMem_Malloc((*n ? *n : 1) * sizeof *t);
    if (!t) {
        PyMem_Free(v);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < *n; i++)
        t[i] = (uint32_t)v[i];
    PyMem_Free(v);
    *out = t;
    return 0;
}

int eg_mask(PyObject *obj, const char *arg, size_t n, uint8_t **out)
{
    *out = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    int64_t *v;
    size_t k;
    if (int_values(obj, arg, 0, 255, &v, &k) < 0)
        return -1;
    if (k != n) {
        PyErr_Format(PyExc_ValueError, "%s: %zu entries for %zu tokens", arg, k, n);
        PyMem_Free(v);
        return -1;
    }
    uint8_t *m = PyMem_Malloc(n ? n : 1);
    if (!m) {
        PyMem_Free(v);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        m[i] = (uint8_t)v[i];
    PyMem_Free(v);
    *out = m;
    return 0;
}

/* ------------------------------------------------------------- NumPy */

static PyObject *numpy_mod;

PyObject *eg_numpy_empty(int ndim, const int64_t *shape, eg_kind kind)
{
    if (!numpy_mod) {
        numpy_mod = PyImport_ImportModule("numpy");
        if (!numpy_mod) {
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
            PyErr_SetString(PyExc_ImportError,
                            "engram returns NumPy arrays and NumPy is not importable: install it "
                            "(python3-numpy) or pass out=");
            return NULL;
        }
    }
    const char *dt = kind == EG_U32 ? "uint32" : kind == EG_U16 || kind == EG_BF16 ? "uint16"
                   : kind == EG_F32 ? "float32" : kind == EG_U8 ? "uint8" : NULL;
    if (!dt) {
        PyErr_SetString(PyExc_SystemError, "eg_numpy_empty: no such kind");
        return NULL;
    }
    PyObject *shp = PyTuple_New(ndim);
    if (!shp)
        return NULL;
    for (int i = 0; i < ndim; i++)
        PyTuple_SetItem(shp, i, PyLong_FromLongLong(shape[i]));
    PyObject *r = PyObject_CallMethod(numpy_mod, "empty", "Os", shp, dt);
    Py_DECREF(shp);
    return r;
}

PyObject *eg_slice_axis1(PyObject *obj, Py_ssize_t start, Py_ssize_t stop)
{
    PyObject *all = PySlice_New(NULL, NULL, NULL);
    PyObject *b = PyLong_FromSsize_t(start), *e = PyLong_FromSsize_t(stop);
    PyObject *s = b && e ? PySlice_New(b, e, NULL) : NULL;
    PyObject *idx = all && s ? PyTuple_Pack(2, all, s) : NULL;
    PyObject *r = idx ? PyObject_GetItem(obj, idx) : NULL;
    Py_XDECREF(all);
    Py_XDECREF(b);
    Py_XDECREF(e);
    Py_XDECREF(s);
    Py_XDECREF(idx);
    return r;
}

/* ------------------------------------------------------------- module */

static PyObject *py_version(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    return PyUnicode_FromString(engram_version());
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
    (void)self;
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(engram_strerror((int)(c > 0 ? -c : c)));
}

static PyMethodDef module_methods[] = {
    {"version", py_version, METH_NOARGS,
     "version() -> str\n\nThe version of the libengram linked into this module (\"0.2.0\")."},
    {"strerror", py_strerror, METH_O,
     "strerror(code) -> str\n\nThe library's text for an errno value (positive or negative)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_engram",
    "engram._engram: the C extension behind the engram package (see help(engram)).", -1,
    module_methods, NULL, NULL, NULL, NULL};

static PyObject *new_error(PyObject *m, const char *name, const char *doc, PyObject *base1,
                           PyObject *base2)
{
    char full[96];
    snprintf(full, sizeof full, "engram.%s", name);
    PyObject *bases = base2 ? PyTuple_Pack(2, base1, base2) : PyTuple_Pack(1, base1);
    if (!bases)
        return NULL;
    PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    Py_DECREF(bases);
    if (!e)
        return NULL;
    Py_INCREF(e);
    if (PyModule_AddObject(m, name, e) < 0) {
        Py_DECREF(e);
        Py_DECREF(e);
        return NULL;
    }
    return e;
}

PyMODINIT_FUNC PyInit__engram(void);
PyMODINIT_FUNC PyInit__engram(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (!(eg_Error = new_error(m, "Error",
                               "An error of libengram: errno (positive), strerror (the library's "
                               "message naming the field, token or row), code (the negative errno "
                               "the C call returned), offset (byte offset in the file, or None) "
                               "and row (the row that failed, or None).",
                               PyExc_OSError, NULL)) ||
        !(eg_ArgumentError = new_error(m, "ArgumentError",
                                       "A bad argument (EINVAL): a token out of the vocabulary, a "
                                       "bad table, a wrong shape the library caught.",
                                       eg_Error, PyExc_ValueError)) ||
        !(eg_DataError = new_error(m, "DataError",
                                   "Values that cannot be used (EDOM): a NaN or infinite residual "
                                   "or row, a row that does not decode.",
                                   eg_Error, PyExc_ValueError)) ||
        !(eg_ModelError = new_error(m, "ModelError",
                                    "A model file that is malformed or not supported (EBADMSG, "
                                    "ENOTSUP, ESTALE); offset names the byte.",
                                    eg_Error, NULL)) ||
        !(eg_NotFoundError = new_error(m, "NotFoundError", "A file or tensor that is not there (ENOENT).",
                                       eg_Error, PyExc_FileNotFoundError)) ||
        !(eg_TimeoutError = new_error(m, "TimeoutError",
                                      "A timed wait ran out (ETIMEDOUT); nothing is lost: wait again.",
                                      eg_Error, PyExc_TimeoutError)) ||
        !(eg_CancelledError = new_error(m, "CancelledError",
                                        "The step or prefill ended (abort, cancel, close) while it "
                                        "was waited for (ECANCELED).",
                                        eg_Error, NULL)) ||
        !(eg_ClosedError = new_error(m, "ClosedError",
                                     "An object used after close, or a session whose pool was "
                                     "closed (EBADF, ESHUTDOWN).",
                                     eg_Error, PyExc_ValueError)) ||
        !(eg_BusyError = new_error(m, "BusyError",
                                   "A session that already has a step or prefill in progress (EBUSY).",
                                   eg_Error, NULL)))
        goto fail;
    if (eg_model_init(m) < 0 || eg_layer_init(m) < 0 || eg_pool_init(m) < 0)
        goto fail;
    if (PyModule_AddStringConstant(m, "__version__", engram_version()) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DRAFT", ENGRAM_MAX_DRAFT) < 0 ||
        PyModule_AddIntConstant(m, "MASK_PAD", ENGRAM_MASK_PAD) < 0 ||
        PyModule_AddIntConstant(m, "MASK_TEXT", ENGRAM_MASK_TEXT) < 0 ||
        PyModule_AddIntConstant(m, "MASK_IMAGE", ENGRAM_MASK_IMAGE) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
