/* allreduce.native._kernels: the reduction kernels (kernels.h) reachable from Python.
 *
 * The engines call the kernels from C; this module lets Python ask which (dtype, op) pairs the
 * compiled engine reduces itself, and lets the tests hold every kernel's bits against numpy's.
 * Buffers come through the buffer protocol (C-contiguous, aligned to the item size); the GIL is
 * released while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "kernels.h"

/* Fill *view with a C-contiguous buffer of obj (writable if asked) of n items of dtype. */
static int take(PyObject *obj, Py_buffer *view, int writable, int dtype, Py_ssize_t *n)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    size_t item = ar_itemsize(dtype);
    if (view->len % (Py_ssize_t)item != 0 || ((uintptr_t)view->buf % item) != 0) {
        PyErr_Format(PyExc_ValueError, "a buffer of %zd bytes is not whole aligned items of %zu bytes",
                     view->len, item);
        PyBuffer_Release(view);
        return -1;
    }
    if (*n >= 0 && view->len / (Py_ssize_t)item != *n) {
        PyErr_Format(PyExc_ValueError, "buffers of %zd and %zd items", *n, view->len / (Py_ssize_t)item);
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->len / (Py_ssize_t)item;
    return 0;
}

static int known(int dtype, int op)
{
    if (ar_supported(dtype, op))
        return 1;
    PyErr_Format(PyExc_ValueError, "no kernel for dtype code %d and op %d", dtype, op);
    return 0;
}

PyDoc_STRVAR(fold_doc, "fold(dtype, op, out, a, b): out = a (op) b, item by item (codes as dtypes.code_of and ReduceOp).");

static PyObject *fold(PyObject *self, PyObject *args)
{
    int dtype, op;
    PyObject *out, *a, *b;
    if (!PyArg_ParseTuple(args, "iiOOO", &dtype, &op, &out, &a, &b) || !known(dtype, op))
        return NULL;
    Py_buffer d, x, y;
    Py_ssize_t n = -1;
    if (take(out, &d, 1, dtype, &n) < 0)
        return NULL;
    if (take(a, &x, 0, dtype, &n) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    if (take(b, &y, 0, dtype, &n) < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ar_fold(dtype, op, d.buf, x.buf, y.buf, (size_t)n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&y);
    PyBuffer_Release(&x);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(finish_doc, "finish(dtype, op, out, size): what op still owes on out (AVG: divide by size).");

static PyObject *finish(PyObject *self, PyObject *args)
{
    int dtype, op, size;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "iiOi", &dtype, &op, &out, &size) || !known(dtype, op))
        return NULL;
    Py_buffer d;
    Py_ssize_t n = -1;
    if (take(out, &d, 1, dtype, &n) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    ar_finish(dtype, op, d.buf, (size_t)n, size);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(supported_doc, "supported(dtype, op) -> bool: whether the compiled kernels reduce this pair.");

static PyObject *supported(PyObject *self, PyObject *args)
{
    int dtype, op;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op))
        return NULL;
    return PyBool_FromLong(ar_supported(dtype, op));
}

static PyMethodDef methods[] = {
    {"fold", fold, METH_VARARGS, fold_doc},
    {"finish", finish, METH_VARARGS, finish_doc},
    {"supported", supported, METH_VARARGS, supported_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "The reduction kernels, from Python.", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
