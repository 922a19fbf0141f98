/* allreduce.native._line_plans: the shared-memory lines (transport/shm/linepath.py) run in C, a call per run.
 *
 * The protocol is the Python engine's, word for word (transport/shm/layout.py): a rank writes its
 * payload into line `number % 2`, then the call's sequence number, its fingerprint and frame header,
 * and the number last (a release store: x86-64 keeps one process's stores in order); it waits until
 * every peer's line shows the number, compares their call and fingerprint with its own, and reads
 * their payloads in place. A Plan is one call shape (engines/native_line_plans.py makes them): `lines`
 * (one round: all-reduce, reduce, broadcast, all-gather, barrier) or `chunked_lines` (two rounds per
 * chunk of a line: each rank folds its slice of the chunk, then every rank copies the folded slices).
 *
 * Everything between entering and leaving runs with the GIL released. A wait gives control back to
 * Python at the end of each slice (the caller's next duty: its gone-peer check, idle hook, deadline)
 * and after a signal interrupted a sleep; Python then calls resume(), which continues where run()
 * stopped. So the C side never decides an error: it says what it saw (WAITING for a rank, or MISMATCH
 * with a rank) and Python words it exactly as the Python engine does.
 *
 * A Shortcut (below) is one plan bound to its group's issue state: a blocking call of a shape the group
 * ran before, claimed, numbered and run in one call from Python.
 *
 * What a peer writes can be any bytes: only its number, call and fingerprint words are read (and
 * compared), and the payload is read as data of the size this rank planned, never as a length.
 *
 * Waiting (see await_one): spin with `pause` while a rank is expected soon (for spin_max_s of a wait at
 * most: a peer expected for longer is waiting for a core, which a spin would keep from it), then yield,
 * then sleep on a futex on the awaited line's number with this rank's sleeping flag raised; a poster
 * wakes the sleepers it sees flagged. "Expected soon" is read from the peer itself: a peer still inside its
 * call (it posted after it last returned: it is reading, folding, or was woken and waits for a core)
 * posts next as soon as it runs; one that returned within awake_s is in a loop of calls. A late call
 * changes nothing for the next one: no state of this rank's decides, so no wait can push later
 * waits into sleeping (a rank that slept returns, and so is expected again, right after).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "callstate.h"
#include "kernels.h"

/* transport/shm/layout.py, in words of the lines area and of a line (checked by the tests: LAYOUT) */
enum { LINE_SLEEPING = 0, LINE_POSTED = 1, LINE_RETURNED = 2, LINES_FIRST = 64 };
enum { LINE_NUMBER = 0, LINE_CALL = 1, LINE_PRINT = 2, LINE_HEADER_AT = 24, LINE_PAYLOAD_AT = 64, HEADER_SIZE = 40 };

/* what a plan runs */
enum { ALL_REDUCE, REDUCE, BROADCAST, ALL_GATHER, BARRIER, KINDS };  /* chunked: an all-reduce or reduce with per_line */
/* what run() and resume() return */
enum { DONE = 0, WAITING = 1, MISMATCH = 2 };
/* where a run stands */
enum { SEND, WAIT, WAIT_FOLDS, OVER };

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double now_s(void) { return (double)now_ns() * 1e-9; }

