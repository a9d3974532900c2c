/* statedb._rowbuild: many slotted rows, or bytes-subclass keys, built in one call.
 *
 * The compiled helper of statedb/rowbuild.py (which documents the functions and holds
 * their Python equivalents). A row is built as ``object.__new__(cls)`` builds it (the
 * type's tp_alloc: zeroed, GC-tracked when the type is) and its two slots are then
 * stored directly at the offsets their member descriptors name: what assigning them
 * through the descriptors does, without a call per slot and without the class's
 * ``__init__`` or ``__setattr__`` (a frozen row refuses the latter). A key is built as
 * ``bytes.__new__(cls, key)`` builds it from an exact bytes object: tp_alloc of the
 * key's length, then its bytes copied.
 *
 * The layouts are read at run time from the descriptors and types passed in, and
 * checked, so the helper depends on no project source but this file.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <arpa/inet.h>

/* The offset of the writable object slot `descr` (a member descriptor) in objects of
 * `cls`, or -1 with TypeError set. */
static Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *descr)
{
    if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a slot's member descriptor, got %.100s",
                     Py_TYPE(descr)->tp_name);
        return -1;
    }
    PyMemberDescrObject *d = (PyMemberDescrObject *)descr;
    PyMemberDef *m = d->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "slot %s is not a writable object slot", m->name);
        return -1;
    }
    if (!PyType_IsSubtype(cls, PyDescr_TYPE(d))) {
        PyErr_Format(PyExc_TypeError, "slot %s is not a slot of %.100s", m->name,
                     cls->tp_name);
        return -1;
    }
    if (m->offset < (Py_ssize_t)sizeof(PyObject)
        || m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "slot %s lies outside %.100s", m->name, cls->tp_name);
        return -1;
    }
    return m->offset;
}

/* Items of a list or tuple by index, of anything else by its iterator. */
typedef struct {
    PyObject *seq;  /* the list or tuple (borrowed), or NULL */
    PyObject *iter; /* the iterator (owned), or NULL */
    Py_ssize_t i;
} items_t;

static int
items_open(items_t *it, PyObject *obj)
{
    it->i = 0;
    it->iter = NULL;
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        it->seq = obj;
        return 0;
    }
    it->seq = NULL;
    it->iter = PyObject_GetIter(obj);
    return it->iter == NULL ? -1 : 0;
}

/* A new reference to the next item; NULL at the end (no error set) or on error. */
static PyObject *
items_next(items_t *it)
{
    if (it->seq != NULL) {
        PyObject *seq = it->seq;
        Py_ssize_t n = PyList_CheckExact(seq) ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
        if (it->i >= n)
            return NULL;
        PyObject *item = PyList_CheckExact(seq) ? PyList_GET_ITEM(seq, it->i)
                                                : PyTuple_GET_ITEM(seq, it->i);
        it->i++;
        Py_INCREF(item);
        return item;
    }
    return PyIter_Next(it->iter);
}

