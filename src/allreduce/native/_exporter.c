/* allreduce.native._exporter: a base class that gives a Python class the buffer protocol.
 *
 * Before Python 3.12 a class written in Python cannot export a buffer (``__buffer__`` is 3.12's),
 * so ``memoryview(obj)`` refuses it. A class that derives from ``Exporter`` exports, instead, the
 * buffer of whatever its ``_view`` attribute holds (a memoryview, say): ``memoryview(obj)`` then
 * reads and writes that memory, with its format, shape and read-only flag.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int exporter_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *inner = PyObject_GetAttrString(self, "_view");
    if (inner == NULL)
        return -1;
    int status = PyObject_GetBuffer(inner, view, flags);
    Py_DECREF(inner);
    return status;
}

static PyBufferProcs exporter_as_buffer = {exporter_getbuffer, NULL};

static PyTypeObject ExporterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allreduce.native._exporter.Exporter",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Exports the buffer of its _view attribute (the buffer protocol for Python subclasses).",
    .tp_as_buffer = &exporter_as_buffer,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef exporter_module = {PyModuleDef_HEAD_INIT, "_exporter",
                                             "A base class giving Python classes the buffer protocol.", -1, NULL};

PyMODINIT_FUNC PyInit__exporter(void)
{
    if (PyType_Ready(&ExporterType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&exporter_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&ExporterType);
    if (PyModule_AddObject(module, "Exporter", (PyObject *)&ExporterType) < 0) {
        Py_DECREF(&ExporterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
