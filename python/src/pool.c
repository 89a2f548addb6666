/*
 * pool.c - engram.Pool, Session, Step and Prefill: the library's sessions
 * (engram_pool_*, engram_session_*, engram_step_*, engram_prefill_*) for
 * Python.
 *
 * Locks.  The C API forbids concurrent start/end calls on one session
 * (begin, commit, abort, close, prefill begin/end/cancel, snapshots,
 * engram_step_apply, engram_prefill_apply); Python threads may make them, so
 * each Session has a mutex `mu` that every such call holds.  `mu` is only
 * ever taken with the GIL released and nothing that needs the GIL runs
 * under it, so it cannot deadlock with the GIL (a Layer's mutex, taken
 * inside it by the applies, follows the same rule: order session -> layer).
 * Waits never hold it: a wait registers as a waiter under `mu`, waits
 * without it and unregisters; close aborts the step (which wakes the
 * waits) and waits for the waiters to leave before engram_session_close
 * frees the session.  A Pool has its own mutex for its handle (session
 * open, stats, ring sizes against close).
 *
 * Which step is in progress is the Session's `cur` (a borrowed pointer set
 * at begin, cleared at commit, abort, close and by the Step's dealloc), so
 * a Step that has ended can never wait for, commit or abort a later one;
 * `gen` counts the steps begun (a wait that straddled a begin is reported
 * cancelled).
 *
 * Lifetimes.  Session -> Pool -> Model are strong references; a Step holds
 * its Session and its out array (and the array's buffer export, so that
 * the memory stays where the library writes it), a Prefill its Session,
 * tokens, mask and ring.  The Model's `users` counts a Pool until the pool
 * is closed and every session and prefill of it is gone (the library's
 * handles use the model until then).
 */
#include "ext.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* layer.c */
pthread_mutex_t *eg_layer_mutex(PyObject *layer);
engram_applier *eg_layer_applier_held(PyObject *layer);
eg_model *eg_layer_model_of(PyObject *layer);

static PyObject *PoolType, *SessionType, *StepType, *PrefillType;

/* waits release the GIL and come back for signals (Ctrl-C) this often */
#define WAIT_SLICE_NS 100000000ull

/* ------------------------------------------------------------- objects */

typedef struct eg_pool {
    PyObject_HEAD
    eg_model *model;            /* strong                                     */
    engram_pool *p;             /* NULL once closed (written under mu)        */
    pthread_mutex_t mu;         /* p against close                            */
    int closed;                 /* close() has begun (GIL)                    */
    unsigned handles;           /* sessions and prefills still open (GIL)     */
    int user;                   /* counted in model->users                    */
    int ple;
    unsigned tables, rpt, row_values, row_bytes, S, W;
    uint64_t cache_bytes;       /* asked of the reader                        */
} eg_pool;

struct eg_step;

typedef struct eg_session {
    PyObject_HEAD
    eg_pool *pool;              /* strong                                     */
    engram_session *s;          /* NULL once closed                           */
    int closed;                 /* close() has begun (GIL; s is mu's)         */
    pthread_mutex_t mu;         /* start/end calls; s and the fields below    */
    pthread_cond_t idle;        /* waiters reached 0                          */
    unsigned waiters;           /* waits in progress on s                     */
    struct eg_step *cur;        /* the step in progress (borrowed)            */
    uint64_t gen;               /* steps begun                                */
} eg_session;

enum { ST_NEW, ST_LIVE, ST_COMMITTED, ST_ABORTED, ST_FAILED };

typedef struct eg_step {
    PyObject_HEAD
    eg_session *sess;           /* strong                                     */
    PyObject *out;              /* strong: the array rows are written into    */
    eg_array arr;               /* its memory, held for the step's life       */
    int have_arr;
    unsigned k;
    engram_dtype dtype;
    uint64_t gen;               /* sess->gen at begin                         */
    int state;                  /* ST_* (GIL); sess->cur is the truth         */
} eg_step;

typedef struct eg_prefill {
    PyObject_HEAD
    eg_session *sess;           /* strong                                     */
    engram_prefill *pf;         /* NULL once ended or cancelled               */
    uint32_t *tokens;           /* [n], owned: read until end or cancel       */
    uint8_t *mask;              /* NULL or [n], owned                         */
    size_t n;
    PyObject *ring;             /* numpy uint8: both tables' rings            */
    eg_array ring_arr;
    int have_ring;
    char *ring_base;            /* 64-byte aligned inside ring                */
    PyObject *ring_ro;          /* read-only memoryview of ring               */
    engram_dtype dtype;
    size_t chunks;
    uint64_t timeout_ns;
    size_t next;                /* the next item (chunk next/tables, table next%tables) */
    int held;                   /* the current item waited for, not released  */
    int cur_table;
    size_t cur_chunk, cur_first, cur_n;
    int busy;                   /* a call is working without the GIL          */
    int exhausted, ended, cancelled;
} eg_prefill;

/* ------------------------------------------------------------- helpers */

static PyObject *closed_error(const char *what, const char *msg)
{
    engram_error err;
    eg_set_err(&err, -EBADF, msg);
    return eg_raise(-EBADF, &err, what);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* None -> ENGRAM_FOREVER; seconds (>= 0) -> ns */
static int timeout_arg(PyObject *o, uint64_t *ns)
{
    if (!o || o == Py_None) {
        *ns = ENGRAM_FOREVER;
        return 0;
    }
    if (!PyNumber_Check(o) || PyBool_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "timeout: seconds (a number) or None");
        return -1;
    }
    double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) { /* an int too large for a double */
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeout: seconds out of range (None: no limit)");
        return -1;
    }
    if (!(d >= 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout: seconds >= 0, or None (no limit)");
        return -1;
    }
    *ns = d >= 1.8e10 ? ENGRAM_FOREVER - 1 : (uint64_t)(d * 1e9);
    return 0;
}

static int dtype_arg(const char *s, engram_dtype *dt)
{
    if (!strcmp(s, "bfloat16"))
        *dt = ENGRAM_BF16;
    else if (!strcmp(s, "float32"))
        *dt = ENGRAM_F32;
    else if (!strcmp(s, "raw"))
        *dt = ENGRAM_RAW;
    else {
        PyErr_Format(PyExc_ValueError, "dtype: '%s'; \"bfloat16\", \"float32\" or \"raw\"", s);
        return -1;
    }
    return 0;
}

/* One row of a step's or prefill's buffer in a pool's numbers: its NumPy
 * kind and elements (V4.1 raw: 264 bytes; PLE raw: the BF16 values). */
static void row_shape(const eg_pool *po, engram_dtype dt, eg_kind *kind, unsigned *elems)
{
    if (dt == ENGRAM_F32) {
        *kind = EG_F32;
        *elems = po->row_values;
    } else if (dt == ENGRAM_RAW && !po->ple) {
        *kind = EG_U8;
        *elems = po->row_bytes;
    } else {
        *kind = EG_U16;
        *elems = po->row_values;
    }
}

static int kind_fits(eg_kind want, eg_kind have)
{
    if (want == EG_U16)
        return have == EG_U16 || have == EG_BF16 || have == EG_I16;
    if (want == EG_U8)
        return have == EG_U8 || have == EG_I8;
    return have == want;
}

/* A residual for an apply: (n, S, W), float32 or BF16, C-contiguous,
 * writable host memory. */
/* A Layer made from another Model (perhaps of the same shape) would apply
 * the wrong weights without an error: refused.  0 or -1. */
static int layer_of_pool(PyObject *layer, const eg_pool *po)
{
    if (eg_layer_model_of(layer) != po->model) {
        PyErr_SetString(PyExc_ValueError, "layer: a Layer of another Model (use this pool's model's layer)");
        return -1;
    }
    return 0;
}

static int residual_arg(const eg_pool *po, PyObject *o, size_t n, eg_array *a, engram_dtype *dt)
{
    return eg_residual_arg(o, 0, NULL, n, po->S, po->W, "array", a, dt);
}

static PyObject *numpy_frombuffer;

/* numpy.frombuffer(buf, dtype, count, offset).reshape(n, a, b) */
static PyObject *numpy_view(PyObject *buf, eg_kind kind, Py_ssize_t offset, size_t n, unsigned a,
                            unsigned b)
{
    if (!numpy_frombuffer) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np)
            return NULL;
        numpy_frombuffer = PyObject_GetAttrString(np, "frombuffer");
        Py_DECREF(np);
        if (!numpy_frombuffer)
            return NULL;
    }
    const char *dt = kind == EG_F32 ? "float32" : kind == EG_U16 ? "uint16" : "uint8";
    PyObject *args = Py_BuildValue("(O)", buf);
    PyObject *kw = Py_BuildValue("{s:s,s:n,s:n}", "dtype", dt, "count", (Py_ssize_t)(n * a * b), "offset",
                                 offset);
    PyObject *flat = args && kw ? PyObject_Call(numpy_frombuffer, args, kw) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(kw);
    if (!flat)
        return NULL;
    PyObject *r = PyObject_CallMethod(flat, "reshape", "nII", (Py_ssize_t)n, a, b);
    Py_DECREF(flat);
    return r;
}

