"""A process group: its ranks, its links, its sequence numbers and the queue its collectives run in.

Collectives run strictly in the order they are issued. A synchronous call on an idle group runs
right in the caller's thread (no hand-off, the lowest latency); anything issued while work is queued,
and every ``async_op=True`` call, goes through the group's progress thread, so the caller can compute
meanwhile. A small heartbeat thread publishes which collective this rank has reached, so that a rank
that times out can say which ranks never arrived (the stall report).

Mismatched calls are caught by the fingerprint in every frame header (see :mod:`.wire`), or, where
ranks wait on each other without a frame, by comparing the fingerprints they publish. The root of a
broadcast or scatter receives nothing, so a root that disagreed with the others would return as if
all were well: its collective therefore ends with one empty frame from the next rank, whose header
the root checks (see :func:`_confirmed`).

Any communication error breaks the group for good, as in NCCL: the peers are told why (ABORT frames,
and the store under ``failed/{rank}``, for a peer that only sees the connection close), links are
closed, and every later call raises :class:`GroupBroken` naming the first failure.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading

import numpy as np

from . import algorithms, collectives, planner
from .algorithms.schedule import Recv, Region, Schedule, Send
from .errors import AllreduceError, CommTimeout, GroupBroken, Mismatch, PeerLost
from .executor import Call, Executor
from .settings import Settings
from .ops import ReduceOp, finish as finish_op
from .topology import Topology, from_host_ids
from .transport import Transport
from .work import Work


class ProcessGroup:
    """Ranks ``0..size-1`` joined by a transport; see the module docstring.

    ``ranks`` are the members' ranks in the world group (for messages and ``get_global_rank``).
    """

    def __init__(self, store, rank: int, size: int, transport: Transport, timeout: float,
                 name: str = "default", ranks: list[int] | None = None, topology: Topology | None = None,
                 intra: str = "tcp", settings: Settings | None = None):
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
        self._supplies = {"hosts": hosts}  # what an algorithm may need from the group (its ``needs``)
        self._hierarchical = len(hosts) > 1 and self.topology.uniform and len(hosts[0]) > 1
        self._executor = Executor(transport)
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._busy = False
        self._closed = False
        self._broken: AllreduceError | None = None
        self._seq = 0
        self._started: Call | None = None  # the last collective this rank began
        self._interval = min(1.0, timeout / 5)  # heartbeat period, and quiet time before inspecting peers
        self._p2p: collections.Counter = collections.Counter()
        self._choices: dict[tuple, str] = {}  # the algorithm chosen per call shape, decided once per group
        self._seen: tuple[int, dict] = (0, {})  # (seq, peers' states) at the last inspection, for the stall report
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._progress_loop, name=f"allreduce-{name}-progress", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name=f"allreduce-{name}-heartbeat", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def healthy(self) -> bool:
        """False once a collective has failed and broken the group."""
        return self._broken is None

    # ---- issuing ---------------------------------------------------------------------------------

    def collective(self, collective: str, buffers: dict[str, np.ndarray], count: int, dtype: np.dtype,
                   op: ReduceOp = ReduceOp.SUM, root: int = 0, algorithm: str | None = None,
                   after=None, async_op: bool = False) -> Work | None:
        """Run ``collective`` with the chosen algorithm's schedule on ``buffers``.

        ``after()`` runs once the schedule is done: copy-outs of list-shaped APIs, and AVG's division
        (see :func:`finish_reduction`).
        """
        name = self.algorithm_for(collective, algorithm, count * dtype.itemsize, dtype)
        entry = algorithms.get(collective, name)
        options = {need: self._supplies[need] for need in entry.needs}
        if collectives.get(collective).root_sends_only and self.size > 1:
            schedule = _confirmed(entry, self.rank, self.size, count, root, **options)
        else:
            schedule = entry(self.rank, self.size, count, root=root, **options)
        with self._cv:
            self._seq += 1
            call = Call(collective, self._seq, name, dtype, op, count, root)
        return self._submit(call, schedule, buffers, after, async_op)

    def algorithm_for(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype) -> str:
        """The planner's choice, except that an automatic all-reduce over several hosts of several
        ranks each is hierarchical (inside hosts, then across them, then inside again).

        Remembered per call shape: the planner reads the environment and the cost profile, which is
        too slow to repeat for every small collective.
        """
        key = (collective, algorithm, nbytes, dtype)
        name = self._choices.get(key)
        if name is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            name = self._choices[key] = self._plan(collective, algorithm, nbytes, dtype)
        return name

    def _plan(self, collective: str, algorithm: str | None, nbytes: int, dtype: np.dtype) -> str:
        if (self._hierarchical and collective == "all_reduce" and algorithm in (None, "auto")
                and self.settings.algorithm == "auto"):
            return "hierarchical"
        return planner.choose(collective, algorithm, nbytes, self.size, hosts=len(self.topology.hosts), dtype=dtype,
                              transport=self.intra, forced=self.settings.algorithm, profile=self.settings.profile)

    def point_to_point(self, buffer: np.ndarray, peer: int, tag: int, sending: bool, async_op: bool) -> Work | None:
        """``send`` (``sending=True``) or ``recv`` of ``buffer`` with ``peer``; matched in order per pair."""
        region = Region("data", 0, buffer.size)
        op = Send(peer, region) if sending else Recv(peer, region)
        schedule = Schedule(((op,),) if buffer.size else ())
        with self._cv:
            key = ("send" if sending else "recv", peer)
            self._p2p[key] += 1
            call = Call("send", self._p2p[key], "p2p", buffer.dtype, ReduceOp.SUM, buffer.size, tag)
        return self._submit(call, schedule, {"data": buffer}, None, async_op)

    def _submit(self, call: Call, schedule: Schedule, buffers, after, async_op: bool) -> Work | None:
        with self._cv:
            self._check_usable()
            inline = not async_op and not self._busy and not self._queue
            if inline:
                self._busy = True
            else:
                future: concurrent.futures.Future = concurrent.futures.Future()
                self._queue.append((call, schedule, buffers, after, future))
                self._cv.notify_all()
        if inline:
            try:
                self._execute(call, schedule, buffers, after)
            finally:
                with self._cv:
                    self._busy = False
                    if self._queue:  # wake the progress thread only when it has work
                        self._cv.notify_all()
            return None
        work = Work(future, f"rank {self.rank}/{self.size}: {call.collective} #{call.seq}")
        if async_op:
            return work
        work.wait()
        return None

    # ---- running ---------------------------------------------------------------------------------

    def _execute(self, call: Call, schedule: Schedule, buffers, after) -> None:
        if self._broken is not None:
            raise self._broken_error()
        if call.collective != "send":
            self._started = call
        try:
            self._executor.run(schedule, buffers, call, self.timeout, lambda: self._inspect(call), self._interval)
        except AllreduceError as exc:
            raise self._fail(exc, call) from exc
        if after is not None:
            after()

    def _progress_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue or self._busy:
                    if self._stop.is_set() and not self._queue:
                        return
                    self._cv.wait()
                call, schedule, buffers, after, future = self._queue.popleft()
                self._busy = True
            try:
                if future.set_running_or_notify_cancel():
                    self._execute(call, schedule, buffers, after)
                    future.set_result(None)
            except BaseException as exc:  # delivered to whoever waits on the work
                future.set_exception(exc)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _heartbeat_loop(self) -> None:
        published = None
        while not self._stop.wait(self._interval):
            call = self._started
            if call is not None and call is not published:
                try:
                    self.store.set(f"progress/{self.rank}", f"{call.seq}|{_describe(call)}".encode())
                    published = call
                except Exception:  # the store may be gone at shutdown; the report is best effort
                    return

    def _peer_state(self, rank: int) -> tuple[int, str] | None:
        """(sequence number, description) of the last collective ``rank`` published, if any."""
        key = f"progress/{rank}"
        if not self.store.check([key]):
            return None
        seq, _, what = self.store.get(key, timeout=1.0).decode().partition("|")
        return int(seq), what

    def _peer_states(self) -> dict[int, tuple[int, str] | None]:
        return {rank: self._peer_state(rank) for rank in range(self.size) if rank != self.rank}

    def _inspect(self, call: Call) -> None:
        """While stuck in ``call``: raise :class:`Mismatch` if a peer is in a different collective #seq.

        What it saw is kept for the stall report, should the store be gone by the deadline.
        """
        try:
            states = self._peer_states()
        except Exception:  # no store, no verdict: the collective still ends at its deadline
            return
        self._seen = (call.seq, states)
        ours = _describe(call)
        for rank, state in states.items():
            if state is not None and state[0] == call.seq and state[1] != ours:
                raise Mismatch(f"rank {rank} called {state[1]} #{call.seq} while this rank called {ours} #{call.seq}")

    # ---- failure ---------------------------------------------------------------------------------

    def _fail(self, exc: AllreduceError, call: Call) -> AllreduceError:
        """Word the error for the user, break the group and tell the peers why."""
        message = f"rank {self.rank}/{self.size}: {exc}"
        if isinstance(exc, CommTimeout):
            message += self._stall_report(call)
        elif isinstance(exc, PeerLost) and " aborted: " not in message:
            message += self._peer_failure(getattr(exc, "peer", None))
        error = type(exc)(message)
        error.peer = getattr(exc, "peer", None)
        self._broken = error
        try:  # before the links close, so that a peer that sees them close can read why
            self.store.set(f"failed/{self.rank}", message.encode()[:4096])
        except Exception:  # the store may be gone too; the ABORT frames still carry the reason
            pass
        self._executor.transport.abort(message)
        return error

    def _peer_failure(self, peer: int | None) -> str:
        """Why ``peer`` gave up, if it said so in the store: a closed link alone cannot tell."""
        try:
            if peer is None or not self.store.check([f"failed/{peer}"]):
                return ""
            return f"; rank {peer} had failed: " + self.store.get(f"failed/{peer}", timeout=1.0).decode(errors="replace")
        except Exception:  # no store, no reason
            return ""

    def _stall_report(self, call: Call) -> str:
        """Which ranks have not reached collective ``call.seq``, from their heartbeats in the store."""
        try:
            states = self._peer_states()
        except Exception:  # the store is gone (its host may have failed first): the last inspection's view
            states = self._seen[1] if self._seen[0] == call.seq else {}
        behind = []
        for rank, state in states.items():
            if state is None:
                behind.append(f"{rank} (no collective yet)")
            elif state[0] < call.seq:
                behind.append(f"{rank} (last at {state[1]} #{state[0]})")
        if not behind:
            return ""
        return f"; ranks that have not reached {call.collective} #{call.seq}: " + ", ".join(behind)

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
    """A collective as every rank must agree on it, e.g. ``all_reduce(count=10, float32, SUM)``."""
    facts = collectives.get(call.collective)
    op = f", {call.op.name}" if facts.reduces else ""
    root = f", root={call.root}" if facts.rooted else ""
    return f"{call.collective}(count={call.count}, {call.dtype}{op}{root})"


def finish_reduction(op: ReduceOp, result: np.ndarray, size: int):
    """An ``after`` callback that applies what ``op`` still owes to ``result`` (AVG's division)."""
    if op is not ReduceOp.AVG:
        return None
    return lambda: finish_op(op, result, size)
