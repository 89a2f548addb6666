/*
 * cuda.c - engram._engram_cuda, behind engram.cuda: an Engram layer's output
 * stage on an NVIDIA GPU (libengram-cuda, include/engram_cuda.h) applied in
 * place to CUDA tensors borrowed through DLPack, on the caller's stream.
 *
 * A module of its own so that `import engram` never loads CUDA: this one
 * links libengram-cuda, cuBLAS (dynamic) and the CUDA runtime (static), and
 * fails to import where libcublas is missing; engram.cuda then says why.
 * ext.c is compiled in for its array helpers (eg_array_get, eg_tokens,
 * eg_mask, eg_raise); its exception globals are pointed at engram._engram's
 * classes at init, so both modules raise the same engram.Error family.  Its
 * module init (PyInit__engram) is never called from here: the three
 * functions it would call are stubs below.
 *
 * The library calls cudaSetDevice; every entry here restores the thread's
 * current device afterwards (PyTorch keeps its own notion of it).
 */
#include "ext.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram_cuda.h"

#define RAW_TOKEN ((size_t)ENGRAM_COLUMNS * ENGRAM_ROW_BYTES) /* 6336 bytes: a token's rows */

/* ext.c's module init refers to these; it is not run in this module */
int eg_model_init(PyObject *module)
{
    (void)module;
    PyErr_SetString(PyExc_SystemError, "engram._engram_cuda holds no Model type");
    return -1;
}

int eg_layer_init(PyObject *module)
{
    return eg_model_init(module);
}

int eg_pool_init(PyObject *module)
{
    return eg_model_init(module);
}

static PyObject *LayerType;   /* engram._engram.Layer   */
static PyObject *HistoryType; /* engram._engram.History */
static PyObject *CudaLayerType;

typedef struct cu_layer {
    PyObject_HEAD
    engram_cuda_layer *c;
    PyObject *layer;            /* the engram.Layer it was made from (strong) */
    char *path;                 /* its model's file, for tokens=              */
    int device;
    engram_layer_info info;
    engram_model *m;            /* our own handle on that file (tokens=)      */
    engram_reader *rd;
    uint32_t *ids;              /* tokens=: [cap][48] row ids                  */
    uint8_t *h_raw;             /* tokens=: [cap][24][264] raw rows (host)     */
    size_t h_cap;               /* tokens the two above hold                   */
    uint8_t *d_raw, *d_mask;    /* device scratch: host rows, host masks       */
    size_t d_raw_cap, d_mask_cap;
    cudaEvent_t ev;             /* recorded after each apply on its stream     */
    int have_ev;
    void *last;                 /* the stream of the last apply                */
    int used;                   /* ev was recorded                             */
    pthread_mutex_t mu;         /* one call at a time (one workspace)          */
} cu_layer;

/* ------------------------------------------------------------- helpers */

static int cu_err(cudaError_t e, engram_error *err, int code, const char *what)
{
    cudaGetLastError(); /* clears a non-sticky error */
    char m[sizeof err->msg];
    snprintf(m, sizeof m, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return eg_set_err(err, code, m);
}

/* Whether stream st is under a CUDA graph capture (torch.cuda.graph): 1
 * if so, 0 if not; -EINVAL where the call cannot be captured (waits: it
 * synchronizes; host: it reads tokens, host rows or a host mask at call
 * time and may grow the scratch, which a replay would not repeat), refused
 * before anything is queued; -EINVAL also for the legacy default stream
 * while a blocking stream is captured (CUDA's refusal), -EIO for another
 * CUDA error.  err and *what filled on failure. */
static int capture_state(void *st, int waits, int host, engram_error *err, const char **what)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing((cudaStream_t)st, &cs);
    if (e != cudaSuccess) {
        *what = "cudaStreamIsCapturing";
        return cu_err(e, err, e == cudaErrorStreamCaptureImplicit ? -EINVAL : -EIO, *what);
    }
    if (cs == cudaStreamCaptureStatusNone)
        return 0;
    if (waits || host) {
        *what = "under CUDA graph capture";
        return eg_set_err(err, -EINVAL,
                          waits ? "sync cannot be captured (a capture may not wait)"
                                : "rows= and mask= must be CUDA tensors (tokens=, host rows and host masks are "
                                  "read and copied when called, not when replayed)");
    }
    return 1;
}

/* Makes `device` current; *prev: the device to restore (-1: none). */
static cudaError_t dev_enter(int device, int *prev)
{
    if (cudaGetDevice(prev) != cudaSuccess) {
        cudaGetLastError();
        *prev = -1;
    }
    return cudaSetDevice(device);
}

static void dev_leave(int prev)
{
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess)
        cudaGetLastError();
}

/* A device buffer of at least `need` bytes; the old one is freed once the
 * layer's last apply has passed it. */