static int dict_put(PyObject *d, const char *k, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *self_enter(PyObject *o, PyObject *args)
{
    (void)args;
    Py_INCREF(o);
    return o;
}

/* Waits through fn (which runs without the GIL) in slices, coming back
 * for signals between them: the library's code (-ETIMEDOUT once timeout_ns
 * passed), or -EINTR with the signal handler's exception set. */
typedef int (*wait_fn)(void *ctx, uint64_t ns, engram_error *err);

static int wait_sliced(wait_fn fn, void *ctx, uint64_t timeout_ns, engram_error *err)
{
    uint64_t start = now_ns();
    int forever = timeout_ns == ENGRAM_FOREVER;
    for (;;) {
        uint64_t spent = now_ns() - start;
        uint64_t left = forever ? WAIT_SLICE_NS : spent >= timeout_ns ? 0 : timeout_ns - spent;
        uint64_t ns = left < WAIT_SLICE_NS ? left : WAIT_SLICE_NS;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = fn(ctx, ns, err);
        Py_END_ALLOW_THREADS
        if (rc != -ETIMEDOUT || (!forever && ns == left))
            return rc;
        if (PyErr_CheckSignals() < 0)
            return -EINTR;
    }
}

/* ------------------------------------------------------------- Pool */

/* The pool stops counting as a user of its model once it is closed and
 * every session and prefill of it is gone. */
static void pool_check_user(eg_pool *po)
{
    if (po->user && po->closed && po->handles == 0) {
        po->user = 0;
        po->model->users--;
    }
}

static void pool_handle_gone(eg_pool *po)
{
    if (po->handles)
        po->handles--;
    pool_check_user(po);
}

static PyObject *pool_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"model", "threads", "cache_rows", "engine", NULL};
    PyObject *model, *thr_o = Py_None, *eng_o = Py_None, *cache_o = NULL;
    unsigned long long cache_rows = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OOO:Pool", kwl, (PyTypeObject *)eg_ModelType, &model,
                                     &thr_o, &cache_o, &eng_o))
        return NULL;
    if (cache_o && cache_o != Py_None) {
        cache_rows = PyLong_AsUnsignedLongLong(cache_o);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "cache_rows: rows of the row cache, an int >= 0");
            return NULL;
        }
    }
    eg_model *m = (eg_model *)model;
    if (!m->m)
        return closed_error("model", "the model is closed");
    engram_pool_opts o;
    memset(&o, 0, sizeof o);
    if (thr_o != Py_None) {
        long t = PyLong_AsLong(thr_o);
        if (t == -1 && PyErr_Occurred())
            return NULL;
        if (t < 1 || t > ENGRAM_READER_MAX_DEPTH) {
            PyErr_Format(PyExc_ValueError, "threads: %ld; reads in flight 1 .. %d, or None", t,
                         ENGRAM_READER_MAX_DEPTH);
            return NULL;
        }
        o.reader.depth = (unsigned)t;
    }
    if (eng_o != Py_None) {
        PyObject *u = PyUnicode_Check(eng_o) ? PyUnicode_AsUTF8String(eng_o) : NULL;
        const char *e = u ? PyBytes_AsString(u) : NULL;
        if (!e) {
            Py_XDECREF(u);
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "engine: None, \"auto\", \"uring\", \"threads\" or \"buffered\"");
            return NULL;
        }
        int ok = 1;
        if (!strcmp(e, "auto"))
            o.reader.engine = ENGRAM_IO_AUTO;
        else if (!strcmp(e, "uring") || !strcmp(e, "io_uring"))
            o.reader.engine = ENGRAM_IO_URING;
        else if (!strcmp(e, "threads"))
            o.reader.engine = ENGRAM_IO_THREADS;
        else if (!strcmp(e, "buffered"))
            o.reader.engine = ENGRAM_IO_BUFFERED;
        else
            ok = 0;
        if (!ok)
            PyErr_Format(PyExc_ValueError, "engine: '%s'; \"auto\", \"uring\", \"threads\" or \"buffered\"", e);
        Py_DECREF(u);
        if (!ok)
            return NULL;
    }
    const engram_family *f = &m->info.family;
    if (cache_rows > 0) {
        /* the reader's cache holds (bytes - its header) / (8 x (row + 9))
         * sets of 8 rows: one set more than the rows asked for and 64 bytes
         * of header cover the rounding, so it holds at least cache_rows */
        uint64_t per = (uint64_t)f->row_bytes + 9;
        if (cache_rows > (UINT64_MAX - 64) / per - 8) {
            PyErr_SetString(PyExc_ValueError, "cache_rows: too many");
            return NULL;
        }
        uint64_t bytes = (cache_rows + 8) * per + 64;
        o.reader.cache_bytes = bytes < ENGRAM_READER_MIN_CACHE ? ENGRAM_READER_MIN_CACHE : bytes;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_pool *self = (eg_pool *)alloc(tp, 0);
    if (!self)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    Py_INCREF(m);
    self->model = m;
    self->ple = f->member == ENGRAM_MEMBER_PLE;
    self->tables = f->tables;
    self->rpt = f->rows_per_token;
    self->row_values = f->row_values;
    self->row_bytes = f->row_bytes;
    self->S = m->info.streams;
    self->W = m->info.width;
    self->cache_bytes = o.reader.cache_bytes;
    engram_error err;
    int rc;
    m->users++; /* before the GIL goes: Model.close() is refused from here on */
    self->user = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_pool_open(m->m, &o, &self->p, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        self->p = NULL;
        eg_raise(rc, &err, "Pool");
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void pool_close_now(eg_pool *self)
{
    engram_pool *p;
    self->closed = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    p = self->p;
    self->p = NULL;
    pthread_mutex_unlock(&self->mu);
    engram_pool_close(p);
    Py_END_ALLOW_THREADS
    pool_check_user(self);
}

static void pool_dealloc(PyObject *o)
{
    eg_pool *self = (eg_pool *)o;
    if (!self->closed)
        pool_close_now(self);
    if (self->user && self->model) /* sessions hold the pool: none is left */
        self->model->users--;
    self->user = 0;
    Py_CLEAR(self->model);
    pthread_mutex_destroy(&self->mu);
    eg_heap_free(o);
}

static PyObject *pool_close(PyObject *o, PyObject *args)
{
    (void)args;
    pool_close_now((eg_pool *)o);
    Py_RETURN_NONE;
}

static PyObject *pool_exit(PyObject *o, PyObject *args)
{
    (void)args;
    return pool_close(o, NULL);
}

static PyObject *pool_session(PyObject *o, PyObject *args)
{
    (void)args;
    eg_pool *self = (eg_pool *)o;
    PyTypeObject *tp = (PyTypeObject *)SessionType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_session *se = (eg_session *)alloc(tp, 0);
    if (!se)
        return NULL;
    pthread_mutex_init(&se->mu, NULL);
    pthread_cond_init(&se->idle, NULL);
    Py_INCREF(self);
    se->pool = self;
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    rc = self->p ? engram_session_open(self->p, &se->s, &err) : eg_set_err(&err, -EBADF, "the pool is closed");
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        se->s = NULL;
        Py_DECREF(se);
        return eg_raise(rc, &err, "session");
    }
    self->handles++;
    return (PyObject *)se;
}

static PyObject *steps_begin_many(eg_pool *po, PyObject *requests, const char *dtype);

static PyObject *pool_step_batch(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"requests", "dtype", NULL};
    PyObject *req;
    const char *dtype = "bfloat16";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|s:step_batch", kwl, &req, &dtype))
        return NULL;
    return steps_begin_many((eg_pool *)o, req, dtype);
}

