"""The compiled schedule engine: a planned call's steps over plain TCP links in one C call, GIL released.

It runs exactly what :mod:`.schedules` runs (the same schedule, the same steps worked out once per
call shape, the same frames on the wire), but the whole call is one call into ``native/_tcp.c``:
the steps become a flat program of byte spans when the call is planned, and every run hands the C
side the call's buffers, its sequence number and deadline. Ranks of either engine form one group.

Where a run fails, the C side hands back why (a deadline, a lost link, a header that differs, a
peer's ABORT, the caller's own exception from a signal or the idle hook) and what it left half sent;
this module words the error as the Python engine does (the transport's own words, reworded to name
the collective and step) and gives the half-sent frames back to the transport, whose abort finishes
them before its ABORT. Folds run the compiled kernel where the call's op and dtype have one, else
the op's numpy kernel, called back with the GIL taken.

Only a group whose every link is a plain socket runs here (:meth:`TcpTransport.descriptors`); TLS
links stay on the Python engine.
"""

from __future__ import annotations

import os
import struct
from types import ModuleType
from typing import Any

import numpy as np

from .. import algorithms, wire
from ..algorithms.schedule import Region, Schedule
from ..ops import kernel
from ..transport import Transport
from ..transport.tcp import TcpTransport
from ..transport.tcp.wording import aborted, lost, stalled, unexpected
from .call import Call, Idle, reworded
from .schedules import Scratch, schedule_for, steps_of

_BUFFERS = ("data", "out", "tmp")  # the first entries of a run's buffer table; the staging buffers follow
SPIN_S = 50e-6  # seconds a quiet rank retries at once before it sleeps in poll (native/tcpsteps.c: may_spin)


class NativeTcpEngine:
    """Plans calls as compiled programs for one group's plain TCP links (see the module docstring)."""

    def __init__(self, transport: TcpTransport, module: ModuleType, descriptors: list[int]):
        self.transport = transport
        self.module = module
        self.descriptors = descriptors
        self.scratch = Scratch()
        # Spin briefly before sleeping in poll only where every rank of this host can have a core.
        self.spin = SPIN_S if transport.size <= len(os.sched_getaffinity(0)) else 0.0

    def plan(self, entry: algorithms.Algorithm, call: Call, options: dict[str, Any]) -> NativeScheduled:
        """``call`` as ``entry``'s schedule for this rank, compiled into a program of byte spans."""
        schedule = schedule_for(entry, call, self.transport.rank, self.transport.size, options)
        return NativeScheduled(self, call, schedule)

    def close(self) -> None:
        """Nothing to drop: the links belong to the transport, which closes them."""


