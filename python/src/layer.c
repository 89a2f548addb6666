/*
 * layer.c - engram.Layer: one Engram layer's weights and an applier, applied
 * in place to a caller's residual (NumPy array, torch tensor, any buffer or
 * DLPack producer on the host), from tokens (hashed and read here) or from
 * rows a step or prefill delivered.
 */
#include "ext.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

PyObject *eg_LayerType;

/* tokens hashed and read per round of a tokens apply: the rows buffer is
 * READ_TOKENS x 24 x 256 x 2 bytes (12.6 MB), the ids 48 x 4 a token */
#define READ_TOKENS 1024u

typedef struct eg_layer {
    PyObject_HEAD
    eg_model *model;            /* strong reference                          */
    engram_layer *L;
    engram_layer_info info;
    engram_applier *a;
    unsigned threads;           /* the applier's                             */
    engram_reader *rd;          /* opened by the first tokens apply          */
    uint32_t *ids;              /* [READ_TOKENS][48 or 16]                   */
    uint16_t *rows;             /* [READ_TOKENS][24 or 16][256 or 160]       */
    pthread_mutex_t mu;         /* one apply at a time (the applier, reader) */
    int pins;                   /* engram.cuda uploads in progress (_pin)    */
    int table;
    int ple;
} eg_layer;

PyObject *eg_layer_open(eg_model *m, int layer, unsigned threads);
PyObject *eg_layer_open(eg_model *m, int layer, unsigned threads)
{
    const engram_family *f = &m->info.family;
    int table = -1;
    for (uint32_t t = 0; t < f->tables; t++)
        if ((int)f->layers[t] == layer)
            table = (int)t;
    if (f->member == ENGRAM_MEMBER_PLE && layer == 0)
        table = 0;
    if (table < 0) {
        if (f->member == ENGRAM_MEMBER_PLE)
            PyErr_Format(PyExc_ValueError, "layer: %d; this PLE model's layer is %u", layer,
                         (unsigned)f->layers[0]);
        else
            PyErr_Format(PyExc_ValueError, "layer: %d; V4.1's Engram layers are 1 and 14", layer);
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)eg_LayerType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_layer *self = (eg_layer *)alloc(tp, 0);
    if (!self)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    Py_INCREF(m);
    self->model = m;
    m->users++;
    self->table = table;
    self->ple = f->member == ENGRAM_MEMBER_PLE;
    self->threads = threads ? threads : engram_default_threads();
    engram_error err;
    int rc;
    engram_apply_opts o;
    memset(&o, 0, sizeof o);
    o.threads = self->threads;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_layer_open(m->m, table, &self->L, &err);
    if (rc == 0)
        rc = engram_applier_new(self->L, &o, &self->a, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(self);
        return eg_raise(rc, &err, "layer");
    }
    engram_layer_get_info(self->L, &self->info);
    return (PyObject *)self;
}

/* Frees the C objects; the caller holds mu (or is the last reference). */
static void layer_free_c(eg_layer *self)
{
    engram_reader_close(self->rd);
    self->rd = NULL;
    engram_applier_free(self->a);
    self->a = NULL;
    engram_layer_close(self->L);
    self->L = NULL;
    free(self->ids);
    free(self->rows);
    self->ids = NULL;
    self->rows = NULL;
}

/* With the GIL: drops the model once the C objects are gone. */
static void layer_release(eg_layer *self)
{
    layer_free_c(self);
    if (self->model) {
        self->model->users--;
        Py_CLEAR(self->model);
    }
}

static void layer_dealloc(PyObject *o)
{
    eg_layer *self = (eg_layer *)o;
    layer_release(self);
    pthread_mutex_destroy(&self->mu);
    eg_heap_free(o);
}