static PyObject *pool_stats(PyObject *o, void *c)
{
    (void)c;
    eg_pool *self = (eg_pool *)o;
    engram_pool_stats st;
    char engine[32] = "", note[160] = "", drop[32] = "";
    int live;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    live = self->p != NULL;
    if (live) {
        engram_pool_get_stats(self->p, &st);
        /* the strings are the pool's: copied before it can close */
        snprintf(engine, sizeof engine, "%s", st.io.engine ? st.io.engine : "");
        snprintf(note, sizeof note, "%s", st.io.note ? st.io.note : "");
        snprintf(drop, sizeof drop, "%s", st.io.drop ? st.io.drop : "");
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (!live)
        return closed_error("stats", "the pool is closed");
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    const engram_io_stats *io = &st.io;
    if (dict_put(d, "steps", PyLong_FromUnsignedLongLong(st.steps)) < 0 ||
        dict_put(d, "rounds", PyLong_FromUnsignedLongLong(st.rounds)) < 0 ||
        dict_put(d, "step_rows_requested", PyLong_FromUnsignedLongLong(st.step_rows_requested)) < 0 ||
        dict_put(d, "step_rows_read", PyLong_FromUnsignedLongLong(st.step_rows_read)) < 0 ||
        dict_put(d, "prefill_chunks", PyLong_FromUnsignedLongLong(st.prefill_chunks)) < 0 ||
        dict_put(d, "prefill_rows_requested", PyLong_FromUnsignedLongLong(st.prefill_rows_requested)) < 0 ||
        dict_put(d, "prefill_rows_read", PyLong_FromUnsignedLongLong(st.prefill_rows_read)) < 0 ||
        dict_put(d, "engine", PyUnicode_FromString(engine)) < 0 ||
        dict_put(d, "engine_note", PyUnicode_FromString(note)) < 0 ||
        dict_put(d, "direct", PyBool_FromLong(io->direct)) < 0 ||
        dict_put(d, "drop", PyUnicode_FromString(drop)) < 0 ||
        dict_put(d, "align", PyLong_FromUnsignedLong(io->align)) < 0 ||
        dict_put(d, "depth", PyLong_FromUnsignedLong(io->depth)) < 0 ||
        dict_put(d, "reserved_bytes", PyLong_FromUnsignedLongLong(io->reserved_bytes)) < 0 ||
        dict_put(d, "rows_requested", PyLong_FromUnsignedLongLong(io->rows_requested)) < 0 ||
        dict_put(d, "rows_read", PyLong_FromUnsignedLongLong(io->rows_read)) < 0 ||
        dict_put(d, "broken", PyBool_FromLong(io->broken)) < 0 ||
        dict_put(d, "cache_bytes", PyLong_FromUnsignedLongLong(io->cache_bytes)) < 0 ||
        dict_put(d, "cache_rows", PyLong_FromUnsignedLongLong(io->cache_rows)) < 0 ||
        dict_put(d, "prefill_rings_allocated", PyLong_FromUnsignedLongLong(st.prefill_rings_allocated)) < 0 ||
        dict_put(d, "prefill_rings_reused", PyLong_FromUnsignedLongLong(st.prefill_rings_reused)) < 0 ||
        dict_put(d, "prefill_ring_bytes", PyLong_FromUnsignedLongLong(st.prefill_ring_bytes)) < 0 ||
        dict_put(d, "closed", PyBool_FromLong(st.closed)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *pool_closed(PyObject *o, void *c)
{
    (void)c;
    return PyBool_FromLong(((eg_pool *)o)->closed);
}

static PyObject *pool_model(PyObject *o, void *c)
{
    (void)c;
    PyObject *m = (PyObject *)((eg_pool *)o)->model;
    Py_INCREF(m);
    return m;
}

static PyObject *pool_repr(PyObject *o)
{
    eg_pool *self = (eg_pool *)o;
    return PyUnicode_FromFormat("engram.Pool(%s, sessions=%u%s)", self->ple ? "ple" : "v4.1", self->handles,
                                self->closed ? ", closed" : "");
}

static PyGetSetDef pool_getset[] = {
    {"stats", pool_stats, NULL,
     "A dict of the pool's counters since open (engram_pool_get_stats): steps (begun), rounds "
     "(of merged step reads), step_rows_requested / step_rows_read (requested vs distinct reads), "
     "prefill_chunks, prefill_rows_requested / prefill_rows_read, prefill_rings_allocated / "
     "_reused, prefill_ring_bytes, closed; and the reader's: engine (\"io_uring\", \"threads\" or "
     "\"buffered\"), engine_note (why a fallback was taken), direct (O_DIRECT), drop, align, depth "
     "(reads in flight), reserved_bytes, rows_requested / rows_read (the steps' and prefills' "
     "together), broken, cache_bytes and cache_rows (the row cache's memory and capacity): the "
     "reader's facts as taken at open (its live counters belong to the I/O thread).  Raises "
     "ClosedError after close().",
     NULL},
    {"closed", pool_closed, NULL, "True once close() was called.", NULL},
    {"model", pool_model, NULL, "The Model the pool reads.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef pool_methods[] = {
    {"session", pool_session, METH_NOARGS,
     "session() -> Session\n\n"
     "A new session (one sequence) at a sequence start, idle.  Its memory is the library's "
     "(a few KiB; PLE adds twice its convolution state), freed by Session.close().  Raises "
     "ClosedError after close()."},
    {"step_batch", (PyCFunction)(void (*)(void))pool_step_batch, METH_VARARGS | METH_KEYWORDS,
     "step_batch(requests, dtype=\"bfloat16\") -> list of Step\n\n"
     "Begins steps of several sessions at once (engram_step_begin_many): requests is a sequence "
     "of (session, tokens) or (session, tokens, mask), each as Session.step takes them (1 .. "
     "MAX_DRAFT tokens, a new out array each, masked tokens' rows zero), sessions of this pool, each once.  "
     "Validated as a whole first: nothing begins unless every session can (a bad token is named "
     "by its position in the requests' tokens taken in order); then queued together, so rows "
     "wanted by several sessions are read once.  Raises TypeError / ValueError naming the "
     "request, ArgumentError, BusyError (a session with a step or prefill in progress), "
     "ClosedError (a closed session or pool)."},
    {"close", pool_close, METH_NOARGS,
     "close()\n\n"
     "Closes the pool: its I/O thread stops after collecting every read in flight.  Sessions "
     "still open stay valid objects: their steps and prefills in progress fail, and every later "
     "begin raises ClosedError (the library's ESHUTDOWN); close them too.  The Model stays in "
     "use (Model.close() refuses) until the pool and all its sessions are closed.  Idempotent."},
    {"__enter__", self_enter, METH_NOARGS, "__enter__() -> Pool\n\nThe pool itself."},
    {"__exit__", pool_exit, METH_VARARGS, "__exit__(*exc)\n\nclose()."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot pool_slots[] = {
    {Py_tp_doc,
     "Pool(model, threads=None, cache_rows=0, engine=None)\n\n"
     "Many sequences of one model share one pool (engram_pool_open): one uncached reader and "
     "one I/O thread that issues every session's reads, merges reads of the same row wanted by "
     "several sessions, decodes rows into the sessions' buffers and wakes whoever waits.  Decode "
     "steps are served before prefill chunks.\n\n"
     "threads: reads in flight (the reader's depth: io_uring's queue depth; a thread pool "
     "runs a pread thread per two of them, the others queued), 1 .. 512; None: the library's "
     "default (64).\n"
     "cache_rows: a row cache of at least that many rows (0: none).  It is given to the reader "
     "as cache_bytes = (cache_rows + 8) x (row_bytes + 9) + 64 (the cache keeps each row's raw "
     "bytes, a tag and an age in sets of 8, so this holds at least cache_rows rows: about 273 "
     "bytes a row for V4.1, 329 for PLE), and at least ENGRAM_READER_MIN_CACHE (64 KiB); "
     "stats['cache_rows'] says what it holds.\n"
     "engine: None or \"auto\" (io_uring where the kernel allows, else pread threads; the "
     "buffered fallback where O_DIRECT is refused), \"uring\", \"threads\" or \"buffered\".\n\n"
     "Holds the model (Model.close() raises BusyError until the pool and its sessions are "
     "closed).  A context manager: `with engram.Pool(m) as pool:` closes it on exit.  Raises "
     "ValueError for bad arguments, ClosedError for a closed model, engram.Error (errno set) if "
     "the reader or the thread cannot start."},
    {Py_tp_new, pool_new},
    {Py_tp_dealloc, pool_dealloc},
    {Py_tp_getset, pool_getset},
    {Py_tp_methods, pool_methods},
    {Py_tp_repr, pool_repr},
    {0, NULL}};

static PyType_Spec pool_spec = {"engram.Pool", sizeof(eg_pool), 0, Py_TPFLAGS_DEFAULT, pool_slots};

/* ------------------------------------------------------------- Session */

/* Runs without the GIL: the step (if any) aborted, waits let go of, the
 * session closed.  0, or 1 if it was closed already. */
static int session_close_nogil(eg_session *se)
{
    pthread_mutex_lock(&se->mu);
    if (!se->s) {
        pthread_mutex_unlock(&se->mu);
        return 1;
    }
    se->cur = NULL;
    if (se->waiters) {
        engram_step_abort(se->s); /* wakes them: their step ended */
        while (se->waiters)
            pthread_cond_wait(&se->idle, &se->mu);
    }
    engram_session_close(se->s);
    se->s = NULL;
    pthread_mutex_unlock(&se->mu);
    return 0;
}

static void session_close_now(eg_session *se)
{
    int was;
    se->closed = 1;
    Py_BEGIN_ALLOW_THREADS
    was = session_close_nogil(se);
    Py_END_ALLOW_THREADS
    if (!was)
        pool_handle_gone(se->pool);
}

static void session_dealloc(PyObject *o)
{
    eg_session *self = (eg_session *)o;
    if (!self->closed)
        session_close_now(self);
    Py_CLEAR(self->pool);
    pthread_cond_destroy(&self->idle);
    pthread_mutex_destroy(&self->mu);
    eg_heap_free(o);
}

static PyObject *session_close(PyObject *o, PyObject *args)
{
    (void)args;
    session_close_now((eg_session *)o);
    Py_RETURN_NONE;
}

static PyObject *session_exit(PyObject *o, PyObject *args)
{
    (void)args;
    return session_close(o, NULL);
}

/* A Step not yet begun: out made (the rows of masked tokens, which the
 * library leaves as they are, zero-filled; nothing else: the library
 * writes every other row, and a fill by this thread would only make the
 * I/O thread fetch the lines back) or the caller's checked.  mask: NULL or
 * [k] (0: masked / padding). */
static eg_step *step_prepare(eg_session *se, unsigned k, engram_dtype dt, PyObject *out_o, const char *arg,
                             const uint8_t *mask)
{
    eg_pool *po = se->pool;
    eg_kind kind;
    unsigned elems;
    row_shape(po, dt, &kind, &elems);
    int64_t shape[3] = {(int64_t)k, (int64_t)(po->tables * po->rpt), (int64_t)elems};
    PyTypeObject *tp = (PyTypeObject *)StepType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_step *st = (eg_step *)alloc(tp, 0);
    if (!st)
        return NULL;
    Py_INCREF(se);
    st->sess = se;
    st->k = k;
    st->dtype = dt;
    st->state = ST_NEW;
    if (out_o && out_o != Py_None) {
        char b[128];
        if (eg_array_get(out_o, arg, EG_WRITABLE, NULL, &st->arr) < 0)
            goto fail;
        st->have_arr = 1;
        if (!kind_fits(kind, st->arr.kind)) {
            PyErr_Format(PyExc_TypeError, "%s: %s; %s is needed for dtype \"%s\"", arg, eg_kind_name(st->arr.kind),
                         kind == EG_U16 ? "uint16 (or torch.bfloat16)" : eg_kind_name(kind),
                         dt == ENGRAM_F32 ? "float32" : dt == ENGRAM_RAW ? "raw" : "bfloat16");
            goto fail;
        }
        if (st->arr.ndim != 3 || st->arr.shape[0] != shape[0] || st->arr.shape[1] != shape[1] ||
            st->arr.shape[2] != shape[2]) {
            PyErr_Format(PyExc_ValueError, "%s: shape %s; (%u, %u, %u) is needed", arg,
                         eg_shape_str(&st->arr, b, sizeof b), k, (unsigned)shape[1], elems);
            goto fail;
        }
        if (!eg_array_contiguous(&st->arr)) {
            PyErr_Format(PyExc_ValueError, "%s: not contiguous (rows are written into it: a C-contiguous "
                                           "array is needed, it is never copied)", arg);
            goto fail;
        }
        Py_INCREF(out_o);
        st->out = out_o;
    } else {
        if (!(st->out = eg_numpy_empty(3, shape, kind)))
            goto fail;
        if (eg_array_get(st->out, arg, EG_WRITABLE, NULL, &st->arr) < 0)
            goto fail;
        st->have_arr = 1;
        size_t tok_bytes = (size_t)shape[1] * (size_t)shape[2] * (size_t)st->arr.itemsize;
        for (unsigned i = 0; mask && i < k; i++)
            if (mask[i] == 0)
                memset((char *)st->arr.data + i * tok_bytes, 0, tok_bytes);
    }
    return st;
fail:
    Py_DECREF(st);
    return NULL;
}

static PyObject *session_step(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tokens", "mask", "dtype", "out", NULL};
    PyObject *tok_o, *mask_o = Py_None, *out_o = Py_None;
    const char *dtype = "bfloat16";
    eg_session *se = (eg_session *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OsO:step", kwl, &tok_o, &mask_o, &dtype, &out_o))
        return NULL;
    engram_dtype dt;
    if (dtype_arg(dtype, &dt) < 0)
        return NULL;
    if (se->closed)
        return closed_error("step", "the session is closed");
    uint32_t *tokens = NULL;
    uint8_t *mask = NULL;
    size_t k = 0;
    eg_step *st = NULL;
    if (eg_tokens(tok_o, "tokens", &tokens, &k) < 0)
        return NULL;
    if (k < 1 || k > ENGRAM_MAX_DRAFT) {
        PyErr_Format(PyExc_ValueError, "tokens: %zu tokens; a step takes 1 .. %u (MAX_DRAFT)", k,
                     ENGRAM_MAX_DRAFT);
        goto done;
    }
    if (eg_mask(mask_o, "mask", k, &mask) < 0)
        goto done;
    if (!(st = step_prepare(se, (unsigned)k, dt, out_o, "out", mask)))
        goto done;
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (!se->s) {
        rc = eg_set_err(&err, -EBADF, "the session is closed");
    } else {
        rc = engram_step_begin(se->s, tokens, mask, (unsigned)k, dt, st->arr.data, &err);
        if (rc == 0) {
            se->cur = st;
            st->gen = ++se->gen;
        }
    }
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_CLEAR(st);
        eg_raise(rc, &err, "step");
        goto done;
    }
    st->state = ST_LIVE;
done:
    PyMem_Free(tokens);
    PyMem_Free(mask);
    return (PyObject *)st;
}

static int ptr_order(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(eg_session *const *)a, y = (uintptr_t)*(eg_session *const *)b;
    return x < y ? -1 : x > y;
}

static PyObject *steps_begin_many(eg_pool *po, PyObject *requests, const char *dtype)
{
    engram_dtype dt;
    if (dtype_arg(dtype, &dt) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(requests, "requests: a sequence of (session, tokens[, mask]) is needed");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Size(seq);
    PyObject *list = PyList_New(n), *ret = NULL;
    engram_step_req *reqs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *reqs);
    eg_session **locks = PyMem_Calloc((size_t)(n ? n : 1), sizeof *locks);
    eg_step **steps = PyMem_Calloc((size_t)(n ? n : 1), sizeof *steps); /* borrowed from list */
    if (!list || !reqs || !locks || !steps) {
        if (list)
            PyErr_NoMemory();
        goto done;
    }
    if (po->closed) {
        closed_error("step_batch", "the pool is closed");
        goto done;
    }
    char arg[48];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PySequence_GetItem(seq, i);
        if (!r)
            goto done;
        Py_ssize_t len = PyTuple_Check(r) ? PyTuple_Size(r) : -1;
        if (len != 2 && len != 3) {
            Py_DECREF(r);
            PyErr_Format(PyExc_TypeError, "requests[%zd]: a tuple (session, tokens) or (session, tokens, mask) "
                                          "is needed", i);
            goto done;
        }
        PyObject *so = PyTuple_GetItem(r, 0), *to = PyTuple_GetItem(r, 1);
        PyObject *mo = len == 3 ? PyTuple_GetItem(r, 2) : Py_None;
        if (!PyObject_TypeCheck(so, (PyTypeObject *)SessionType)) {
            Py_DECREF(r);
            PyErr_Format(PyExc_TypeError, "requests[%zd][0]: an engram.Session is needed", i);
            goto done;
        }
        eg_session *se = (eg_session *)so;
        if (se->pool != po) {
            Py_DECREF(r);
            PyErr_Format(PyExc_ValueError, "requests[%zd]: the session is of another pool", i);
            goto done;
        }
        if (se->closed) {
            Py_DECREF(r);
            snprintf(arg, sizeof arg, "requests[%zd]", i);
            closed_error(arg, "the session is closed");
            goto done;
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (locks[j] == se) {
                Py_DECREF(r);
                PyErr_Format(PyExc_ValueError, "requests[%zd]: the session appears twice (also at %zd)", i, j);
                goto done;
            }
        uint32_t *tokens;
        uint8_t *mask;
        size_t k;
        snprintf(arg, sizeof arg, "requests[%zd] tokens", i);
        if (eg_tokens(to, arg, &tokens, &k) < 0) {
            Py_DECREF(r);
            goto done;
        }
        reqs[i].tokens = tokens;
        locks[i] = se;
        if (k < 1 || k > ENGRAM_MAX_DRAFT) {
            Py_DECREF(r);
            PyErr_Format(PyExc_ValueError, "%s: %zu tokens; a step takes 1 .. %u (MAX_DRAFT)", arg, k,
                         ENGRAM_MAX_DRAFT);
            goto done;
        }
        reqs[i].k = (unsigned)k;
        snprintf(arg, sizeof arg, "requests[%zd] mask", i);
        int mrc = eg_mask(mo, arg, k, &mask);
        Py_DECREF(r);
        if (mrc < 0)
            goto done;
        reqs[i].mask = mask;
        snprintf(arg, sizeof arg, "requests[%zd] out", i);
        eg_step *st = step_prepare(se, (unsigned)k, dt, NULL, arg, mask);
        if (!st)
            goto done;
        reqs[i].out = st->arr.data;
        steps[i] = st;
        PyList_SetItem(list, i, (PyObject *)st);
    }
    /* every session's lock, in address order (two batches never deadlock) */
    qsort(locks, (size_t)n, sizeof *locks, ptr_order);
    engram_error err;
    int rc = 0;
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        pthread_mutex_lock(&locks[i]->mu);
    for (Py_ssize_t i = 0; i < n && bad < 0; i++)
        if (!steps[i]->sess->s)
            bad = i;
    if (bad >= 0) {
        rc = eg_set_err(&err, -EBADF, "the session is closed");
    } else {
        /* closed sessions' handles are never passed: each s was re-read */
        for (Py_ssize_t i = 0; i < n; i++)
            reqs[i].s = steps[i]->sess->s;
        rc = engram_step_begin_many(reqs, (size_t)n, dt, &err);
        for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
            steps[i]->sess->cur = steps[i];
            steps[i]->gen = ++steps[i]->sess->gen;
        }
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--)
        pthread_mutex_unlock(&locks[i]->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (bad >= 0) {
            snprintf(arg, sizeof arg, "requests[%zd]", bad);
            eg_raise(rc, &err, arg);
        } else {
            eg_raise(rc, &err, "step_batch");
        }
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        steps[i]->state = ST_LIVE;
    ret = list;
    list = NULL;
done:
    for (Py_ssize_t i = 0; reqs && i < n; i++) {
        PyMem_Free((void *)reqs[i].tokens);
        PyMem_Free((void *)reqs[i].mask);
    }
    PyMem_Free(reqs);
    PyMem_Free(locks);
    PyMem_Free(steps);
    Py_XDECREF(list);
    Py_DECREF(seq);
    return ret;
}

static PyObject *session_step_batch(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"requests", "dtype", NULL};
    PyObject *req;
    const char *dtype = "bfloat16";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|s:step_batch", kwl, &req, &dtype))
        return NULL;
    return steps_begin_many(((eg_session *)o)->pool, req, dtype);
}

static PyObject *session_snapshot(PyObject *o, PyObject *args)
{
    (void)args;
    eg_session *se = (eg_session *)o;
    size_t n = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (se->s)
        n = engram_session_state_bytes(se->s);
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (!n)
        return closed_error("snapshot", "the session is closed");
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!b)
        return NULL;
    char *buf = PyBytes_AsString(b);
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    rc = se->s ? engram_session_save(se->s, buf, n, &err) : eg_set_err(&err, -EBADF, "the session is closed");
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(b);
        return eg_raise(rc, &err, "snapshot");
    }
    return b;
}

static PyObject *session_restore(PyObject *o, PyObject *data)
{
    eg_session *se = (eg_session *)o;
    if (se->closed)
        return closed_error("restore", "the session is closed");
    Py_buffer v;
    if (PyObject_GetBuffer(data, &v, 0) < 0) /* PyBUF_SIMPLE: contiguous bytes */
        return NULL;
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    rc = se->s ? engram_session_load(se->s, v.buf, (size_t)v.len, &err)
               : eg_set_err(&err, -EBADF, "the session is closed");
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (rc < 0)
        return eg_raise(rc, &err, "restore");
    Py_RETURN_NONE;
}

static PyObject *session_restore_tokens(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tokens", "mask", NULL};
    PyObject *tok_o, *mask_o = Py_None;
    eg_session *se = (eg_session *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:restore_tokens", kwl, &tok_o, &mask_o))
        return NULL;
    if (se->closed)
        return closed_error("restore_tokens", "the session is closed");
    uint32_t *tokens;
    uint8_t *mask = NULL;
    size_t n;
    if (eg_tokens(tok_o, "tokens", &tokens, &n) < 0)
        return NULL;
    if (eg_mask(mask_o, "mask", n, &mask) < 0) {
        PyMem_Free(tokens);
        return NULL;
    }
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    rc = se->s ? engram_session_restore(se->s, tokens, mask, n, &err)
               : eg_set_err(&err, -EBADF, "the session is closed");
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    PyMem_Free(tokens);
    PyMem_Free(mask);
    if (rc < 0)
        return eg_raise(rc, &err, "restore_tokens");
    Py_RETURN_NONE;
}

static PyObject *session_history(PyObject *o, void *c)
{
    (void)c;
    eg_session *se = (eg_session *)o;
    engram_history h;
    int live;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    live = se->s != NULL;
    if (live)
        engram_session_history(se->s, &h);
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (!live)
        return closed_error("history", "the session is closed");
    return Py_BuildValue("(iii)", h.id[0], h.id[1], h.id[2]);
}

static PyObject *session_closed(PyObject *o, void *c)
{
    (void)c;
    return PyBool_FromLong(((eg_session *)o)->closed);
}

static PyObject *session_pool(PyObject *o, void *c)
{
    (void)c;
    PyObject *p = (PyObject *)((eg_session *)o)->pool;
    Py_INCREF(p);
    return p;
}

static PyObject *session_repr(PyObject *o)
{
    eg_session *se = (eg_session *)o;
    return PyUnicode_FromFormat("engram.Session(%s)", se->closed ? "closed" : "open");
}

static PyObject *session_prefill(PyObject *o, PyObject *args, PyObject *kw);

static PyGetSetDef session_getset[] = {
    {"history", session_history, NULL,
     "The committed history: a tuple of 3 ints (engram_session_history; V4.1 the compressed "
     "ids newest first, -1 dead; PLE (lag 1, lag 2, -1)).  A PLE session also has its "
     "convolution state: snapshot() takes both.",
     NULL},
    {"closed", session_closed, NULL, "True once closed.", NULL},
    {"pool", session_pool, NULL, "The Pool of the session.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef session_methods[] = {
    {"step", (PyCFunction)(void (*)(void))session_step, METH_VARARGS | METH_KEYWORDS,
     "step(tokens, mask=None, dtype=\"bfloat16\", out=None) -> Step\n\n"
     "Begins a decode step of k = len(tokens) tokens (1 .. MAX_DRAFT: one token, or draft "
     "tokens for speculative decoding; engram_step_begin): the tokens are validated and hashed "
     "from the committed history, their reads queued, and it returns at once.  Wait for a "
     "table's rows with Step.wait(t), then Step.commit(j) (or abort).\n\n"
     "The rows land in the step's buffer, Step.out: per token table 0's rows then table 1's.  "
     "dtype \"bfloat16\": uint16 (BF16 bits) (k, 48, 256); \"float32\": float32 (k, 48, 256); "
     "\"raw\": uint8 (k, 48, 264) (the file's bytes).  PLE: (k, 16, 160) uint16 for "
     "\"bfloat16\" and \"raw\" (the same bytes), float32 for \"float32\".  By default a new "
     "NumPy array (the rows of masked tokens, which are not read, zero); out=: the caller's C-contiguous, "
     "writable host array of that dtype (uint16 or torch.bfloat16 for BF16) and shape, e.g. a "
     "pinned torch tensor, written in place and never copied; the Step keeps it alive until it "
     "goes, and nothing is written into it after the step ends.\n\n"
     "mask: None or k values: V4.1 0 = masked (a dead history entry, nothing read); PLE "
     "MASK_PAD (0), MASK_TEXT (1) or MASK_IMAGE (2).\n\n"
     "Raises ValueError / TypeError naming the argument, ArgumentError (a token out of the "
     "vocabulary, nothing queued), BusyError (a step or prefill in progress), ClosedError (the "
     "session, or its pool, is closed)."},
    {"step_batch", (PyCFunction)(void (*)(void))session_step_batch, METH_VARARGS | METH_KEYWORDS,
     "step_batch(requests, dtype=\"bfloat16\") -> list of Step\n\n"
     "The same as Pool.step_batch on this session's pool (requests may name any of its "
     "sessions)."},
    {"prefill", (PyCFunction)(void (*)(void))session_prefill, METH_VARARGS | METH_KEYWORDS,
     "prefill(tokens, chunk=2048, mask=None, dtype=\"bfloat16\", ring_chunks=2, timeout=None) -> Prefill\n\n"
     "Begins reading a prompt (engram_prefill_begin): the tokens are validated, then the pool "
     "hashes and reads them chunk by chunk (chunk tokens each, de-duplicated) into a ring of "
     "ring_chunks buffers per table.  Iterate the Prefill for (table, chunk, rows); the "
     "history becomes that after the prompt when the iteration ends (Prefill.end).  The "
     "tokens and mask are copied into memory the Prefill owns; the ring (2 x ring_chunks x "
     "chunk x 24 rows of dtype at most, sized by the prompt) is a NumPy buffer the Prefill "
     "owns.  dtype as step() (\"bfloat16\", \"float32\", \"raw\").  timeout: seconds each "
     "chunk's wait may take (None: no limit), then TimeoutError with nothing lost.\n\n"
     "Raises ValueError / TypeError naming the argument, ArgumentError (a bad token, naming "
     "its position; bad options), BusyError (a step or prefill in progress), ClosedError."},
    {"snapshot", session_snapshot, METH_NOARGS,
     "snapshot() -> bytes\n\n"
     "The session's whole per-sequence state (engram_session_save): its committed history and, "
     "for PLE, its committed convolution state (40 bytes for V4.1; 40 + 4 x state_floats for "
     "PLE).  Host byte order: for this machine's processes.  Raises BusyError during a step or "
     "prefill, ClosedError."},
    {"restore", session_restore, METH_O,
     "restore(data)\n\n"
     "Restores a snapshot() (any bytes-like object; engram_session_load): validated as a whole "
     "first (size, magic, version, member, width, history, finite state), so on any error the "
     "session is unchanged.  A session restored from another's snapshot continues bit for bit "
     "as the other would.  Raises ArgumentError (a bad snapshot), BusyError, ClosedError."},
    {"restore_tokens", (PyCFunction)(void (*)(void))session_restore_tokens, METH_VARARGS | METH_KEYWORDS,
     "restore_tokens(tokens, mask=None)\n\n"
     "Rebuilds the history from the last tokens of a sequence (engram_session_restore; masks "
     "as step()).  PLE: the convolution state is left as it is (it depends on residuals: use "
     "restore(snapshot) for it).  Raises ArgumentError, BusyError, ClosedError."},
    {"close", session_close, METH_NOARGS,
     "close()\n\n"
     "Ends a step in progress (as abort: nothing is written into its buffer after close "
     "returns; waits on other threads raise CancelledError), cancels a prefill in progress (its "
     "Prefill then raises CancelledError; end or drop it) and releases the session.  Later "
     "calls raise ClosedError.  Idempotent; also done when the Session is collected."},
    {"__enter__", self_enter, METH_NOARGS, "__enter__() -> Session\n\nThe session itself."},
    {"__exit__", session_exit, METH_VARARGS, "__exit__(*exc)\n\nclose(): a step or prefill still in progress ends."},
    {NULL, NULL, 0, NULL}};

static PyObject *no_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    PyErr_SetString(PyExc_TypeError, (PyObject *)tp == SessionType ? "engram.Session is made by Pool.session()"
                                     : (PyObject *)tp == StepType
                                         ? "engram.Step is made by Session.step() or step_batch()"
                                         : "engram.Prefill is made by Session.prefill()");
    return NULL;
}

static PyType_Slot session_slots[] = {
    {Py_tp_doc,
     "Session: one sequence of a Pool (Pool.session()).\n\n"
     "Its committed hash history (PLE: and convolution state) and its current step or prefill.  "
     "One step or prefill at a time: step() or prefill() begins one, Step.commit / abort or "
     "Prefill.end / cancel ends it.  Holds its Pool.  Thread safety: its calls may come from "
     "any threads (the library's rule that calls which start or end something never overlap "
     "is kept by a lock, taken with the GIL released and never held across a wait); waits for "
     "the two tables may run on two threads.  A context manager: `with pool.session() as s:` "
     "closes it on exit."},
    {Py_tp_new, no_new},
    {Py_tp_dealloc, session_dealloc},
    {Py_tp_getset, session_getset},
    {Py_tp_methods, session_methods},
    {Py_tp_repr, session_repr},
    {0, NULL}};

static PyType_Spec session_spec = {"engram.Session", sizeof(eg_session), 0, Py_TPFLAGS_DEFAULT, session_slots};

/* ------------------------------------------------------------- Step */

struct step_wait_ctx {
    eg_step *st;
    int table;
};

/* Runs without the GIL: one wait of up to ns for the step's table, as a
 * registered waiter (close waits for it to leave).  -EBADF: the session is
 * closed; -ECANCELED: the step ended (or another began during the wait). */
static int step_wait_nogil(void *ctx, uint64_t ns, engram_error *err)
{
    struct step_wait_ctx *c = ctx;
    eg_step *st = c->st;
    eg_session *se = st->sess;
    pthread_mutex_lock(&se->mu);
    if (!se->s) {
        pthread_mutex_unlock(&se->mu);
        return eg_set_err(err, -EBADF, "the session is closed");
    }
    if (se->cur != st) {
        pthread_mutex_unlock(&se->mu);
        return eg_set_err(err, -ECANCELED, "the step has ended (commit, abort or close)");
    }
    engram_session *s = se->s;
    uint64_t gen = se->gen;
    se->waiters++;
    pthread_mutex_unlock(&se->mu);
    int rc = engram_step_wait_timed(s, c->table, ns, err);
    pthread_mutex_lock(&se->mu);
    if (--se->waiters == 0)
        pthread_cond_broadcast(&se->idle);
    if (se->gen != gen || (rc < 0 && rc != -ETIMEDOUT && se->cur != st))
        rc = eg_set_err(err, -ECANCELED, "the step ended (commit, abort or close) during the wait");
    pthread_mutex_unlock(&se->mu);
    return rc;
}

static int table_arg(const eg_pool *po, int t)
{
    if (t < 0 || (unsigned)t >= po->tables) {
        if (po->tables == 1)
            PyErr_Format(PyExc_ValueError, "table: %d; this model has one table (0)", t);
        else
            PyErr_Format(PyExc_ValueError, "table: %d; 0 (layer 1) or 1 (layer 14)", t);
        return -1;
    }
    return 0;
}

/* the view of table t's rows in the step's buffer */
static PyObject *step_rows(eg_step *st, int t)
{
    eg_pool *po = st->sess->pool;
    if (po->tables == 1) {
        Py_INCREF(st->out);
        return st->out;
    }
    return eg_slice_axis1(st->out, (Py_ssize_t)t * po->rpt, (Py_ssize_t)(t + 1) * po->rpt);
}

static PyObject *step_wait(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"table", "timeout", NULL};
    int t;
    PyObject *to = Py_None;
    eg_step *st = (eg_step *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|O:wait", kwl, &t, &to))
        return NULL;
    uint64_t ns;
    if (table_arg(st->sess->pool, t) < 0 || timeout_arg(to, &ns) < 0)
        return NULL;
    struct step_wait_ctx c = {st, t};
    engram_error err;
    int rc = wait_sliced(step_wait_nogil, &c, ns, &err);
    if (rc == -EINTR && PyErr_Occurred())
        return NULL;
    if (rc < 0)
        return eg_raise(rc, &err, "wait");
    return step_rows(st, t);
}

static int step_poll_nogil(void *ctx, uint64_t ns, engram_error *err)
{
    (void)ns;
    struct step_wait_ctx *c = ctx;
    eg_session *se = c->st->sess;
    pthread_mutex_lock(&se->mu);
    int rc = !se->s               ? eg_set_err(err, -EBADF, "the session is closed")
           : se->cur != c->st     ? eg_set_err(err, -ECANCELED, "the step has ended (commit, abort or close)")
                                  : engram_step_poll(se->s, c->table, err);
    pthread_mutex_unlock(&se->mu);
    return rc;
}

static PyObject *step_poll(PyObject *o, PyObject *args)
{
    int t;
    eg_step *st = (eg_step *)o;
    if (!PyArg_ParseTuple(args, "i:poll", &t) || table_arg(st->sess->pool, t) < 0)
        return NULL;
    struct step_wait_ctx c = {st, t};
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = step_poll_nogil(&c, 0, &err);
    Py_END_ALLOW_THREADS
    if (rc == -EAGAIN)
        Py_RETURN_FALSE;
    if (rc < 0)
        return eg_raise(rc, &err, "poll");
    Py_RETURN_TRUE;
}

static PyObject *step_commit(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"j", NULL};
    PyObject *j_o = Py_None;
    eg_step *st = (eg_step *)o;
    eg_session *se = st->sess;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:commit", kwl, &j_o))
        return NULL;
    unsigned j = st->k;
    if (j_o != Py_None) {
        long v = PyLong_AsLong(j_o);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < 0 || v > (long)st->k) {
            PyErr_Format(PyExc_ValueError, "j: %ld; 0 .. %u (the step's tokens)", v, st->k);
            return NULL;
        }
        j = (unsigned)v;
    }
    /* the step's reads first, without the lock (commit would wait for them
     * holding it); their errors are commit's to report */
    engram_error err;
    int rc = 0;
    for (int t = 0; t < (int)se->pool->tables && rc == 0; t++) {
        struct step_wait_ctx c = {st, t};
        rc = wait_sliced(step_wait_nogil, &c, ENGRAM_FOREVER, &err);
        if (rc == -EINTR && PyErr_Occurred())
            return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (!se->s) {
        rc = eg_set_err(&err, -EBADF, "the session is closed");
    } else if (se->cur != st) {
        rc = eg_set_err(&err, -EINVAL, "the step is not in progress (committed or aborted already)");
    } else {
        rc = engram_step_commit(se->s, j, &err);
        se->cur = NULL;
    }
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (st->state == ST_LIVE && rc != -EINVAL && rc != -EBADF)
            st->state = ST_FAILED;
        return eg_raise(rc, &err, "commit");
    }
    st->state = ST_COMMITTED;
    Py_RETURN_NONE;
}

static void step_abort_now(eg_step *st)
{
    eg_session *se = st->sess;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (se->cur == st) {
        if (se->s)
            engram_step_abort(se->s);
        se->cur = NULL;
    }
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (st->state == ST_LIVE)
        st->state = ST_ABORTED;
}

static PyObject *step_abort(PyObject *o, PyObject *args)
{
    (void)args;
    step_abort_now((eg_step *)o);
    Py_RETURN_NONE;
}

static PyObject *step_exit(PyObject *o, PyObject *args)
{
    (void)args;
    step_abort_now((eg_step *)o);
    Py_RETURN_NONE;
}

static void step_dealloc(PyObject *o)
{
    eg_step *st = (eg_step *)o;
    if (st->sess) {
        /* no row is written into out once this returns */
        if (st->state == ST_LIVE)
            step_abort_now(st);
        Py_CLEAR(st->sess);
    }
    if (st->have_arr)
        eg_array_release(&st->arr);
    Py_CLEAR(st->out);
    eg_heap_free(o);
}

static PyObject *step_apply(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"layer", "residual", NULL};
    PyObject *layer, *res_o;
    eg_step *st = (eg_step *)o;
    eg_session *se = st->sess;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:apply", kwl, &layer, &res_o))
        return NULL;
    pthread_mutex_t *lmu = eg_layer_mutex(layer);
    if (!lmu || layer_of_pool(layer, se->pool) < 0)
        return NULL;
    eg_array res;
    engram_dtype rdt;
    if (residual_arg(se->pool, res_o, st->k, &res, &rdt) < 0)
        return NULL;
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (!se->s) {
        rc = eg_set_err(&err, -EBADF, "the session is closed");
    } else if (se->cur != st) {
        rc = eg_set_err(&err, -EINVAL, "the step is not in progress (committed or aborted already)");
    } else {
        pthread_mutex_lock(lmu);
        engram_applier *a = eg_layer_applier_held(layer);
        rc = a ? engram_step_apply(se->s, a, res.data, rdt, &err)
               : eg_set_err(&err, -EBADF, "the layer is closed");
        pthread_mutex_unlock(lmu);
    }
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    eg_array_release(&res);
    if (rc < 0)
        return eg_raise(rc, &err, "apply");
    Py_INCREF(res_o);
    return res_o;
}

static PyObject *step_out(PyObject *o, void *c)
{
    (void)c;
    PyObject *r = ((eg_step *)o)->out;
    Py_INCREF(r);
    return r;
}

static PyObject *step_k(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(((eg_step *)o)->k);
}

static PyObject *step_state(PyObject *o, void *c)
{
    (void)c;
    eg_step *st = (eg_step *)o;
    static const char *const names[] = {"new", "in progress", "committed", "aborted", "failed"};
    int s = st->state;
    if (s == ST_LIVE) {
        eg_session *se = st->sess;
        int live;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&se->mu);
        live = se->cur == st;
        pthread_mutex_unlock(&se->mu);
        Py_END_ALLOW_THREADS
        if (!live)
            s = ST_ABORTED; /* ended by Session.close */
    }
    return PyUnicode_FromString(names[s]);
}

static PyObject *step_info(PyObject *o, void *c)
{
    (void)c;
    eg_step *st = (eg_step *)o;
    eg_session *se = st->sess;
    engram_step_info in;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    rc = !se->s ? -EBADF : se->gen != st->gen ? -ESTALE : 0;
    if (rc == 0)
        engram_step_get_info(se->s, &in);
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (rc == -EBADF)
        return closed_error("info", "the session is closed");
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "info: a later step of the session has begun");
        return NULL;
    }
    const char *dt = st->dtype == ENGRAM_F32 ? "float32" : st->dtype == ENGRAM_RAW ? "raw" : "bfloat16";
    unsigned T = se->pool->tables;
    return Py_BuildValue("{s:I,s:K,s:[KK],s:[II],s:s}", "k", in.k, "begin_ns", (unsigned long long)in.begin_ns,
                         "ready_ns", (unsigned long long)in.ready_ns[0],
                         (unsigned long long)(T > 1 ? in.ready_ns[1] : 0), "rows", in.rows[0],
                         T > 1 ? in.rows[1] : 0u, "dtype", dt);
}