class NativeScheduled:
    """A call shape planned on the compiled engine: its program, and the buffers it runs on."""

    __slots__ = ("engine", "call", "schedule", "ufunc", "_plan", "_stages", "_tmp", "_grown")

    def __init__(self, engine: NativeTcpEngine, call: Call, schedule: Schedule):
        self.engine, self.call, self.schedule = engine, call, schedule
        self.ufunc = kernel(call.op, call.dtype)
        program, self._stages = _compiled(steps_of(schedule), call.dtype.itemsize, engine.module.STAGE_RING)
        self._tmp = schedule.tmp * call.dtype.itemsize
        template = wire.encode(call.headers(0)(0, 0))
        self._plan = engine.module.Plan(engine.descriptors, program, template, len(_BUFFERS) + len(self._stages),
                                        call.dtype.itemsize, int(call.op), template[5], self._fold, engine.spin)
        self._grown = -1  # the scratch's growth count when the plan was last bound to it

    def run(self, buffers: dict[str, np.ndarray], seq: int, timeout: float, idle: Idle = None,
            idle_every: float = 1.0) -> None:
        """See :meth:`Planned.run <allreduce.engines.Planned.run>`."""
        scratch = self.engine.scratch
        if self._grown != scratch.grown:  # another call shape grew it: take the new buffers
            self._plan.bind((scratch.tmp(self._tmp), *(scratch.stage(slot, n) for slot, n in enumerate(self._stages))))
            self._grown = scratch.grown
        why = self._plan.run(buffers, seq, timeout, idle, idle_every)
        if why is not None:
            raise self._failure(why, seq, timeout)

    def _fold(self, a: np.ndarray, a_at: int, b: np.ndarray, b_at: int, out: np.ndarray, out_at: int,
              nbytes: int) -> None:
        """``out = a (op) b`` on byte spans of three of the run's arrays: the fold where no compiled kernel is."""
        dtype = self.call.dtype
        self.ufunc(a.view(np.uint8)[a_at:a_at + nbytes].view(dtype), b.view(np.uint8)[b_at:b_at + nbytes].view(dtype),
                   out=out.view(np.uint8)[out_at:out_at + nbytes].view(dtype))

    def _failure(self, why: tuple[Any, ...], seq: int, timeout: float) -> BaseException:
        """The error of a failed run (see the module docstring); the half-sent frames go back to the transport."""
        status, step, peer, detail, half_sent = why
        module, transport = self.engine.module, self.engine.transport
        for to, rest, frame in half_sent:
            transport.unfinished(to, rest, frame)
        if status == module.RUN_TIMEOUT:
            exc: BaseException = stalled(peer, detail)
        elif status in (module.RUN_LOST, module.RUN_SEND):
            exc = lost(peer, OSError(detail, os.strerror(detail)) if detail else None)
        elif status == module.RUN_ABORT:
            exc = aborted(peer, detail.decode("utf-8", "replace") or "no reason given")
        elif status == module.RUN_HEADER:
            got, want = detail
            exc = unexpected(peer, wire.decode(want), got) or RuntimeError("header accepted by Python, not by C")
        else:
            exc = detail
        where = f"{self.call.collective} #{seq} ({self.call.algorithm}, step {step + 1}/{len(self.schedule.steps)})"
        error = reworded(exc, where, timeout)
        error.__cause__ = exc
        return error


def _compiled(steps: tuple[Any, ...], itemsize: int, ring: int) -> tuple[bytes, list[int]]:
    """The program ``_tcp.Plan`` reads (int64s: steps, each its index and counts, then its copies, sends
    and receives as buffer indices and byte spans) and the bytes each staging buffer needs: a receive
    folded as it arrives goes through a ring of at most ``ring`` bytes, one folded after its step
    (``later``) is staged whole."""
    stages: list[int] = []
    words = [len(steps)]

    def span(region: Region | None) -> tuple[int, int]:
        if region is None:
            return -1, 0
        return _BUFFERS.index(region.buf), region.start * itemsize

    for index, copies, sends, recvs in steps:
        words += (index, len(copies), len(sends), len(recvs))
        for src, dst, acc in copies:
            words += (*span(src), *span(dst), src.count * itemsize, *span(acc))
        for peer, src in sends:
            words += (peer, *span(src), src.count * itemsize)
        for slot, (peer, dst, acc, later) in enumerate(recvs):
            stage = -1
            if acc is not None:
                while slot >= len(stages):
                    stages.append(0)
                nbytes = dst.count * itemsize
                stages[slot] = max(stages[slot], nbytes if later else min(nbytes, ring))
                stage = len(_BUFFERS) + slot
            words += (peer, *span(dst), dst.count * itemsize, *span(acc), stage, int(later))
    return struct.pack(f"<{len(words)}q", *words), stages


def engine_for(transport: Transport, module: ModuleType | None) -> NativeTcpEngine | None:
    """The compiled engine for ``transport`` where ``module`` (``native._tcp``) loaded and every link of
    the transport is a plain TCP socket, else ``None`` (the Python engine runs the group)."""
    if module is None or type(transport) is not TcpTransport:
        return None
    descriptors = transport.descriptors()
    return NativeTcpEngine(transport, module, descriptors) if descriptors is not None else None
