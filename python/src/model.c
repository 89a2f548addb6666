/*
 * model.c - engram.Model (a model file of the family: info, hash, rows,
 * layers) and engram.History (a sequence's hash state).
 */
#include "ext.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

PyObject *eg_ModelType, *eg_HistoryType;

/* ------------------------------------------------------------- History */

static int is_ple(const eg_model *m)
{
    return m->info.family.member == ENGRAM_MEMBER_PLE;
}

PyObject *eg_history_new(const eg_model *m)
{
    PyTypeObject *tp = (PyTypeObject *)eg_HistoryType;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_history *h = (eg_history *)alloc(tp, 0);
    if (!h)
        return NULL;
    h->member = m->info.family.member;
    engram_history_reset(&h->h);
    h->eos = m->info.family.eos;
    if (h->member == ENGRAM_MEMBER_PLE)
        engram_ple_history_reset(m->m, &h->ph);
    return (PyObject *)h;
}

int eg_history_arg(PyObject *obj, const eg_model *m, eg_history **out)
{
    *out = NULL;
    if (!obj || obj == Py_None)
        return 0;
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)eg_HistoryType)) {
        PyErr_SetString(PyExc_TypeError, "history: an engram.History is needed (Model.history())");
        return -1;
    }
    eg_history *h = (eg_history *)obj;
    if (h->member != m->info.family.member) {
        PyErr_SetString(PyExc_ValueError, "history: a History of another family member");
        return -1;
    }
    *out = h;
    return 0;
}

static PyObject *history_ids(PyObject *self, void *c)
{
    (void)c;
    eg_history *h = (eg_history *)self;
    if (h->member == ENGRAM_MEMBER_PLE)
        return Py_BuildValue("(kk)", (unsigned long)h->ph.lag[0], (unsigned long)h->ph.lag[1]);
    return Py_BuildValue("(iii)", h->h.id[0], h->h.id[1], h->h.id[2]);
}

static int history_set_ids(PyObject *self, PyObject *v, void *c)
{
    (void)c;
    eg_history *h = (eg_history *)self;
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "ids cannot be deleted");
        return -1;
    }
    Py_ssize_t want = h->member == ENGRAM_MEMBER_PLE ? 2 : 3;
    PyObject *seq = PySequence_Fast(v, "ids: a sequence of ints");
    if (!seq)
        return -1;
    if (PySequence_Size(seq) != want) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "ids: %zd ints needed", want);
        return -1;
    }
    long long x[3] = {0, 0, 0};
    for (Py_ssize_t i = 0; i < want; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        long xi = -1;
        int bad = !it || eg_long_arg(it, "ids", LONG_MIN, LONG_MAX, &xi) < 0;
        x[i] = xi;
        Py_XDECREF(it);
        if (bad) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    if (h->member == ENGRAM_MEMBER_PLE) {
        if (x[0] < 0 || x[0] > UINT32_MAX || x[1] < 0 || x[1] > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "ids: PLE lags are token ids 0 .. 2^32-1");
            return -1;
        }
        h->ph.lag[0] = (uint32_t)x[0];
        h->ph.lag[1] = (uint32_t)x[1];
    } else {
        for (int i = 0; i < 3; i++) {
            if (x[i] < -1 || x[i] > INT32_MAX) {
                PyErr_SetString(PyExc_ValueError, "ids: compressed ids >= 0, or -1 (dead)");
                return -1;
            }
        }
        for (int i = 0; i < 3; i++)
            h->h.id[i] = (int32_t)x[i];
    }
    return 0;
}

static PyObject *history_reset(PyObject *self, PyObject *args)
{
    (void)args;
    eg_history *h = (eg_history *)self;
    engram_history_reset(&h->h);
    h->ph.lag[0] = h->ph.lag[1] = h->eos;
    Py_RETURN_NONE;
}