static PyObject *step_repr(PyObject *o)
{
    eg_step *st = (eg_step *)o;
    PyObject *s = step_state(o, NULL);
    if (!s)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("engram.Step(k=%u, %U)", st->k, s);
    Py_DECREF(s);
    return r;
}

static PyGetSetDef step_getset[] = {
    {"out", step_out, NULL,
     "The step's whole buffer (the array the rows are written into: per token table 0's rows "
     "then table 1's).  Rows of a table are complete only after wait(t) returned.",
     NULL},
    {"k", step_k, NULL, "The step's tokens.", NULL},
    {"state", step_state, NULL, "\"in progress\", \"committed\", \"aborted\" or \"failed\".", NULL},
    {"info", step_info, NULL,
     "A dict (engram_step_get_info): k, begin_ns (CLOCK_MONOTONIC), ready_ns (per table, when "
     "its rows were all in; 0: not yet), rows (per table, rows asked for), dtype.  Until the "
     "session's next step begins (then ValueError).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef step_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))step_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(table, timeout=None) -> array\n\n"
     "Blocks (the GIL released; Ctrl-C interrupts it) until table's rows of every token of the "
     "step are in the step's buffer, and returns a view of them in it, never a copy: V4.1 "
     "out[:, 24*table : 24*(table+1), :], shape (k, 24, 256) (raw: (k, 24, 264)), so that "
     "Layer.apply(None, residual, rows=view) takes it as it is; PLE (table 0) the whole "
     "(k, 16, 160).  timeout: seconds (None: no limit; 0: a poll), then engram.TimeoutError "
     "with nothing lost (wait again).  Raises the read's error (engram.Error naming the row; "
     "the step then commits nothing), CancelledError (the step was committed or aborted, "
     "before or during the wait), ClosedError (the session or its pool closed)."},
    {"poll", step_poll, METH_VARARGS,
     "poll(table) -> bool\n\nTrue if table's rows are all in (wait would return at once), False "
     "if not yet; raises as wait() for a failed, ended or closed step."},
    {"commit", (PyCFunction)(void (*)(void))step_commit, METH_VARARGS | METH_KEYWORDS,
     "commit(j=None)\n\n"
     "Ends the step keeping the history of its first j tokens (default: all k; 0 <= j <= k; "
     "engram_step_commit): waits for the step's reads first.  PLE: the convolution state "
     "advances by the first j tokens if apply() ran in this step.  If a read failed: raises its "
     "error and the history is unchanged; either way the step is over.  Raises ArgumentError if "
     "the step is no longer in progress, ClosedError."},
    {"abort", step_abort, METH_NOARGS,
     "abort()\n\nEnds the step without changing the history; returns at once, and no row is "
     "written into out afterwards.  A no-op for a step that has ended."},
    {"apply", (PyCFunction)(void (*)(void))step_apply, METH_VARARGS | METH_KEYWORDS,
     "apply(layer, residual) -> residual\n\n"
     "Applies the step's rows of the table of layer (an engram.Layer of this model: layer 1 "
     "takes table 0, layer 14 table 1) to residual IN PLACE (engram_step_apply), after a wait "
     "for that table returned: float32 or BF16 (uint16 / torch.bfloat16), (k, S, W), "
     "C-contiguous, writable host memory, never copied; masked tokens untouched.  The step's "
     "dtype must be \"bfloat16\" or \"float32\" (V4.1) / \"bfloat16\" or \"raw\" (PLE).  PLE: "
     "from the session's committed convolution state into a tentative one that commit(j) "
     "keeps.  The GIL is released; the Layer's calls run one at a time.  Raises TypeError / "
     "ValueError naming the argument, ArgumentError (no wait for that table, a layer of "
     "another width, dtypes, a step no longer in progress), DataError (a non-finite residual), "
     "ClosedError."},
    {"__enter__", self_enter, METH_NOARGS, "__enter__() -> Step\n\nThe step itself."},
    {"__exit__", step_exit, METH_VARARGS, "__exit__(*exc)\n\nabort() if the step was not committed in the block."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot step_slots[] = {
    {Py_tp_doc,
     "Step: a decode step of a Session (Session.step(), step_batch()).\n\n"
     "Its rows are read into out in the background; wait(t) returns table t's rows, apply() "
     "applies them, commit() ends the step (abort() drops it).  Holds its Session and out.  A "
     "Step collected while in progress is aborted first, so its buffer is never written after "
     "the Step is gone.  A context manager: on exit a step not committed is aborted (commit "
     "inside the block):\n\n"
     "    with s.step([tok]) as st:\n"
     "        rows0 = st.wait(0)   # (1, 24, 256) view\n"
     "        st.apply(layer1, residual)\n"
     "        st.commit()"},
    {Py_tp_new, no_new},
    {Py_tp_dealloc, step_dealloc},
    {Py_tp_getset, step_getset},
    {Py_tp_methods, step_methods},
    {Py_tp_repr, step_repr},
    {0, NULL}};

static PyType_Spec step_spec = {"engram.Step", sizeof(eg_step), 0, Py_TPFLAGS_DEFAULT, step_slots};

/* ------------------------------------------------------------- Prefill */

static PyObject *session_prefill(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tokens", "chunk", "mask", "dtype", "ring_chunks", "timeout", NULL};
    PyObject *tok_o, *mask_o = Py_None, *to = Py_None;
    long chunk = ENGRAM_BATCH_TOKENS, ring_chunks = 2;
    const char *dtype = "bfloat16";
    eg_session *se = (eg_session *)o;
    eg_pool *po = se->pool;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|lOslO:prefill", kwl, &tok_o, &chunk, &mask_o, &dtype,
                                     &ring_chunks, &to))
        return NULL;
    engram_dtype dt;
    uint64_t tns;
    if (dtype_arg(dtype, &dt) < 0 || timeout_arg(to, &tns) < 0)
        return NULL;
    if (chunk < 1 || chunk > (long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "chunk: %ld; tokens per chunk >= 1", chunk);
        return NULL;
    }
    if (ring_chunks < 1 || ring_chunks > (long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "ring_chunks: %ld; chunk buffers per table >= 1", ring_chunks);
        return NULL;
    }
    if (se->closed)
        return closed_error("prefill", "the session is closed");
    PyTypeObject *tp = (PyTypeObject *)PrefillType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_prefill *pf = (eg_prefill *)alloc(tp, 0);
    if (!pf)
        return NULL;
    Py_INCREF(se);
    pf->sess = se;
    pf->dtype = dt;
    pf->timeout_ns = tns;
    pf->cur_table = -1;
    if (eg_tokens(tok_o, "tokens", &pf->tokens, &pf->n) < 0 || eg_mask(mask_o, "mask", pf->n, &pf->mask) < 0)
        goto fail;
    engram_prefill_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.chunk_tokens = (unsigned)chunk;
    opts.ring_chunks = (unsigned)ring_chunks;
    opts.dtype = dt;
    opts.table1_delay_ns = 0;
    size_t bytes = 0;
    int live;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&po->mu);
    live = po->p != NULL;
    if (live)
        bytes = engram_pool_prefill_ring_bytes(po->p, &opts, pf->n);
    pthread_mutex_unlock(&po->mu);
    Py_END_ALLOW_THREADS
    if (!live) {
        closed_error("prefill", "the pool is closed");
        goto fail;
    }
    if (bytes > 0) {
        /* the ring is ours (a NumPy buffer), so that a row view kept past its
         * chunk reads later rows instead of freed memory */
        int64_t len = (int64_t)bytes + 64;
        if (!(pf->ring = eg_numpy_empty(1, &len, EG_U8)))
            goto fail;
        if (eg_array_get(pf->ring, "ring", EG_WRITABLE, NULL, &pf->ring_arr) < 0)
            goto fail;
        pf->have_ring = 1;
        pf->ring_base = (char *)(((uintptr_t)pf->ring_arr.data + 63) & ~(uintptr_t)63);
        PyObject *mv = PyMemoryView_FromObject(pf->ring);
        pf->ring_ro = mv ? PyObject_CallMethod(mv, "toreadonly", NULL) : NULL;
        Py_XDECREF(mv);
        if (!pf->ring_ro)
            goto fail;
        opts.ring_mem = pf->ring_base;
        opts.ring_bytes = bytes;
    }
    engram_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    rc = se->s ? engram_prefill_begin(se->s, pf->tokens, pf->mask, pf->n, &opts, &pf->pf, &err)
               : eg_set_err(&err, -EBADF, "the session is closed");
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        pf->pf = NULL;
        eg_raise(rc, &err, "prefill");
        goto fail;
    }
    pf->chunks = engram_prefill_chunks(pf->pf);
    po->handles++;
    return (PyObject *)pf;
