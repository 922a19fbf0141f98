/* CallState: the state a group's call passes through, claimed, numbered, begun and freed.
 *
 * One type for the runtime and the compiled shortcut: the runtime (runtime/claims.py, queue.py, life.py,
 * health.py) reads and writes its fields and calls its methods with the group's lock held; the shortcut
 * (_line_plans.c) drives the same struct with the GIL held, through the functions below. Its pure-Python twin,
 * engines/callstate.py's CallState, has the same fields and methods and the same rules; a group uses
 * this one where the compiled lines may run (allreduce.native._line_plans exports it).
 */
#include "callstate.h"

#include <structmember.h>

long long call_idle_claim(ar_CallState *s, unsigned long me)
{
    if (!s->usable || me == s->progress || s->busy || s->queued)
        return 0;
    s->busy = 1;
    s->issuer = me;
    return ++s->issued;
}

long long call_probe_claim(ar_CallState *s, unsigned long me)
{
    if (!s->usable)
        return 0;
    PyObject *no = Py_False;
    PyObject *got = PyObject_Vectorcall(s->acquire, &no, 1, NULL);
    if (got == NULL)
        return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked)  /* another thread is issuing a call: the general path decides */
        return 0;
    long long seq = call_idle_claim(s, me);
    PyObject *done = PyObject_CallNoArgs(s->release);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return seq;
}

int call_begin(ar_CallState *s, long long seq, PyObject *call)
{
    PyObject *started = Py_BuildValue("(LO)", seq, call);
    if (started == NULL)
        return -1;
    Py_XSETREF(s->started, started);
    return 0;
}

int call_finish(ar_CallState *s)
{
    if ((s->conflict != NULL && s->conflict != Py_None) || s->queued)
        return 0;
    s->busy = 0;
    return 1;
}

/* CallState(acquire, release): `acquire` and `release` are the group's lock's bound methods. */
static int CallState_init(ar_CallState *s, PyObject *args, PyObject *kwds)
{
    PyObject *acquire, *release;
    if (!PyArg_ParseTuple(args, "OO", &acquire, &release))
        return -1;
    if (!PyCallable_Check(acquire) || !PyCallable_Check(release)) {
        PyErr_SetString(PyExc_TypeError, "CallState(acquire, release): the group's lock's methods");
        return -1;
    }
    Py_XSETREF(s->acquire, Py_NewRef(acquire));
    Py_XSETREF(s->release, Py_NewRef(release));
    Py_XSETREF(s->conflict, Py_NewRef(Py_None));
    Py_XSETREF(s->started, Py_NewRef(Py_None));
    s->usable = 1;
    s->busy = 0;
    s->queued = 0;
    s->issued = 0;
    s->issuer = s->progress = 0;
    return 0;
}

static int CallState_traverse(ar_CallState *s, visitproc visit, void *arg)
{
    Py_VISIT(s->conflict);
    Py_VISIT(s->started);
    Py_VISIT(s->acquire);
    Py_VISIT(s->release);
    return 0;
}

static int CallState_clear(ar_CallState *s)
{
    Py_CLEAR(s->conflict);
    Py_CLEAR(s->started);
    Py_CLEAR(s->acquire);
    Py_CLEAR(s->release);
    return 0;
}

static void CallState_dealloc(ar_CallState *s)
{
    PyObject_GC_UnTrack(s);
    CallState_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *CallState_idle_claim(ar_CallState *s, PyObject *me)
{
    unsigned long ident = PyLong_AsUnsignedLong(me);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(call_idle_claim(s, ident));
}

static PyObject *CallState_number(ar_CallState *s, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(++s->issued);
}

static PyObject *CallState_begin(ar_CallState *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "begin(seq, call)");
        return NULL;
    }
    long long seq = PyLong_AsLongLong(args[0]);
    if ((seq == -1 && PyErr_Occurred()) || call_begin(s, seq, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CallState_free(ar_CallState *s, PyObject *Py_UNUSED(ignored))
{
    s->busy = 0;
    return PyBool_FromLong(s->queued != 0);
}

static PyMethodDef CallState_methods[] = {
    {"idle_claim", (PyCFunction)CallState_idle_claim, METH_O,
     "idle_claim(me) -> seq: claim the idle, usable group for thread `me` and number the call; 0: the general path decides."},
    {"number", (PyCFunction)CallState_number, METH_NOARGS, "number() -> seq: number the call being issued."},
    {"begin", (PyCFunction)(void (*)(void))CallState_begin, METH_FASTCALL,
     "begin(seq, call): call `seq` of `call` began (`started`, which the heartbeat publishes)."},
    {"free", (PyCFunction)CallState_free, METH_NOARGS, "free() -> bool: the running call is over; whether work is queued."},
    {NULL},
};

static PyMemberDef CallState_members[] = {
    {"usable", T_BOOL, offsetof(ar_CallState, usable), 0, "a call may be issued (runtime/life.py keeps it)"},
    {"busy", T_BOOL, offsetof(ar_CallState, busy), 0, "a call runs, inline or on the progress thread"},
    {"queued", T_PYSSIZET, offsetof(ar_CallState, queued), 0, "calls waiting for the progress thread"},
    {"issued", T_LONGLONG, offsetof(ar_CallState, issued), 0, "calls numbered so far"},
    {"issuer", T_ULONG, offsetof(ar_CallState, issuer), 0, "the thread whose calls are in flight (0: none yet)"},
    {"progress", T_ULONG, offsetof(ar_CallState, progress), 0, "the progress thread, which runs Work callbacks"},
    {"conflict", T_OBJECT, offsetof(ar_CallState, conflict), 0, "the error of a call from a second thread, or None"},
    {"started", T_OBJECT, offsetof(ar_CallState, started), 0, "(seq, call) of the call begun last, or None"},
    {"acquire", T_OBJECT, offsetof(ar_CallState, acquire), READONLY, "the group's lock's acquire (probed by a shortcut)"},
    {"release", T_OBJECT, offsetof(ar_CallState, release), READONLY, "the group's lock's release"},
    {NULL},
};

PyTypeObject ar_CallStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "allreduce.native._line_plans.CallState",
    .tp_basicsize = sizeof(ar_CallState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state a group's call passes through (see engines/callstate.py, its Python twin).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)CallState_init,
    .tp_dealloc = (destructor)CallState_dealloc,
    .tp_traverse = (traverseproc)CallState_traverse,
    .tp_clear = (inquiry)CallState_clear,
    .tp_methods = CallState_methods,
    .tp_members = CallState_members,
};
