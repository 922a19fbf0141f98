/* The state a group's call passes through (callstate.c), for the compiled shortcut to drive directly. */
#ifndef ALLREDUCE_CALLSTATE_H
#define ALLREDUCE_CALLSTATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    char usable;  /* a call may be issued: not destroyed, not broken, not a fork() child's (runtime/life.py) */
    char busy;  /* a call runs, inline or on the progress thread (runtime/queue.py) */
    Py_ssize_t queued;  /* calls waiting for the progress thread */
    long long issued;  /* calls numbered so far: the last one's sequence number */
    unsigned long issuer;  /* the thread whose calls are in flight (0: none yet; runtime/claims.py) */
    unsigned long progress;  /* the group's progress thread, which runs Work callbacks (0: none) */
    PyObject *conflict;  /* None, or the RuntimeError of a call from a second thread: the calls in flight fail */
    PyObject *started;  /* None, or (seq, call) of the call begun last, which the heartbeat publishes */
    PyObject *acquire, *release;  /* the group's lock's bound methods: a shortcut only probes it */
} ar_CallState;

extern PyTypeObject ar_CallStateType;

/* Claim the idle group for thread `me` and number the call: its sequence number, 0 where the general
 * path must decide (unusable, busy, work queued, or `me` is the progress thread). With the lock held. */
long long call_idle_claim(ar_CallState *state, unsigned long me);

/* call_idle_claim with the group's lock only probed (held elsewhere: 0), for a caller holding only the GIL;
 * -1 with an exception set. */
long long call_probe_claim(ar_CallState *state, unsigned long me);

/* Record call `seq` of `call` as begun (what the heartbeat publishes); -1 with an exception set. */
int call_begin(ar_CallState *state, long long seq, PyObject *call);

/* The call ended plainly: free the group (1), or 0 where the general path must finish it (another
 * thread's call meanwhile, or work queued behind it). */
int call_finish(ar_CallState *state);

#endif