static int dev_grow(cu_layer *s, uint8_t **p, size_t *cap, size_t need, engram_error *err)
{
    if (*cap >= need)
        return 0;
    if (*p) {
        if (s->used && cudaEventSynchronize(s->ev) != cudaSuccess)
            cudaGetLastError();
        cudaFree(*p);
        *p = NULL;
        *cap = 0;
    }
    size_t sz = (need + 0xfffffu) & ~(size_t)0xfffffu; /* whole MiB */
    cudaError_t e = cudaMalloc((void **)p, sz);
    if (e != cudaSuccess) {
        *p = NULL;
        return cu_err(e, err, -ENOMEM, "cudaMalloc (the layer's scratch for host rows or masks)");
    }
    *cap = sz;
    return 0;
}

/* 1 if obj's __dlpack_device__ says CUDA memory, 0 if not (or it has none),
 * -1 with an exception. */
static int on_cuda(PyObject *obj)
{
    if (!PyObject_HasAttrString(obj, "__dlpack_device__"))
        return 0;
    PyObject *r = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (!r)
        return -1;
    long t = -1;
    if (PyTuple_Check(r) && PyTuple_Size(r) == 2)
        t = PyLong_AsLong(PyTuple_GetItem(r, 0));
    Py_DECREF(r);
    if (t == -1 && PyErr_Occurred())
        return -1;
    return t == EG_DEV_CUDA;
}

/* stream: None (the default stream), an int (a cudaStream_t), or an object
 * with .cuda_stream (torch.cuda.Stream) or __cuda_stream__() (the CUDA
 * stream protocol).  *st for the library, *dl (new) for __dlpack__(stream=):
 * DLPack's 1 for the legacy default stream. */
static int stream_arg(PyObject *o, void **st, PyObject **dl)
{
    PyObject *v = NULL;
    *dl = NULL;
    if (o == Py_None) {
        *st = NULL;
        *dl = PyLong_FromLong(1);
        return *dl ? 0 : -1;
    }
    if (PyLong_Check(o)) {
        Py_INCREF(o);
        v = o;
    } else if (PyObject_HasAttrString(o, "cuda_stream")) {
        v = PyObject_GetAttrString(o, "cuda_stream");
    } else if (PyObject_HasAttrString(o, "__cuda_stream__")) {
        PyObject *t = PyObject_CallMethod(o, "__cuda_stream__", NULL);
        if (t && PyTuple_Check(t) && PyTuple_Size(t) == 2) {
            v = PyTuple_GetItem(t, 1);
            Py_XINCREF(v);
        }
        Py_XDECREF(t);
        if (!v && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "stream: __cuda_stream__() did not return (version, handle)");
    } else {
        PyErr_SetString(PyExc_TypeError, "stream: an int (a cudaStream_t), a torch.cuda.Stream "
                                         "(its .cuda_stream) or None (the default stream) is needed");
        return -1;
    }
    if (!v)
        return -1;
    if (!PyLong_Check(v)) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "stream: the handle is not an int");
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "stream: a negative or too large handle");
        return -1;
    }
    *st = (void *)(uintptr_t)u;
    *dl = PyLong_FromUnsignedLongLong(u ? u : 1); /* 0: the legacy default stream */
    return *dl ? 0 : -1;
}

static int layer_live(const cu_layer *s)
{
    if (!s->c) {
        PyErr_SetString(eg_ClosedError, "the cuda layer is closed");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- open, close */

static void release(cu_layer *s)
{
    if (s->c || s->d_raw || s->d_mask || s->have_ev) {
        int prev;
        if (dev_enter(s->device, &prev) != cudaSuccess)
            cudaGetLastError();
        if (s->used && cudaEventSynchronize(s->ev) != cudaSuccess)
            cudaGetLastError();
        engram_cuda_layer_close(s->c);
        cudaFree(s->d_raw);
        cudaFree(s->d_mask);
        if (s->have_ev)
            cudaEventDestroy(s->ev);
        /* the clean-up's own errors; a caller's (torch's) are not here:
         * this module links the CUDA runtime statically and hides its
         * symbols (-Wl,--exclude-libs,ALL), so it is a runtime instance of
         * its own, whose last error only this module's calls set (a sticky
         * error, one that spoils the context, is the context's: every
         * instance sees it, and no clear removes it) */
        cudaGetLastError();
        dev_leave(prev);
    }
    s->c = NULL;
    s->d_raw = s->d_mask = NULL;
    s->d_raw_cap = s->d_mask_cap = 0;
    s->have_ev = s->used = 0;
    engram_reader_close(s->rd);
    s->rd = NULL;
    engram_model_close(s->m);
    s->m = NULL;
    free(s->ids);
    free(s->h_raw);
    s->ids = NULL;
    s->h_raw = NULL;
    s->h_cap = 0;
}

static void cl_dealloc(PyObject *o)
{
    cu_layer *s = (cu_layer *)o;
    release(s);
    free(s->path);
    Py_CLEAR(s->layer);
    pthread_mutex_destroy(&s->mu);
    eg_heap_free(o);
}

/* The reason CUDA cannot be used, or NULL (the GIL released inside). */
static int probe(engram_error *err)
{
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = engram_cuda_available(err);
    Py_END_ALLOW_THREADS
    return ok;
}

static PyObject *attr_str_fs(PyObject *o, const char *name)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return NULL;
    PyObject *b = PyUnicode_Check(v) ? PyUnicode_EncodeFSDefault(v) : NULL;
    if (!b && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "%s: not a str", name);
    Py_DECREF(v);
    return b;
}

/* Ends the layer's _pin(), an exception being raised kept as it is. */
static void unpin(PyObject *lay)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = PyObject_CallMethod(lay, "_unpin", NULL);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}

