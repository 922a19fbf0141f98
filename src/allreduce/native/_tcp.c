/* The compiled schedule engine over TCP: one planned call's steps in one C call, the GIL released.
 *
 * engines/native_tcp.py compiles a schedule into a flat program (each step's copies, sends and
 * receives as buffer indices and byte spans) and builds a Plan from it once per call shape; every
 * run then walks the steps here. A step's copies run first; then every send and receive of the step
 * progresses at once on the links' non-blocking sockets, in one poll loop: header and payload leave
 * in one sendmsg, a receive lands straight in its destination (a small frame's header and payload in
 * one recvmsg), and a receive that reduces lands in a staging buffer and is folded into its
 * destination in blocks as it arrives. The frames are byte for byte those of the Python engine
 * (engines/schedules.py over transport/tcp.py), so ranks of either engine form one group.
 *
 * What the Python engine guarantees holds here: every expected header is compared whole before its
 * payload is used; a peer's ABORT is read and handed back; a deadline, the idle hook every
 * ``idle_every`` quiet seconds and signals (checked on EINTR and at least every SIGNAL_S) all return
 * to Python. Nothing is raised from C during a run: a failure comes back as a tuple that the Python
 * side words exactly as the Python engine would (engines/native_tcp.py), with the remainder of every
 * frame left half sent, which the transport's abort finishes before its ABORT.
 *
 * Folds use the shared kernels (kernels.h) where they have the call's op and dtype and the spans
 * do not partly overlap; otherwise the Python fold given at planning (numpy's ufunc), GIL taken.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "frames.h"
#include "kernels.h"

#define SMALL_FRAME (1 << 16)   /* payloads up to this size are read together with their header */
#define REDUCE_BLOCK (1 << 16)  /* bytes folded at a time while a segment is still arriving */
#define IOV_MAX_SEND 64         /* buffers per sendmsg */
#define SIGNAL_S 0.1            /* the longest wait between two looks at pending signals */
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
    uint8_t want[AR_HEADER_SIZE];
} recv_op;

/* One peer's part in a step: its sends and receives, in list order (frames keep that order). */
typedef struct { int peer, fd, nsends, nrecvs; int *sends, *recvs; } link_plan;

typedef struct {
    uint32_t index;  /* the schedule's step number, carried in every frame of the step */
    int ncopies, nsends, nrecvs, nlinks;
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
    PyObject *fold;  /* the Python fold: fold(acc_buf, acc_off, src_buf, src_off, dst_buf, dst_off, nbytes) */
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of Python's time.monotonic() */
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- running with the GIL taken for a moment ----------------------------------------------- */

static void take_gil(run_t *r) { PyEval_RestoreThread(r->thread); }
static void drop_gil(run_t *r) { r->thread = PyEval_SaveThread(); }

/* Keep the pending Python exception as the run's failure (GIL held). */
static int failed_with_exception(run_t *r) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    r->exception = value;
    r->status = RUN_EXCEPTION;
    return -1;
}

static int check_signals(run_t *r) {
    take_gil(r);
    int bad = PyErr_CheckSignals() < 0 ? failed_with_exception(r) : 0;
    drop_gil(r);
    return bad;
}

static int call_idle(run_t *r) {
    take_gil(r);
    PyObject *got = PyObject_CallNoArgs(r->idle);
    int bad = got == NULL ? failed_with_exception(r) : 0;
    Py_XDECREF(got);
    drop_gil(r);
    return bad;
}

/* Whether out and ``in`` overlap other than exactly (the kernels take dst == a or b, not a part of one). */
static int partly_overlap(const uint8_t *out, const uint8_t *in, Py_ssize_t nbytes) {
    return out != in && out < in + nbytes && in < out + nbytes;
}