static inline int64_t load(volatile int64_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
static inline void store(volatile int64_t *word, int64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- Lines: every rank's two lines, as this process maps them ---------------------------------- */

typedef struct {
    PyObject_HEAD
    int rank, size;
    char **areas;  /* [rank]: the lines area of each rank's control segment (its flag words) */
    char **lines;  /* [parity * size + rank]: the start of each line */
    Py_ssize_t capacity;  /* payload bytes of a line */
    double spin_s, spin_max_s, awake_s, yield_s, sleep_s;
    int crowded;  /* the group's ranks outnumber the cores: spinning only delays the peer */
    int closed;
    long long numbered;  /* line numbers taken so far, by every plan of the group (compiled or not) */
} Lines;

static inline volatile int64_t *word_of(char *at, int index) { return (volatile int64_t *)at + index; }
static inline char *line_of(Lines *L, int64_t number, int rank) { return L->lines[(number & 1) * L->size + rank]; }

static void Lines_dealloc(Lines *self)
{
    PyMem_Free(self->areas);
    PyMem_Free(self->lines);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Lines(rank, areas, line_size, capacity, spin_s, spin_max_s, awake_s, yield_s, sleep_s, crowded): `areas` are the
 * addresses (ints) of every rank's lines area in this process, in rank order. */
static int Lines_init(Lines *self, PyObject *args, PyObject *kwds)
{
    PyObject *areas;
    Py_ssize_t line_size;
    if (!PyArg_ParseTuple(args, "iO!nndddddp", &self->rank, &PyTuple_Type, &areas, &line_size, &self->capacity,
                          &self->spin_s, &self->spin_max_s, &self->awake_s, &self->yield_s, &self->sleep_s,
                          &self->crowded))
        return -1;
    self->size = (int)PyTuple_GET_SIZE(areas);
    if (self->rank < 0 || self->rank >= self->size || self->capacity < 0 || line_size < LINE_PAYLOAD_AT + self->capacity) {
        PyErr_SetString(PyExc_ValueError, "lines: rank, size or line size out of range");
        return -1;
    }
    PyMem_Free(self->areas);
    PyMem_Free(self->lines);
    self->areas = PyMem_Calloc(self->size, sizeof(char *));
    self->lines = PyMem_Calloc(2 * self->size, sizeof(char *));
    if (self->areas == NULL || self->lines == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int r = 0; r < self->size; r++) {
        uintptr_t at = (uintptr_t)PyLong_AsVoidPtr(PyTuple_GET_ITEM(areas, r));
        if (PyErr_Occurred())
            return -1;
        if (at == 0 || at % 64 != 0) {
            PyErr_SetString(PyExc_ValueError, "lines: an area's address is not a cache line's");
            return -1;
        }
        self->areas[r] = (char *)at;
        for (int parity = 0; parity < 2; parity++)
            self->lines[parity * self->size + r] = (char *)at + LINES_FIRST + parity * line_size;
    }
    return 0;
}

static PyObject *Lines_close(Lines *self, PyObject *unused)
{
    self->closed = 1;  /* the segments are about to be unmapped: no plan touches them again */
    Py_RETURN_NONE;
}

/* ---- posting and waiting ---------------------------------------------------------------------- */

static void futex_wake(volatile int64_t *word)
{
    syscall(SYS_futex, (void *)word, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

/* Sleep while *word's low 32 bits hold `seen`, at most `seconds`; -1 with errno EINTR for a signal. */
static int futex_sleep(volatile int64_t *word, int64_t seen, double seconds)
{
    if (seconds <= 0)
        return 0;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    return (int)syscall(SYS_futex, (void *)word, FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
}

typedef struct Plan Plan;

/* Publish round `number` of the plan's call on this rank's line (its payload already written). */
static void post(Lines *L, int64_t number, int64_t call, int64_t fingerprint, const char *header)
{
    char *line = line_of(L, number, L->rank);
    if (*word_of(line, LINE_PRINT) != fingerprint) {  /* the header changes only with the call's shape */
        memcpy(line + LINE_HEADER_AT, header, HEADER_SIZE);
        *word_of(line, LINE_PRINT) = fingerprint;
    }
    *word_of(line, LINE_CALL) = call;
    store(word_of(L->areas[L->rank], LINE_POSTED), now_ns());
    store(word_of(line, LINE_NUMBER), number);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* the number is out before the flags are read */
    for (int r = 0; r < L->size; r++)
        if (r != L->rank && load(word_of(L->areas[r], LINE_SLEEPING))) {
            futex_wake(word_of(line, LINE_NUMBER));
            return;
        }
}

/* Whether `rank` is expected soon: it is inside its call (posted since it last returned), or it
 * returned within awake_s (see the file's opening comment). */
static int expected(Lines *L, int rank, double now)
{
    char *area = L->areas[rank];
    int64_t posted = load(word_of(area, LINE_POSTED)), returned = load(word_of(area, LINE_RETURNED));
    return posted > returned || now - (double)returned * 1e-9 < L->awake_s;
}

/* Wait until `rank`'s line shows `number`, from a wait that began at `began`, until `until`.
 * Returns 1 once it does, 0 at `until`, -1 when a signal interrupted a sleep (called without the GIL).
 * Spin while every rank has a core and the wait is young, or the peer is expected soon and the wait is
 * younger than spin_max_s; yield the core instead where the group's ranks outnumber the cores (spinning
 * would keep it from the peer), while the peer is expected past spin_max_s (it is most likely waiting for
 * a core: a spin would hold one for a whole time slice) and while the wait is younger than yield_s;
 * then sleep. */
static int await_one(Lines *L, int rank, int64_t number, double began, double until)
{
    volatile int64_t *theirs = word_of(line_of(L, number, rank), LINE_NUMBER);
    volatile int64_t *sleeping = word_of(L->areas[L->rank], LINE_SLEEPING);
    for (;;) {
        for (int spin = 0; spin < 64; spin++) {
            if (load(theirs) == number)
                return 1;
            relax();
        }
        double now = now_s(), elapsed = now - began;
        if (now >= until)
            return 0;
        int young = elapsed < L->spin_s;
        if (young && !L->crowded)
            continue;
        int soon = young || expected(L, rank, now);
        if (soon && !L->crowded && elapsed < L->spin_max_s)
            continue;
        if (soon || elapsed < L->yield_s) {
            sched_yield();
            continue;
        }
        int64_t seen = load(theirs);
        __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);  /* then look once more: a post after this wakes us */
        int rc = 0;
        if (load(theirs) == seen) {
            double nap = until - now < L->sleep_s ? until - now : L->sleep_s;
            rc = futex_sleep(theirs, seen, nap);
        }
        store(sleeping, 0);
        if (rc < 0 && errno == EINTR)
            return load(theirs) == number ? 1 : -1;
    }
}

/* ---- Plan: one call shape, run and resumed ---------------------------------------------------- */

struct Plan {
    PyObject_HEAD
    Lines *lines;
    int kind, root, dtype, op;
    ar_fold_fn fold;
    Py_ssize_t itemsize, count, per_line;  /* per_line: items of a chunk (chunked plans) */
    int64_t fingerprint;
    char header[HEADER_SIZE];
    /* the run in progress */
    int64_t number, call;
    int phase;
    Py_ssize_t chunk;  /* the chunk in progress (chunked plans) */
    int next;  /* the peer to wait for next in this round */
    double deadline, began;
    int waiting, peer, parity;  /* the rank waited for (WAITING); the rank and line that differ (MISMATCH) */
};

/* Wait for every peer's `number` until `until`: DONE, WAITING (p->waiting) or MISMATCH (p->peer);
 * -1 for a signal. Peers are taken in rank order; those already seen this round are not looked at again. */
static int await_all(Plan *p, int64_t number, double until)
{
    Lines *L = p->lines;
    for (; p->next < L->size; p->next++) {
        int r = p->next;
        if (r == L->rank)
            continue;
        char *line = line_of(L, number, r);
        if (load(word_of(line, LINE_NUMBER)) != number) {
            int got = await_one(L, r, number, p->began, until);
            if (got <= 0) {
                p->waiting = r;
                return got < 0 ? -1 : WAITING;
            }
        }
        if (*word_of(line, LINE_CALL) != p->call || *word_of(line, LINE_PRINT) != p->fingerprint) {
            p->peer = r;
            p->parity = (int)(number & 1);
            return MISMATCH;
        }
    }
    return DONE;
}

static void start_wait(Plan *p)
{
    p->next = 0;
    p->began = now_s();
}

/* Rank r's term of a fold: bytes at `offset` of its line `number`; this rank's is `own` (its line, or
 * the caller's array). */
static inline const char *term(Plan *p, int r, int64_t number, Py_ssize_t offset, const char *own)
{
    return r == p->lines->rank ? own : line_of(p->lines, number, r) + LINE_PAYLOAD_AT + offset;
}

/* The left fold over ranks in rank order into dst: dst = t0 op t1, then dst op= t_r (dst is no term). */
static void fold_ranks(Plan *p, char *dst, Py_ssize_t offset, Py_ssize_t items, int64_t number, const char *own)
{
    int size = p->lines->size;
    if (size == 1) {
        memcpy(dst, own, (size_t)(items * p->itemsize));
        return;
    }
    p->fold(dst, term(p, 0, number, offset, own), term(p, 1, number, offset, own), (size_t)items);
    for (int r = 2; r < size; r++)
        p->fold(dst, dst, term(p, r, number, offset, own), (size_t)items);
}

/* One round: write, post, wait, then what the collective does with the lines. */
static int step_once(Plan *p, char *data, char *out, double until)
{
    Lines *L = p->lines;
    Py_ssize_t nbytes = p->count * p->itemsize;
    if (p->phase == SEND) {
        int sends = p->kind != BROADCAST && p->kind != BARRIER ? 1 : p->kind == BROADCAST && L->rank == p->root;
        if (sends && nbytes)
            memcpy(line_of(L, p->number, L->rank) + LINE_PAYLOAD_AT, data, (size_t)nbytes);
        post(L, p->number, p->call, p->fingerprint, p->header);
        start_wait(p);
        p->phase = WAIT;
    }
    int state = await_all(p, p->number, until);
    if (state != DONE)
        return state;
    char *mine = line_of(L, p->number, L->rank) + LINE_PAYLOAD_AT;
    switch (p->kind) {
    case ALL_REDUCE:
    case REDUCE:
        if ((p->kind == ALL_REDUCE || L->rank == p->root) && nbytes)
            fold_ranks(p, data, 0, p->count, p->number, mine);
        break;
    case BROADCAST:
        if (L->rank != p->root && nbytes)
            memcpy(data, line_of(L, p->number, p->root) + LINE_PAYLOAD_AT, (size_t)nbytes);
        break;
    case ALL_GATHER:
        for (int r = 0; r < L->size && nbytes; r++)
            memcpy(out + r * nbytes, line_of(L, p->number, r) + LINE_PAYLOAD_AT, (size_t)nbytes);
        break;
    }
    p->phase = OVER;
    return DONE;
}

/* A chunk's slice of rank `part`: items [low, high) of the chunk [start, start + items). */
static inline void cut(Py_ssize_t items, int size, int part, Py_ssize_t *low, Py_ssize_t *high)
{
    *low = items * part / size;
    *high = items * (part + 1) / size;
}

/* Chunks of a line each, two rounds per chunk (engines/line_plans.py's ChunkedPlan): round one posts this
 * rank's chunk but its own slice; then it folds its slice over every rank's line (its own term from
 * the caller's array) into its other line and posts that; round two copies every folded slice. */
static int step_chunked(Plan *p, char *data, double until)
{
    Lines *L = p->lines;
    Py_ssize_t item = p->itemsize;
    int keeps = p->kind == ALL_REDUCE || L->rank == p->root;  /* an all-reduce, or a reduce's root */
    for (; p->chunk * p->per_line < p->count; p->chunk++) {
        Py_ssize_t start = p->chunk * p->per_line, items = p->count - start, low, high;
        if (items > p->per_line)
            items = p->per_line;
        cut(items, L->size, L->rank, &low, &high);
        char *chunk = data + start * item;
        if (p->phase == SEND) {
            char *line = line_of(L, p->number, L->rank) + LINE_PAYLOAD_AT;
            memcpy(line, chunk, (size_t)(low * item));
            memcpy(line + high * item, chunk + high * item, (size_t)((items - high) * item));
            post(L, p->number, p->call, p->fingerprint, p->header);
            start_wait(p);
            p->phase = WAIT;
        }
        if (p->phase == WAIT) {
            int state = await_all(p, p->number, until);
            if (state != DONE)
                return state;
            char *folded = line_of(L, p->number + 1, L->rank) + LINE_PAYLOAD_AT + low * item;
            if (high > low)
                fold_ranks(p, folded, low * item, high - low, p->number, chunk + low * item);
            post(L, p->number + 1, p->call, p->fingerprint, p->header);
            if (keeps)
                memcpy(chunk + low * item, folded, (size_t)((high - low) * item));
            start_wait(p);
            p->phase = WAIT_FOLDS;
        }
        int state = await_all(p, p->number + 1, until);
        if (state != DONE)
            return state;
        for (int part = 0; keeps && part < L->size; part++) {
            Py_ssize_t a, b;
            cut(items, L->size, part, &a, &b);
            if (part != L->rank && b > a)
                memcpy(chunk + a * item, line_of(L, p->number + 1, part) + LINE_PAYLOAD_AT + a * item,
                       (size_t)((b - a) * item));
        }
        p->number += 2;
        p->phase = SEND;
    }
    p->phase = OVER;
    return DONE;
}

static PyObject *Misaligned;  /* the exception for a buffer whose items are not aligned (a ValueError) */

/* Take `obj`'s buffer as `nbytes` bytes, aligned to the plan's items (writable if asked); None is no buffer. */
static int take(PyObject *obj, Py_buffer *view, Py_ssize_t nbytes, int writable, Py_ssize_t item, const char *what)
{
    view->obj = NULL;
    view->buf = NULL;
    if (obj == Py_None) {
        if (nbytes == 0)
            return 0;
        PyErr_Format(PyExc_ValueError, "lines: the call needs its %s buffer", what);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->len != nbytes) {
        PyErr_Format(PyExc_ValueError, "lines: the %s buffer holds %zd bytes, the call %zd", what, view->len, nbytes);
    } else if (nbytes > 0 && item > 1 && (uintptr_t)view->buf % (uintptr_t)item) {
        /* the kernels take typed pointers: the caller stages such a buffer through an aligned copy */
        PyErr_Format(Misaligned, "lines: the %s buffer is not aligned to its %zd-byte items", what, item);
    } else {
        return 0;
    }
    PyBuffer_Release(view);
    view->obj = NULL;
    return -1;
}

static void give_back(Py_buffer *view)
{
    if (view->obj != NULL)
        PyBuffer_Release(view);
}

/* Advance the run on the buffers at `data` and `out` for up to `slice` seconds (not past the deadline):
 * DONE, WAITING or MISMATCH, or -1 with the exception set. */
static int closed(Lines *L)
{
    if (L->closed)
        PyErr_SetString(PyExc_RuntimeError, "lines: the shared-memory transport is closed");
    return L->closed;
}

static int drive(Plan *p, char *data, char *out, double slice)
{
    Lines *L = p->lines;
    if (closed(L))
        return -1;
    if (p->phase == OVER)
        return DONE;
    for (;;) {
        int state;
        Py_BEGIN_ALLOW_THREADS
        double until = now_s() + slice;
        if (until > p->deadline)
            until = p->deadline;
        state = p->per_line ? step_chunked(p, data, until) : step_once(p, data, out, until);
        Py_END_ALLOW_THREADS
        if (state == DONE)  /* peers waiting for this rank's next call read when it left this one */
            store(word_of(L->areas[L->rank], LINE_RETURNED), now_ns());
        if (state >= 0)
            return state;
        if (PyErr_CheckSignals() < 0)  /* a signal's handler raised (KeyboardInterrupt, say) */
            return -1;
    }
}

/* Whether the plan writes its data buffer on this rank. */
static int writes(Plan *p)
{
    int root = p->lines->rank == p->root;
    return p->kind == ALL_REDUCE || (p->kind == REDUCE && root) || (p->kind == BROADCAST && !root);
}

/* drive() on `data_obj` and `out_obj`, taken as the plan's buffers: its state as an int object. */
static PyObject *advance(Plan *p, PyObject *data_obj, PyObject *out_obj, double slice)
{
    if (closed(p->lines))  /* before the buffers: whatever they are, closed lines are never touched */
        return NULL;
    Py_ssize_t nbytes = p->count * p->itemsize;
    int gathers = p->kind == ALL_GATHER;
    Py_buffer data, out;
    if (take(data_obj, &data, nbytes, writes(p), p->itemsize, "data") < 0)
        return NULL;
    if (take(gathers ? out_obj : Py_None, &out, gathers ? nbytes * p->lines->size : 0, 1, p->itemsize, "out") < 0) {
        give_back(&data);
        return NULL;
    }
    int state = drive(p, data.buf, out.buf, slice);
    give_back(&out);
    give_back(&data);
    return state < 0 ? NULL : PyLong_FromLong(state);
}

/* Begin run `number` of the plan as group call `call`, its deadline `timeout` seconds away. */
static void begin(Plan *p, int64_t number, int64_t call, double timeout)
{
    p->number = number;
    p->call = call;
    p->phase = SEND;
    p->chunk = 0;
    p->waiting = p->peer = -1;
    p->deadline = now_s() + timeout;
}

/* run(number, call, data, out, timeout, slice) -> DONE | WAITING | MISMATCH: start run `number` of the
 * plan as group call `call` with its deadline `timeout` seconds away. */
static PyObject *Plan_run(Plan *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(number, call, data, out, timeout, slice)");
        return NULL;
    }
    int64_t number = PyLong_AsLongLong(args[0]), call = PyLong_AsLongLong(args[1]);
    double timeout = PyFloat_AsDouble(args[4]), slice = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    begin(p, number, call, timeout);
    return advance(p, args[2], args[3], slice);
}

/* resume(data, out, slice) -> DONE | WAITING | MISMATCH: go on with the run that returned WAITING. */
static PyObject *Plan_resume(Plan *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "resume(data, out, slice)");
        return NULL;
    }
    double slice = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred())
        return NULL;
    return advance(p, args[0], args[1], slice);
}

static void Plan_dealloc(Plan *p)
{
    Py_XDECREF(p->lines);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMemberDef Plan_members[] = {
    {"waiting", T_INT, offsetof(Plan, waiting), READONLY, "the rank the run waits for (after WAITING)"},
    {"peer", T_INT, offsetof(Plan, peer), READONLY, "the rank whose line differs (after MISMATCH)"},
    {"parity", T_INT, offsetof(Plan, parity), READONLY, "the line that differs (after MISMATCH)"},
    {"number", T_LONGLONG, offsetof(Plan, number), READONLY, "the line number of the round in progress"},
    {"deadline", T_DOUBLE, offsetof(Plan, deadline), READONLY, "the run's deadline (time.monotonic's clock)"},
    {NULL},
};

static PyObject *Plan_shortcut(Plan *p, PyObject *args);

static PyMethodDef Plan_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Plan_run, METH_FASTCALL, "run(number, call, data, out, timeout, slice)"},
    {"resume", (PyCFunction)(void (*)(void))Plan_resume, METH_FASTCALL, "resume(data, out, slice)"},
    {"shortcut", (PyCFunction)Plan_shortcut, METH_VARARGS,
     "shortcut(state, call, per_run, timeout, slice, resume) -> Shortcut"},
    {NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "allreduce.native._line_plans.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One call shape on the lines (made by Lines.plan).",
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
    .tp_members = Plan_members,
};

/* ---- Shortcut: a blocking call of a shape the group ran before, claimed and run in one call -------
 *
 * The group's call state is a CallState (callstate.c) that the Python runtime drives with the group's
 * lock held (runtime/queue.py, claims.py, life.py, health.py); a Shortcut drives the same struct in C,
 * with the GIL held throughout (so no Python code runs in between), doing exactly what the Python
 * shortcut (runtime/shortcuts.py), WorkQueue.run_inline and NativePlan.run do on success: it probes the
 * group's lock (held by another thread: a call is being issued, so the general path decides), claims the idle
 * group for this thread (never the progress thread: a Work callback), numbers the call, records it as
 * begun for the heartbeat, takes its line numbers and runs the plan. A call that ends other than plainly
 * (WAITING, MISMATCH, an exception, another thread's call meanwhile, work queued behind it) is handed, as
 * it stands, to the Python `resume(seq, data, outcome)`, which goes on exactly as the general path would
 * and frees the group. Calling it returns False, with nothing done, where the general path must take
 * the call.
 *
 * A shortcut is stale once its group has retired it (retire(): the group re-planned the shape, told its
 * peers of a refusal, or the determinism mode changed); a stale one returns False too, so a caller that
 * keeps one (the torch backend's shim) needs no other check than calling it. Compiled callers call it
 * through the module's `_C_API` capsule: a pointer to shortcut_run(), which takes any object (0 for one
 * that is not a Shortcut). */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Plan *plan;
    ar_CallState *state;  /* the group's call state */
    PyObject *call;  /* the planned call's Call (the state's `started` is (seq, call)) */
    PyObject *resume;
    int retired;  /* set by retire(): every call goes the general way */
    int64_t per_run;  /* line numbers one run takes */
    double timeout, slice;
} Shortcut;

