/* The compiled schedule engine over TCP: one planned call's steps in one C call, the GIL released.
 *
 * engines/native_tcp.py compiles a schedule into a flat program (each step's copies, sends and
 * receives as buffer indices and byte spans) and builds a Plan from it once per call shape; every
 * run then walks the steps (tcpsteps.c). The frames are byte for byte those of the Python engine
 * (engines/schedules.py over transport/tcp/), so ranks of either engine form one group.
 *
 * The program is checked value by value when the Plan is made, and every run checks that its
 * buffers hold every span (and that what is written is writable) before anything moves. Nothing is
 * raised from C during a run: a failure comes back as a tuple that the Python side words exactly as
 * the Python engine would, with the remainder of every frame left half sent, which the transport's
 * abort finishes before its ABORT.
 */
#include "tcpsteps.h"

#include <string.h>

/* ---- the Plan object -------------------------------------------------------------------------- */

static void plan_free_steps(PlanObject *p) {
    if (p->steps == NULL) return;
    for (int s = 0; s < p->nsteps; s++) {
        step_plan *st = &p->steps[s];
        for (int i = 0; i < st->nlinks; i++) {
            PyMem_Free(st->links[i].sends);
            PyMem_Free(st->links[i].recvs);
        }
        PyMem_Free(st->copies);
        PyMem_Free(st->sends);
        PyMem_Free(st->recvs);
        PyMem_Free(st->links);
    }
    PyMem_Free(p->steps);
    p->steps = NULL;
}

static void unbind(PlanObject *p) {
    if (p->bound == NULL) return;
    for (int i = 2; i < p->nbuffers; i++) PyBuffer_Release(&p->views[i]);
    Py_CLEAR(p->bound);
}