/* out = a (op) b over ``nbytes``: the compiled kernel, or the Python fold with the GIL taken. */
static int fold(run_t *r, span a, span b, span out, Py_ssize_t from, Py_ssize_t nbytes) {
    if (nbytes <= 0) return 0;
    PlanObject *p = r->plan;
    uint8_t *pa = r->base[a.buf] + a.off + from, *pb = r->base[b.buf] + b.off + from;
    uint8_t *po = r->base[out.buf] + out.off + from;
    if (p->kernel != NULL && !partly_overlap(po, pa, nbytes) && !partly_overlap(po, pb, nbytes)) {
        p->kernel(po, pa, pb, (size_t)(nbytes / p->itemsize));
        return 0;
    }
    take_gil(r);
#define OBJECT(i) ((i) < 2 ? r->caller[i] : PyTuple_GET_ITEM(p->bound, (i) - 2))
    PyObject *got = PyObject_CallFunction(p->fold, "OnOnOnn", OBJECT(a.buf), a.off + from, OBJECT(b.buf), b.off + from,
                                          OBJECT(out.buf), out.off + from, nbytes);
#undef OBJECT
    int bad = got == NULL ? failed_with_exception(r) : 0;
    Py_XDECREF(got);
    drop_gil(r);
    return bad;
}

/* ---- one link's frames ----------------------------------------------------------------------- */

/* Send until the socket is full or the link's frames of this step are out. */
static int send_some(run_t *r, step_plan *st, link_plan *lp, link_state *ls) {
    struct iovec iov[IOV_MAX_SEND];
    while (ls->send_i < lp->nsends) {
        int n = 0;
        size_t skip = ls->sent;
        for (int i = ls->send_i; i < lp->nsends && n + 2 <= IOV_MAX_SEND; i++) {
            send_op *op = &st->sends[lp->sends[i]];
            size_t hs = AR_HEADER_SIZE, ps = (size_t)op->src.len;
            uint8_t *payload = r->base[op->src.buf] + op->src.off;
            if (skip < hs) {
                iov[n].iov_base = op->header + skip;
                iov[n++].iov_len = hs - skip;
                skip = 0;
            } else {
                skip -= hs;
            }
            if (ps > skip) {
                iov[n].iov_base = payload + skip;
                iov[n++].iov_len = ps - skip;
            }
            skip = 0;
        }
        struct msghdr msg = {0};
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        ssize_t sent = sendmsg(lp->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            r->status = RUN_SEND;
            r->err = errno;
            r->peer = lp->peer;
            return -1;
        }
        r->moved++;
        size_t moved = (size_t)sent;
        while (moved && ls->send_i < lp->nsends) {
            size_t frame = AR_HEADER_SIZE + (size_t)st->sends[lp->sends[ls->send_i]].src.len;
            size_t rest = frame - ls->sent;
            if (moved >= rest) {
                moved -= rest;
                ls->sent = 0;
                ls->send_i++;
            } else {
                ls->sent += moved;
                moved = 0;
            }
        }
    }
    return 0;
}

