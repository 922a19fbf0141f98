/* How one step of a compiled schedule runs on the links, the GIL released (types in tcpsteps.h).
 *
 * A step's copies run first; then every send and receive of the step progresses at once on the
 * links' non-blocking sockets, in one poll loop: header and payload leave in one sendmsg, a receive
 * lands straight in its destination (a small frame's header and payload in one recvmsg), and a
 * receive that reduces lands in a staging buffer and is folded into its destination in blocks as
 * it arrives; receives marked later are folded after the step, in the schedule's order. Every
 * expected header is compared whole before its payload is used; a peer's ABORT is read. The
 * deadline, the idle hook every ``idle_every`` quiet seconds and signals (on EINTR and at least
 * every SIGNAL_S) are honoured here; nothing is raised: a failure is left in the run_t.
 *
 * Folds use the shared kernels (kernels.h) where they have the call's op and dtype and the spans
 * do not partly overlap; otherwise the Python fold given at planning (numpy's ufunc), GIL taken.
 */
#include "tcpsteps.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

double tcp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of Python's time.monotonic() */
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- running with the GIL taken for a moment ----------------------------------------------- */

void tcp_take_gil(run_t *r) { PyEval_RestoreThread(r->thread); }
void tcp_drop_gil(run_t *r) { r->thread = PyEval_SaveThread(); }

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
    tcp_take_gil(r);
    int bad = PyErr_CheckSignals() < 0 ? failed_with_exception(r) : 0;
    tcp_drop_gil(r);
    return bad;
}

static int call_idle(run_t *r) {
    tcp_take_gil(r);
    PyObject *got = PyObject_CallNoArgs(r->idle);
    int bad = got == NULL ? failed_with_exception(r) : 0;
    Py_XDECREF(got);
    tcp_drop_gil(r);
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
    tcp_take_gil(r);
#define OBJECT(i) ((i) < 2 ? r->caller[i] : PyTuple_GET_ITEM(p->bound, (i) - 2))
    PyObject *got = PyObject_CallFunction(p->fold, "OnOnOnn", OBJECT(a.buf), a.off + from, OBJECT(b.buf), b.off + from,
                                          OBJECT(out.buf), out.off + from, nbytes);
#undef OBJECT
    int bad = got == NULL ? failed_with_exception(r) : 0;
    Py_XDECREF(got);
    tcp_drop_gil(r);
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
    double until = tcp_now() + ABORT_READ_S;
    while (have < nbytes) {
        ssize_t n = recv(fd, r->reason + have, nbytes - have, MSG_DONTWAIT);
        if (n > 0) {
            have += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
        double left = until - tcp_now();
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

/* Fold what has arrived of a reducing receive, a block at a time (all of it once complete, and all
 * of it before the ring wraps: payload byte ``i`` lands at ``i % ring`` of the stage, and a read
 * never crosses the ring's end, so what is not yet folded lies in one piece). */
static int fold_arrived(run_t *r, recv_op *op, link_state *ls) {
    if (!op->reduce || op->later) return 0;
    Py_ssize_t ready = (Py_ssize_t)ls->got / r->plan->itemsize * r->plan->itemsize;
    Py_ssize_t done = (Py_ssize_t)ls->folded;
    if (ready == op->dst.len || ready - done >= REDUCE_BLOCK || (ready > done && ready % op->ring == 0)) {
        span stage = {op->stage, done % op->ring - done, op->ring};  /* fold() adds ``done`` back */
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
            size_t at = ls->got, want = size - at;
            if (op->reduce) {  /* into the ring, up to its end */
                at %= (size_t)op->ring;
                if (want > (size_t)op->ring - at) want = (size_t)op->ring - at;
            }
            ssize_t n = recv(lp->fd, dest + at, want, MSG_DONTWAIT);
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
 * often spinning paid off lately (only steps of small frames spin: a large one's next bytes come
 * as the kernel moves them, and a spinning rank would take the core that does it): a spin that ends with bytes moving scores one, one that runs out
 * loses two; below SPIN_SCORE a rank sleeps at once but for every 16th wait, which probes again.
 * One late peer costs one spin; a busy machine, where the peer is rarely on a core when expected,
 * soon stops the spinning that would take the core from it. */

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
    double quiet_since = tcp_now();
    int try_all = 1, spinning = 0, spin_ok = st->small && may_spin(p);
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
        double now = tcp_now();
        if (now >= r->deadline) return timed_out(r, st);
        if (r->moved != before) {
            quiet_since = now;
            if (spinning) spin_ok = st->small && may_spin(p);
            spinning = 0;
        } else if (r->idle != Py_None && now - quiet_since >= r->idle_every) {
            if (call_idle(r) < 0) return -1;
            quiet_since = now = tcp_now();
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
            spin_ok = st->small && may_spin(p);  /* the next quiet spell may spin again */
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

int tcp_step(run_t *r, step_plan *st) {
    return copies(r, st) < 0 || progress(r, st) < 0 || later_folds(r, st) < 0 ? -1 : 0;
}
