"""The lines engine in C: the plans of :mod:`.line_plans`, each run by one call into ``allreduce.native._line_plans``.

The compiled plan writes the payload, posts, waits for every peer's line, compares fingerprints,
folds in rank order and copies out with the GIL released, in the Python engine's protocol and with
its bits (the same kernels' results, :mod:`allreduce.native`'s ``kernels.c``). What the C side cannot
decide alone it hands back: it returns ``WAITING`` at the end of each slice (``check_s``) so that
Python looks for a gone peer, calls the idle hook, keeps the deadline and lets signal handlers run,
then resumes it; and ``MISMATCH`` with the rank whose line differs, which Python words as the Python
engine does. A plan also makes the group's *shortcut* for its shape (:meth:`NativePlan.shortcut`): the
claim, numbering and run of a blocking call in one C call, whose endings other than the plain one come
back to :meth:`NativePlan.resume`. A pair the compiled kernels lack (complex PRODUCT), and any call of a
dtype whose items the compiled plans do not know (long double), is planned by the Python lines engine,
which shares this engine's round numbers, so both kinds of plan run in one group.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any
from collections.abc import Callable

import numpy as np

from ..algorithms import Algorithm
from ..dtypes import code_of
from ..errors import CommTimeout, PeerLost, with_peer
from ..transport.shm.layout import line_size
from ..transport.shm.linepath import Lines
from .call import Call, Idle, reworded
from .line_plans import ChunkedPlan, LinesEngine, Plan, described

_REDUCES = ("all_reduce", "reduce")


class NativePlan:
    """One call shape run by the compiled lines (see the module docstring)."""

    __slots__ = ("engine", "call", "numbers", "native", "slice", "_where")

    def __init__(self, engine: NativeLinesEngine, call: Call, chunked: bool):
        self.engine = engine
        self.call = call
        lines, module = engine.lines, engine.module
        header, fingerprint = described(call)
        count = call.count if call.collective != "barrier" else 0
        per_line = lines.capacity // call.dtype.itemsize if chunked else 0
        self.numbers = 2 * -(-count // per_line) if chunked else 1
        self.native = engine.native.plan(module.KINDS[call.collective], code_of(call.dtype), int(call.op), count,
                                         call.root, fingerprint, header, per_line)
        self.slice = engine.slice
        self._where = f"{call.collective} #%d ({call.algorithm})"

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle = None,
            idle_every: float = 1.0) -> None:
        """See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        numbering = self.engine.native
        number = numbering.numbered + 1  # the next line numbers (LinesEngine.take, inlined)
        numbering.numbered += self.numbers
        try:
            state = self.native.run(number, seq, buffers.get("data"), buffers.get("out"), float(timeout), self.slice)
        except self.engine.module.Misaligned:  # refused before anything was posted
            self._run_aligned(number, buffers, seq, timeout, idle, idle_every)
            return
        except BaseException as exc:  # resume words it, as it does a shortcut's
            state = exc
        self.resume(state, buffers, seq, timeout, idle, idle_every)

    def _run_aligned(self, number: int, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle,
                     idle_every: float) -> None:
        """The run on aligned copies of buffers whose items are not aligned (a numpy view at an odd
        offset, say: the kernels take typed pointers), copied back into those the call may write."""
        copies = {name: array.copy() for name, array in buffers.items() if array is not None}
        try:
            state = self.native.run(number, seq, copies.get("data"), copies.get("out"), float(timeout), self.slice)
        except BaseException as exc:
            state = exc
        self.resume(state, copies, seq, timeout, idle, idle_every)
        for name, copy in copies.items():
            if buffers[name].flags.writeable:
                buffers[name][...] = copy

    def resume(self, outcome: int | BaseException, buffers: dict[str, np.ndarray], seq: int, timeout: float,
               idle: Idle = None, idle_every: float = 1.0) -> None:
        """Go on with run ``seq`` from what the compiled run returned (``WAITING``, ``MISMATCH``, ``DONE``)
        or raised, as :meth:`run` does: the shortcut's run hands its endings here."""
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome:
                self._settle(outcome, buffers.get("data"), buffers.get("out"), idle, idle_every)
        except BaseException as exc:
            raise reworded(exc, self._where % seq, timeout) from exc

    def shortcut(self, state: Any, timeout: float, resume: Callable[[int, np.ndarray | None, Any], None]) -> Any:
        """The compiled shortcut of a blocking call of this shape (see ``_line_plans.c``'s Shortcut): it claims
        the group's call ``state`` (the compiled :class:`~.callstate.CallState`) for the calling thread
        where the group is idle and usable and nobody holds its lock, numbers the call, records it as
        begun, takes its line numbers and runs it, handing any ending but the plain one to ``resume(seq,
        data, outcome)``. It refuses every call (``False``) once retired (``retire()``)."""
        return self.native.shortcut(state, self.call, self.numbers, float(timeout), self.slice, resume)

    def _settle(self, state: int, data: np.ndarray | None, out: np.ndarray | None, idle: Idle,
                idle_every: float) -> None:
        """Go on with a run that returned ``WAITING`` or ``MISMATCH`` until it is done, doing at each
        return what the Python engine's wait does: the deadline, the gone-peer check, the idle hook."""
        native, lines, waiting = self.native, self.engine.lines, self.engine.module.WAITING
        quiet = time.monotonic()
        while state:
            if state != waiting:
                raise lines.mismatch(native.peer, native.parity)
            rank, now = native.waiting, time.monotonic()
            if now >= native.deadline:
                raise with_peer(CommTimeout(f"waiting for rank {rank}"), rank)
            reason = lines.gone(rank)
            if reason is not None:  # what it posted before it went still counts
                state = native.resume(data, out, 0.0)
                if state == waiting and native.waiting == rank:
                    raise with_peer(PeerLost(reason), rank)
                continue
            if idle is not None and now - quiet >= idle_every:
                idle()
                quiet = now
            state = native.resume(data, out, self.slice)


class NativeLinesEngine:
    """Plans calls on one group's ``lines`` in C where the compiled kernels reduce the call's pair."""

    def __init__(self, lines: Lines, module: ModuleType):
        self.lines = lines
        self.module = module
        options = lines.options
        self.native = module.Lines(lines.rank, lines.areas(), line_size(lines.capacity), lines.capacity,
                                   options.spin_s, options.spin_max_s, options.awake_s, options.yield_s,
                                   options.sleep_ms / 1000,
                                   lines.crowded)
        self.python = LinesEngine(lines, self.native)  # the plans of pairs C does not reduce: same numbering
        lines.on_close(self.native.close)
        self.slice = max(options.check_s, 1e-3)  # how long a wait stays in C before Python's duties

    def plan(self, entry: Algorithm, call: Call, options: dict[str, Any]) -> NativePlan | Plan | ChunkedPlan:
        """``call`` as a compiled plan of ``entry`` (``lines`` or ``chunked_lines``), or the Python
        engine's where the compiled plans do not know its dtype or the kernels do not reduce it with its op."""
        code = code_of(call.dtype)
        if self.module.itemsize(code) != call.dtype.itemsize or (
                call.collective in _REDUCES and not self.module.supported(code, int(call.op))):
            return self.python.plan(entry, call, options)
        return NativePlan(self, call, entry.name == "chunked_lines")

    def close(self) -> None:
        """Stop every plan touching the lines (the transport unmaps them later)."""
        self.native.close()