fail:
    Py_DECREF(pf);
    return NULL;
}

static int prefill_idle(eg_prefill *pf)
{
    if (pf->busy) {
        PyErr_SetString(eg_BusyError, "the prefill is in use by another thread");
        return -1;
    }
    return 0;
}

/* Stops it (cancel) or ends it (end): pf->pf is gone afterwards. */
static int prefill_finish(eg_prefill *pf, int end, engram_error *err)
{
    eg_session *se = pf->sess;
    engram_prefill *h = pf->pf;
    int rc = 0;
    pf->pf = NULL;
    pf->held = 0;
    pf->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    if (end)
        rc = engram_prefill_end(h, err);
    else
        engram_prefill_cancel(h);
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    pf->busy = 0;
    if (end && rc == 0)
        pf->ended = 1;
    else
        pf->cancelled = 1;
    pool_handle_gone(se->pool);
    return rc;
}

static void prefill_dealloc(PyObject *o)
{
    eg_prefill *pf = (eg_prefill *)o;
    if (pf->pf) {
        engram_error err;
        prefill_finish(pf, 0, &err); /* nothing is written into the ring after it */
    }
    if (pf->have_ring)
        eg_array_release(&pf->ring_arr);
    Py_CLEAR(pf->ring_ro);
    Py_CLEAR(pf->ring);
    PyMem_Free(pf->tokens);
    PyMem_Free(pf->mask);
    Py_CLEAR(pf->sess);
    eg_heap_free(o);
}