static PyObject *cl_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"layer", "device", NULL};
    PyObject *lay;
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:Layer", kwl, &lay, &device))
        return NULL;
    engram_error err;
    memset(&err, 0, sizeof err);
    if (!probe(&err)) {
        PyErr_Format(PyExc_RuntimeError, "engram.cuda is not available: %s", err.msg);
        return NULL;
    }
    int r = PyObject_IsInstance(lay, LayerType);
    if (r < 0)
        return NULL;
    if (!r) {
        PyErr_SetString(PyExc_TypeError, "layer: an engram.Layer (Model.layer(1) or (14)) is needed");
        return NULL;
    }
    PyObject *info = PyObject_GetAttrString(lay, "info"); /* ClosedError if closed */
    if (!info)
        return NULL;
    PyObject *member = PyDict_GetItemString(info, "member");
    int v41 = member && PyUnicode_Check(member) &&
              PyUnicode_CompareWithASCIIString(member, "deepseek-v4.1-engram") == 0;
    Py_DECREF(info);
    if (!v41) {
        PyErr_SetString(PyExc_ValueError,
                        "layer: a Qwen3.8 PLE layer; engram.cuda applies DeepSeek V4.1 layers only "
                        "(PLE's GPU path is internal to libengram-cuda, not yet offered here)");
        return NULL;
    }
    int count = 0;
    cudaError_t e;
    Py_BEGIN_ALLOW_THREADS
    e = cudaGetDeviceCount(&count);
    Py_END_ALLOW_THREADS
    if (e != cudaSuccess) {
        cudaGetLastError();
        PyErr_Format(PyExc_RuntimeError, "engram.cuda is not available: %s", cudaGetErrorString(e));
        return NULL;
    }
    if (device < 0 || device >= count) {
        PyErr_Format(PyExc_ValueError, "device: %d; this machine has CUDA devices 0 .. %d", device, count - 1);
        return NULL;
    }
    /* the weights are read without the GIL: the layer is pinned (its close
     * refused) from here until the upload returns */
    PyObject *h = PyObject_CallMethod(lay, "_pin", NULL);
    if (!h)
        return NULL;
    const engram_layer *L = PyLong_AsVoidPtr(h);
    Py_DECREF(h);
    if (!L) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "layer: no handle");
        unpin(lay);
        return NULL;
    }
    PyObject *model = PyObject_GetAttrString(lay, "model");
    PyObject *path = model ? attr_str_fs(model, "path") : NULL;
    Py_XDECREF(model);
    if (!path) {
        unpin(lay);
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    cu_layer *s = (cu_layer *)alloc(tp, 0);
    if (!s) {
        Py_DECREF(path);
        unpin(lay);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->device = device;
    s->path = strdup(PyBytes_AsString(path));
    Py_DECREF(path);
    Py_INCREF(lay);
    s->layer = lay;
    if (!s->path) {
        unpin(lay);
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    int rc = 0, prev = -1;
    const char *what = "cuda layer";
    Py_BEGIN_ALLOW_THREADS
    if ((e = dev_enter(device, &prev)) != cudaSuccess)
        rc = cu_err(e, &err, -EIO, "cudaSetDevice");
    if (rc == 0)
        rc = engram_cuda_layer_open(L, device, &s->c, &err);
    if (rc == 0) {
        engram_layer_get_info(L, &s->info);
        if ((e = cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming)) != cudaSuccess)
            rc = cu_err(e, &err, -EIO, "cudaEventCreate");
        else
            s->have_ev = 1;
    }
    dev_leave(prev);
    Py_END_ALLOW_THREADS
    unpin(lay);
    if (rc < 0) {
        Py_DECREF(s);
        return eg_raise(rc, &err, what);
    }
    return (PyObject *)s;
}

static PyObject *cl_close(PyObject *o, PyObject *args)
{
    (void)args;
    cu_layer *s = (cu_layer *)o;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->mu); /* a call on another thread finishes first */
    release(s);
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *cl_enter(PyObject *o, PyObject *args)
{
    (void)args;
    Py_INCREF(o);
    return o;
}

static PyObject *cl_exit(PyObject *o, PyObject *args)
{
    (void)args;
    return cl_close(o, NULL);
}

/* ------------------------------------------------------------- apply */

struct call {
    cu_layer *s;
    engram_cuda_args a;         /* device pointers given, the rest filled in run */
    size_t n;
    const uint8_t *h_rows;      /* host rows given (or read): token i at + i*h_stride */
    size_t h_stride;
    uint32_t *tokens;           /* tokens= (PyMem)                        */
    uint8_t *h_mask;            /* a host mask (PyMem), uploaded           */
    engram_history hist;        /* tokens=: advanced here, copied back at 0 */
    int sync;
    engram_error err;
    const char *what;
};

static int host_grow(cu_layer *s, size_t n)
{
    if (s->h_cap >= n)
        return 0;
    uint32_t *ids = malloc(n * ENGRAM_ROWS_PER_TOKEN * sizeof *ids);
    uint8_t *raw = malloc(n * RAW_TOKEN);
    if (!ids || !raw) {
        free(ids);
        free(raw);
        return -ENOMEM;
    }
    free(s->ids);
    free(s->h_raw);
    s->ids = ids;
    s->h_raw = raw;
    s->h_cap = n;
    return 0;
}

/* Runs without the GIL, the layer's lock held and its device current. */
static int run_on_device(struct call *c)
{
    cu_layer *s = c->s;
    cudaStream_t st = (cudaStream_t)c->a.stream;
    size_t n = c->n;
    int rc;
    cudaError_t e;
    /* Under a CUDA graph capture of st (torch.cuda.graph): the apply is
     * recorded for replays, which repeat its device work only (tokens=,
     * host rows and host masks are read and copied at call time, the
     * scratch may grow, sync waits: refused before the library queues
     * anything, so the caller's capture goes on); the layer's event is
     * neither waited on (it was recorded outside the capture: a dependency
     * across its boundary) nor recorded (an event recorded in a capture
     * cannot be waited on outside it).  So replays are outside the layer's
     * own ordering of its applies: the caller orders them (the docstring). */
    const int captured = capture_state(st, c->sync, c->tokens || c->h_rows || c->h_mask, &c->err, &c->what);
    if (captured < 0)
        return captured;
    if (c->tokens) {
        c->what = "tokens";
        if (!s->m && (rc = engram_model_open(s->path, &s->m, &c->err)) < 0)
            return rc;
        if (!s->rd && (rc = engram_reader_open(s->m, NULL, &s->rd, &c->err)) < 0)
            return rc;
        if (host_grow(s, n) < 0)
            return -ENOMEM;
        c->what = "hash";
        rc = engram_hash_tokens(engram_model_hasher(s->m), &c->hist, c->tokens, c->h_mask, n, s->ids,
                                &c->err);
        if (rc < 0)
            return rc;
        c->what = "reading rows";
        rc = engram_reader_batch(s->rd, s->info.table, s->ids, n, ENGRAM_RAW, s->h_raw, &c->err);
        if (rc < 0)
            return rc;
        c->h_rows = s->h_raw;
        c->h_stride = RAW_TOKEN;
    } else if (c->h_rows) {
        /* as the pool checks what it delivers: every row decodes */
        c->what = "rows";
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < ENGRAM_COLUMNS; j++) {
                engram_error e2;
                if ((rc = engram_row_check(c->h_rows + i * c->h_stride + j * ENGRAM_ROW_BYTES, &e2)) < 0) {
                    memset(&c->err, 0, sizeof c->err);
                    c->err.code = rc;
                    c->err.offset = ENGRAM_NO_OFFSET;
                    c->err.row = ENGRAM_NO_ROW;
                    snprintf(c->err.msg, sizeof c->err.msg, "token %zu, row %zu: %.200s", i, j, e2.msg);
                    return rc;
                }
            }
    }
    /* one workspace: an apply on another stream than the last waits for it */
    c->what = "cudaStreamWaitEvent";
    if (!captured && s->used && s->last != (void *)st && (e = cudaStreamWaitEvent(st, s->ev, 0)) != cudaSuccess)
        return cu_err(e, &c->err, -EIO, c->what);
    if (c->h_rows) {
        if ((rc = dev_grow(s, &s->d_raw, &s->d_raw_cap, n * RAW_TOKEN, &c->err)) < 0)
            return rc;
        c->what = "copying rows to the GPU";
        e = cudaMemcpy2DAsync(s->d_raw, RAW_TOKEN, c->h_rows, n > 1 ? c->h_stride : RAW_TOKEN, RAW_TOKEN, n,
                              cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return cu_err(e, &c->err, -EIO, c->what);
        c->a.raw = s->d_raw;
        c->a.raw_stride = 0;
    }
    if (c->h_mask) {
        if ((rc = dev_grow(s, &s->d_mask, &s->d_mask_cap, n, &c->err)) < 0)
            return rc;
        c->what = "copying the mask to the GPU";
        if ((e = cudaMemcpyAsync(s->d_mask, c->h_mask, n, cudaMemcpyHostToDevice, st)) != cudaSuccess)
            return cu_err(e, &c->err, -EIO, c->what);
        c->a.mask = s->d_mask;
    }
    c->what = "apply";
    rc = engram_cuda_apply(s->c, &c->a, &c->err);
    if (captured)
        return rc;
    /* whatever was queued is covered by the event */
    if ((e = cudaEventRecord(s->ev, st)) != cudaSuccess) {
        if (rc == 0)
            rc = cu_err(e, &c->err, -EIO, "cudaEventRecord");
        else
            cudaGetLastError();
    } else {
        s->used = 1;
        s->last = (void *)st;
    }
    if (rc == 0 && c->sync) {
        c->what = "sync";
        rc = engram_cuda_sync(s->c, st, &c->err);
    }
    return rc;
}

static int run(struct call *c)
{
    int prev, rc;
    cudaError_t e = dev_enter(c->s->device, &prev);
    if (e != cudaSuccess) {
        c->what = "cudaSetDevice";
        rc = cu_err(e, &c->err, -EIO, c->what);
    } else {
        rc = run_on_device(c);
    }
    dev_leave(prev);
    return rc;
}

static int same_device(const cu_layer *s, const eg_array *a, const char *arg)
{
    if (a->device_id != s->device) {
        PyErr_Format(PyExc_ValueError, "%s: on cuda:%d; this layer is on cuda:%d", arg, a->device_id,
                     s->device);
        return -1;
    }
    return 0;
}

/* rows' shape and layout: (n, 24, 264) uint8, each token's rows contiguous */
static int check_rows(const eg_array *r, size_t n, int device_mem)
{
    char b[128];
    if (r->kind != EG_U8) {
        PyErr_Format(PyExc_TypeError, "rows: %s; uint8 raw rows (264 bytes each, dtype \"raw\") are needed",
                     eg_kind_name(r->kind));
        return -1;
    }
    if (r->ndim != 3 || (size_t)r->shape[0] != n || r->shape[1] != ENGRAM_COLUMNS ||
        r->shape[2] != ENGRAM_ROW_BYTES) {
        PyErr_Format(PyExc_ValueError, "rows: shape %s; (%zu, 24, 264) is needed (a table's slice of a "
                     "step's (n, 48, 264))", eg_shape_str(r, b, sizeof b), n);
        return -1;
    }
    if (!eg_array_inner_contiguous(r, 1)) {
        PyErr_SetString(PyExc_ValueError, "rows: each token's 24 rows must be contiguous (a step's or "
                                          "prefill's view is)");
        return -1;
    }
    if (n > 1 && (r->strides[0] < (int64_t)RAW_TOKEN || (device_mem && r->strides[0] % 8))) {
        PyErr_Format(PyExc_ValueError, "rows: tokens %lld bytes apart; at least 24 x 264%s",
                     (long long)r->strides[0], device_mem ? ", a multiple of 8" : "");
        return -1;
    }
    if (device_mem && (uintptr_t)r->data % 8) {
        PyErr_SetString(PyExc_ValueError, "rows: the device pointer is not 8-byte aligned");
        return -1;
    }
    return 0;
}

static PyObject *cl_apply(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"residual", "rows", "tokens", "mask", "stream", "flags", "sync", "history", NULL};
    PyObject *res_o, *rows_o = Py_None, *tok_o = Py_None, *mask_o = Py_None, *stream_o = Py_None,
             *hist_o = Py_None;
    long flags = 0;
    int sync = 0;
    cu_layer *s = (cu_layer *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOlpO:apply", kwl, &res_o, &rows_o, &tok_o, &mask_o,
                                     &stream_o, &flags, &sync, &hist_o))
        return NULL;
    if (layer_live(s) < 0)
        return NULL;
    struct call c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.sync = sync;
    eg_array res, rows, mk;
    int have_res = 0, have_rows = 0, have_mk = 0;
    PyObject *dl = NULL, *ret = NULL;
    eg_history *h = NULL;
    char b[128];
    if ((rows_o == Py_None) == (tok_o == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "apply: give rows= or tokens= (one of them)");
        return NULL;
    }
    if (flags & ~(long)(ENGRAM_CUDA_FMA_ONLY | ENGRAM_CUDA_SERIAL_GATE | ENGRAM_CUDA_NO_GRAPH)) {
        PyErr_Format(PyExc_ValueError, "flags: %ld; FMA_ONLY (1), SERIAL_GATE (4), NO_GRAPH (8) or'd", flags);
        return NULL;
    }
    if (hist_o != Py_None) {
        int r = PyObject_IsInstance(hist_o, HistoryType);
        if (r < 0)
            return NULL;
        if (!r || ((eg_history *)hist_o)->member != ENGRAM_MEMBER_V41) {
            PyErr_SetString(PyExc_TypeError, "history: an engram.History of a V4.1 model (Model.history())");
            return NULL;
        }
        if (tok_o == Py_None) {
            PyErr_SetString(PyExc_TypeError, "history: only with tokens= (rows were hashed already)");
            return NULL;
        }
        h = (eg_history *)hist_o;
    }
    if (stream_arg(stream_o, &c.a.stream, &dl) < 0)
        return NULL;
    c.a.flags = (unsigned)flags;
    /* residual: (n, S, W) CUDA memory, C-contiguous, updated in place */
    uint32_t S = s->info.streams, W = s->info.width;
    if (eg_residual_arg(res_o, EG_CUDA, dl, SIZE_MAX, S, W, "tensor", &res, &c.a.resid_dtype) < 0)
        goto done;
    have_res = 1;
    if (same_device(s, &res, "residual") < 0)
        goto done;
    c.n = (size_t)res.shape[0];
    if (c.n > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "residual: %zu tokens (at most %u a call)", c.n, UINT32_MAX);
        goto done;
    }
    c.a.n = (unsigned)c.n;
    c.a.resid = res.data;
    size_t resid_bytes = c.n * S * W * (size_t)res.itemsize;
    if (tok_o != Py_None) {
        size_t nt;
        if (eg_tokens(tok_o, "tokens", &c.tokens, &nt) < 0)
            goto done;
        if (nt != c.n) {
            PyErr_Format(PyExc_ValueError, "tokens: %zu tokens for a residual of %zu", nt, c.n);
            goto done;
        }
    } else {
        int cu = on_cuda(rows_o);
        if (cu < 0)
            goto done;
        if (eg_array_get(rows_o, "rows", cu ? EG_CUDA : 0, cu ? dl : NULL, &rows) < 0)
            goto done;
        have_rows = 1;
        if (check_rows(&rows, c.n, cu) < 0)
            goto done;
        size_t stride = c.n > 1 ? (size_t)rows.strides[0] : RAW_TOKEN;
        if (cu) {
            if (same_device(s, &rows, "rows") < 0)
                goto done;
            const char *r0 = rows.data, *x0 = res.data;
            if (c.n && r0 < x0 + resid_bytes && x0 < r0 + (c.n - 1) * stride + RAW_TOKEN) {
                PyErr_SetString(PyExc_ValueError, "rows: overlaps residual");
                goto done;
            }
            c.a.raw = rows.data;
            c.a.raw_stride = stride;
        } else {
            c.h_rows = rows.data;
            c.h_stride = stride;
        }
    }
    /* mask: None, CUDA memory (n,) uint8/bool, or host values (uploaded) */
    if (mask_o != Py_None) {
        int cu = on_cuda(mask_o);
        if (cu < 0)
            goto done;
        if (cu) {
            if (eg_array_get(mask_o, "mask", EG_CUDA, dl, &mk) < 0)
                goto done;
            have_mk = 1;
            if ((mk.kind != EG_U8 && mk.kind != EG_BOOL && mk.kind != EG_I8) || mk.ndim != 1 ||
                (size_t)mk.shape[0] != c.n || (c.n > 1 && mk.strides[0] != 1)) {
                PyErr_Format(PyExc_ValueError, "mask: %s %s; a contiguous (%zu,) uint8 or bool tensor is needed",
                             eg_kind_name(mk.kind), eg_shape_str(&mk, b, sizeof b), c.n);
                goto done;
            }
            if (same_device(s, &mk, "mask") < 0)
                goto done;
            c.a.mask = mk.data;
        } else if (eg_mask(mask_o, "mask", c.n, &c.h_mask) < 0) {
            goto done;
        }
    }
    if (h)
        c.hist = h->h;
    else
        engram_history_reset(&c.hist);
    int rc = 0;
    if (c.n || c.sync) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&s->mu);
        if (!s->c) {
            rc = -EBADF; /* closed by another thread meanwhile */
            c.what = "apply";
            memset(&c.err, 0, sizeof c.err);
        } else if (c.n) {
            rc = run(&c);
        } else {
            int prev;
            c.what = "sync";
            if (dev_enter(s->device, &prev) != cudaSuccess)
                rc = cu_err(cudaGetLastError(), &c.err, -EIO, "cudaSetDevice");
            else if ((rc = capture_state(c.a.stream, 1, 0, &c.err, &c.what)) == 0)
                rc = engram_cuda_sync(s->c, c.a.stream, &c.err);
            dev_leave(prev);
        }
        pthread_mutex_unlock(&s->mu);
        Py_END_ALLOW_THREADS
    }
    if (rc < 0) {
        eg_raise(rc, &c.err, c.what);
        goto done;
    }
    if (h)
        h->h = c.hist;
    Py_INCREF(res_o);
    ret = res_o;