static PyTypeObject ShortcutType;

/* A shortcut holds its group's state, and the group (through resume) holds its shortcuts: a cycle the
 * garbage collector must see through. */
static int Shortcut_traverse(Shortcut *s, visitproc visit, void *arg)
{
    Py_VISIT(s->plan);
    Py_VISIT(s->state);
    Py_VISIT(s->call);
    Py_VISIT(s->resume);
    return 0;
}

static int Shortcut_clear(Shortcut *s)
{
    Py_CLEAR(s->plan);
    Py_CLEAR(s->state);
    Py_CLEAR(s->call);
    Py_CLEAR(s->resume);
    return 0;
}

static void Shortcut_dealloc(Shortcut *s)
{
    PyObject_GC_UnTrack(s);
    Shortcut_clear(s);
    PyObject_GC_Del(s);
}

/* Record call `seq` as begun and take its line numbers: the first of them, -1 on an error. */
static int64_t begun(Shortcut *s, int64_t seq)
{
    if (call_begin(s->state, seq, s->call) < 0)
        return -1;
    Lines *L = s->plan->lines;
    L->numbered += s->per_run;
    return L->numbered - s->per_run + 1;
}

/* shortcut(data), for Python and compiled callers: 1 if the call ran, 0 if the general path must take
 * it (nothing done), -1 with the call's exception set. With the GIL held. */