struct prefill_wait_ctx {
    engram_prefill *pf;
    int table;
    size_t chunk;
    const void *rows;
    size_t first, n;
};

static int prefill_wait_nogil(void *ctx, uint64_t ns, engram_error *err)
{
    struct prefill_wait_ctx *c = ctx;
    return engram_prefill_wait_timed(c->pf, c->table, c->chunk, ns, &c->rows, &c->first, &c->n, err);
}

static PyObject *prefill_gone(eg_prefill *pf)
{
    if (pf->ended)
        return NULL; /* StopIteration */
    engram_error err;
    eg_set_err(&err, -ECANCELED, "the prefill was cancelled");
    return eg_raise(-ECANCELED, &err, "prefill");
}

/* For calls other than the iteration: the prefill has ended or was cancelled. */
static PyObject *prefill_closed(eg_prefill *pf, const char *what)
{
    if (pf->ended)
        return closed_error(what, "the prefill has ended");
    engram_error err;
    eg_set_err(&err, -ECANCELED, "the prefill was cancelled");
    return eg_raise(-ECANCELED, &err, what);
}

static PyObject *prefill_next(PyObject *o)
{
    eg_prefill *pf = (eg_prefill *)o;
    if (prefill_idle(pf) < 0)
        return NULL;
    if (!pf->pf)
        return prefill_gone(pf);
    eg_pool *po = pf->sess->pool;
    if (pf->held) {
        engram_prefill_release(pf->pf, pf->cur_table, pf->cur_chunk);
        pf->held = 0;
    }
    size_t T = po->tables;
    if (pf->next >= pf->chunks * T) {
        pf->exhausted = 1;
        engram_error err;
        int rc = prefill_finish(pf, 1, &err);
        if (rc < 0)
            return eg_raise(rc, &err, "prefill end");
        return NULL; /* StopIteration */
    }
    struct prefill_wait_ctx c = {pf->pf, (int)(pf->next % T), pf->next / T, NULL, 0, 0};
    engram_error err;
    pf->busy = 1;
    int rc = wait_sliced(prefill_wait_nogil, &c, pf->timeout_ns, &err);
    pf->busy = 0;
    if (rc == -EINTR && PyErr_Occurred())
        return NULL;
    if (rc < 0)
        return eg_raise(rc, &err, "prefill wait");
    pf->held = 1;
    pf->cur_table = c.table;
    pf->cur_chunk = c.chunk;
    pf->cur_first = c.first;
    pf->cur_n = c.n;
    pf->next++;
    PyObject *view;
    if (!c.n) {
        int64_t shape[3] = {0, 0, 0};
        eg_kind kind;
        unsigned elems;
        row_shape(po, pf->dtype, &kind, &elems);
        shape[1] = po->rpt;
        shape[2] = elems;
        view = eg_numpy_empty(3, shape, kind);
    } else {
        Py_ssize_t off = (Py_ssize_t)((const char *)c.rows - pf->ring_base);
        if (!pf->ring_base || off < 0 || off >= pf->ring_arr.shape[0]) {
            PyErr_SetString(PyExc_SystemError, "prefill: the rows are not in the ring");
            return NULL;
        }
        eg_kind kind;
        unsigned elems;
        row_shape(po, pf->dtype, &kind, &elems);
        off += (Py_ssize_t)(pf->ring_base - (char *)pf->ring_arr.data);
        view = numpy_view(pf->ring_ro, kind, off, c.n, po->rpt, elems);
    }
    if (!view)
        return NULL;
    PyObject *r = Py_BuildValue("(inN)", c.table, (Py_ssize_t)c.chunk, view);
    return r;
}

