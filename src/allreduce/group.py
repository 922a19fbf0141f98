"""A process group: its ranks, its links, its sequence numbers and the queue its collectives run in.

Collectives run strictly in the order they are issued. A synchronous call on an idle group runs
right in the caller's thread (no hand-off, the lowest latency); anything issued while work is queued,
and every ``async_op=True`` call, goes through the group's progress thread, so the caller can compute
meanwhile. A small heartbeat thread publishes which collective this rank has reached, so that a rank
that times out can say which ranks never arrived (the stall report). Point-to-point messages do not
use the queue: the group's engine (:mod:`.p2p`) matches them by source and tag on links of its own,
so a receive posted before its send never waits behind it (see :meth:`ProcessGroup.point_to_point`).

A small collective among ranks that all share one host skips the planner, the schedule and the
executor: it runs its call shape's ready plan on the shared-memory lines (:mod:`.fastpath`), numbered
and queued like any other call. Whether a call takes the lines depends only on what every rank knows
alike (the group, the call's shape, the settings), never on timing or on the queue.

Mismatched calls are caught by the fingerprint in every frame header (see :mod:`.wire`) and line, or,
where ranks wait on each other without a frame, by comparing the fingerprints they publish. Both include the
algorithm and everything else that shapes the schedule (see :func:`_prepare`): ranks that would run
different schedules can exchange frames of the same sizes and return different wrong sums. The root of a
broadcast or scatter receives nothing, so a root that disagreed with the others would return as if
all were well: its collective therefore ends with one empty frame from the next rank, whose header
the root checks (see :func:`_confirmed`).

Any communication error breaks the group for good, as in NCCL: the peers are told why (ABORT frames,
and the store under ``failed/{rank}``, for a peer that only sees the connection close), links are
closed, and every later call raises :class:`GroupBroken` naming the first failure. So does any other
exception that escapes a collective mid-way (``KeyboardInterrupt``, a signal handler's): the peers are
mid-step with it, and a frame half sent must never be followed by the next call's.

Any thread may use a group, one thread at a time (torch's contract). Calls issued from two threads
at once would be numbered in a different order on different ranks and pair up wrongly, silently: so
a call from one thread while another thread's calls are in flight raises ``RuntimeError`` in the late
thread before anything is sent, and the calls in flight fail instead of returning (the group breaks,
peers are told), so that no rank keeps a result paired across threads. A call from a :class:`Work`
callback, which runs on the progress thread where a blocking call would wait for itself, raises too.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading

import numpy as np

from . import algorithms, collectives, fastpath, logs, planner, wire
from .planner import determinism
from .algorithms.schedule import Recv, Region, Schedule, Send
from .errors import AllreduceError, CommTimeout, GroupBroken, Interrupted, Mismatch, PeerLost
from .executor import Call, Executor
from .p2p import Engine, P2PWork
from .settings import Settings
from .ops import ReduceOp, finish as finish_op
from .topology import Topology, from_host_ids
from .transport import Transport
from .work import Work

_log = logs.get("planner")
STORE_GRACE = 1.0  # seconds a store call may take off a collective's path (heartbeat, error report)


class ProcessGroup:
    """Ranks ``0..size-1`` joined by a transport; see the module docstring.

    ``ranks`` are the members' ranks in the world group (for messages and ``get_global_rank``).
    """

    def __init__(self, store, rank: int, size: int, transport: Transport, timeout: float,
                 name: str = "default", ranks: list[int] | None = None, topology: Topology | None = None,
                 intra: str = "tcp", settings: Settings | None = None, p2p: Engine | None = None):
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.name = name
        self.ranks = list(ranks) if ranks is not None else list(range(size))
        self.topology = topology or from_host_ids(rank, [""] * size)  # which ranks share a host
        self.intra = intra  # the transport between ranks of one host: "tcp" or "shm"
        self.settings = settings or Settings()  # what the environment asked for when the group formed
        hosts = self.topology.hosts
        self._prepared = _prepare({"hosts": hosts})  # registry entry -> (options the group supplies, digest)
        self._hierarchical = len(hosts) > 1 and self.topology.uniform and len(hosts[0]) > 1
        self._executor = Executor(transport)
        if logs.DETAIL:  # ALLREDUCE_DEBUG=DETAIL: log every collective (when off, this costs nothing per call)
            self._executor = logs.TimedExecutor(self._executor, self.ranks[rank])
        self._issuer: int | None = None  # the thread whose calls are in flight; no other may issue meanwhile
        self._in_flight = 0  # calls issued and not yet finished
        self._conflict: RuntimeError | None = None  # set when two threads issued at once: the calls in flight fail
        self._lock = threading.RLock()  # self._cv's lock: the hot path takes it without the Condition's wrapper
        self._cv = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._busy = False
        self._closed = False
        self._broken: AllreduceError | None = None
        self._seq = 0
        self._started: tuple[int, Call] | None = None  # (seq, call) of the last collective this rank began
        # The small-message path (see fastpath), where every member is on this host, no algorithm is forced and
        # no timeline traces the schedules: its plans by call shape (None: the shape does not take it), and the
        # calls that took it so far.
        lines = self.settings.algorithm == "auto" and not self.settings.timeline
        self._lines = getattr(transport, "lines", None) if lines else None
        self._plans: dict[tuple, fastpath.Plan | None] = {}
        self._numbered = 0
        self._interval = min(1.0, timeout / 5)  # heartbeat period, and quiet time before inspecting peers
        self._choices: dict[tuple, str] = {}  # the algorithm chosen per call shape, decided once per group
        self._seen: tuple[int, dict] = (0, {})  # (seq, peers' states) at the last inspection, for the stall report
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._progress_loop, name=f"allreduce-{name}-progress", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name=f"allreduce-{name}-heartbeat", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.p2p = p2p  # point-to-point messages: their own links and thread (see point_to_point)
        if p2p is not None:
            p2p.on_failure = self.p2p_failed

    @property
    def healthy(self) -> bool:
        """False once a collective has failed and broken the group."""
        return self._broken is None

    # ---- issuing ---------------------------------------------------------------------------------

    def collective(self, collective: str, buffers: dict[str, np.ndarray], count: int, dtype: np.dtype,
                   op: ReduceOp = ReduceOp.SUM, root: int = 0, algorithm: str | None = None,
                   after=None, async_op: bool = False) -> Work | None:
        """Run ``collective`` with the chosen algorithm's schedule on ``buffers`` (a small call among
        ranks of one host: on the lines, see the module docstring).

        ``after()`` runs once the schedule is done: copy-outs of list-shaped APIs, and AVG's division
        (see :func:`finish_reduction`).
        """
        usable = self._broken is None and not self._closed  # else the checks below say why not
        if self._lines is not None and usable and (algorithm is None or algorithm == "auto"):
            plan = self._plans.get((collective, count, dtype, op, root), False)
            if plan is False:
                plan = self._plan_lines(collective, count, dtype, op, root)
            if plan is not None:
                return self._run_lines(plan, buffers, after, async_op)
        self._claim(collective)
        try:
            ordered = collectives.get(collective).reduces and determinism.required(self.settings, op, dtype)
            name = self.algorithm_for(collective, algorithm, count * dtype.itemsize, dtype, ordered)
            entry = algorithms.get(collective, name)
            options, digest = self._prepared[entry]
            if collectives.get(collective).root_sends_only and self.size > 1:
                schedule = _confirmed(entry, self.rank, self.size, count, root, **options)
            else:
                schedule = entry(self.rank, self.size, count, root=root, **options)
            with self._cv:
                self._seq += 1
                call = Call(collective, self._seq, name, dtype, op, count, root, digest)
        except BaseException:
            self._release()
            raise
        return self._submit(call, schedule, buffers, after, async_op)

    def _plan_lines(self, collective: str, count: int, dtype: np.dtype, op: ReduceOp,
                    root: int) -> fastpath.Plan | None:
        """The lines' plan for this call shape (``None``: it takes the schedules), remembered."""
        if len(self._plans) > 4096:
            self._plans.clear()
        plan = fastpath.plan(self._lines, collective, count, dtype, op, root)
        if plan is not None and logs.DETAIL:  # as the executor: logged only when DETAIL asks, at no cost otherwise
            plan = logs.TimedPlan(plan, self.ranks[self.rank])
        self._plans[(collective, count, dtype, op, root)] = plan
        return plan

    def _run_lines(self, plan: fastpath.Plan, buffers, after, async_op: bool) -> Work | None:
        """:meth:`collective` on the lines: numbered in turn with every other call, run inline when the
        group is idle, else queued behind the calls in flight (the path never depends on timing)."""
        me = threading.get_ident()
        with self._lock:
            if self._in_flight or self._broken is not None or self._closed or me == self._threads[0].ident:
                self._claim_locked(plan.call.collective, me)  # the checks in full: they may raise
                try:
                    self._check_usable()
                except GroupBroken:
                    self._in_flight -= 1
                    raise
            else:  # an idle, usable group, called from an application thread: what the checks would do
                self._issuer, self._in_flight = me, 1
            self._seq += 1
            seq, work = self._seq, (plan, self._numbered + 1)
            self._numbered += plan.numbers
            inline = not async_op and not self._busy and not self._queue
            if inline:
                self._busy = True
        if inline:
            return self._run_inline(seq, plan.call, work, buffers, after)
        return self._submit(dataclasses.replace(plan.call, seq=seq), work, buffers, after, async_op, queue=True)

    def algorithm_for(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype,
                      in_rank_order: bool = False) -> str:
        """The planner's choice, except that an automatic all-reduce over several hosts of several
        ranks each is hierarchical (inside hosts, then across them, then inside again). With
        ``in_rank_order`` (deterministic mode), only an algorithm that reduces in rank order.

        Remembered per call shape: the planner reads the environment and the cost profile, which is
        too slow to repeat for every small collective.
        """
        key = (collective, algorithm, nbytes, dtype, in_rank_order)
        name = self._choices.get(key)
        if name is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            name = self._choices[key] = self._plan(collective, algorithm, nbytes, dtype, in_rank_order)
            _log.info("group %s: %s of %d bytes (%s) runs %s", self.name, collective, nbytes, dtype, name)
        return name

    def _plan(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype, in_rank_order: bool) -> str:
        if (self._hierarchical and collective == "all_reduce" and algorithm in (None, "auto")
                and self.settings.algorithm == "auto" and not in_rank_order):
            return "hierarchical"
        return planner.choose(collective, algorithm, nbytes, self.size, hosts=len(self.topology.hosts), dtype=dtype,
                              transport=self.intra, forced=self.settings.algorithm, profile=self.settings.profile,
                              cache_home=self.settings.cache_home, in_rank_order=in_rank_order)

    def point_to_point(self, buffer: np.ndarray | None, peer: int | None, tag: int | None, sending: bool,
                       exact: bool = True) -> P2PWork:
        """``isend`` (``sending=True``) of ``buffer`` to ``peer``, or ``irecv`` into it from ``peer``
        (``None``: any rank) with ``tag`` (``None``: any, receives only), on the group's point-to-point
        engine (:mod:`.p2p`): matched by source and tag, never queued behind collectives nor they behind it.

        Raises:
            GroupBroken: the group failed or was destroyed.
        """
        with self._cv:
            self._check_usable()
        if self.p2p is None:
            raise RuntimeError(f"rank {self.rank}/{self.size}: process group '{self.name}' was formed without "
                               "point-to-point links")
        if sending:
            return self.p2p.isend(buffer, peer, tag)
        return self.p2p.irecv(buffer, peer, tag, exact)

    def p2p_failed(self, error: AllreduceError) -> None:
        """The point-to-point engine failed with ``error``: the group is broken too (as after a failed
        collective; told to the peers through the store, and by ABORT frames when no collective runs)."""
        with self._cv:
            if self._broken is not None or self._stop.is_set():  # broken already, or being destroyed
                return
            self._broken = error
            idle = not self._busy and not self._queue
        message = f"{type(error).__name__}: {error}"
        try:
            self.store.within(STORE_GRACE).set(f"failed/{self.rank}", message.encode()[:4096])
        except Exception:  # the store may be gone; the ABORT frames still carry the reason
            pass
        if idle:  # a running collective is left to end on its own; no later one starts
            self._executor.transport.abort(message)

    def _claim(self, collective: str) -> None:
        """Count a call in flight for this thread, or raise if it comes from a Work callback or while
        another thread's calls are in flight (see the module docstring)."""
        with self._cv:
            self._claim_locked(collective, threading.get_ident())

    def _claim_locked(self, collective: str, me: int) -> None:
        """:meth:`_claim` with ``self._cv`` held, for thread ``me``."""
        if me == self._threads[0].ident:
            raise self._wrong_thread(collective, "from a Work callback, which runs on the group's progress "
                                     "thread: a blocking call there would wait for itself. Issue it once the "
                                     "work is done, from the thread that issued it")
        if self._in_flight and self._issuer != me:
            other = next((f"'{t.name}'" for t in threading.enumerate() if t.ident == self._issuer), "another")
            self._conflict = self._wrong_thread(
                collective, f"from thread '{threading.current_thread().name}' while thread {other} has calls in "
                "flight on it: calls from two threads at once pair up in different orders on different ranks. "
                "Use a group from one thread at a time, or give each thread its own group (new_group())")
            raise self._conflict
        self._issuer = me
        self._in_flight += 1

    def _release(self) -> None:
        with self._cv:
            self._in_flight -= 1

    def _submit(self, call: Call, work, buffers, after, async_op: bool, queue: bool = False) -> Work | None:
        """Run ``work`` (a schedule, or a lines plan and number) inline on an idle group, else queue it;
        ``queue``: it is counted in flight and checked usable already, queue it."""
        with self._cv:
            if not queue:
                try:
                    self._check_usable()
                except GroupBroken:
                    self._in_flight -= 1
                    raise
            inline = not queue and not async_op and not self._busy and not self._queue
            if inline:
                self._busy = True
            else:
                future: concurrent.futures.Future = concurrent.futures.Future()
                self._queue.append((call, work, buffers, after, future))
                self._cv.notify_all()
        if inline:
            return self._run_inline(call.seq, call, work, buffers, after)
        work = Work(future, f"rank {self.rank}/{self.size}: {call.collective} #{call.seq}", self._threads[0].ident)
        if async_op:
            return work
        work.wait()
        return None

    # ---- running ---------------------------------------------------------------------------------

    def _run_inline(self, seq: int, call: Call, work, buffers, after) -> None:
        """Run call ``seq`` in the caller's thread (the group was idle and is marked busy), then free the group."""
        try:
            self._execute(seq, call, work, buffers, after)
        finally:
            with self._lock:
                self._busy = False
                self._in_flight -= 1
                if self._queue:  # wake the progress thread only when it has work
                    self._cv.notify_all()

    def _execute(self, seq: int, call: Call, work, buffers, after) -> None:
        """Run call ``seq``: ``work`` is a schedule for the executor, or a lines plan and number (whose
        ``call`` carries no ``seq``: it is made with the right one only for an error)."""
        if self._broken is not None:
            raise self._broken_error()
        self._started = (seq, call)
        try:
            if type(work) is tuple:
                work[0].run(buffers, work[1], seq, self.timeout, self._inspect_started, self._interval)
            else:
                self._executor.run(work, buffers, call, self.timeout, self._inspect_started, self._interval)
        except Interrupted as exc:
            self._fail(exc, seq, call)
            raise exc.__cause__ from None  # the caller's own exception, as it was raised
        except AllreduceError as exc:
            raise self._fail(exc, seq, call) from exc
        if self._conflict is not None:  # another thread issued while this ran: its pairing cannot be trusted
            raise self._fail(Mismatch(f"{call.collective} #{seq} overlapped a call from another thread: "
                                      f"{self._conflict}"), seq, call)
        if after is not None:
            after()

    def _progress_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue or self._busy:
                    if self._stop.is_set() and not self._queue:
                        return
                    self._cv.wait()
                call, work, buffers, after, future = self._queue.popleft()
                self._busy = True
            try:
                if future.set_running_or_notify_cancel():
                    self._execute(call.seq, call, work, buffers, after)
                    future.set_result(None)
            except BaseException as exc:  # delivered to whoever waits on the work
                future.set_exception(exc)
            finally:
                with self._cv:
                    self._busy = False
                    self._in_flight -= 1
                    self._cv.notify_all()

    def _heartbeat_loop(self) -> None:
        published = None
        while not self._stop.wait(self._interval):
            started = self._started
            if started is not None and started is not published:
                try:  # bounded: a frozen store host must hold neither this thread nor close()
                    record = f"{started[0]}|{_describe(started[1])}".encode()
                    self.store.within(STORE_GRACE).set(f"progress/{self.rank}", record)
                    published = started
                except CommTimeout:  # a slow or frozen store host: try again at the next beat
                    continue
                except Exception:  # the store may be gone at shutdown; the report is best effort
                    return

    @staticmethod
    def _peer_state(store, rank: int) -> tuple[int, str] | None:
        """(sequence number, description) of the last collective ``rank`` published, if any."""
        key = f"progress/{rank}"
        if not store.check([key]):
            return None
        seq, _, what = store.get(key).decode().partition("|")
        return int(seq), what

    def _peer_states(self, store) -> dict[int, tuple[int, str] | None]:
        """Every peer's :meth:`_peer_state`, read through ``store``: a bounded view of the group's."""
        return {rank: self._peer_state(store, rank) for rank in range(self.size) if rank != self.rank}

    def _inspect_started(self) -> None:
        """While stuck in the collective begun last: raise :class:`Mismatch` if a peer is in a different
        collective #seq.

        What it saw is kept for the stall report, should the store be gone by the deadline.
        """
        seq, call = self._started
        try:
            states = self._peer_states(self.store.within(self._interval))  # late by an interval at most
        except Exception:  # no store, no verdict: the collective still ends at its deadline
            return
        self._seen = (seq, states)
        ours = _describe(call)
        for rank, state in states.items():
            if state is not None and state[0] == seq and state[1] != ours:
                raise Mismatch(f"rank {rank} called a different collective or arguments: {state[1]} #{seq}, while "
                               f"this rank called {ours} #{seq}")

    # ---- failure ---------------------------------------------------------------------------------

    def _fail(self, exc: AllreduceError, seq: int, call: Call) -> AllreduceError:
        """Word the error for the user, break the group and tell the peers why.

        The reason the peers are told (ABORT frames, the store) starts with the error's kind, so that a
        peer of a rank that found a mismatch raises :class:`Mismatch` too: it made the mismatched call.
        """
        text = f"rank {self.rank}/{self.size}: {exc}"
        store = self.store.within(STORE_GRACE)  # the whole report, even with the store's host frozen
        if isinstance(exc, CommTimeout):
            text += self._stall_report(seq, call.collective, store)
        elif isinstance(exc, PeerLost) and " aborted: " not in text:
            text += self._peer_failure(getattr(exc, "peer", None), store)
        kind = Mismatch if isinstance(exc, PeerLost) and ": Mismatch: rank " in text else type(exc)
        error = kind(text)
        error.peer = getattr(exc, "peer", None)
        self._broken = error
        message = f"{kind.__name__}: {text}"
        try:  # before the links close, so that a peer that sees them close can read why
            store.set(f"failed/{self.rank}", message.encode()[:4096])
        except Exception:  # the store may be gone too; the ABORT frames still carry the reason
            pass
        self._executor.transport.abort(message)
        if self.p2p is not None:
            self.p2p.abort(message)
        return error

    def _peer_failure(self, peer: int | None, store) -> str:
        """Why ``peer`` gave up, if it said so in the store: a closed link alone cannot tell."""
        try:
            if peer is None or not store.check([f"failed/{peer}"]):
                return ""
            return f"; rank {peer} had failed: " + store.get(f"failed/{peer}").decode(errors="replace")
        except Exception:  # no store, no reason
            return ""

    def _stall_report(self, seq: int, collective: str, store) -> str:
        """Which ranks have not reached collective #``seq``, from their heartbeats in ``store``."""
        try:
            states = self._peer_states(store)
        except Exception:  # the store is gone (its host may have failed first): the last inspection's view
            states = self._seen[1] if self._seen[0] == seq else {}
        behind = []
        for rank, state in states.items():
            if state is None:
                behind.append(f"{rank} (no collective yet)")
            elif state[0] < seq:
                behind.append(f"{rank} (last at {state[1]} #{state[0]})")
        if not behind:
            return ""
        return f"; ranks that have not reached {collective} #{seq}: " + ", ".join(behind)

    def _wrong_thread(self, collective: str, why: str) -> RuntimeError:
        return RuntimeError(f"rank {self.rank}/{self.size}: {collective} on process group '{self.name}' {why}")

    def _check_usable(self) -> None:
        if self._closed:
            raise GroupBroken(f"rank {self.rank}/{self.size}: process group '{self.name}' was destroyed")
        if self._broken is not None:
            raise self._broken_error()

    def _broken_error(self) -> GroupBroken:
        return GroupBroken(f"rank {self.rank}/{self.size}: process group '{self.name}' is unusable after an "
                           f"earlier failure; destroy it and form a new one. The failure was: {self._broken}")

    # ---- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Finish queued work, stop the threads and close every link."""
        with self._cv:
            if self._closed:
                return
            self._stop.set()
            self._cv.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._cv:
            self._closed = True
        self._plans.clear()
        if self.p2p is not None:
            self.p2p.close()
        self._executor.transport.close()