static void Plan_dealloc(PlanObject *p) {
    plan_free_steps(p);
    unbind(p);
    PyMem_Free(p->states);
    PyMem_Free(p->polls);
    PyMem_Free(p->views);
    PyMem_Free(p->writable);
    PyMem_Free(p->bases);
    PyMem_Free(p->lens);
    Py_XDECREF(p->fold);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* Reads the int64 program (see engines/native_tcp.py); every value is checked as it is read. */
typedef struct { const int64_t *at, *end; int bad; } reader;

static int64_t next(reader *rd, int64_t low, int64_t high) {
    if (rd->at >= rd->end) {
        rd->bad = 1;
        return low;
    }
    int64_t v = *rd->at++;
    if (v < low || v > high) {
        rd->bad = 1;
        return low;
    }
    return v;
}

static span read_span(reader *rd, int nbuffers, int optional) {
    span s;
    s.buf = (int)next(rd, optional ? -1 : 0, nbuffers - 1);
    s.off = (Py_ssize_t)next(rd, 0, PY_SSIZE_T_MAX / 2);
    s.len = 0;
    return s;
}

static int add_to_link(step_plan *st, int peer, int fd, int is_send, int index) {
    link_plan *lp = NULL;
    for (int i = 0; i < st->nlinks; i++)
        if (st->links[i].peer == peer) lp = &st->links[i];
    if (lp == NULL) {
        lp = &st->links[st->nlinks++];
        lp->peer = peer;
        lp->fd = fd;
    }
    int **list = is_send ? &lp->sends : &lp->recvs;
    int *count = is_send ? &lp->nsends : &lp->nrecvs;
    int *grown = PyMem_Realloc(*list, sizeof(int) * (size_t)(*count + 1));
    if (grown == NULL) return -1;
    grown[(*count)++] = index;
    *list = grown;
    return 0;
}

static int parse_program(PlanObject *p, reader *rd, const int *fds, int nfds, const uint8_t *template) {
    const int64_t big = PY_SSIZE_T_MAX / 2;
    p->nsteps = (int)next(rd, 0, 1 << 20);
    p->steps = PyMem_Calloc((size_t)(p->nsteps ? p->nsteps : 1), sizeof(step_plan));
    if (p->steps == NULL) return -1;
    for (int s = 0; s < p->nsteps && !rd->bad; s++) {
        step_plan *st = &p->steps[s];
        st->index = (uint32_t)next(rd, 0, UINT32_MAX);
        st->ncopies = (int)next(rd, 0, 1 << 16);
        st->nsends = (int)next(rd, 0, 1 << 16);
        st->nrecvs = (int)next(rd, 0, 1 << 16);
        if (rd->bad) break;
        st->copies = PyMem_Calloc((size_t)st->ncopies + 1, sizeof(copy_op));
        st->sends = PyMem_Calloc((size_t)st->nsends + 1, sizeof(send_op));
        st->recvs = PyMem_Calloc((size_t)st->nrecvs + 1, sizeof(recv_op));
        st->links = PyMem_Calloc((size_t)(st->nsends + st->nrecvs) + 1, sizeof(link_plan));
        if (!st->copies || !st->sends || !st->recvs || !st->links) return -1;
        for (int i = 0; i < st->ncopies && !rd->bad; i++) {
            copy_op *op = &st->copies[i];
            op->src = read_span(rd, p->nbuffers, 0);
            op->dst = read_span(rd, p->nbuffers, 0);
            Py_ssize_t len = (Py_ssize_t)next(rd, 0, big);
            op->acc = read_span(rd, p->nbuffers, 1);
            op->src.len = op->dst.len = op->acc.len = len;
            op->reduce = op->acc.buf >= 0;
        }
        for (int i = 0; i < st->nsends && !rd->bad; i++) {
            send_op *op = &st->sends[i];
            op->peer = (int)next(rd, 0, nfds - 1);
            op->src = read_span(rd, p->nbuffers, 0);
            op->src.len = (Py_ssize_t)next(rd, 0, big);
            if (rd->bad || fds[op->peer] < 0) return rd->bad = 1, 0;
            memcpy(op->header, template, AR_HEADER_SIZE);
            ar_header_stamp(op->header, st->index, 0, (uint64_t)op->src.len);
            if (add_to_link(st, op->peer, fds[op->peer], 1, i) < 0) return -1;
        }
        for (int i = 0; i < st->nrecvs && !rd->bad; i++) {
            recv_op *op = &st->recvs[i];
            op->peer = (int)next(rd, 0, nfds - 1);
            op->dst = read_span(rd, p->nbuffers, 0);
            op->dst.len = (Py_ssize_t)next(rd, 0, big);
            op->acc = read_span(rd, p->nbuffers, 1);
            op->acc.len = op->dst.len;
            op->stage = (int)next(rd, -1, p->nbuffers - 1);
            op->later = (int)next(rd, 0, 1);
            op->reduce = op->acc.buf >= 0;
            op->ring = op->later || op->dst.len < STAGE_RING ? op->dst.len : STAGE_RING;
            if (op->ring == 0) op->ring = 1;  /* an empty segment: nothing lands, nothing wraps */
            if (rd->bad || fds[op->peer] < 0 || (op->reduce && op->stage < 0)) return rd->bad = 1, 0;
            memcpy(op->want, template, AR_HEADER_SIZE);
            ar_header_stamp(op->want, st->index, 0, (uint64_t)op->dst.len);
        }
        st->small = 1;
        for (int i = 0; i < st->nsends; i++) st->small &= st->sends[i].src.len <= SMALL_FRAME;
        for (int i = 0; i < st->nrecvs; i++) st->small &= st->recvs[i].dst.len <= SMALL_FRAME;
        for (int i = 0; i < st->nrecvs && !rd->bad; i++)  /* receives' peers after every send's */
            if (add_to_link(st, st->recvs[i].peer, fds[st->recvs[i].peer], 0, i) < 0) return -1;
        if (st->nlinks > p->maxlinks) p->maxlinks = st->nlinks;
    }
    if (rd->at != rd->end) rd->bad = 1;
    return 0;
}

static PyObject *Plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fds", "program", "template", "buffers", "itemsize", "op", "dtype", "fold", "spin", NULL};
    PyObject *fd_list, *fold_obj;
    Py_buffer program, template;
    int nbuffers, itemsize, op, dtype;
    double spin = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oy*y*iiiiO|d", names, &fd_list, &program, &template, &nbuffers,
                                     &itemsize, &op, &dtype, &fold_obj, &spin))
        return NULL;
    PlanObject *p = NULL;
    int *fds = NULL;
    PyObject *seq = PySequence_Fast(fd_list, "fds must be a sequence of descriptors (-1 for this rank)");
    if (seq == NULL) goto done;
    Py_ssize_t nfds = PySequence_Fast_GET_SIZE(seq);
    if (template.len != AR_HEADER_SIZE || program.len % 8 || nbuffers < 3 || nbuffers > MAX_BUFFERS ||
        itemsize < 1 || nfds < 1 || nfds > 1 << 20 || !PyCallable_Check(fold_obj)) {
        PyErr_SetString(PyExc_ValueError, "Plan: bad template, program, buffer count, itemsize, fds or fold");
        goto done;
    }
    fds = PyMem_Calloc((size_t)nfds, sizeof(int));
    if (fds == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nfds; i++) {
        fds[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (PyErr_Occurred()) goto done;
    }
    p = (PlanObject *)type->tp_alloc(type, 0);
    if (p == NULL) goto done;
    p->nbuffers = nbuffers;
    p->itemsize = itemsize;
    p->spin = spin > 0 ? spin : 0;
    p->spin_score = SPIN_SCORE_MAX;
    p->kernel = ar_itemsize(dtype) == (size_t)itemsize ? ar_kernel(dtype, op) : NULL;
    Py_INCREF(fold_obj);
    p->fold = fold_obj;
    reader rd = {(const int64_t *)program.buf, (const int64_t *)program.buf + program.len / 8, 0};
    if (parse_program(p, &rd, fds, (int)nfds, template.buf) < 0) {
        PyErr_NoMemory();
        Py_CLEAR(p);
        goto done;
    }
    if (rd.bad) {
        PyErr_SetString(PyExc_ValueError, "Plan: malformed program (a value out of range, or a peer without a link)");
        Py_CLEAR(p);
        goto done;
    }
    p->states = PyMem_Calloc((size_t)p->maxlinks + 1, sizeof(link_state));
    p->polls = PyMem_Calloc((size_t)p->maxlinks + 1, sizeof(struct pollfd));
    p->views = PyMem_Calloc((size_t)nbuffers, sizeof(Py_buffer));
    p->writable = PyMem_Calloc((size_t)nbuffers, sizeof(int));
    p->bases = PyMem_Calloc((size_t)nbuffers, sizeof(uint8_t *));
    p->lens = PyMem_Calloc((size_t)nbuffers, sizeof(Py_ssize_t));
    if (!p->states || !p->polls || !p->views || !p->writable || !p->bases || !p->lens) {
        PyErr_NoMemory();
        Py_CLEAR(p);
    }
done:
    Py_XDECREF(seq);
    PyMem_Free(fds);
    PyBuffer_Release(&program);
    PyBuffer_Release(&template);
    return (PyObject *)p;
}