static int shortcut_run(PyObject *obj, PyObject *data)
{
    if (Py_TYPE(obj) != &ShortcutType)
        return 0;
    Shortcut *s = (Shortcut *)obj;
    if (s->plan == NULL || s->retired)  /* no plan: cleared by the garbage collector, its group is going */
        return 0;
    Plan *p = s->plan;
    Py_buffer view = {0};
    if (data != Py_None) {  /* memory the call may not run on in place is the general path's to refuse */
        if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            return 0;
        }
        if (view.len != p->count * p->itemsize || (uintptr_t)view.buf % (uintptr_t)p->itemsize) {
            PyBuffer_Release(&view);
            return 0;
        }
    } else if (p->count * p->itemsize != 0) {
        return 0;
    }
    int64_t seq = call_probe_claim(s->state, PyThread_get_thread_ident());
    if (seq <= 0) {
        give_back(&view);
        return seq < 0 ? -1 : 0;
    }
    /* from here the group is this call's: every way out but the plain one goes through resume() */
    PyObject *outcome = NULL;
    int64_t number = begun(s, seq);
    if (number > 0) {
        begin(p, number, seq, s->timeout);
        int state = drive(p, view.buf, NULL, s->slice);
        outcome = state < 0 ? NULL : PyLong_FromLong(state);
    }
    give_back(&view);
    if (outcome != NULL && PyLong_CheckExact(outcome) && PyLong_AsLong(outcome) == DONE && call_finish(s->state)) {
        Py_DECREF(outcome);
        return 1;
    }
    if (outcome == NULL) {  /* the exception, as the engine's run would have raised it */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL && value != NULL)
            PyException_SetTraceback(value, traceback);
        Py_XDECREF(type);
        Py_XDECREF(traceback);
        outcome = value != NULL ? value : Py_NewRef(Py_None);
    }
    PyObject *seq_obj = PyLong_FromLongLong(seq);
    PyObject *result = seq_obj == NULL ? NULL : PyObject_CallFunctionObjArgs(s->resume, seq_obj, data, outcome, NULL);
    Py_XDECREF(seq_obj);
    Py_DECREF(outcome);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 1;
}

