"""A process group: the facade over the runtime that runs its calls in issue order.

Every call takes one path: it is claimed for its thread (:mod:`.claims`), refused if the group
cannot run it (:mod:`.life`), numbered, planned once per shape (:mod:`.choice`: the algorithm, and
the engine that runs it), then run inline or on the progress thread (:mod:`.queue`), with a
heartbeat that names the ranks that did not arrive (:mod:`.health`). What a call passes through
(usable, claimed, numbered, begun, freed) is one object, the group's call state
(:mod:`..engines.callstate`), which those parts read and write and a compiled shortcut drives directly;
a blocking call of a shape run before goes straight to its shortcut (:mod:`.shortcuts`).
Point-to-point messages do not use the queue: the group's messenger (:mod:`..p2p`) matches them by
source and tag on links of its own, so a receive posted before its send never waits behind it (see
:meth:`ProcessGroup.point_to_point`).

Mismatched calls are caught by the fingerprint in every frame header (see :mod:`..wire`) and line,
or, where ranks wait on each other without a frame, by comparing the fingerprints they publish
(:meth:`.health.Health.inspect`). Both include the algorithm and everything else that shapes the
schedule: ranks that would run different schedules can exchange frames of the same sizes and return
different wrong sums.

Any communication error breaks the group for good, as in NCCL: the peers are told why (ABORT frames,
and the store under ``failed/{rank}``, for a peer that only sees the connection close), links are
closed, and every later call raises :class:`GroupBroken` naming the first failure. So does any other
exception that escapes a collective mid-way (``KeyboardInterrupt``, a signal handler's): the peers are
mid-step with it, and a frame half sent must never be followed by the next call's.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, cast
from collections.abc import Callable

import numpy as np

from ..dtypes import resolve
from ..errors import AllreduceError, Interrupted, Mismatch, Revoked
from ..ops import ReduceOp
from ..p2p import Messenger, P2PWork
from ..algorithms.lines import LineLimits
from ..engines import Call, Planned, Resumable
from ..engines.callstate import call_state, compiled
from ..planner import determinism
from ..rendezvous.store import Store
from ..settings import Settings
from ..topology import Topology, from_host_ids
from ..transport import Transport
from ..transport.shm import ShmOptions
from ..work import Work
from .choice import Choice, lines_engine, schedule_engine
from .claims import Claims
from .health import Health
from .life import Life, State
from .queue import Job, WorkQueue
from .request import Request
from .shortcuts import Shape, Shortcuts


_groups: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()  # this process's groups, disowned in a fork() child


def _disown_in_child() -> None:
    for group in list(_groups):
        group.disown()


def _retire_every_shortcut() -> None:
    """The determinism mode switched: a remembered shortcut may run the other mode's plan."""
    for group in list(_groups):
        group.shortcuts.retire_all()


os.register_at_fork(after_in_child=_disown_in_child)
determinism.on_switch(_retire_every_shortcut)