/* Whether every span of the program lies inside the run's buffers, and what is written is writable. */
static int spans_fit(PlanObject *p, run_t *r, const int *writable) {
#define FITS(s) ((s).buf < 0 || (s).len <= r->len[(s).buf] - (s).off)
#define WRITES(s) ((s).buf >= 0 && writable[(s).buf])
    for (int s = 0; s < p->nsteps; s++) {
        step_plan *st = &p->steps[s];
        for (int i = 0; i < st->ncopies; i++) {
            copy_op *op = &st->copies[i];
            if (!FITS(op->src) || !FITS(op->dst) || !FITS(op->acc) || !WRITES(op->dst)) return 0;
        }
        for (int i = 0; i < st->nsends; i++)
            if (!FITS(st->sends[i].src)) return 0;
        for (int i = 0; i < st->nrecvs; i++) {
            recv_op *op = &st->recvs[i];
            span stage = {op->stage, 0, op->ring};
            if (!FITS(op->dst) || !FITS(op->acc) || !WRITES(op->dst) || (op->reduce && (!FITS(stage) ||
                                                                                      !WRITES(stage))))
                return 0;
        }
    }
    return 1;
#undef FITS
#undef WRITES
}

/* The remainder of each frame left half sent in the failed step: (peer, bytes, frame size). */
static PyObject *half_sent(run_t *r, step_plan *st) {
    PyObject *list = PyList_New(0);
    if (list == NULL || st == NULL) return list;
    for (int i = 0; i < st->nlinks; i++) {
        link_plan *lp = &st->links[i];
        link_state *ls = &r->plan->states[i];
        if (ls->send_i >= lp->nsends || ls->sent == 0) continue;
        send_op *op = &st->sends[lp->sends[ls->send_i]];
        size_t frame = AR_HEADER_SIZE + (size_t)op->src.len;
        PyObject *rest = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(frame - ls->sent));
        if (rest == NULL) return Py_DECREF(list), NULL;
        char *to = PyBytes_AS_STRING(rest);
        size_t from = ls->sent;
        if (from < AR_HEADER_SIZE) {
            memcpy(to, op->header + from, AR_HEADER_SIZE - from);
            to += AR_HEADER_SIZE - from;
            from = AR_HEADER_SIZE;
        }
        memcpy(to, r->base[op->src.buf] + op->src.off + (from - AR_HEADER_SIZE), frame - from);
        PyObject *item = Py_BuildValue("(iNn)", lp->peer, rest, (Py_ssize_t)frame);
        if (item == NULL || PyList_Append(list, item) < 0) return Py_XDECREF(item), Py_DECREF(list), NULL;
        Py_DECREF(item);
    }
    return list;
}