/* shortcut(data) -> bool: see above. */
static PyObject *Shortcut_vectorcall(PyObject *s, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "shortcut(data)");
        return NULL;
    }
    int ran = shortcut_run(s, args[0]);
    if (ran < 0)
        return NULL;
    return PyBool_FromLong(ran);
}

static PyObject *Shortcut_retire(Shortcut *s, PyObject *Py_UNUSED(ignored))
{
    s->retired = 1;
    Py_RETURN_NONE;
}

static PyMethodDef Shortcut_methods[] = {
    {"retire", (PyCFunction)Shortcut_retire, METH_NOARGS, "retire(): every later call returns False (its group dropped it)."},
    {NULL},
};

static PyObject *Shortcut_call(PyObject *s, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(s, args, kwargs);
}

static PyTypeObject ShortcutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "allreduce.native._line_plans.Shortcut",
    .tp_basicsize = sizeof(Shortcut),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A blocking call of a known shape, claimed and run in one call (made by Plan.shortcut).",
    .tp_dealloc = (destructor)Shortcut_dealloc,
    .tp_traverse = (traverseproc)Shortcut_traverse,
    .tp_clear = (inquiry)Shortcut_clear,
    .tp_vectorcall_offset = offsetof(Shortcut, vectorcall),
    .tp_call = Shortcut_call,
    .tp_methods = Shortcut_methods,
};