done:
    if (have_res)
        eg_array_release(&res);
    if (have_rows)
        eg_array_release(&rows);
    if (have_mk)
        eg_array_release(&mk);
    Py_XDECREF(dl);
    PyMem_Free(c.tokens);
    PyMem_Free(c.h_mask);
    return ret;
}

static PyObject *cl_sync(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"stream", NULL};
    PyObject *stream_o = Py_None, *dl = NULL;
    cu_layer *s = (cu_layer *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:sync", kwl, &stream_o))
        return NULL;
    if (layer_live(s) < 0)
        return NULL;
    void *st = NULL;
    int given = stream_o != Py_None;
    if (given) {
        if (stream_arg(stream_o, &st, &dl) < 0)
            return NULL;
        Py_DECREF(dl);
    }
    engram_error err;
    memset(&err, 0, sizeof err);
    int rc, prev;
    const char *what = "sync";
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->mu);
    if (!s->c) {
        rc = -EBADF;
    } else if (dev_enter(s->device, &prev) != cudaSuccess) {
        rc = cu_err(cudaGetLastError(), &err, -EIO, "cudaSetDevice");
        dev_leave(prev);
    } else {
        if ((rc = capture_state(given ? st : s->last, 1, 0, &err, &what)) == 0)
            rc = engram_cuda_sync(s->c, given ? st : s->last, &err);
        dev_leave(prev);
    }
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return eg_raise(rc, &err, what);
    Py_RETURN_NONE;
}