/* bind(scratch): hold the buffers of tmp and the staging slots (a tuple) for every later run. */
static PyObject *Plan_bind(PlanObject *p, PyObject *scratch) {
    if (!PyTuple_Check(scratch) || PyTuple_GET_SIZE(scratch) != p->nbuffers - 2) {
        PyErr_SetString(PyExc_TypeError, "bind(scratch): a tuple of tmp and every staging buffer");
        return NULL;
    }
    unbind(p);
    for (int i = 2; i < p->nbuffers; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(scratch, i - 2), &p->views[i], PyBUF_WRITABLE) < 0) {
            while (--i >= 2) PyBuffer_Release(&p->views[i]);
            return NULL;
        }
        p->writable[i] = 1;
        p->bases[i] = p->views[i].buf;
        p->lens[i] = p->views[i].len;
    }
    p->bound = Py_NewRef(scratch);
    Py_RETURN_NONE;
}

/* A caller's buffer (data, out) as buffer ``i`` of the run: writable where it can be, absent as empty. */
static int hold(PlanObject *p, run_t *r, PyObject *buffers, PyObject *name, int i) {
    PyObject *obj = PyDict_GetItemWithError(buffers, name);
    r->caller[i] = obj != NULL ? obj : Py_None;
    if (obj == NULL) {
        p->bases[i] = NULL;
        p->lens[i] = 0;
        p->writable[i] = 0;
        return PyErr_Occurred() ? -1 : 0;
    }
    p->writable[i] = PyObject_GetBuffer(obj, &p->views[i], PyBUF_WRITABLE) == 0;
    if (!p->writable[i]) {
        PyErr_Clear();
        if (PyObject_GetBuffer(obj, &p->views[i], PyBUF_SIMPLE) < 0) return -1;
    }
    p->bases[i] = p->views[i].buf;
    p->lens[i] = p->views[i].len;
    return 1;
}

static PyObject *DATA_KEY, *OUT_KEY;

/* run(buffers, seq, timeout, idle, idle_every): None, or (status, step, peer, detail, half_sent). */
static PyObject *Plan_run(PlanObject *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || p->bound == NULL) {
        PyErr_SetString(PyExc_TypeError, "run(buffers: dict, seq, timeout, idle, idle_every), after bind()");
        return NULL;
    }
    unsigned long long seq = PyLong_AsUnsignedLongLongMask(args[1]);
    double timeout = PyFloat_AsDouble(args[2]), idle_every = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    run_t r;
    memset(&r, 0, offsetof(run_t, header));  /* not the 4 KiB reason: it is written before it is read */
    r.reason_len = 0;
    r.exception = NULL;
    r.plan = p;
    r.idle = args[3];
    r.idle_every = idle_every;
    r.deadline = tcp_now() + timeout;
    r.base = p->bases;
    r.len = p->lens;
    PyObject *result = NULL;
    int data = hold(p, &r, args[0], DATA_KEY, 0), out = data < 0 ? 0 : hold(p, &r, args[0], OUT_KEY, 1);
    if (data < 0 || out < 0) goto release;
    if (!spans_fit(p, &r, p->writable)) {
        PyErr_SetString(PyExc_ValueError, "run: a buffer is smaller than the plan's spans, or read-only where written");
        goto release;
    }
    step_plan *failed = NULL;
    tcp_drop_gil(&r);
    for (int s = 0; s < p->nsteps; s++) {
        step_plan *st = &p->steps[s];
        for (int i = 0; i < st->nsends; i++)
            ar_header_stamp(st->sends[i].header, st->index, (uint32_t)seq, (uint64_t)st->sends[i].src.len);
        for (int i = 0; i < st->nrecvs; i++)
            ar_header_stamp(st->recvs[i].want, st->index, (uint32_t)seq, (uint64_t)st->recvs[i].dst.len);
        memset(p->states, 0, sizeof(link_state) * (size_t)st->nlinks);
        if (tcp_step(&r, st) < 0) {
            r.step = s;
            failed = st;
            break;
        }
    }
    tcp_take_gil(&r);
    if (failed == NULL) {
        result = Py_NewRef(Py_None);
        goto release;
    }
    PyObject *detail;
    switch (r.status) {
    case RUN_TIMEOUT: detail = PyBool_FromLong(r.waiting_recv); break;
    case RUN_LOST: case RUN_SEND: detail = PyLong_FromLong(r.err); break;
    case RUN_HEADER: detail = Py_BuildValue("(y#y#)", r.header, (Py_ssize_t)AR_HEADER_SIZE, r.want,
                                            (Py_ssize_t)AR_HEADER_SIZE); break;
    case RUN_ABORT: detail = PyBytes_FromStringAndSize(r.reason, (Py_ssize_t)r.reason_len); break;
    default: detail = r.exception ? r.exception : Py_NewRef(Py_None); r.exception = NULL; break;
    }
    PyObject *rest = half_sent(&r, failed);
    if (detail != NULL && rest != NULL)
        result = Py_BuildValue("(iIiNN)", r.status, failed->index, r.peer, detail, rest);
    else
        Py_XDECREF(detail), Py_XDECREF(rest);