/* Read an ABORT's reason of ``nbytes``, ``early`` of them already at ``start``, within ABORT_READ_S. */
static void read_reason(run_t *r, int fd, const uint8_t *start, size_t early, size_t nbytes) {
    size_t have = early < nbytes ? early : nbytes;
    if (have) memcpy(r->reason, start, have);
    double until = now_s() + ABORT_READ_S;
    while (have < nbytes) {
        ssize_t n = recv(fd, r->reason + have, nbytes - have, MSG_DONTWAIT);
        if (n > 0) {
            have += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
        double left = until - now_s();
        if (left <= 0) break;
        struct pollfd one = {fd, POLLIN, 0};
        poll(&one, 1, (int)(left * 1000) + 1);
    }
    r->reason_len = have;
}

static int same_fields(const ar_header *a, const ar_header *b) {
    return a->kind == b->kind && a->collective == b->collective && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root && a->step == b->step && a->seq == b->seq && a->algorithm == b->algorithm &&
           a->count == b->count && a->nbytes == b->nbytes;
}

/* The header that arrived differs from the one expected: 0 where only its padding does (the Python
 * engine compares fields), else -1: an ABORT (its reason read) or anything else. */
static int unexpected(run_t *r, link_plan *lp, link_state *ls, const uint8_t *want, const uint8_t *payload) {
    ar_header h, w;
    int parsed = ar_header_parse(ls->header, AR_HEADER_SIZE, &h) == AR_FRAME_OK;
    if (parsed && ar_header_parse(want, AR_HEADER_SIZE, &w) == AR_FRAME_OK && same_fields(&h, &w)) return 0;
    r->peer = lp->peer;
    r->want = want;
    memcpy(r->header, ls->header, AR_HEADER_SIZE);
    if (parsed && h.kind == AR_KIND_ABORT) {
        read_reason(r, lp->fd, payload, ls->got, (size_t)h.nbytes);
        r->status = RUN_ABORT;
    } else {
        r->status = RUN_HEADER;
    }
    return -1;
}

static int lost(run_t *r, link_plan *lp, int err) {
    r->status = RUN_LOST;
    r->peer = lp->peer;
    r->err = err;
    return -1;
}

/* Fold what has arrived of a reducing receive, a block at a time (all of it once complete). */
static int fold_arrived(run_t *r, recv_op *op, link_state *ls) {
    if (!op->reduce || op->later) return 0;
    Py_ssize_t ready = (Py_ssize_t)ls->got / r->plan->itemsize * r->plan->itemsize;
    Py_ssize_t done = (Py_ssize_t)ls->folded;
    if (ready == op->dst.len || ready - done >= REDUCE_BLOCK) {
        span stage = {op->stage, 0, op->dst.len};
        if (fold(r, op->acc, stage, op->dst, done, ready - done) < 0) return -1;
        ls->folded = (size_t)ready;
    }
    return 0;
}

/* Receive until the socket is empty or the link's frames of this step have arrived. */
static int recv_some(run_t *r, step_plan *st, link_plan *lp, link_state *ls) {
    while (ls->recv_i < lp->nrecvs) {
        recv_op *op = &st->recvs[lp->recvs[ls->recv_i]];
        uint8_t *dest = op->reduce ? r->base[op->stage] : r->base[op->dst.buf] + op->dst.off;
        size_t size = (size_t)op->dst.len;
        if (ls->hdr_got < AR_HEADER_SIZE) {
            ssize_t n;
            int both = ls->hdr_got == 0 && size <= SMALL_FRAME;
            if (both) {  /* header and payload in one syscall */
                struct iovec iov[2] = {{ls->header, AR_HEADER_SIZE}, {dest, size}};
                struct msghdr msg = {0};
                msg.msg_iov = iov;
                msg.msg_iovlen = size ? 2 : 1;
                n = recvmsg(lp->fd, &msg, MSG_DONTWAIT);
            } else {
                n = recv(lp->fd, ls->header + ls->hdr_got, AR_HEADER_SIZE - ls->hdr_got, MSG_DONTWAIT);
            }
            if (n == 0) return lost(r, lp, 0);
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                return lost(r, lp, errno);
            }
            r->moved++;
            if (both) {
                ls->hdr_got = (size_t)n < AR_HEADER_SIZE ? (size_t)n : AR_HEADER_SIZE;
                ls->got = (size_t)n > AR_HEADER_SIZE ? (size_t)n - AR_HEADER_SIZE : 0;
            } else {
                ls->hdr_got += (size_t)n;
            }
            if (ls->hdr_got < AR_HEADER_SIZE) continue;
            if (memcmp(ls->header, op->want, AR_HEADER_SIZE) != 0 && unexpected(r, lp, ls, op->want, dest) < 0)
                return -1;
            if (ls->got && fold_arrived(r, op, ls) < 0) return -1;
        }
        while (ls->got < size) {
            ssize_t n = recv(lp->fd, dest + ls->got, size - ls->got, MSG_DONTWAIT);
            if (n == 0) return lost(r, lp, 0);
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                return lost(r, lp, errno);
            }
            ls->got += (size_t)n;
            r->moved++;
            if (fold_arrived(r, op, ls) < 0) return -1;
        }
        if (size == 0 && fold_arrived(r, op, ls) < 0) return -1;
        ls->recv_i++;
        ls->hdr_got = ls->got = ls->folded = 0;
    }
    return 0;
}

/* A send failed: as the Python engine, read on (the frames still expected, then an ABORT that may
 * wait unread) so that a peer's own reason wins over the bare loss. */