/* plan.shortcut(state, call, per_run, timeout, slice, resume) */
static PyObject *Plan_shortcut(Plan *p, PyObject *args)
{
    PyObject *state, *call, *resume;
    long long per_run;
    double timeout, slice;
    if (!PyArg_ParseTuple(args, "O!OLddO", &ar_CallStateType, &state, &call, &per_run, &timeout, &slice, &resume))
        return NULL;
    if (per_run <= 0 || !PyCallable_Check(resume) || p->kind == ALL_GATHER || ((ar_CallState *)state)->acquire == NULL) {
        PyErr_SetString(PyExc_ValueError, "shortcut: per_run must be positive, resume callable, the plan no gather");
        return NULL;
    }
    Shortcut *s = PyObject_GC_New(Shortcut, &ShortcutType);
    if (s == NULL)
        return NULL;
    s->vectorcall = (vectorcallfunc)Shortcut_vectorcall;
    s->plan = (Plan *)Py_NewRef(p);
    s->state = (ar_CallState *)Py_NewRef(state);
    s->call = Py_NewRef(call);
    s->resume = Py_NewRef(resume);
    s->retired = 0;
    s->per_run = per_run;
    s->timeout = timeout;
    s->slice = slice;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

/* plan(kind, dtype, op, count, root, fingerprint, header, per_line) -> Plan. per_line is the chunk's
 * items for a chunked all-reduce or reduce, else 0. */
static PyObject *Lines_plan(Lines *self, PyObject *args)
{
    int kind, dtype, op, root;
    Py_ssize_t count, per_line, header_len;
    long long fingerprint;
    const char *header;
    if (!PyArg_ParseTuple(args, "iiiniLy#n", &kind, &dtype, &op, &count, &root, &fingerprint, &header, &header_len,
                          &per_line))
        return NULL;
    Py_ssize_t item = (Py_ssize_t)ar_itemsize(dtype);
    int reduces = kind == ALL_REDUCE || kind == REDUCE, chunked = per_line != 0;
    if (kind < 0 || kind >= KINDS || item == 0 || count < 0 || root < 0 || root >= self->size
        || header_len != HEADER_SIZE || (reduces && !ar_supported(dtype, op)) || (chunked && !reduces)) {
        PyErr_SetString(PyExc_ValueError, "lines: a plan of an unknown kind, dtype, op, root or header");
        return NULL;
    }
    if (chunked ? per_line <= 0 || per_line * item > self->capacity : count > self->capacity / item) {
        PyErr_SetString(PyExc_ValueError, "lines: the call does not fit a line");
        return NULL;
    }
    Plan *p = PyObject_New(Plan, &PlanType);
    if (p == NULL)
        return NULL;
    Py_INCREF(self);
    p->lines = self;
    p->kind = kind;
    p->root = root;
    p->dtype = dtype;
    p->op = op;
    p->fold = reduces ? ar_kernel(dtype, op) : NULL;
    p->itemsize = item;
    p->count = count;
    p->per_line = chunked ? per_line : 0;
    p->fingerprint = fingerprint;
    memcpy(p->header, header, HEADER_SIZE);
    p->phase = OVER;
    p->number = p->call = 0;
    p->chunk = 0;
    p->next = 0;
    p->deadline = p->began = 0;
    p->waiting = p->peer = p->parity = -1;
    return (PyObject *)p;
}

static PyMemberDef Lines_members[] = {
    {"numbered", T_LONGLONG, offsetof(Lines, numbered), 0, "line numbers taken so far (engines/line_plans.py's numbering)"},
    {NULL},
};

static PyMethodDef Lines_methods[] = {
    {"plan", (PyCFunction)Lines_plan, METH_VARARGS, "plan(kind, dtype, op, count, root, fingerprint, header, per_line)"},
    {"close", (PyCFunction)Lines_close, METH_NOARGS, "No plan touches the lines after this (they are unmapped next)."},
    {NULL},
};

static PyTypeObject LinesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "allreduce.native._line_plans.Lines",
    .tp_basicsize = sizeof(Lines),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Every rank's two lines as this process maps them.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lines_init,
    .tp_dealloc = (destructor)Lines_dealloc,
    .tp_methods = Lines_methods,
    .tp_members = Lines_members,
};