release:
    Py_XDECREF(r.exception);
    if (data > 0) PyBuffer_Release(&p->views[0]);
    if (out > 0) PyBuffer_Release(&p->views[1]);
    return result;
}

static PyMethodDef Plan_methods[] = {
    {"bind", (PyCFunction)Plan_bind, METH_O, "bind(scratch): the tuple of tmp and the staging buffers every run uses."},
    {"run", (PyCFunction)(void (*)(void))Plan_run, METH_FASTCALL,
     "run(buffers, seq, timeout, idle, idle_every): run the planned steps; None, or why they failed."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Plan_compiled(PlanObject *p, void *closure) {
    (void)closure;
    return PyBool_FromLong(p->kernel != NULL);
}

static PyGetSetDef Plan_getset[] = {
    {"compiled_fold", (getter)Plan_compiled, NULL, "whether folds run a compiled kernel (else the Python fold)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allreduce.native._tcp.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One call shape's steps, compiled: Plan(fds, program, template, buffers, itemsize, op, dtype, fold, spin=0).",
    .tp_methods = Plan_methods,
    .tp_getset = Plan_getset,
    .tp_new = Plan_new,
};

/* parse_header(data): the fields of a frame header as a tuple, or the parser's reason code (an int). */
static PyObject *parse_header(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    ar_header h;
    int why = ar_header_parse(b.buf, (size_t)b.len, &h);
    PyBuffer_Release(&b);
    if (why != AR_FRAME_OK) return PyLong_FromLong(why);
    return Py_BuildValue("(iiiiiIIIKK)", h.kind, h.collective, h.dtype, h.op, h.root, h.step, h.seq, h.algorithm,
                         (unsigned long long)h.count, (unsigned long long)h.nbytes);
}

static PyMethodDef module_methods[] = {
    {"parse_header", parse_header, METH_O,
     "parse_header(data): (kind, collective, dtype, op, root, step, seq, algorithm, count, nbytes), or why not (int)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tcp", "The compiled schedule engine over TCP (see engines/native_tcp.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__tcp(void) {
    DATA_KEY = PyUnicode_InternFromString("data");
    OUT_KEY = PyUnicode_InternFromString("out");
    if (DATA_KEY == NULL || OUT_KEY == NULL || PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddIntConstant(m, "RUN_TIMEOUT", RUN_TIMEOUT) < 0 || PyModule_AddIntConstant(m, "RUN_LOST", RUN_LOST) < 0 ||
        PyModule_AddIntConstant(m, "RUN_HEADER", RUN_HEADER) < 0 || PyModule_AddIntConstant(m, "RUN_ABORT", RUN_ABORT) < 0 ||
        PyModule_AddIntConstant(m, "RUN_SEND", RUN_SEND) < 0 || PyModule_AddIntConstant(m, "STAGE_RING", STAGE_RING) < 0 ||
        PyModule_AddIntConstant(m, "RUN_EXCEPTION", RUN_EXCEPTION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