static PyObject *history_copy(PyObject *self, PyObject *args)
{
    (void)args;
    eg_history *h = (eg_history *)self;
    PyTypeObject *tp = Py_TYPE(self);
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_history *c = (eg_history *)alloc(tp, 0);
    if (!c)
        return NULL;
    c->member = h->member;
    c->h = h->h;
    c->ph = h->ph;
    c->eos = h->eos;
    return (PyObject *)c;
}

static PyObject *history_repr(PyObject *self)
{
    PyObject *ids = history_ids(self, NULL);
    if (!ids)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("engram.History(%s, ids=%R)",
                                       ((eg_history *)self)->member == ENGRAM_MEMBER_PLE ? "ple" : "v4.1",
                                       ids);
    Py_DECREF(ids);
    return r;
}

static PyObject *history_new_py(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)tp;
    static char *kwl[] = {"model", NULL};
    PyObject *m;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!:History", kwl, (PyTypeObject *)eg_ModelType, &m))
        return NULL;
    if (!((eg_model *)m)->m) {
        PyErr_SetString(eg_ClosedError, "model: closed");
        return NULL;
    }
    return eg_history_new((eg_model *)m);
}

static PyGetSetDef history_getset[] = {
    {"ids", history_ids, history_set_ids,
     "The carried ids: V4.1 3 compressed ids, newest first (-1: dead, before the start or "
     "after a masked token); PLE the 2 previous raw ids (lag 1, lag 2; EOS at a start).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef history_methods[] = {
    {"reset", history_reset, METH_NOARGS, "reset()\n\nBack to a sequence start."},
    {"copy", history_copy, METH_NOARGS, "copy() -> History\n\nA snapshot of this history."},
    {"__copy__", history_copy, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot history_slots[] = {
    {Py_tp_doc, "History(model)\n\n"
                "The hash state of one sequence between calls (the last ids), at a sequence start "
                "when made.  Model.hash and Layer.apply read and advance it in place when given "
                "one, so that a stream cut anywhere hashes as one call."},
    {Py_tp_new, history_new_py},
    {Py_tp_dealloc, eg_heap_free},
    {Py_tp_getset, history_getset},
    {Py_tp_methods, history_methods},
    {Py_tp_repr, history_repr},
    {0, NULL}};

static PyType_Spec history_spec = {"engram.History", sizeof(eg_history), 0, Py_TPFLAGS_DEFAULT,
                                   history_slots};

/* ------------------------------------------------------------- Model */

static PyObject *model_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"path", NULL};
    PyObject *path;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:Model", kwl, PyUnicode_FSConverter, &path))
        return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    eg_model *self = (eg_model *)alloc(tp, 0);
    if (!self) {
        Py_DECREF(path);
        return NULL;
    }
    self->path = path;
    const char *p = PyBytes_AsString(path);
    engram_error err;
    memset(&err, 0, sizeof err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_model_open(p, &self->m, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        eg_raise(rc, &err, p); /* p points into self->path: raise before self goes */
        Py_DECREF(self);
        return NULL;
    }
    engram_model_get_info(self->m, &self->info);
    return (PyObject *)self;
}

static void model_dealloc(PyObject *o)
{
    eg_model *self = (eg_model *)o;
    engram_model_close(self->m);
    self->m = NULL;
    Py_CLEAR(self->path);
    eg_heap_free(o);
}

static int model_open(const eg_model *m)
{
    if (!m->m) {
        PyErr_SetString(eg_ClosedError, "the model is closed");
        return -1;
    }
    return 0;
}

static int dict_set(PyObject *d, const char *k, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *model_info(PyObject *o, void *c)
{
    (void)c;
    eg_model *self = (eg_model *)o;
    if (model_open(self) < 0)
        return NULL;
    const engram_model_info *in = &self->info;
    const engram_family *f = &in->family;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    PyObject *rows = PyList_New(0), *layers = PyList_New(0), *tables = PyList_New(0);
    int ok = rows && layers && tables;
    for (uint32_t t = 0; ok && t < f->tables; t++) {
        PyObject *r = PyLong_FromUnsignedLongLong(in->table[t].rows);
        PyObject *l = PyLong_FromUnsignedLong(f->layers[t]);
        PyObject *td = Py_BuildValue("{s:s,s:i,s:K,s:K,s:K,s:O}", "name",
                                     in->table[t].name ? in->table[t].name : "", "layer",
                                     (int)f->layers[t], "rows", (unsigned long long)in->table[t].rows,
                                     "offset", (unsigned long long)in->table[t].offset, "bytes",
                                     (unsigned long long)in->table[t].bytes, "has_projection",
                                     in->table[t].has_projection ? Py_True : Py_False);
        ok = r && l && td && PyList_Append(rows, r) == 0 && PyList_Append(layers, l) == 0 &&
             PyList_Append(tables, td) == 0;
        Py_XDECREF(r);
        Py_XDECREF(l);
        Py_XDECREF(td);
    }
    const engram_layout *lay = engram_model_layout(self->m);
    ok = ok && dict_set(d, "path", PyUnicode_DecodeFSDefault(in->path ? in->path : "")) == 0 &&
         dict_set(d, "arch", PyUnicode_FromString(in->architecture ? in->architecture : "")) == 0 &&
         dict_set(d, "member", PyUnicode_FromString(f->name ? f->name : "")) == 0 &&
         dict_set(d, "vocab", PyLong_FromUnsignedLong(f->vocab)) == 0 &&
         dict_set(d, "compressed_vocab",
                  lay ? PyLong_FromUnsignedLong(lay->compressed_vocab) : (Py_INCREF(Py_None), Py_None)) == 0 &&
         dict_set(d, "tables", PyLong_FromUnsignedLong(f->tables)) == 0 &&
         dict_set(d, "rows", (Py_INCREF(rows), rows)) == 0 &&
         dict_set(d, "rows_per_token", PyLong_FromUnsignedLong(f->rows_per_token * f->tables)) == 0 &&
         dict_set(d, "row_values", PyLong_FromUnsignedLong(f->row_values)) == 0 &&
         dict_set(d, "row_bytes", PyLong_FromUnsignedLong(f->row_bytes)) == 0 &&
         dict_set(d, "ngram", PyLong_FromUnsignedLong(f->ngram)) == 0 &&
         dict_set(d, "width", PyLong_FromUnsignedLong(in->width)) == 0 &&
         dict_set(d, "streams", PyLong_FromUnsignedLong(in->streams)) == 0 &&
         dict_set(d, "layers", (Py_INCREF(layers), layers)) == 0 &&
         dict_set(d, "has_projection", PyBool_FromLong(in->has_projection)) == 0 &&
         dict_set(d, "state_floats", PyLong_FromUnsignedLong(f->state_floats)) == 0 &&
         dict_set(d, "eos", f->member == ENGRAM_MEMBER_PLE ? PyLong_FromUnsignedLong(f->eos)
                                                            : (Py_INCREF(Py_None), Py_None)) == 0 &&
         dict_set(d, "file_bytes", PyLong_FromUnsignedLongLong(in->file_bytes)) == 0 &&
         dict_set(d, "table_info", (Py_INCREF(tables), tables)) == 0;
    /* the engine reads would take: what a reader opened now gets */
    if (ok) {
        engram_reader *r = NULL;
        engram_error err;
        int rc;
        self->users++; /* Model.close() on another thread waits its turn */
        Py_BEGIN_ALLOW_THREADS
        rc = engram_reader_open(self->m, NULL, &r, &err);
        Py_END_ALLOW_THREADS
        self->users--;
        if (rc == 0) {
            engram_io_stats st;
            engram_reader_get_stats(r, &st);
            ok = dict_set(d, "engine", PyUnicode_FromString(st.engine)) == 0 &&
                 dict_set(d, "direct", PyBool_FromLong(st.direct)) == 0;
            engram_reader_close(r);
        } else {
            ok = dict_set(d, "engine", PyUnicode_FromFormat("none (%s)", err.msg)) == 0 &&
                 dict_set(d, "direct", (Py_INCREF(Py_False), Py_False)) == 0;
        }
    }
    Py_XDECREF(rows);
    Py_XDECREF(layers);
    Py_XDECREF(tables);
    if (!ok) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *model_history(PyObject *o, PyObject *args)
{
    (void)args;
    eg_model *self = (eg_model *)o;
    if (model_open(self) < 0)
        return NULL;
    return eg_history_new(self);
}

/* Checks that out (an array the caller gave) is C-contiguous, writable, on
 * the host, of `kind` (or `kind2`) and of the shape wanted. */
static int check_out(const eg_array *a, const char *arg, int ndim, const int64_t *shape, eg_kind kind,
                     eg_kind kind2)
{
    char b[128];
    if (a->kind != kind && a->kind != kind2) {
        PyErr_Format(PyExc_TypeError, "%s: %s; %s needed", arg, eg_kind_name(a->kind),
                     eg_kind_name(kind));
        return -1;
    }
    int same = a->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = a->shape[i] == shape[i];
    if (!same) {
        PyErr_Format(PyExc_ValueError, "%s: shape %s; (%lld, %lld) needed", arg,
                     eg_shape_str(a, b, sizeof b), (long long)shape[0],
                     (long long)(ndim > 1 ? shape[1] : 0));
        return -1;
    }
    if (!eg_array_contiguous(a)) {
        PyErr_Format(PyExc_ValueError, "%s: not contiguous (a C-contiguous array is needed)", arg);
        return -1;
    }
    return 0;
}

static PyObject *model_hash(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"tokens", "history", "mask", "out", NULL};
    PyObject *tok_o, *hist_o = Py_None, *mask_o = Py_None, *out_o = Py_None;
    eg_model *self = (eg_model *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:hash", kwl, &tok_o, &hist_o, &mask_o, &out_o))
        return NULL;
    if (model_open(self) < 0)
        return NULL;
    eg_history *h;
    if (eg_history_arg(hist_o, self, &h) < 0)
        return NULL;
    uint32_t *tokens = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    PyObject *res = NULL;
    eg_array out;
    int have_out = 0;
    if (eg_tokens(tok_o, "tokens", &tokens, &n) < 0 || eg_mask(mask_o, "mask", n, &mask) < 0)
        goto done;
    const engram_family *f = &self->info.family;
    int64_t shape[2] = {(int64_t)n, (int64_t)(f->rows_per_token * f->tables)};
    if (is_ple(self) && mask) {
        for (size_t i = 0; i < n; i++) {
            if (mask[i] > ENGRAM_PLE_IMAGE) {
                PyErr_Format(PyExc_ValueError,
                             "mask[%zu] = %u: PLE masks are MASK_PAD (0), MASK_TEXT (1) or MASK_IMAGE (2)",
                             i, mask[i]);
                goto done;
            }
            /* kinds: the session masks' numbers (PAD 0, TEXT 1, IMAGE 2) -> engram_ple_hash's */
            mask[i] = mask[i] == ENGRAM_MASK_PAD ? ENGRAM_PLE_PAD
                      : mask[i] == ENGRAM_MASK_IMAGE ? ENGRAM_PLE_IMAGE : ENGRAM_PLE_TEXT;
        }
    }
    if (out_o != Py_None) {
        if (eg_array_get(out_o, "out", EG_WRITABLE, NULL, &out) < 0)
            goto done;
        have_out = 1;
        if (check_out(&out, "out", 2, shape, EG_U32, EG_I32) < 0)
            goto done;
        res = out_o;
        Py_INCREF(res);
    } else {
        if (!(res = eg_numpy_empty(2, shape, EG_U32)))
            goto done;
        if (eg_array_get(res, "out", EG_WRITABLE, NULL, &out) < 0) {
            Py_CLEAR(res);
            goto done;
        }
        have_out = 1;
    }
    engram_history tmp;
    engram_history_reset(&tmp);
    engram_ple_history ptmp;
    engram_ple_history_reset(self->m, &ptmp);
    engram_history *hp = h ? &h->h : &tmp;
    engram_ple_history *php = h ? &h->ph : &ptmp;
    engram_error err;
    int rc;
    self->users++; /* Model.close() on another thread is refused meanwhile */
    Py_BEGIN_ALLOW_THREADS
    if (is_ple(self))
        rc = engram_ple_hash(self->m, php, tokens, mask, n, out.data, &err);
    else
        rc = engram_hash_tokens(engram_model_hasher(self->m), hp, tokens, mask, n, out.data, &err);
    Py_END_ALLOW_THREADS
    self->users--;
    if (rc < 0) {
        Py_CLEAR(res);
        eg_raise(rc, &err, "hash");
    }
done:
    if (have_out)
        eg_array_release(&out);
    PyMem_Free(tokens);
    PyMem_Free(mask);
    return res;
}

static PyObject *model_rows(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"table", "ids", "dtype", "out", NULL};
    long table;
    PyObject *table_o, *ids_o, *dtype_o = NULL, *out_o = Py_None;
    eg_model *self = (eg_model *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:rows", kwl, &table_o, &ids_o, &dtype_o, &out_o))
        return NULL;
    if (model_open(self) < 0)
        return NULL;
    int bf16 = 0;
    if (dtype_o) {
        if (!PyUnicode_Check(dtype_o)) {
            PyErr_SetString(PyExc_TypeError, "dtype: a str is needed: \"float32\" or \"bfloat16\"");
            return NULL;
        }
        if (PyUnicode_CompareWithASCIIString(dtype_o, "bfloat16") == 0)
            bf16 = 1;
        else if (PyUnicode_CompareWithASCIIString(dtype_o, "float32") != 0) {
            PyErr_Format(PyExc_ValueError, "dtype: %R; \"float32\" or \"bfloat16\"", dtype_o);
            return NULL;
        }
    }
    const engram_family *f = &self->info.family;
    if (eg_long_arg(table_o, "table", LONG_MIN, LONG_MAX, &table) < 0)
        return NULL;
    if (table < 0 || (unsigned long)table >= f->tables) {
        PyErr_Format(PyExc_ValueError, "table: %ld; this model has table%s 0%s", table,
                     f->tables > 1 ? "s" : "", f->tables > 1 ? " and 1" : "");
        return NULL;
    }
    uint32_t *ids = NULL;
    size_t n = 0;
    PyObject *res = NULL;
    eg_array out;
    int have_out = 0;
    if (eg_tokens(ids_o, "ids", &ids, &n) < 0)
        return NULL;
    int64_t shape[2] = {(int64_t)n, (int64_t)f->row_values};
    if (out_o != Py_None) {
        if (eg_array_get(out_o, "out", EG_WRITABLE, NULL, &out) < 0)
            goto done;
        have_out = 1;
        if (check_out(&out, "out", 2, shape, bf16 ? EG_BF16 : EG_F32, bf16 ? EG_U16 : EG_F32) < 0)
            goto done;
        res = out_o;
        Py_INCREF(res);
    } else {
        if (!(res = eg_numpy_empty(2, shape, bf16 ? EG_U16 : EG_F32)))
            goto done;
        if (eg_array_get(res, "out", EG_WRITABLE, NULL, &out) < 0) {
            Py_CLEAR(res);
            goto done;
        }
        have_out = 1;
    }
    engram_error err;
    int rc;
    self->users++; /* Model.close() on another thread is refused meanwhile */
    Py_BEGIN_ALLOW_THREADS
    rc = bf16 ? engram_model_read_bf16(self->m, (uint32_t)table, ids, n, out.data, &err)
              : engram_model_read_f32(self->m, (uint32_t)table, ids, n, out.data, &err);
    Py_END_ALLOW_THREADS
    self->users--;
    if (rc < 0) {
        Py_CLEAR(res);
        eg_raise(rc, &err, "rows");
    }
done:
    if (have_out)
        eg_array_release(&out);
    PyMem_Free(ids);
    return res;
}

/* implemented in layer.c */
PyObject *eg_layer_open(eg_model *m, int layer, unsigned threads);

static PyObject *model_layer(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"layer", "threads", NULL};
    long layer;
    PyObject *layer_o, *thr = Py_None;
    eg_model *self = (eg_model *)o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:layer", kwl, &layer_o, &thr))
        return NULL;
    if (model_open(self) < 0)
        return NULL;
    /* out of int's range: -1, refused by eg_layer_open naming the layers */
    if (eg_long_arg(layer_o, "layer", LONG_MIN, LONG_MAX, &layer) < 0)
        return NULL;
    if (layer < INT_MIN || layer > INT_MAX)
        layer = -1;
    long t = 0;
    if (thr != Py_None && eg_long_arg(thr, "threads", 1, (long)ENGRAM_APPLY_MAX_THREADS, &t) < 0)
        return NULL;
    return eg_layer_open(self, (int)layer, (unsigned)t);
}

static PyObject *model_close(PyObject *o, PyObject *args)
{
    (void)args;
    eg_model *self = (eg_model *)o;
    if (self->users > 0) {
        PyErr_Format(eg_BusyError,
                     "the model is in use (%d layer(s), pool(s) or calls in progress): close them first",
                     self->users);
        return NULL;
    }
    engram_model_close(self->m);
    self->m = NULL;
    Py_RETURN_NONE;
}

static PyObject *model_enter(PyObject *o, PyObject *args)
{
    (void)args;
    Py_INCREF(o);
    return o;
}

static PyObject *model_exit(PyObject *o, PyObject *args)
{
    (void)args;
    eg_model *self = (eg_model *)o;
    if (self->users > 0) /* leaving the block with a layer still alive: closed when it goes */
        Py_RETURN_NONE;
    return model_close(o, NULL);
}

static PyObject *model_repr(PyObject *o)
{
    eg_model *self = (eg_model *)o;
    PyObject *p = PyUnicode_DecodeFSDefault(PyBytes_AsString(self->path));
    if (!p)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("engram.Model(%R, member='%s', width=%u)", p,
                                       self->info.family.name ? self->info.family.name : "",
                                       (unsigned)self->info.width);
    Py_DECREF(p);
    return r;
}

static PyObject *model_path(PyObject *o, void *c)
{
    (void)c;
    return PyUnicode_DecodeFSDefault(PyBytes_AsString(((eg_model *)o)->path));
}

static PyGetSetDef model_getset[] = {
    {"info", model_info, NULL,
     "A dict of the model's facts: path, arch (general.architecture), member "
     "(\"deepseek-v4.1-engram\" or \"qwen3.8-ple\"), vocab, compressed_vocab (V4.1; None for "
     "PLE), tables, rows (per table), rows_per_token (48 or 16), row_values (256 or 160), "
     "row_bytes, ngram, width (W), streams (S), layers (0-based, per table), has_projection, "
     "state_floats, eos (PLE), file_bytes, table_info (a dict per table) and engine (the I/O "
     "engine a reader gets on this file: \"io_uring\", \"threads\" or \"buffered\") with direct "
     "(O_DIRECT).",
     NULL},
    {"path", model_path, NULL, "The path the model was opened from.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef model_methods[] = {
    {"hash", (PyCFunction)(void (*)(void))model_hash, METH_VARARGS | METH_KEYWORDS,
     "hash(tokens, history=None, mask=None, out=None) -> numpy.ndarray\n\n"
     "Row ids of n tokens: uint32 (n, 48) for V4.1 (per token table 0's 24 columns, then "
     "table 1's; table-local ids) or (n, 16) for PLE (global ids, head 0 first), exactly as "
     "engram hash and the C API give them.  tokens: a sequence or 1-D integer array of raw ids. "
     "history: an engram.History advanced in place (None: a sequence start, not kept).  mask: "
     "None or n values: V4.1 0 masks a token; PLE MASK_PAD (0, hashed as EOS), MASK_TEXT (1) or "
     "MASK_IMAGE (2).  out: a C-contiguous uint32/int32 (n, 48|16) array to fill instead of a "
     "new one.  Raises ArgumentError (a ValueError) naming the first token out of the "
     "vocabulary; nothing is written and history is unchanged then."},
    {"rows", (PyCFunction)(void (*)(void))model_rows, METH_VARARGS | METH_KEYWORDS,
     "rows(table, ids, dtype=\"float32\", out=None) -> numpy.ndarray\n\n"
     "Reads and decodes rows of a table (table-local ids for V4.1, table 0 for PLE) with plain "
     "positional reads: (k, 256) (PLE: (k, 160)) of float32, or of BF16 bit patterns as uint16 "
     "(dtype=\"bfloat16\"; NumPy has no bfloat16).  out: a C-contiguous host array to fill "
     "(float32, or uint16 / torch.bfloat16 for \"bfloat16\").  Raises ArgumentError for an id "
     "out of range (nothing read), DataError for a row that does not decode."},
    {"layer", (PyCFunction)(void (*)(void))model_layer, METH_VARARGS | METH_KEYWORDS,
     "layer(layer, threads=None) -> Layer\n\n"
     "Opens the Engram layer fed by a table: V4.1 layer 1 (table 0) or 14 (table 1); PLE its "
     "one layer (info['layers'][0]; 0 is accepted too).  Loads the projection weights into "
     "memory (315 MB at W = 5120).  threads: the applier's workers (None: the machine's "
     "cores); results do not depend on it."},
    {"history", model_history, METH_NOARGS,
     "history() -> History\n\nA new hash state at a sequence start for this model."},
    {"close", model_close, METH_NOARGS,
     "close()\n\nCloses the file now (else when the model is collected).  Raises BusyError while "
     "a Layer or Pool made from it is open; afterwards every call raises ClosedError."},
    {"__enter__", model_enter, METH_NOARGS, NULL},
    {"__exit__", model_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot model_slots[] = {
    {Py_tp_doc, "Model(path)\n\n"
                "A model file of the Engram family, opened and validated: a DeepSeek V4.1 Flash "
                "Engram GGUF (two tables of E4M3 + E8M0 rows, layers 1 and 14) or a Qwen3.8 PLE "
                "file (qwen4exp: one table of BF16 rows).  The tables stay on disk and are never "
                "mapped: rows are read on demand (uncached).  Raises NotFoundError (a "
                "FileNotFoundError), ModelError (malformed or unsupported; .offset is the byte) "
                "or engram.Error.\n\n"
                "    m = engram.Model('model.gguf')\n"
                "    ids = m.hash([1, 2, 3])            # uint32 (3, 48)\n"
                "    rows = m.rows(0, ids[0, :24])      # float32 (24, 256)\n"
                "    layer = m.layer(1)\n"
                "    layer.apply([1, 2, 3], residual)   # residual (3, 4, W) updated in place"},
    {Py_tp_new, model_new},
    {Py_tp_dealloc, model_dealloc},
    {Py_tp_getset, model_getset},
    {Py_tp_methods, model_methods},
    {Py_tp_repr, model_repr},
    {0, NULL}};

static PyType_Spec model_spec = {"engram.Model", sizeof(eg_model), 0, Py_TPFLAGS_DEFAULT, model_slots};

int eg_model_init(PyObject *module)
{
    if (!(eg_ModelType = PyType_FromSpec(&model_spec)) || !(eg_HistoryType = PyType_FromSpec(&history_spec)))
        return -1;
    Py_INCREF(eg_ModelType);
    Py_INCREF(eg_HistoryType);
    if (PyModule_AddObject(module, "Model", eg_ModelType) < 0 ||
        PyModule_AddObject(module, "History", eg_HistoryType) < 0)
        return -1;
    return 0;
}