static int send_failed(run_t *r, step_plan *st, link_plan *lp, link_state *ls) {
    int err = r->err;
    if (recv_some(r, st, lp, ls) < 0) return -1;
    if (ls->hdr_got == 0) {
        ssize_t n = recv(lp->fd, ls->header, AR_HEADER_SIZE, MSG_DONTWAIT);
        ar_header h;
        if (n == AR_HEADER_SIZE && ar_header_parse(ls->header, AR_HEADER_SIZE, &h) == AR_FRAME_OK &&
            h.kind == AR_KIND_ABORT) {
            r->peer = lp->peer;
            memcpy(r->header, ls->header, AR_HEADER_SIZE);
            read_reason(r, lp->fd, NULL, 0, (size_t)h.nbytes);
            r->status = RUN_ABORT;
            return -1;
        }
    }
    r->status = RUN_SEND;
    r->err = err;
    r->peer = lp->peer;
    return -1;
}

/* ---- one step ---------------------------------------------------------------------------------- */

static int copies(run_t *r, step_plan *st) {
    for (int i = 0; i < st->ncopies; i++) {
        copy_op *op = &st->copies[i];
        if (!op->reduce) {
            memmove(r->base[op->dst.buf] + op->dst.off, r->base[op->src.buf] + op->src.off, (size_t)op->src.len);
        } else if (fold(r, op->acc, op->src, op->dst, 0, op->src.len) < 0) {
            return -1;
        }
    }
    return 0;
}

static int link_done(link_plan *lp, link_state *ls) { return ls->send_i == lp->nsends && ls->recv_i == lp->nrecvs; }

/* The error at the deadline names the first link still receiving, else the first still sending. */
static int timed_out(run_t *r, step_plan *st) {
    link_state *states = r->plan->states;
    int pick = -1;
    for (int i = 0; i < st->nlinks && pick < 0; i++)
        if (states[i].recv_i < st->links[i].nrecvs) pick = i;
    r->waiting_recv = pick >= 0;
    for (int i = 0; i < st->nlinks && pick < 0; i++)
        if (!link_done(&st->links[i], &states[i])) pick = i;
    r->status = RUN_TIMEOUT;
    r->peer = st->links[pick].peer;
    return -1;
}

/* Whether a rank whose links are quiet retries at once for ``spin`` seconds rather than sleep in poll
 * (a peer's answer due within microseconds would otherwise have to wake it). A score counts how
 * often spinning paid off lately: a spin that ends with bytes moving scores one, one that runs out
 * loses two; below SPIN_SCORE a rank sleeps at once but for every 16th wait, which probes again.
 * One late peer costs one spin; a busy machine, where the peer is rarely on a core when expected,
 * soon stops the spinning that would take the core from it. */
#define SPIN_SCORE 4
#define SPIN_SCORE_MAX 16

static int may_spin(PlanObject *p) {
    return p->spin > 0 && (p->spin_score >= SPIN_SCORE || (++p->spin_probe & 15) == 0);
}

static void spun(PlanObject *p, int won) {
    p->spin_score = won ? (p->spin_score < SPIN_SCORE_MAX ? p->spin_score + 1 : SPIN_SCORE_MAX)
                        : (p->spin_score > 2 ? p->spin_score - 2 : 0);
}

/* Progress every link of the step until all are done. Each pass tries the links poll found ready
 * (all of them on the first pass, and while spinning). */
