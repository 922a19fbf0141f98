/* One step of a compiled schedule over TCP links: the types the Plan (``_tcp.c``) builds and the loop
 * (``tcpsteps.c``) that runs them with the GIL released. See tcpsteps.c for how a step progresses.
 */
#ifndef ALLREDUCE_TCPSTEPS_H
#define ALLREDUCE_TCPSTEPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <poll.h>
#include <stdint.h>

#include "frames.h"
#include "kernels.h"

#define SMALL_FRAME (1 << 16)   /* payloads up to this size are read together with their header */
#define REDUCE_BLOCK (1 << 16)  /* bytes folded at a time while a segment is still arriving */
#define STAGE_RING (1 << 18)    /* a reducing receive folded as it arrives lands in a ring this size */
#define IOV_MAX_SEND 64         /* buffers per sendmsg */
#define SIGNAL_S 0.1            /* the longest wait between two looks at pending signals */
#define SPIN_SCORE 4            /* spin while the score (tcpsteps.c: may_spin) is at least this */
#define SPIN_SCORE_MAX 16
#define ABORT_READ_S 1.0        /* how long an ABORT's reason may take to arrive (tcp.read_abort_reason) */

/* How a run ended; the Python side turns each into the Python engine's error. */
enum { RUN_OK = 0, RUN_TIMEOUT = 1, RUN_LOST = 2, RUN_HEADER = 3, RUN_ABORT = 4, RUN_SEND = 5, RUN_EXCEPTION = 6 };

typedef struct { int buf; Py_ssize_t off, len; } span;  /* bytes [off, off + len) of buffer ``buf`` */

typedef struct { span src, dst, acc; int reduce; } copy_op;         /* dst = src, or dst = acc (op) src */
typedef struct { int peer; span src; uint8_t header[AR_HEADER_SIZE]; } send_op;
typedef struct {
    int peer;
    span dst, acc;  /* where the segment goes; with ``reduce``, dst = acc (op) segment */
    int reduce, later, stage;  /* staging buffer of a reducing receive; ``later``: folded after the step */
    Py_ssize_t ring;  /* bytes of the stage: the whole segment where ``later``, else at most STAGE_RING */
    uint8_t want[AR_HEADER_SIZE];
} recv_op;

/* One peer's part in a step: its sends and receives, in list order (frames keep that order). */
typedef struct { int peer, fd, nsends, nrecvs; int *sends, *recvs; } link_plan;

typedef struct {
    uint32_t index;  /* the schedule's step number, carried in every frame of the step */
    int ncopies, nsends, nrecvs, nlinks;
    int small;  /* every frame of the step is at most SMALL_FRAME: a reply may be due within microseconds */
    copy_op *copies;
    send_op *sends;
    recv_op *recvs;
    link_plan *links;  /* peers in order of first appearance: sends, then receives */
} step_plan;

/* A link's progress through one step. */
typedef struct {
    int send_i, recv_i;          /* the current frame out and in */
    size_t sent, hdr_got, got, folded;  /* bytes of them so far; bytes of the incoming one folded */
    uint8_t header[AR_HEADER_SIZE];     /* the incoming header */
} link_state;

#define MAX_BUFFERS (1 << 16)  /* data, out, tmp and the staging buffers */

typedef struct {
    PyObject_HEAD
    int nsteps, nbuffers, maxlinks, itemsize;
    double spin;  /* seconds a rank retries at once after the last byte moved, before it sleeps in poll */
    int spin_score;  /* how well spinning paid off lately (see may_spin) */
    unsigned spin_probe;
    step_plan *steps;
    PyObject *fold;  /* the Python fold: fold(a, a_off, b, b_off, out, out_off, nbytes) on the arrays */
    ar_fold_fn kernel;  /* or the compiled one (dst, a, b, n) */
    link_state *states;
    struct pollfd *polls;
    uint8_t **bases;
    Py_ssize_t *lens;
    Py_buffer *views;  /* data and out for a run (one run at a time: the group runs its calls in order), */
    int *writable;     /* then tmp and the staging buffers, held from bind() to the next or the end */
    PyObject *bound;   /* the tuple bind() was given */
} PlanObject;

/* What one run has: its buffers, deadline and, once it fails, why. */
typedef struct {
    PlanObject *plan;
    uint8_t **base;
    Py_ssize_t *len;
    PyThreadState *thread;  /* the saved thread state while the GIL is released */
    double deadline, idle_every;
    unsigned long moved;  /* syscalls that moved bytes, so far */
    PyObject *idle;
    PyObject *caller[2];  /* data and out, for the Python fold */
    int status, peer, err, step, waiting_recv;
    const uint8_t *want;  /* the header expected where another arrived */
    uint8_t header[AR_HEADER_SIZE];
    char reason[AR_MAX_ABORT_REASON];
    size_t reason_len;
    PyObject *exception;
} run_t;

/* The time on the clock of Python's time.monotonic(). */
double tcp_now(void);

/* Take the GIL back for a moment (GIL released by tcp_drop_gil), and release it again. */
void tcp_take_gil(run_t *r);
void tcp_drop_gil(run_t *r);

/* Run one step: its copies, then its sends and receives until all are done, then its later folds.
 * 0, or -1 with the reason in ``r`` (status, peer, detail); the GIL is released on entry and exit. */
int tcp_step(run_t *r, step_plan *st);

#endif
