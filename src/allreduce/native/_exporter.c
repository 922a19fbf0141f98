/* allreduce.native._exporter: the buffer protocol for Python classes that define __buffer__.
 *
 * Python 3.12 (PEP 688) lets a class written in Python export its memory by defining
 * __buffer__(flags); Python 3.11 offers no such hook, so memoryview(obj) and every C consumer refuse
 * the object. A class that derives from Exporter gets it on 3.11 too: a request for its buffer calls
 * obj.__buffer__(flags) and exports what that returns (a memoryview, or any object with the buffer
 * protocol), for as long as the consumer holds it; __buffer__ returning None exports no bytes and
 * no owner (memoryview(obj).obj is None), as MPI's address constants (BOTTOM, IN_PLACE) do in mpi4py.
 * MPI.buffer and those constants are the classes this is for.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int exporter_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *inner = PyObject_CallMethod(self, "__buffer__", "i", flags);
    if (inner == NULL)
        return -1;
    if (inner == Py_None) {
        Py_DECREF(inner);
        return PyBuffer_FillInfo(view, NULL, NULL, 0, 1, flags);
    }
    if (inner == self) {
        Py_DECREF(inner);
        PyErr_SetString(PyExc_TypeError, "__buffer__ returned the object itself");
        return -1;
    }
    int failed = PyObject_GetBuffer(inner, view, flags);  /* view->obj now holds inner */
    Py_DECREF(inner);
    return failed;
}

static PyBufferProcs exporter_as_buffer = {exporter_getbuffer, NULL};

static PyTypeObject ExporterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allreduce.native._exporter.Exporter",
    .tp_doc = "A base class whose buffer is what the instance's __buffer__(flags) returns.",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_as_buffer = &exporter_as_buffer,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_exporter", "__buffer__ as the buffer protocol.", -1, NULL};

PyMODINIT_FUNC PyInit__exporter(void)
{
    if (PyType_Ready(&ExporterType) < 0)
        return NULL;
    PyObject *made = PyModule_Create(&module);
    if (made == NULL)
        return NULL;
    Py_INCREF(&ExporterType);
    if (PyModule_AddObject(made, "Exporter", (PyObject *)&ExporterType) < 0) {
        Py_DECREF(&ExporterType);
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