static int progress(run_t *r, step_plan *st) {
    PlanObject *p = r->plan;
    link_state *states = p->states;
    struct pollfd *polls = p->polls;
    double quiet_since = now_s();
    int try_all = 1, spinning = 0, spin_ok = may_spin(p);
    for (;;) {
        int busy = 0;
        unsigned long before = r->moved;
        for (int i = 0; i < st->nlinks; i++) {
            link_plan *lp = &st->links[i];
            link_state *ls = &states[i];
            if (link_done(lp, ls)) continue;
            short ready = try_all ? (POLLIN | POLLOUT) : polls[i].revents;
            if (ready & (POLLERR | POLLHUP | POLLNVAL)) ready |= POLLIN | POLLOUT;  /* the syscall says why */
            if (ls->send_i < lp->nsends && (ready & POLLOUT) && send_some(r, st, lp, ls) < 0)
                return r->status == RUN_SEND ? send_failed(r, st, lp, ls) : -1;
            if (ls->recv_i < lp->nrecvs && (ready & POLLIN) && recv_some(r, st, lp, ls) < 0)
                return -1;
            if (!link_done(lp, ls)) busy = 1;
        }
        if (r->moved != before && spinning) spun(p, 1);
        if (!busy) return 0;
        double now = now_s();
        if (now >= r->deadline) return timed_out(r, st);
        if (r->moved != before) {
            quiet_since = now;
            if (spinning) spin_ok = may_spin(p);
            spinning = 0;
        } else if (r->idle != Py_None && now - quiet_since >= r->idle_every) {
            if (call_idle(r) < 0) return -1;
            quiet_since = now = now_s();
        }
        if (spin_ok && now - quiet_since < p->spin) {
            spinning = try_all = 1;
            sched_yield();  /* a process waiting for this core runs first */
            continue;
        }
        if (spinning) spun(p, 0);
        spinning = try_all = 0;
        spin_ok = 0;  /* until bytes move again */
        for (int i = 0; i < st->nlinks; i++) {
            polls[i].fd = link_done(&st->links[i], &states[i]) ? -1 : st->links[i].fd;  /* poll skips fd -1 */
            polls[i].events = (short)((states[i].send_i < st->links[i].nsends ? POLLOUT : 0) |
                                      (states[i].recv_i < st->links[i].nrecvs ? POLLIN : 0));
            polls[i].revents = 0;
        }
        double wait = r->deadline - now;
        if (r->idle != Py_None && r->idle_every - (now - quiet_since) < wait) wait = r->idle_every - (now - quiet_since);
        if (wait > SIGNAL_S) wait = SIGNAL_S;
        if (wait < 0) wait = 0;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        int got = ppoll(polls, (nfds_t)st->nlinks, &ts, NULL);
        if (got <= 0) {
            for (int i = 0; i < st->nlinks; i++) polls[i].revents = 0;
            if ((got == 0 || errno == EINTR) && check_signals(r) < 0) return -1;
        } else {
            spin_ok = may_spin(p);  /* the next quiet spell may spin again */
        }
    }
}

/* Fold the step's later receives, in the schedule's order, once all of them have arrived. */
static int later_folds(run_t *r, step_plan *st) {
    for (int i = 0; i < st->nrecvs; i++) {
        recv_op *op = &st->recvs[i];
        if (op->reduce && op->later) {
            span stage = {op->stage, 0, op->dst.len};
            if (fold(r, op->acc, stage, op->dst, 0, op->dst.len) < 0) return -1;
        }
    }
    return 0;
}

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
            if (rd->bad || fds[op->peer] < 0 || (op->reduce && op->stage < 0)) return rd->bad = 1, 0;
            memcpy(op->want, template, AR_HEADER_SIZE);
            ar_header_stamp(op->want, st->index, 0, (uint64_t)op->dst.len);
        }
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
            span stage = {op->stage, 0, op->dst.len};
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
    r.deadline = now_s() + timeout;
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
    drop_gil(&r);
    for (int s = 0; s < p->nsteps; s++) {
        step_plan *st = &p->steps[s];
        for (int i = 0; i < st->nsends; i++)
            ar_header_stamp(st->sends[i].header, st->index, (uint32_t)seq, (uint64_t)st->sends[i].src.len);
        for (int i = 0; i < st->nrecvs; i++)
            ar_header_stamp(st->recvs[i].want, st->index, (uint32_t)seq, (uint64_t)st->recvs[i].dst.len);
        memset(p->states, 0, sizeof(link_state) * (size_t)st->nlinks);
        if (copies(&r, st) < 0 || progress(&r, st) < 0 || later_folds(&r, st) < 0) {
            r.step = s;
            failed = st;
            break;
        }
    }
    take_gil(&r);
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
        PyModule_AddIntConstant(m, "RUN_SEND", RUN_SEND) < 0 ||
        PyModule_AddIntConstant(m, "RUN_EXCEPTION", RUN_EXCEPTION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