static PyObject *cl_info(PyObject *o, void *cl)
{
    (void)cl;
    cu_layer *s = (cu_layer *)o;
    if (layer_live(s) < 0)
        return NULL;
    return Py_BuildValue("{s:i,s:i,s:i,s:I,s:I,s:K}", "device", s->device, "table", s->info.table, "layer",
                         s->info.layer, "width", s->info.width, "streams", s->info.streams, "bytes",
                         (unsigned long long)engram_cuda_layer_bytes(s->c));
}

static PyObject *cl_layer(PyObject *o, void *cl)
{
    (void)cl;
    cu_layer *s = (cu_layer *)o;
    Py_INCREF(s->layer);
    return s->layer;
}

static PyObject *cl_repr(PyObject *o)
{
    cu_layer *s = (cu_layer *)o;
    if (!s->c)
        return PyUnicode_FromString("engram.cuda.Layer(closed)");
    return PyUnicode_FromFormat("engram.cuda.Layer(layer=%d, width=%u, streams=%u, device=%d)", s->info.layer,
                                s->info.width, s->info.streams, s->device);
}

static PyGetSetDef cl_getset[] = {
    {"info", cl_info, NULL,
     "A dict: device, table, layer (0-based model layer), width, streams, bytes (device memory "
     "the layer holds: F16 weights, norms, workspace).",
     NULL},
    {"layer", cl_layer, NULL, "The engram.Layer whose weights were uploaded.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef cl_methods[] = {
    {"apply", (PyCFunction)(void (*)(void))cl_apply, METH_VARARGS | METH_KEYWORDS,
     "apply(residual, rows=None, tokens=None, mask=None, stream=None, flags=0, sync=False, "
     "history=None) -> residual\n\n"
     "Applies the layer on the GPU to n tokens, updating residual IN PLACE on the stream, "
     "asynchronously (nothing is allocated on the device unless host rows or a host mask need "
     "the layer's scratch to grow, or the call is the second with its arguments: its graph, "
     "below).\n\n"
     "residual: a CUDA tensor (DLPack: torch, CuPy), float32 or bfloat16 (or BF16 bits as "
     "uint16), shape (n, S, W), C-contiguous, on this layer's device.  It is exported with "
     "__dlpack__(stream=...), so the producer orders its pending work before the stream.\n"
     "rows: the tokens' raw rows, uint8 (n, 24, 264) as a pool step or prefill delivers them "
     "with dtype \"raw\" (each token's 24 rows contiguous; tokens may be further apart: a "
     "table's slice [:, 24t:24t+24] of a step's (n, 48, 264) buffer is taken as it is).  In CUDA "
     "memory they are read in place; in host memory (a NumPy array) they are checked to "
     "decode and copied into the layer's device scratch on the stream (from page-locked "
     "memory asynchronously: keep them unchanged until the stream has passed).\n"
     "tokens: instead of rows, raw ids (n of them): hashed (from history, an engram.History "
     "advanced on success; None: a sequence start) and read on the host through the model's "
     "reader, uncached, then uploaded and applied.\n"
     "mask: None, or n values, 0 = masked (left untouched, and a dead history entry for "
     "tokens=): a CUDA uint8/bool tensor, or host values (uploaded).\n"
     "stream: None (the default stream), a cudaStream_t as an int, or a torch.cuda.Stream.  "
     "Calls on one layer share a workspace: an apply on another stream than the last waits "
     "for it on the device.\n"
     "CUDA graphs: an apply on a stream under capture (torch.cuda.graph: pass "
     "stream=torch.cuda.current_stream(); None is the legacy default stream) is recorded into "
     "the graph; its replays read the tensors given at capture (keep them alive; copy new rows "
     "and residuals into them before a replay).  Under capture rows= and mask= must be CUDA "
     "tensors and sync False (ArgumentError otherwise, before the layer queues anything).  "
     "Replays are outside the layer's own ordering of its applies (it waits only for eager "
     "ones): a replay must follow the layer's earlier applies and replays, and every later "
     "apply or replay must follow it, by the caller's stream order or events; "
     "sync(stream=the replay's stream) reports its non-finite tokens; close the layer only "
     "after its replays have finished, and never replay after close.  While a capture of the "
     "global mode (torch's default) is under way, calls that allocate or wait (host rows or "
     "masks, tokens=, sync, close, a new Layer) are CUDA's to refuse, on any thread.\n"
     "flags: FMA_ONLY, SERIAL_GATE, NO_GRAPH (engram_cuda.h).  An eager apply of 1 to GEMV_MAX "
     "tokens whose arguments (the tensors' addresses, rows, mask, flags) the layer has seen "
     "before is one launch of a graph the layer made of it, unless NO_GRAPH (engram_cuda.h).\n"
     "sync: wait for the stream and report as sync() does.\n\n"
     "Arguments are checked before anything runs: TypeError / ValueError naming the argument "
     "(a CPU tensor, a wrong dtype, shape or device, not contiguous), ArgumentError for a "
     "token out of the vocabulary, DataError for host rows that do not decode.  A token whose "
     "residual or result is not finite is left untouched and recorded: sync() raises "
     "DataError naming it.  The GIL is released while the call runs."},
    {"sync", (PyCFunction)(void (*)(void))cl_sync, METH_VARARGS | METH_KEYWORDS,
     "sync(stream=None)\n\nWaits for the stream (None: the stream of the last eager apply) and reports "
     "what earlier applies recorded: DataError naming the first token whose residual or result "
     "was not finite (left untouched; others were updated), engram.Error for a CUDA error."},
    {"close", cl_close, METH_NOARGS,
     "close()\n\nWaits for the last eager apply and frees the device memory now (a graph that "
     "captured an apply must not be replayed after it)."},
    {"__enter__", cl_enter, METH_NOARGS, NULL},
    {"__exit__", cl_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot cl_slots[] = {
    {Py_tp_doc, "Layer(layer, device=0): an engram.Layer's weights uploaded to a CUDA device.\n\n"
                "DeepSeek V4.1 layers only (a PLE layer raises ValueError: its GPU path is "
                "internal to libengram-cuda).  The upload keeps F16 weights, the norms and a "
                "workspace on the device (info['bytes']; 550 MB at W = 5120).  apply() updates "
                "CUDA residuals in place on the caller's stream.  Raises RuntimeError naming "
                "the reason where CUDA cannot be used (engram.cuda.why())."},
    {Py_tp_new, cl_new},
    {Py_tp_dealloc, cl_dealloc},
    {Py_tp_getset, cl_getset},
    {Py_tp_methods, cl_methods},
    {Py_tp_repr, cl_repr},
    {0, NULL}};

static PyType_Spec cl_spec = {"engram.cuda.Layer", sizeof(cu_layer), 0, Py_TPFLAGS_DEFAULT, cl_slots};

/* ------------------------------------------------------------- module */

static PyObject *py_probe(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    engram_error err;
    memset(&err, 0, sizeof err);
    if (probe(&err))
        Py_RETURN_NONE;
    return PyUnicode_FromString(err.msg[0] ? err.msg : "no CUDA device");
}

static PyMethodDef module_methods[] = {
    {"probe", py_probe, METH_NOARGS,
     "probe() -> None or str\n\nNone if a CUDA device can be used, else the reason "
     "(engram_cuda_available's message: the CUDA runtime's error text, or \"no CUDA device\")."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_engram_cuda",
    "engram._engram_cuda: the C extension behind engram.cuda (see help(engram.cuda)).", -1,
    module_methods, NULL, NULL, NULL, NULL};

static int fetch(PyObject *from, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(from, name); /* kept for the process's life */
    return *out ? 0 : -1;
}

PyMODINIT_FUNC PyInit__engram_cuda(void);
PyMODINIT_FUNC PyInit__engram_cuda(void)
{
    PyObject *core = PyImport_ImportModule("engram._engram");
    if (!core)
        return NULL;
    int rc = fetch(core, "Error", &eg_Error) < 0 || fetch(core, "ArgumentError", &eg_ArgumentError) < 0 ||
                     fetch(core, "DataError", &eg_DataError) < 0 || fetch(core, "ModelError", &eg_ModelError) < 0 ||
                     fetch(core, "NotFoundError", &eg_NotFoundError) < 0 ||
                     fetch(core, "TimeoutError", &eg_TimeoutError) < 0 ||
                     fetch(core, "CancelledError", &eg_CancelledError) < 0 ||
                     fetch(core, "ClosedError", &eg_ClosedError) < 0 || fetch(core, "BusyError", &eg_BusyError) < 0 ||
                     fetch(core, "Layer", &LayerType) < 0 || fetch(core, "History", &HistoryType) < 0
                 ? -1 : 0;
    Py_DECREF(core);
    if (rc < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (!(CudaLayerType = PyType_FromSpec(&cl_spec)))
        goto fail;
    Py_INCREF(CudaLayerType);
    if (PyModule_AddObject(m, "Layer", CudaLayerType) < 0) {
        Py_DECREF(CudaLayerType);
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "FMA_ONLY", ENGRAM_CUDA_FMA_ONLY) < 0 ||
        PyModule_AddIntConstant(m, "SERIAL_GATE", ENGRAM_CUDA_SERIAL_GATE) < 0 ||
        PyModule_AddIntConstant(m, "NO_GRAPH", ENGRAM_CUDA_NO_GRAPH) < 0 ||
        PyModule_AddIntConstant(m, "GEMV_MAX", ENGRAM_CUDA_GEMV_MAX) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK", ENGRAM_CUDA_BLOCK) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