class ProcessGroup:
    """Ranks ``0..size-1`` joined by a transport; see the module docstring.

    ``ranks`` are the members' ranks in the world group (for messages and ``get_global_rank``).
    """

    def __init__(self, store: Store, rank: int, size: int, transport: Transport, timeout: float,
                 name: str = "default", ranks: list[int] | None = None, topology: Topology | None = None,
                 intra: str = "tcp", settings: Settings | None = None, p2p: Messenger | None = None,
                 shm_options: ShmOptions | None = None):
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.name = name
        self.ranks = list(ranks) if ranks is not None else list(range(size))
        self.topology = topology or from_host_ids(rank, [""] * size)  # which ranks share a host
        self.intra = intra  # the transport between ranks of one host: "tcp" or "shm"
        self.settings = settings or Settings()  # what the environment asked for when the group formed
        self.shm_options = shm_options  # likewise, for the shared-memory transport (None: its defaults)
        self.transport = transport
        # The lines serve automatic calls where every member is on this host and no timeline traces schedules.
        lines = transport.lines if not self.settings.timeline else None
        on_lines, self.engine = lines_engine(lines, self.settings)  # the engine that runs the lines, and why
        schedules, self.schedules_engine = schedule_engine(transport, self.settings)  # likewise for the schedules
        limits = LineLimits(lines.at_once, lines.chunked_max, lines.capacity) if lines is not None else None
        self._choice = Choice(name, self.topology, intra, self.settings, schedules, on_lines, limits, self.ranks[rank])
        self._lock = threading.RLock()  # guards the life, claims, queue and numbering (the hot path takes it bare)
        self._cv = threading.Condition(self._lock)
        self._calls = call_state(self.settings, self._lock.acquire, self._lock.release)  # the state calls pass through
        self._life = Life(rank, size, name, self._calls)
        self._queue = WorkQueue(self._lock, self._cv, self._execute, self._life.stopping, name, f"rank {rank}/{size}",
                                self._calls)
        self._claims = Claims(rank, size, name, self._calls)
        self._health = Health(store, rank, size, min(1.0, timeout / 5), self._life.stopping, name, self._calls)
        # blocking calls of a shape already run, which calls.py hands straight to their shortcut
        self.shortcuts = Shortcuts(self._calls, self._lock, self._queue, timeout)
        self.compiled = on_lines is not None and compiled(self._calls)  # whether its shortcuts may be compiled
        self._threads = [self._queue.thread, self._health.thread]
        for thread in self._threads:
            thread.start()
        self._calls.progress = self._queue.thread.ident or 0  # (started: it has one)
        self.p2p = p2p  # point-to-point messages: their own links and thread (see point_to_point)
        if p2p is not None:
            p2p.on_failure = self.p2p_failed
        self.pid = os.getpid()  # the process that formed it: the only one that may use or close it
        self.membership = None  # its members' lifelines (.membership.Membership), where it has them
        _groups.add(self)

    def disown(self) -> None:
        """This process is a fork() child of :attr:`pid`: its links, segments and threads are the parent's,
        so every call (destroy included) raises ``RuntimeError`` and nothing here touches them."""
        why = (f"rank {self.rank}/{self.size}: process group '{self.name}' was formed in process {self.pid}, "
               f"and this process ({os.getpid()}) is a fork() of it: a forked child cannot use or destroy its "
               "parent's groups; fork before forming any, or start it with multiprocessing's 'spawn' method")
        self._life.disown(why)
        if self.p2p is not None:
            self.p2p.disown(why)

    def check_owner(self) -> None:
        """``RuntimeError`` in a fork() child of :attr:`pid` (see :meth:`disown`)."""
        self._life.check_owner()

    @property
    def forked(self) -> bool:
        """Whether this process is a fork() child of the one that formed the group (see :meth:`disown`)."""
        return self._life.foreign is not None

    @property
    def is_revoked(self) -> bool:
        """Whether a member revoked the group (see :meth:`revoke`)."""
        return isinstance(self._life.failure, Revoked)

    @property
    def healthy(self) -> bool:
        """False once a collective has failed and broken the group."""
        return self._life.failure is None

    # ---- issuing ---------------------------------------------------------------------------------

    def collective(self, request: Request, async_op: bool = False) -> Work | None:
        """Run ``request`` after every call issued before it (see the module docstring).

        Raises what the call raises; ``RuntimeError`` for a call from a second thread or a Work
        callback, :class:`GroupBroken` on a broken or destroyed group, ``ValueError`` for an unknown
        algorithm (all before anything is sent).
        """
        if not self._calls.usable:  # read unlocked: a fork child must not take a lock its parent may have held
            self._life.check_owner()
        with self._lock:
            self._claims.claim(request.collective, threading.get_ident())
            if not self._calls.usable:
                raise self._life.refusal()
            epoch = determinism.epoch
            planned = self._choice.planned(request.collective, request.algorithm, request.count, request.dtype,
                                           request.op, request.root)
            key = Shape.of(request)
            if key is not None:
                self.shortcuts.remember(key, planned, epoch)
            seq = self._calls.number()
            if self._queue.inline(async_op):
                job = None
            else:
                job = Job(seq, planned, request.buffers, request.after)
                self._queue.put(job)
        if job is None:
            self._queue.run_inline(seq, planned, request.buffers, request.after)
            return None
        return self._queue.handed_off(job, async_op)

    @property
    def issued(self) -> int:
        """How many collectives this rank has issued on the group (the next is number ``issued + 1``)."""
        return self._calls.issued

    def refused(self, collective: str, reason: str, issued: int) -> None:
        """This rank refused its arguments to ``collective`` before issuing it: tell the peers, so that one
        waiting in that call raises :class:`Mismatch` naming this rank, the call and ``reason`` instead
        of waiting to its deadline. No number is consumed, so where every rank refused alike the group
        stays usable. ``issued``: :attr:`issued` before the call began; if a call was issued since, the
        refusal is not of the call the peers wait in, and nothing is told."""
        with self._lock:
            if issued != self._calls.issued or not self._calls.usable:
                return
            seq = issued + 1
            self.shortcuts.retire_all()  # the next call takes the general path, which says at once that it began
        self._health.refused(seq, f"{collective}: {reason}")

    def algorithm_for(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype,
                      in_rank_order: bool = False) -> str:
        """The algorithm a call of ``nbytes`` runs (see :meth:`.choice.Choice.algorithm_for`)."""
        return self._choice.algorithm_for(collective, algorithm, nbytes, dtype, in_rank_order)

    def algorithm_of(self, collective: str, count: int, dtype: np.dtype, op: ReduceOp = ReduceOp.SUM,
                     root: int = 0) -> str:
        """The algorithm an automatic call of this shape runs: the one its planned call names (what
        ``allreduce bench`` reports as ``auto:NAME``, and errors and logs name)."""
        return self._choice.planned(collective, None, count, resolve(dtype), op, root).call.algorithm

    def point_to_point(self, buffer: np.ndarray | None, peer: int | None, tag: int | None, sending: bool,
                       exact: bool = True) -> P2PWork:
        """``isend`` (``sending=True``) of ``buffer`` to ``peer``, or ``irecv`` into it from ``peer``
        (``None``: any rank) with ``tag`` (``None``: any, receives only), on the group's point-to-point
        engine (:mod:`..p2p`): matched by source and tag, never queued behind collectives nor they behind it.

        Raises:
            GroupBroken: the group failed or was destroyed.
        """
        self._life.check_owner()
        with self._cv:
            self._life.check()
        if self.p2p is None:
            raise RuntimeError(f"rank {self.rank}/{self.size}: process group '{self.name}' was formed without "
                               "point-to-point links")
        if sending:
            assert buffer is not None and peer is not None and tag is not None  # a send names all three
            return self.p2p.isend(buffer, peer, tag)
        return self.p2p.irecv(buffer, peer, tag, exact)

    def p2p_failed(self, error: AllreduceError) -> None:
        """The point-to-point messenger failed with ``error``: the group is broken too (as after a failed
        collective; told to the peers through the store, and by ABORT frames when no collective runs)."""
        self._break_from_outside(error, cut_short=False)

    def revoke(self) -> None:
        """Break this group here and on every member (ULFM's ``MPI_Comm_revoke``), for a rank that learned of
        a failure: a member blocked in a collective of it raises :class:`Revoked` within a heartbeat interval
        (1 s at most) instead of waiting out its deadline, and every later call raises too. The survivors may
        still call :func:`allreduce.failed_ranks`, :func:`allreduce.agree`, :func:`allreduce.shrink_group`
        and destroy it. Needs the members' lifelines (groups of :func:`allreduce.init_process_group`)."""
        self._life.check_owner()
        error = Revoked(f"rank {self.rank}/{self.size}: process group '{self.name}' was revoked by its "
                        f"rank {self.rank}")
        self.revoked(error)
        if self.membership is not None:
            self.membership.revoke(str(error))

    def revoked(self, error: Revoked) -> None:
        """A member revoked the group (this one, or a peer over its lifeline): break it with ``error``, and cut
        short the collective running, at its next quiet heartbeat. A group broken already is revoked too:
        its later calls say so."""
        with self._cv:
            if self._life.state is State.BROKEN:
                self._life.fail(error)
                return
        self._break_from_outside(error, cut_short=True)

    def _break_from_outside(self, error: AllreduceError, cut_short: bool) -> None:
        """Break an open group from another thread than the one running its calls: with ``cut_short``, the
        running collective raises ``error`` at its next heartbeat; without, it is left to end on its own."""
        with self._cv:
            if self._life.state is not State.OPEN:  # broken already, or being destroyed
                return
            self._life.fail(error)
            idle = self._queue.idle
            if cut_short:
                self._health.interrupt = error
        message = f"{type(error).__name__}: {error}"
        self._health.report(message)
        if idle:  # no later call starts; a running one ends on its own, or at its heartbeat
            self.transport.abort(message)

    # ---- running ---------------------------------------------------------------------------------

    def _execute(self, seq: int, planned: Planned, buffers: dict[str, np.ndarray], after: Callable[[], None] | None,
                 begun: Any = None) -> None:
        """Run call ``seq`` on its engine (inline or on the progress thread), then what follows it; or go on
        with a run a compiled shortcut ``begun`` (claimed, numbered and recorded as started already)."""
        call = planned.call
        if begun is None:
            if self._life.failure is not None:
                raise self._life.broken()
            self._health.begin(seq, call)
        try:
            if begun is None:
                planned.run(buffers, seq, self.timeout, self._health.inspect, self._health.interval)
            else:
                resumed = cast(Resumable, planned)  # only a compiled plan's shortcut begins a run
                resumed.resume(begun, buffers, seq, self.timeout, self._health.inspect, self._health.interval)
        except Interrupted as exc:
            self._fail(exc, seq, call)
            assert exc.__cause__ is not None  # Interrupted is always raised from the caller's exception
            raise exc.__cause__ from None  # the caller's own exception, as it was raised
        except AllreduceError as exc:
            raise self._fail(exc, seq, call) from exc
        if self._calls.conflict is not None:  # another thread issued while this ran: its pairing cannot be trusted
            raise self._fail(Mismatch(f"{call.collective} #{seq} overlapped a call from another thread: "
                                      f"{self._calls.conflict}"), seq, call)
        if after is not None:
            after()

    def _fail(self, exc: AllreduceError, seq: int, call: Call) -> AllreduceError:
        """Word the error for the user, break the group and tell the peers why (the store first, so that a
        peer that sees the links close can read why)."""
        error = self._health.failed(exc, seq, call)
        self._life.fail(error)
        message = f"{type(error).__name__}: {error}"
        self.transport.abort(message)
        if self.p2p is not None:
            self.p2p.abort(message)
        return error

    # ---- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Finish queued work, stop the threads and close every link (``RuntimeError`` in a fork() child)."""
        self._life.check_owner()
        with self._cv:
            if self._life.state in (State.CLOSING, State.CLOSED):
                return
            self._life.move(State.CLOSING)
            self._queue.wake()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._cv:
            self._life.move(State.CLOSED)
        self._choice.close()
        if self.p2p is not None:
            self.p2p.close()
        self.transport.close()