static PyObject *prefill_end(PyObject *o, PyObject *args)
{
    (void)args;
    eg_prefill *pf = (eg_prefill *)o;
    if (prefill_idle(pf) < 0)
        return NULL;
    if (!pf->pf) {
        if (pf->ended)
            Py_RETURN_NONE;
        return prefill_closed(pf, "end");
    }
    engram_error err;
    int rc = prefill_finish(pf, 1, &err);
    if (rc < 0)
        return eg_raise(rc, &err, "prefill end");
    Py_RETURN_NONE;
}

static PyObject *prefill_cancel(PyObject *o, PyObject *args)
{
    (void)args;
    eg_prefill *pf = (eg_prefill *)o;
    if (prefill_idle(pf) < 0)
        return NULL;
    if (pf->pf) {
        engram_error err;
        prefill_finish(pf, 0, &err);
    }
    Py_RETURN_NONE;
}

static PyObject *prefill_exit(PyObject *o, PyObject *args)
{
    eg_prefill *pf = (eg_prefill *)o;
    PyObject *et = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : Py_None;
    if (!et)
        return NULL;
    if (prefill_idle(pf) < 0)
        return NULL;
    if (pf->pf) {
        engram_error err;
        if (et == Py_None && pf->next >= pf->chunks * pf->sess->pool->tables) {
            int rc = prefill_finish(pf, 1, &err);
            if (rc < 0)
                return eg_raise(rc, &err, "prefill end");
        } else {
            prefill_finish(pf, 0, &err);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *prefill_start_table1(PyObject *o, PyObject *args)
{
    (void)args;
    eg_prefill *pf = (eg_prefill *)o;
    if (!pf->pf)
        return prefill_closed(pf, "start_table1");
    engram_prefill_start_table1(pf->pf);
    Py_RETURN_NONE;
}

static PyObject *prefill_apply(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"layer", "residual", NULL};
    PyObject *layer, *res_o;
    eg_prefill *pf = (eg_prefill *)o;
    eg_session *se = pf->sess;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:apply", kwl, &layer, &res_o))
        return NULL;
    if (prefill_idle(pf) < 0)
        return NULL;
    if (!pf->pf)
        return prefill_closed(pf, "apply");
    if (!pf->held) {
        PyErr_SetString(PyExc_ValueError, "apply: no current chunk (iterate the prefill first)");
        return NULL;
    }
    pthread_mutex_t *lmu = eg_layer_mutex(layer);
    if (!lmu || layer_of_pool(layer, se->pool) < 0)
        return NULL;
    /* busy before the residual's conversion, which may run Python code (a
     * __dlpack__) during which another thread could move the iteration on
     * and release this chunk */
    pf->busy = 1;
    eg_array res;
    engram_dtype rdt;
    if (residual_arg(se->pool, res_o, pf->cur_n, &res, &rdt) < 0) {
        pf->busy = 0;
        return NULL;
    }
    engram_error err;
    int rc;
    engram_prefill *h = pf->pf;
    size_t c = pf->cur_chunk;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&se->mu);
    pthread_mutex_lock(lmu);
    engram_applier *a = eg_layer_applier_held(layer);
    rc = a ? engram_prefill_apply(h, c, a, res.data, rdt, &err) : eg_set_err(&err, -EBADF, "the layer is closed");
    pthread_mutex_unlock(lmu);
    pthread_mutex_unlock(&se->mu);
    Py_END_ALLOW_THREADS
    pf->busy = 0;
    eg_array_release(&res);
    if (rc < 0)
        return eg_raise(rc, &err, "apply");
    Py_INCREF(res_o);
    return res_o;
}

static PyObject *prefill_first(PyObject *o, void *c)
{
    (void)c;
    eg_prefill *pf = (eg_prefill *)o;
    if (!pf->held)
        Py_RETURN_NONE;
    return PyLong_FromSize_t(pf->cur_first);
}

static PyObject *prefill_n_tokens(PyObject *o, void *c)
{
    (void)c;
    eg_prefill *pf = (eg_prefill *)o;
    if (!pf->held)
        Py_RETURN_NONE;
    return PyLong_FromSize_t(pf->cur_n);
}

static PyObject *prefill_chunks(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromSize_t(((eg_prefill *)o)->chunks);
}

static PyObject *prefill_info(PyObject *o, void *c)
{
    (void)c;
    eg_prefill *pf = (eg_prefill *)o;
    if (!pf->pf)
        return prefill_closed(pf, "info");
    engram_prefill_info in;
    engram_prefill_get_info(pf->pf, &in);
    int T = (int)pf->sess->pool->tables;
    return Py_BuildValue("{s:n,s:I,s:I,s:n,s:[nn],s:[nn]}", "chunks", (Py_ssize_t)in.chunks, "chunk_tokens",
                         in.chunk_tokens, "ring_chunks", in.ring_chunks, "ring_bytes", (Py_ssize_t)in.ring_bytes,
                         "ready", (Py_ssize_t)in.ready[0], (Py_ssize_t)(T > 1 ? in.ready[1] : 0), "chunks_applied",
                         (Py_ssize_t)in.chunks_applied[0], (Py_ssize_t)(T > 1 ? in.chunks_applied[1] : 0));
}

static PyObject *prefill_repr(PyObject *o)
{
    eg_prefill *pf = (eg_prefill *)o;
    return PyUnicode_FromFormat("engram.Prefill(tokens=%zu, chunks=%zu, %s)", pf->n, pf->chunks,
                                pf->pf ? "open" : pf->ended ? "ended" : "cancelled");
}

static PyGetSetDef prefill_getset[] = {
    {"first", prefill_first, NULL, "The prompt position of the current item's first token (None: no item).", NULL},
    {"n_tokens", prefill_n_tokens, NULL, "The current item's tokens (None: no item).", NULL},
    {"chunks", prefill_chunks, NULL, "Chunks of the prompt (per table).", NULL},
    {"info", prefill_info, NULL,
     "A dict (engram_prefill_get_info): chunks, chunk_tokens, ring_chunks, ring_bytes, ready and "
     "chunks_applied (per table).  While the prefill is open.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef prefill_methods[] = {
    {"apply", (PyCFunction)(void (*)(void))prefill_apply, METH_VARARGS | METH_KEYWORDS,
     "apply(layer, residual) -> residual\n\n"
     "Applies the current item's chunk with layer (engram_prefill_apply: the chunk's rows of "
     "the table of layer, which should be the item's table) to residual IN PLACE: float32 or "
     "BF16, (n_tokens, S, W), C-contiguous, writable host memory, never copied.  A table's "
     "chunks are applied in order from 0.  PLE: a convolution state carried from chunk to "
     "chunk (from the session's committed one), committed at end() if every chunk was "
     "applied.  The GIL is released.  Raises ValueError (no current item), TypeError / "
     "ValueError naming the argument, ArgumentError (out of order, another table's layer), "
     "DataError (a non-finite residual: the chunk may be applied again)."},
    {"start_table1", prefill_start_table1, METH_NOARGS,
     "start_table1()\n\nStarts table 1's reads now (engram_prefill_start_table1; they start at "
     "once anyway with this binding's options: a no-op then)."},
    {"end", prefill_end, METH_NOARGS,
     "end()\n\n"
     "Ends the prefill (engram_prefill_end): stops what is left, waits until the pool holds no "
     "read of it, and commits the session's history (PLE: and convolution state, if every "
     "chunk was applied) if every chunk of every table was read; else raises the first error "
     "or CancelledError, history unchanged.  Called by the iteration when it is exhausted; a "
     "no-op after it.  The ring may be reused by nothing after this: views stay readable."},
    {"cancel", prefill_cancel, METH_NOARGS,
     "cancel()\n\nStops the prefill, history unchanged; nothing is written into the ring "
     "afterwards.  A no-op once ended or cancelled."},
    {"__enter__", self_enter, METH_NOARGS, "__enter__() -> Prefill\n\nThe prefill itself."},
    {"__exit__", prefill_exit, METH_VARARGS, "__exit__(*exc)\n\nend() if the iteration ran to its end without an error, else cancel()."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot prefill_slots[] = {
    {Py_tp_doc,
     "Prefill: a prompt read ahead (Session.prefill()); an iterator.\n\n"
     "Iterating yields (table, chunk, rows) in the order table 0 chunk 0, table 1 chunk 0, "
     "table 0 chunk 1, table 1 chunk 1, ... (PLE: table 0 only), each after its chunk is read "
     "(the GIL released while waiting).  rows is a read-only NumPy view of the chunk in the "
     "ring, (n_tokens, 24, 256) (uint16 BF16 bits; float32; raw uint8 (n, 24, 264)) or PLE "
     "(n_tokens, 16, 160); tokens first .. first + n_tokens - 1 of the prompt (.first, "
     ".n_tokens).  Masked (padding) tokens read nothing: their rows in a view are unspecified."
     "\n\n"
     "LIFETIME: a view is valid until the next item is requested.  Requesting it releases the "
     "chunk, and its ring buffer is then filled with a later chunk: a view kept past that "
     "reads other rows (never freed memory: the ring is a NumPy buffer the views keep alive).  "
     "Copy what must outlive its item.  Releasing each chunk at the next request means the "
     "ring (ring_chunks >= 1) can never deadlock.\n\n"
     "When the iteration is exhausted the prefill ends (end(): the history is committed); an "
     "error raised by the iteration (a read's, TimeoutError with nothing lost, CancelledError "
     "after Session.close) leaves it open.  A context manager: on exit it ends if fully "
     "iterated without error, else it is cancelled.  Collected while open: cancelled.  Calls "
     "from two threads at once raise BusyError.\n\n"
     "    with s.prefill(prompt, chunk=512) as pf:\n"
     "        for table, c, rows in pf:\n"
     "            pf.apply(layers[table], residual[pf.first:pf.first + pf.n_tokens])"},
    {Py_tp_new, no_new},
    {Py_tp_dealloc, prefill_dealloc},
    {Py_tp_iter, PyObject_SelfIter},
    {Py_tp_iternext, prefill_next},
    {Py_tp_getset, prefill_getset},
    {Py_tp_methods, prefill_methods},
    {Py_tp_repr, prefill_repr},
    {0, NULL}};

static PyType_Spec prefill_spec = {"engram.Prefill", sizeof(eg_prefill), 0, Py_TPFLAGS_DEFAULT, prefill_slots};

/* ------------------------------------------------------------- module */

static int add_type(PyObject *module, PyType_Spec *spec, const char *name, PyObject **out)
{
    if (!(*out = PyType_FromSpec(spec)))
        return -1;
    Py_INCREF(*out);
    if (PyModule_AddObject(module, name, *out) < 0) {
        Py_DECREF(*out);
        return -1;
    }
    return 0;
}

int eg_pool_init(PyObject *module)
{
    if (add_type(module, &pool_spec, "Pool", &PoolType) < 0 ||
        add_type(module, &session_spec, "Session", &SessionType) < 0 ||
        add_type(module, &step_spec, "Step", &StepType) < 0 ||
        add_type(module, &prefill_spec, "Prefill", &PrefillType) < 0)
        return -1;
    return 0;
}