static PyObject *
new_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "new_rows(cls, slot_a, slot_b, firsts, seconds) takes 5 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "new_rows: cls must be a type");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (cls->tp_itemsize != 0 || cls->tp_alloc == NULL) {
        PyErr_Format(PyExc_TypeError, "new_rows: %.100s is not a fixed-size class",
                     cls->tp_name);
        return NULL;
    }
    Py_ssize_t off_a = slot_offset(cls, args[1]);
    if (off_a < 0)
        return NULL;
    Py_ssize_t off_b = slot_offset(cls, args[2]);
    if (off_b < 0)
        return NULL;
    if (off_a == off_b) {
        PyErr_SetString(PyExc_TypeError, "new_rows: the same slot twice");
        return NULL;
    }
    items_t a_items, b_items;
    if (items_open(&a_items, args[3]) < 0)
        return NULL;
    if (items_open(&b_items, args[4]) < 0) {
        Py_XDECREF(a_items.iter);
        return NULL;
    }
    /* The list's length when either side's is known (the zip's, unless the other is
     * shorter: the tail left unset is then cut). */
    Py_ssize_t hint = a_items.seq != NULL   ? Py_SIZE(a_items.seq)
                      : b_items.seq != NULL ? Py_SIZE(b_items.seq)
                                            : 0;
    PyObject *out = PyList_New(hint);
    Py_ssize_t n = 0;
    if (out == NULL)
        goto fail;
    for (;;) {
        PyObject *a = items_next(&a_items);
        if (a == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        PyObject *b = items_next(&b_items);
        if (b == NULL) {
            Py_DECREF(a);
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        PyObject *o = cls->tp_alloc(cls, 0);
        if (o == NULL) {
            Py_DECREF(a);
            Py_DECREF(b);
            goto fail;
        }
        *(PyObject **)((char *)o + off_a) = a; /* the slots take the references */
        *(PyObject **)((char *)o + off_b) = b;
        if (n < hint) {
            PyList_SET_ITEM(out, n, o);
        }
        else {
            int err = PyList_Append(out, o);
            Py_DECREF(o);
            if (err < 0)
                goto fail;
        }
        n++;
    }
    Py_XDECREF(a_items.iter);
    Py_XDECREF(b_items.iter);
    if (n < hint && PyList_SetSlice(out, n, hint, NULL) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
fail:
    Py_XDECREF(a_items.iter);
    Py_XDECREF(b_items.iter);
    Py_XDECREF(out); /* its unset tail is NULL, which a list's dealloc skips */
    return NULL;
}

static PyObject *
new_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "new_keys(cls, keys) takes 2 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0])
        || !PyType_IsSubtype((PyTypeObject *)args[0], &PyBytes_Type)) {
        PyErr_SetString(PyExc_TypeError, "new_keys: cls must be a subclass of bytes");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *keys = PySequence_Fast(args[1], "new_keys: keys must be iterable");
    if (keys == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *k = PySequence_Fast_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(k)) {
            PyErr_Format(PyExc_TypeError, "new_keys: a key must be bytes, got %.100s",
                         Py_TYPE(k)->tp_name);
            goto fail;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(k);
        PyObject *o = cls->tp_alloc(cls, size);
        if (o == NULL)
            goto fail;
        /* As bytes.__new__(cls, k): the bytes and their closing NUL, and k's hash. */
        memcpy(PyBytes_AS_STRING(o), PyBytes_AS_STRING(k), size + 1);
        _Py_COMP_DIAG_PUSH
        _Py_COMP_DIAG_IGNORE_DEPR_DECLS
        ((PyBytesObject *)o)->ob_shash = ((PyBytesObject *)k)->ob_shash;
        _Py_COMP_DIAG_POP
        PyList_SET_ITEM(out, i, o);
    }
    Py_DECREF(keys);
    return out;
fail:
    Py_DECREF(keys);
    Py_DECREF(out); /* its unset items are NULL, which a list's dealloc skips */
    return NULL;
}

static PyObject *
new_ipv4_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0])
        || !PyType_IsSubtype((PyTypeObject *)args[0], &PyBytes_Type)
        || !PyBytes_CheckExact(args[1]) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "new_ipv4_keys(cls: a bytes subclass, prefix: bytes, texts, suffix: bytes)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    const char *prefix = PyBytes_AS_STRING(args[1]), *suffix = PyBytes_AS_STRING(args[3]);
    Py_ssize_t plen = PyBytes_GET_SIZE(args[1]), slen = PyBytes_GET_SIZE(args[3]);
    PyObject *texts = PySequence_Fast(args[2], "new_ipv4_keys: texts must be iterable");
    if (texts == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(texts);
    PyObject *out = PyList_New(count);
    if (out == NULL)
        goto fail;
    Py_ssize_t klen = plen + 4 + slen;
    const char *last = NULL; /* the key before */
    int increasing = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(texts, i);
        if (!PyUnicode_Check(t))
            goto not_ipv4; /* socket.inet_pton: TypeError */
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(t, &size);
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeError))
                goto fail;
            PyErr_Clear(); /* socket.inet_pton: UnicodeEncodeError */
            goto not_ipv4;
        }
        unsigned char packed[4];
        if ((Py_ssize_t)strlen(text) != size /* socket.inet_pton: ValueError */
            || inet_pton(AF_INET, text, packed) != 1 /* socket.inet_pton: OSError */)
            goto not_ipv4;
        PyObject *o = cls->tp_alloc(cls, klen);
        if (o == NULL)
            goto fail;
        char *key = PyBytes_AS_STRING(o); /* zeroed by tp_alloc, its closing NUL too */
        memcpy(key, prefix, plen);
        memcpy(key + plen, packed, 4);
        memcpy(key + plen + 4, suffix, slen);
        _Py_COMP_DIAG_PUSH
        _Py_COMP_DIAG_IGNORE_DEPR_DECLS
        ((PyBytesObject *)o)->ob_shash = -1; /* not hashed yet */
        _Py_COMP_DIAG_POP
        PyList_SET_ITEM(out, i, o);
        if (last != NULL && memcmp(last, key, klen) >= 0)
            increasing = 0;
        last = key;
    }
    Py_DECREF(texts);
    PyObject *result = Py_BuildValue("(NO)", out, increasing ? Py_True : Py_False);
    return result;
not_ipv4:
    Py_DECREF(texts);
    Py_DECREF(out);
    Py_RETURN_NONE;