static int layer_live(const eg_layer *self)
{
    if (!self->L) {
        PyErr_SetString(eg_ClosedError, "the layer is closed");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- apply */

struct apply_call {
    eg_layer *self;
    eg_model *model;            /* a reference held for the call             */
    uint32_t *tokens;           /* NULL: rows given                          */
    uint8_t *mask;              /* the caller's mask (NULL: none)            */
    size_t n;
    const char *rows;           /* rows given: token i's at rows + i*stride  */
    size_t rows_stride;
    engram_dtype rows_dtype;
    char *resid;
    engram_dtype resid_dtype;
    size_t resid_token;         /* bytes of one token's residual             */
    engram_history hist;        /* tokens: advanced here, copied back at 0   */
    engram_ple_history ph;
    float *state;               /* PLE: a working copy                        */
    unsigned threads;           /* 0: the layer's, read under its lock       */
    size_t at;                  /* the first token of the round that failed  */
    engram_error err;
    const char *what;
};

static int retarget_threads(eg_layer *self, unsigned threads, engram_error *err)
{
    if (threads == self->threads)
        return 0;
    engram_apply_opts o;
    memset(&o, 0, sizeof o);
    o.threads = threads;
    engram_applier *a;
    int rc = engram_applier_new(self->L, &o, &a, err);
    if (rc < 0)
        return rc;
    engram_applier_free(self->a);
    self->a = a;
    self->threads = threads;
    return 0;
}

static int apply_rows(struct apply_call *c, const void *rows, size_t rows_stride, engram_dtype rdt,
                      size_t first, size_t k)
{
    eg_layer *self = c->self;
    const uint8_t *mk = c->mask ? c->mask + first : NULL;
    char *x = c->resid + first * c->resid_token;
    if (self->ple) {
        /* PLE apply masks: 0 padding, anything else applied */
        return engram_apply_seq(self->a, rows, rdt, x, c->resid_dtype, mk, k, c->state, &c->err);
    }
    return engram_apply_strided(self->a, rows, rdt, rows_stride, x, c->resid_dtype, c->resid_token, mk,
                                k, &c->err);
}

static float value_at(const char *p, engram_dtype dt)
{
    if (dt == ENGRAM_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t b;
    memcpy(&b, p, 2);
    uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* Every unmasked residual value finite, checked before any chunk is
 * applied (the library checks per call; a tokens apply makes several). */
static int check_finite(struct apply_call *c)
{
    size_t elem = c->resid_dtype == ENGRAM_F32 ? 4 : 2;
    size_t per = c->resid_token / elem;
    for (size_t i = 0; i < c->n; i++) {
        if (c->mask && c->mask[i] == 0)
            continue;
        const char *p = c->resid + i * c->resid_token;
        for (size_t j = 0; j < per; j++) {
            if (!isfinite(value_at(p + j * elem, c->resid_dtype))) {
                memset(&c->err, 0, sizeof c->err);
                c->err.code = -EDOM;
                c->err.offset = ENGRAM_NO_OFFSET;
                c->err.row = ENGRAM_NO_ROW;
                size_t W = c->self->info.width;
                snprintf(c->err.msg, sizeof c->err.msg,
                         "token %zu, stream %zu, index %zu: residual value is not finite", i, j / W, j % W);
                c->what = "apply";
                return -EDOM;
            }
        }
    }
    return 0;
}

/* Runs without the GIL: the layer's lock held. */
static int apply_run(struct apply_call *c)
{
    eg_layer *self = c->self;
    if (!self->L) { /* closed by another thread while this call waited for the lock */
        memset(&c->err, 0, sizeof c->err);
        c->err.code = -EBADF;
        c->err.offset = ENGRAM_NO_OFFSET;
        c->err.row = ENGRAM_NO_ROW;
        snprintf(c->err.msg, sizeof c->err.msg, "the layer was closed");
        c->what = "apply";
        return -EBADF;
    }
    int rc = check_finite(c);
    if (rc < 0)
        return rc;
    rc = retarget_threads(self, c->threads ? c->threads : self->threads, &c->err);
    if (rc < 0) {
        c->what = "threads";
        return rc;
    }
    if (!c->tokens) {
        c->what = "apply";
        return apply_rows(c, c->rows, c->rows_stride, c->rows_dtype, 0, c->n);
    }
    const engram_family *f = &c->model->info.family;
    size_t per = f->rows_per_token * f->tables; /* ids per token */
    size_t cols = f->rows_per_token;            /* rows per token of the table */
    size_t rowb = (size_t)f->row_values * 2;
    if (!self->rd) {
        c->what = "opening the reader";
        if ((rc = engram_reader_open(c->model->m, NULL, &self->rd, &c->err)) < 0)
            return rc;
    }
    if (!self->ids) {
        self->ids = malloc((size_t)READ_TOKENS * per * sizeof *self->ids);
        self->rows = malloc((size_t)READ_TOKENS * cols * rowb);
        if (!self->ids || !self->rows) {
            free(self->ids);
            free(self->rows);
            self->ids = NULL;
            self->rows = NULL;
            c->what = "apply";
            return -ENOMEM;
        }
    }
    uint8_t kinds[READ_TOKENS];
    for (size_t at = 0; at < c->n; at += READ_TOKENS) {
        size_t k = c->n - at < READ_TOKENS ? c->n - at : READ_TOKENS;
        c->what = "hash";
        c->at = at;
        if (self->ple) {
            for (size_t i = 0; c->mask && i < k; i++)
                kinds[i] = c->mask[at + i] == ENGRAM_MASK_PAD ? ENGRAM_PLE_PAD
                           : c->mask[at + i] == ENGRAM_MASK_IMAGE ? ENGRAM_PLE_IMAGE : ENGRAM_PLE_TEXT;
            rc = engram_ple_hash(c->model->m, &c->ph, c->tokens + at, c->mask ? kinds : NULL, k,
                                 self->ids, &c->err);
        } else {
            rc = engram_hash_tokens(engram_model_hasher(c->model->m), &c->hist, c->tokens + at,
                                    c->mask ? c->mask + at : NULL, k, self->ids, &c->err);
        }
        if (rc < 0)
            return rc;
        c->what = "reading rows";
        rc = engram_reader_batch(self->rd, self->table, self->ids, k, ENGRAM_BF16, self->rows, &c->err);
        if (rc < 0)
            return rc;
        c->what = "apply";
        rc = apply_rows(c, self->rows, cols * rowb, ENGRAM_BF16, at, k);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static const char *dtype_of(eg_kind k, engram_dtype *dt)
{
    if (k == EG_F32) {
        *dt = ENGRAM_F32;
        return NULL;
    }
    if (k == EG_BF16 || k == EG_U16) {
        *dt = ENGRAM_BF16;
        return NULL;
    }
    return "float32 or bfloat16 (torch.bfloat16, or BF16 bit patterns as uint16) is needed";
}

static PyObject *layer_apply(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tokens", "residual", "mask", "history", "threads", "rows", "state", NULL};
    PyObject *tok_o = Py_None, *res_o = NULL, *mask_o = Py_None, *hist_o = Py_None, *thr_o = Py_None,
             *rows_o = Py_None, *state_o = Py_None;
    eg_layer *self = (eg_layer *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOOO:apply", kwl, &tok_o, &res_o, &mask_o, &hist_o,
                                     &thr_o, &rows_o, &state_o))
        return NULL;
    if (layer_live(self) < 0)
        return NULL;
    struct apply_call c;
    memset(&c, 0, sizeof c);
    c.self = self;
    /* argument conversion may run Python code (a __dlpack__) that closes
     * the layer: everything below reads the model through this reference,
     * and the locked part checks the layer again */
    c.model = self->model;
    Py_INCREF(c.model);
    eg_array res, rows, st;
    int have_res = 0, have_rows = 0, have_st = 0;
    eg_history *h = NULL;
    PyObject *ret = NULL;
    char b[128];
    if (thr_o != Py_None) {
        long t;
        if (eg_long_arg(thr_o, "threads", 1, (long)ENGRAM_APPLY_MAX_THREADS, &t) < 0)
            goto done;
        c.threads = (unsigned)t;
    }
    if ((tok_o == Py_None) == (rows_o == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "apply: give tokens or rows= (one of them)");
        goto done;
    }
    if (eg_history_arg(hist_o, c.model, &h) < 0)
        goto done;
    if (h && tok_o == Py_None) {
        PyErr_SetString(PyExc_TypeError, "history: only with tokens (rows were hashed already)");
        goto done;
    }
    /* residual: (n, S, W), C-contiguous, writable host memory */
    uint32_t S = self->info.streams, W = self->info.width;
    if (eg_residual_arg(res_o, 0, NULL, SIZE_MAX, S, W, "array", &res, &c.resid_dtype) < 0)
        goto done;
    have_res = 1;
    c.n = (size_t)res.shape[0];
    c.resid = res.data;
    c.resid_token = (size_t)S * W * (size_t)res.itemsize;
    if (tok_o != Py_None) {
        size_t nt;
        if (eg_tokens(tok_o, "tokens", &c.tokens, &nt) < 0)
            goto done;
        if (nt != c.n) {
            PyErr_Format(PyExc_ValueError, "tokens: %zu tokens for a residual of %zu", nt, c.n);
            goto done;
        }
        /* every token checked before any is applied: the work goes in
         * rounds of READ_TOKENS, and a bad token in a later round must not
         * find the earlier ones updated */
        uint32_t vocab = c.model->info.family.vocab;
        for (size_t i = 0; i < nt; i++) {
            if (c.tokens[i] >= vocab) {
                engram_error e;
                memset(&e, 0, sizeof e);
                e.code = -EINVAL;
                e.offset = ENGRAM_NO_OFFSET;
                e.row = ENGRAM_NO_ROW;
                snprintf(e.msg, sizeof e.msg, "token %u at position %zu is not < vocab %u", c.tokens[i], i,
                         vocab);
                eg_raise(-EINVAL, &e, "tokens");
                goto done;
            }
        }
    } else {
        if (eg_array_get(rows_o, "rows", 0, NULL, &rows) < 0)
            goto done;
        have_rows = 1;
        const char *why = dtype_of(rows.kind, &c.rows_dtype);
        if (self->ple && c.rows_dtype != ENGRAM_BF16)
            why = "bfloat16 (PLE rows are BF16: torch.bfloat16 or uint16 bits) is needed";
        if (why) {
            PyErr_Format(PyExc_TypeError, "rows: %s; %s", eg_kind_name(rows.kind), why);
            goto done;
        }
        const engram_family *f = &c.model->info.family;
        if (rows.ndim != 3 || (size_t)rows.shape[0] != c.n || rows.shape[1] != f->rows_per_token ||
            rows.shape[2] != f->row_values) {
            PyErr_Format(PyExc_ValueError, "rows: shape %s; (%zu, %u, %u) is needed", eg_shape_str(&rows, b, sizeof b),
                         c.n, (unsigned)f->rows_per_token, (unsigned)f->row_values);
            goto done;
        }
        if (!eg_array_inner_contiguous(&rows, 1) || (c.n > 1 && (rows.strides[0] <= 0 || rows.strides[0] % rows.itemsize))) {
            PyErr_SetString(PyExc_ValueError, "rows: each token's rows must be contiguous (a step's or "
                                              "prefill's view is)");
            goto done;
        }
        if (self->ple && c.n > 1 && rows.strides[0] != rows.shape[1] * rows.shape[2] * rows.itemsize) {
            PyErr_SetString(PyExc_ValueError, "rows: PLE rows must be C-contiguous");
            goto done;
        }
        c.rows = rows.data;
        c.rows_stride = c.n > 1 ? (size_t)rows.strides[0] : (size_t)(rows.shape[1] * rows.shape[2] * rows.itemsize);
        if (c.n > 0 && (const char *)c.rows < c.resid + c.n * c.resid_token &&
            c.resid < (const char *)c.rows + (c.n ? (c.n - 1) * c.rows_stride : 0) +
                          (size_t)(rows.shape[1] * rows.shape[2] * rows.itemsize)) {
            PyErr_SetString(PyExc_ValueError, "rows: overlaps residual");
            goto done;
        }
    }
    if (eg_mask(mask_o, "mask", c.n, &c.mask) < 0)
        goto done;
    if (self->ple && c.mask) {
        for (size_t i = 0; i < c.n; i++)
            if (c.mask[i] > ENGRAM_MASK_IMAGE) {
                PyErr_Format(PyExc_ValueError, "mask[%zu] = %u: MASK_PAD (0), MASK_TEXT (1) or MASK_IMAGE (2)",
                             i, c.mask[i]);
                goto done;
            }
    }
    /* PLE state: the caller's float32 [state_floats], advanced in place on
     * success; None: a sequence start, not kept */
    size_t sf = self->info.state_floats;
    if (self->ple) {
        c.state = PyMem_Calloc(sf ? sf : 1, sizeof(float));
        if (!c.state) {
            PyErr_NoMemory();
            goto done;
        }
        if (state_o != Py_None) {
            if (eg_array_get(state_o, "state", EG_WRITABLE, NULL, &st) < 0)
                goto done;
            have_st = 1;
            if (st.kind != EG_F32 || !eg_array_contiguous(&st) || st.ndim != 1 || (size_t)st.shape[0] != sf) {
                PyErr_Format(PyExc_ValueError, "state: float32 (%zu,) C-contiguous is needed (Layer.new_state())",
                             sf);
                goto done;
            }
            memcpy(c.state, st.data, sf * sizeof(float));
        }
    } else if (state_o != Py_None) {
        PyErr_SetString(PyExc_TypeError, "state: V4.1 layers carry no state");
        goto done;
    }
    if (h) {
        c.hist = h->h;
        c.ph = h->ph;
    } else {
        engram_history_reset(&c.hist);
        engram_ple_history_reset(c.model->m, &c.ph); /* a closed model: nothing (the apply refuses) */
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    rc = apply_run(&c);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        char what[96];
        if (c.at) /* the library names positions within the round */
            snprintf(what, sizeof what, "%s (the round from token %zu)", c.what, c.at);
        eg_raise(rc, &c.err, c.at ? what : c.what);
        goto done;
    }
    if (h) {
        h->h = c.hist;
        h->ph = c.ph;
    }
    if (have_st)
        memcpy(st.data, c.state, sf * sizeof(float));
    Py_INCREF(res_o);
    ret = res_o;
done:
    if (have_res)
        eg_array_release(&res);
    if (have_rows)
        eg_array_release(&rows);
    if (have_st)
        eg_array_release(&st);
    PyMem_Free(c.tokens);
    PyMem_Free(c.mask);
    PyMem_Free(c.state);
    Py_XDECREF(c.model);
    return ret;
}

static PyObject *layer_new_state(PyObject *o, PyObject *args)
{
    (void)args;
    eg_layer *self = (eg_layer *)o;
    if (layer_live(self) < 0)
        return NULL;
    int64_t n = (int64_t)self->info.state_floats;
    PyObject *a = eg_numpy_empty(1, &n, EG_F32);
    if (!a)
        return NULL;
    eg_array v;
    if (eg_array_get(a, "state", EG_WRITABLE, NULL, &v) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    memset(v.data, 0, (size_t)n * sizeof(float));
    eg_array_release(&v);
    return a;
}

static PyObject *layer_close(PyObject *o, PyObject *args)
{
    (void)args;
    eg_layer *self = (eg_layer *)o;
    if (self->pins > 0) {
        PyErr_SetString(eg_BusyError, "the layer's weights are being uploaded by engram.cuda.Layer: close it "
                                      "after that returns");
        return NULL;
    }
    /* an apply on another thread finishes first; the C objects are freed
     * under the lock, so an apply waiting for it (Layer.apply, or pool.c's,
     * which re-read the applier under it) finds the layer closed */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    layer_free_c(self);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    layer_release(self);
    Py_RETURN_NONE;
}

/* For pool.c (Step.apply, Prefill.apply).  With the GIL: checks that layer
 * is an open Layer (TypeError / ClosedError set, NULL returned otherwise)
 * and gives its mutex, which the caller locks with the GIL released; under
 * it, eg_layer_applier_held gives the applier to use (NULL: the layer was
 * closed meanwhile; Layer.apply(threads=) may also have replaced it). */
pthread_mutex_t *eg_layer_mutex(PyObject *layer);
pthread_mutex_t *eg_layer_mutex(PyObject *layer)
{
    if (!PyObject_TypeCheck(layer, (PyTypeObject *)eg_LayerType)) {
        PyErr_SetString(PyExc_TypeError, "layer: an engram.Layer is needed (Model.layer(n))");
        return NULL;
    }
    eg_layer *self = (eg_layer *)layer;
    if (layer_live(self) < 0)
        return NULL;
    return &self->mu;
}

engram_applier *eg_layer_applier_held(PyObject *layer);
engram_applier *eg_layer_applier_held(PyObject *layer)
{
    return ((eg_layer *)layer)->a;
}

/* engram.cuda reads the weights without the GIL: it pins the layer (close
 * refused meanwhile) around the upload; with the GIL held, so a plain int */
static PyObject *layer_pin(PyObject *o, PyObject *args)
{
    (void)args;
    eg_layer *self = (eg_layer *)o;
    if (layer_live(self) < 0)
        return NULL;
    self->pins++;
    return PyLong_FromVoidPtr(self->L);
}

static PyObject *layer_unpin(PyObject *o, PyObject *args)
{
    (void)args;
    eg_layer *self = (eg_layer *)o;
    if (self->pins > 0)
        self->pins--;
    Py_RETURN_NONE;
}

/* the Model a Layer was made from (pool.c refuses another model's layer) */
eg_model *eg_layer_model_of(PyObject *layer);
eg_model *eg_layer_model_of(PyObject *layer)
{
    return ((eg_layer *)layer)->model;
}

static PyObject *layer_enter(PyObject *o, PyObject *args)
{
    (void)args;
    Py_INCREF(o);
    return o;
}

static PyObject *layer_exit(PyObject *o, PyObject *args)
{
    (void)args;
    return layer_close(o, NULL);
}

static PyObject *layer_info(PyObject *o, void *cl)
{
    (void)cl;
    eg_layer *self = (eg_layer *)o;
    if (layer_live(self) < 0)
        return NULL;
    return Py_BuildValue("{s:i,s:i,s:I,s:I,s:K,s:n,s:I,s:K,s:s}", "table", self->info.table, "layer",
                         self->info.layer, "width", self->info.width, "streams", self->info.streams, "bytes",
                         (unsigned long long)self->info.bytes, "state_floats", (Py_ssize_t)self->info.state_floats,
                         "threads", self->threads, "applier_bytes",
                         (unsigned long long)engram_applier_bytes(self->a), "member",
                         self->ple ? "qwen3.8-ple" : "deepseek-v4.1-engram");
}

static PyObject *layer_model(PyObject *o, void *cl)
{
    (void)cl;
    eg_layer *self = (eg_layer *)o;
    if (layer_live(self) < 0)
        return NULL;
    Py_INCREF(self->model);
    return (PyObject *)self->model;
}

static PyGetSetDef layer_getset[] = {
    {"info", layer_info, NULL,
     "A dict: table, layer (0-based model layer), width, streams, bytes (the weights held), "
     "state_floats (PLE's per-sequence state; 0 for V4.1), threads, applier_bytes, member.",
     NULL},
    {"model", layer_model, NULL, "The engram.Model this layer was made from.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef layer_methods[] = {
    {"apply", (PyCFunction)(void (*)(void))layer_apply, METH_VARARGS | METH_KEYWORDS,
     "apply(tokens, residual, mask=None, history=None, threads=None, rows=None, state=None) -> residual\n\n"
     "Applies the layer to n tokens, updating residual IN PLACE (never copied): float32, or "
     "bfloat16 (torch.bfloat16, or BF16 bit patterns as uint16), shape (n, S, W), C-contiguous, "
     "writable, in host memory; any object with the buffer protocol or __dlpack__ (NumPy, "
     "torch).  The bits equal `engram apply` and the C API's engram_apply / engram_apply_seq.\n\n"
     "tokens: raw ids (n of them), hashed from history (an engram.History advanced on success; "
     "None: a sequence start) and read here (uncached); or None with rows=: the rows a step's "
     "wait(t) or a prefill delivered, (n, 24, 256) (PLE (n, 16, 160)), BF16 (uint16 / "
     "torch.bfloat16) or float32, each token's rows contiguous.\n"
     "mask: None or n values (V4.1: 0 = masked, untouched; PLE: MASK_PAD 0 padding, MASK_TEXT "
     "1, MASK_IMAGE 2).\n"
     "threads: the applier's workers for this and later calls (same bits whatever the count).\n"
     "state: PLE only, the sequence's convolution state (Layer.new_state()), advanced in place "
     "on success (None: a sequence start).\n\n"
     "The GIL is released while the layer works; calls on one Layer run one at a time.  Raises "
     "TypeError / ValueError naming the argument (wrong dtype, shape, device, read-only, not "
     "contiguous) before anything is touched, ArgumentError for a token out of the vocabulary, "
     "DataError for a non-finite residual (nothing written) or a computed overflow (the tokens "
     "before it updated; state and history unchanged)."},
    {"new_state", layer_new_state, METH_NOARGS,
     "new_state() -> numpy.ndarray\n\nA zero float32 convolution state (state_floats values; "
     "empty for V4.1): a PLE sequence's start."},
    {"_pin", layer_pin, METH_NOARGS,
     "_pin() -> int\n\nFor engram.cuda: the engram_layer * (as an int), and close() refused until _unpin()."},
    {"_unpin", layer_unpin, METH_NOARGS, "_unpin()\n\nEnds a _pin()."},
    {"close", layer_close, METH_NOARGS, "close()\n\nFrees the weights now (after an apply in progress)."},
    {"__enter__", layer_enter, METH_NOARGS, NULL},
    {"__exit__", layer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyObject *layer_repr(PyObject *o)
{
    eg_layer *self = (eg_layer *)o;
    if (!self->L)
        return PyUnicode_FromString("engram.Layer(closed)");
    return PyUnicode_FromFormat("engram.Layer(layer=%d, table=%d, width=%u, streams=%u, threads=%u)",
                                self->info.layer, self->info.table, self->info.width, self->info.streams,
                                self->threads);
}

static PyObject *layer_new_py(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)tp;
    (void)args;
    (void)kw;
    PyErr_SetString(PyExc_TypeError, "engram.Layer is made by Model.layer(1 or 14)");
    return NULL;
}

static PyType_Slot layer_slots[] = {
    {Py_tp_doc, "Layer: one Engram layer (Model.layer(1 or 14); PLE Model.layer(its layer)).\n\n"
                "Holds the projection weights (read once, validated) and an applier with its "
                "threads; apply() updates a residual in place.  Close it (or use `with`) to free "
                "the weights at once."},
    {Py_tp_new, layer_new_py},
    {Py_tp_dealloc, layer_dealloc},
    {Py_tp_getset, layer_getset},
    {Py_tp_methods, layer_methods},
    {Py_tp_repr, layer_repr},
    {0, NULL}};

static PyType_Spec layer_spec = {"engram.Layer", sizeof(eg_layer), 0, Py_TPFLAGS_DEFAULT, layer_slots};

int eg_layer_init(PyObject *module)
{
    if (!(eg_LayerType = PyType_FromSpec(&layer_spec)))
        return -1;
    Py_INCREF(eg_LayerType);
    return PyModule_AddObject(module, "Layer", eg_LayerType);
}