static PyObject *supported(PyObject *self, PyObject *args)
{
    int dtype, op;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op))
        return NULL;
    return PyBool_FromLong(ar_supported(dtype, op));
}

static PyObject *itemsize(PyObject *self, PyObject *args)
{
    int dtype;
    if (!PyArg_ParseTuple(args, "i", &dtype))
        return NULL;
    return PyLong_FromSize_t(ar_itemsize(dtype));
}

static PyMethodDef functions[] = {
    {"supported", supported, METH_VARARGS, "supported(dtype, op) -> bool: whether a plan can reduce this pair."},
    {"itemsize", itemsize, METH_VARARGS, "itemsize(dtype) -> int: an item's bytes as plans count them, 0: no plan."},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_line_plans", "The plans of the shared-memory lines, run in C.", -1, functions};

PyMODINIT_FUNC PyInit__line_plans(void)
{
    if (PyType_Ready(&LinesType) < 0 || PyType_Ready(&PlanType) < 0 || PyType_Ready(&ShortcutType) < 0
        || PyType_Ready(&ar_CallStateType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *layout = Py_BuildValue("{sisisisisisisisisi}", "LINE_SLEEPING", LINE_SLEEPING, "LINE_POSTED", LINE_POSTED,
                                     "LINE_RETURNED", LINE_RETURNED,
                                     "LINES_FIRST", LINES_FIRST, "LINE_NUMBER", LINE_NUMBER, "LINE_CALL", LINE_CALL,
                                     "LINE_PRINT", LINE_PRINT, "LINE_HEADER_AT", LINE_HEADER_AT,
                                     "LINE_PAYLOAD_AT", LINE_PAYLOAD_AT);
    PyObject *kinds = Py_BuildValue("{sisisisisi}", "all_reduce", ALL_REDUCE, "reduce", REDUCE, "broadcast", BROADCAST,
                                    "all_gather", ALL_GATHER, "barrier", BARRIER);
    /* the C entry of a Shortcut, for compiled callers: int (*)(PyObject *shortcut, PyObject *data) */
    PyObject *api = PyCapsule_New((void *)shortcut_run, "allreduce.native._line_plans._C_API", NULL);
    Py_INCREF(&LinesType);
    Py_INCREF(&PlanType);
    Py_INCREF(&ar_CallStateType);
    Misaligned = PyErr_NewException("allreduce.native._line_plans.Misaligned", PyExc_ValueError, NULL);
    Py_XINCREF(Misaligned);
    if (layout == NULL || kinds == NULL || api == NULL || Misaligned == NULL
        || PyModule_AddObject(m, "_C_API", api) < 0 || PyModule_AddObject(m, "Misaligned", Misaligned) < 0
        || PyModule_AddObject(m, "LAYOUT", layout) < 0
        || PyModule_AddObject(m, "KINDS", kinds) < 0 || PyModule_AddObject(m, "Lines", (PyObject *)&LinesType) < 0
        || PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0
        || PyModule_AddObject(m, "CallState", (PyObject *)&ar_CallStateType) < 0 || PyModule_AddIntConstant(m, "DONE", DONE) < 0
        || PyModule_AddIntConstant(m, "WAITING", WAITING) < 0 || PyModule_AddIntConstant(m, "MISMATCH", MISMATCH) < 0
        || PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