fail:
    Py_DECREF(texts);
    Py_XDECREF(out); /* its unset items are NULL, which a list's dealloc skips */
    return NULL;
}

/* A row builder: ``builder(v1, ..., vn)`` is a new row of its class with its n slots
 * set to the values, in order (see statedb.rows.slot_builder). */
typedef struct {
    PyObject_VAR_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *name;
    PyObject *doc;
    Py_ssize_t offsets[1];
} builder_t;

static PyObject *
builder_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    builder_t *b = (builder_t *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError, "%U() takes no keyword arguments", b->name);
        return NULL;
    }
    if (nargs != Py_SIZE(b)) {
        PyErr_Format(PyExc_TypeError, "%U() takes %zd positional arguments but %zd were given",
                     b->name, Py_SIZE(b), nargs);
        return NULL;
    }
    PyTypeObject *cls = b->cls;
    PyObject *o = cls->tp_alloc(cls, 0);
    if (o == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        *(PyObject **)((char *)o + b->offsets[i]) = args[i];
    }
    return o;
}

static int
builder_traverse(builder_t *b, visitproc visit, void *arg)
{
    Py_VISIT(b->cls);
    Py_VISIT(b->name);
    Py_VISIT(b->doc);
    return 0;
}

static int
builder_clear(builder_t *b)
{
    Py_CLEAR(b->cls);
    Py_CLEAR(b->name);
    Py_CLEAR(b->doc);
    return 0;
}

static void
builder_dealloc(builder_t *b)
{
    PyObject_GC_UnTrack(b);
    builder_clear(b);
    PyObject_GC_Del(b);
}

static PyObject *
builder_repr(builder_t *b)
{
    return PyUnicode_FromFormat("<row builder %U of %s>", b->name, b->cls->tp_name);
}

static PyMemberDef builder_members[] = {
    {"__name__", T_OBJECT, offsetof(builder_t, name), READONLY, NULL},
    {"__doc__", T_OBJECT, offsetof(builder_t, doc), 0, NULL},
    {NULL},
};

static PyTypeObject builder_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statedb._rowbuild.RowBuilder",
    .tp_basicsize = offsetof(builder_t, offsets),
    .tp_itemsize = sizeof(Py_ssize_t),
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_vectorcall_offset = offsetof(builder_t, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)builder_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)builder_traverse,
    .tp_clear = (inquiry)builder_clear,
    .tp_members = builder_members,
};

static PyObject *
row_builder(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])
        || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "row_builder(cls, slots: tuple, name: str)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (cls->tp_itemsize != 0 || cls->tp_alloc == NULL) {
        PyErr_Format(PyExc_TypeError, "row_builder: %.100s is not a fixed-size class",
                     cls->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    builder_t *b = PyObject_GC_NewVar(builder_t, &builder_type, n);
    if (b == NULL)
        return NULL;
    b->vectorcall = builder_vectorcall;
    b->cls = NULL;
    b->name = NULL;
    b->doc = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t off = slot_offset(cls, PyTuple_GET_ITEM(args[1], i));
        if (off < 0)
            goto fail;
        for (Py_ssize_t j = 0; j < i; j++) {
            if (b->offsets[j] == off) {
                PyErr_SetString(PyExc_TypeError, "row_builder: a slot named twice");
                goto fail;
            }
        }
        b->offsets[i] = off;
    }
    Py_INCREF(cls);
    b->cls = cls;
    Py_INCREF(args[2]);
    b->name = args[2];
    PyObject_GC_Track(b);
    return (PyObject *)b;
fail:
    Py_DECREF(b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"row_builder", (PyCFunction)(void (*)(void))row_builder, METH_FASTCALL,
     "row_builder(cls, slots, name) -> a builder: see statedb.rows.slot_builder."},
    {"new_rows", (PyCFunction)(void (*)(void))new_rows, METH_FASTCALL,
     "new_rows(cls, slot_a, slot_b, firsts, seconds) -> list: see statedb.rowbuild."},
    {"new_keys", (PyCFunction)(void (*)(void))new_keys, METH_FASTCALL,
     "new_keys(cls, keys) -> list: see statedb.rowbuild."},
    {"new_ipv4_keys", (PyCFunction)(void (*)(void))new_ipv4_keys, METH_FASTCALL,
     "new_ipv4_keys(cls, prefix, texts, suffix) -> (list, bool) | None: see statedb.rowbuild."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "statedb._rowbuild",
    "The compiled helper of statedb.rowbuild.", -1, methods,
};

PyMODINIT_FUNC
PyInit__rowbuild(void)
{
    if (PyType_Ready(&builder_type) < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