@functools.lru_cache(maxsize=1024)
def _confirmed(entry: algorithms.Algorithm, rank: int, size: int, count: int, root: int, **options) -> Schedule:
    """The algorithm's schedule plus a last step: an empty frame from the rank after ``root`` to ``root``.

    Its header carries the sender's fingerprint, so a root whose src, collective, count or dtype
    differs from the others' hears of it in this collective instead of never. Cached, so that a
    repeated call gets the same schedule object (the executor caches its plan by schedule).
    """
    schedule = entry(rank, size, count, root=root, **options)
    nothing = Region("tmp", 0, 0)
    if rank == root:
        last = (Recv((root + 1) % size, nothing),)
    elif rank == (root + 1) % size:
        last = (Send(root, nothing),)
    else:
        return schedule
    return Schedule(schedule.steps + (last,), schedule.tmp)


def _describe(call: Call) -> str:
    """A collective as every rank must agree on it, e.g. ``all_reduce(count=10, float32, SUM, ring)``."""
    facts = collectives.get(call.collective)
    op = f", {call.op.name}" if facts.reduces else ""
    root = f", root={call.root}" if facts.rooted else ""
    return f"{call.collective}(count={call.count}, {call.dtype}{op}{root}, {wire.algorithm_label(call.digest)})"


def _prepare(supplies: dict) -> dict[algorithms.Algorithm, tuple[dict, int]]:
    """Every registry entry's ``(options, digest)`` in a group that supplies ``supplies``.

    ``options`` are what the group passes to its schedule (the entry's ``needs``); ``digest`` is the
    :func:`wire.algorithm_digest` of its name, its own options and those, which ranks check agree on.
    Anything else that comes to shape a schedule belongs in here too. Every entry is digested, not
    only those this rank runs, so that a mismatch names the algorithm the peer ran.
    """
    prepared = {}
    for entry in algorithms.ALGORITHMS:
        options = {need: supplies[need] for need in entry.needs}
        label = entry.name + (f"({', '.join(f'{k}={v}' for k, v in entry.options.items())})" if entry.options else "")
        prepared[entry] = options, wire.algorithm_digest(label, repr(sorted(options.items())))
    return prepared



def finish_reduction(op: ReduceOp, result: np.ndarray, size: int):
    """An ``after`` callback that applies what ``op`` still owes to ``result`` (AVG's division)."""
    if op is not ReduceOp.AVG:
        return None
    return lambda: finish_op(op, result, size)
