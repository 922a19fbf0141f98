"""Horovod's ``join``: ranks that ran out of data keep answering the reductions of those that did not.

Every reduction of the Horovod layer on a *channel* (the global process set's group, and the gradient
group of each :func:`DistributedOptimizer` built after ``hvd.init``) is preceded by an *agreement*:
a SUM all-reduce of six int64s, ``[1, kind, count, dtype, op, wire dtype]``. Ranks still computing
contribute their request; a rank inside :func:`join` contributes zeros. The sum tells a joined rank how
many ranks are active and, divided by that, which reduction they run: it runs the same collectives
on the op's identity (zeros for sums and Adasum), so the active ranks get the result of their own
contributions, Average still dividing by the group size as Horovod does. A round whose first
element is 0 means that every rank has joined, and ``join`` returns.

The agreement also catches active ranks that ask for different reductions (``Mismatch``), as Horovod's
coordinator reports mismatched shapes. Its price is one 48-byte all-reduce per reduction (a fused
bucket of the optimizer is one reduction). Only reductions are served: a joined rank takes no part in
broadcast, allgather, alltoall or reducescatter (Horovod refuses them with a joined rank too), so a
rank calling one then fails with ``Mismatch``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import api
from ...errors import Mismatch
from ...ops import ReduceOp

from ..common import dtypes, reduction
from ..common.compression import Cast, Compression
from . import adasum

REDUCE, ADASUM = 1, 2  # the kinds of reduction: reduction.start, adasum.start


@dataclass(frozen=True)
class Request:
    """One reduction, as the agreement describes it."""

    kind: int  # REDUCE or ADASUM
    count: int  # elements of the flat buffer
    dtype: torch.dtype  # of the buffer
    op: ReduceOp  # for REDUCE (Adasum: SUM, unused)
    wire: torch.dtype  # the compressor's wire dtype for ``dtype``

    def header(self, active: int = 1) -> torch.Tensor:
        """The agreement's sum when ``active`` ranks make this request (1: this rank's share)."""
        codes = [self.kind, self.count, dtypes.code_of(self.dtype), int(self.op), dtypes.code_of(self.wire)]
        return torch.tensor([active] + [active * c for c in codes], dtype=torch.int64)


class Channel:
    """A group that :func:`join` serves, with ``submit(fn, *args) -> Future`` running ``fn`` on the
    thread that owns the group (``None``: the caller's thread owns it)."""

    def __init__(self, group, submit=None):
        self.group = group
        self.submit = submit
        self.rounds = 0  # agreements so far: the same count on every rank


_CHANNELS: list[Channel] = []


def enable(world) -> None:
    """Open the channel of the global process set (``hvd.init``); later optimizers open theirs."""
    _CHANNELS[:] = [Channel(world)]


def disable() -> None:
    """Close every channel (``hvd.shutdown``)."""
    _CHANNELS.clear()


def open_channel(group, submit) -> Channel | None:
    """A channel for ``group`` (owned by ``submit``'s thread), or ``None`` outside ``hvd.init``."""
    if not _CHANNELS:
        return None
    channel = Channel(group, submit)
    _CHANNELS.append(channel)
    return channel


def close_channel(channel: Channel | None) -> None:
    if channel in _CHANNELS:
        _CHANNELS.remove(channel)


def channel_of(group) -> Channel | None:
    """The channel whose group is ``group``, if any."""
    return next((c for c in _CHANNELS if c.group is group), None)


def agree(channel: Channel | None, request: Request) -> None:
    """Tell joined ranks which reduction comes next (nothing to do without a channel).

    Raises:
        Mismatch: the active ranks asked for different reductions.
    """
    if channel is None:
        return
    total = request.header()
    api.all_reduce(total, ReduceOp.SUM, channel.group)
    channel.rounds += 1
    if not torch.equal(total, request.header(int(total[0]))):
        g = channel.group
        raise Mismatch(f"rank {g.rank}/{g.size}: ranks of group '{g.name}' asked for different reductions: this rank "
                       f"for {request}, the {int(total[0])} active ranks' requests sum to {total.tolist()}")


def join() -> int:
    """Serve other ranks' reductions until every rank has joined; return the rank that joined last
    (the one that took part in the most reductions before joining; ties: the highest rank).

    Raises:
        ValueError: ``hvd.init()`` has not been called.
    """
    if not _CHANNELS:
        raise ValueError("Horovod has not been initialized; use hvd.init()")
    world = _CHANNELS[0].group
    ticket = sum(c.rounds for c in _CHANNELS)
    futures = [c.submit(_serve, c) for c in _CHANNELS[1:]]
    _serve(_CHANNELS[0])
    for future in futures:
        future.result()
    last = torch.tensor([ticket * world.size + world.rank], dtype=torch.int64)
    api.all_reduce(last, ReduceOp.MAX, world)
    return int(last) % world.size


def _serve(channel: Channel) -> None:
    """Answer agreements with zeros, and take part in each reduction they announce, until all have joined."""
    g = channel.group
    while True:
        total = torch.zeros(6, dtype=torch.int64)
        api.all_reduce(total, ReduceOp.SUM, g)
        channel.rounds += 1
        active = int(total[0])
        if active == 0:
            return
        codes = (total[1:] // active).tolist()
        known = all(dtypes.known(c) for c in codes[2::2])
        if not known or not torch.equal(total[1:], total[1:] // active * active):
            raise Mismatch(f"rank {g.rank}/{g.size} (joined): the {active} active ranks of group '{g.name}' asked "
                           f"for different reductions; their requests sum to {total.tolist()}")
        kind, count, dtype, op, wire = codes
        _contribute(Request(kind, count, dtypes.dtype_of(dtype), ReduceOp(op), dtypes.dtype_of(wire)), g)


def _contribute(request: Request, group) -> None:
    """Run ``request``'s collectives with the identity of its op as this rank's share."""
    flat = torch.full((request.count,), _identity(request.op, request.dtype), dtype=request.dtype)
    compressor = Compression.none if request.wire == request.dtype else Cast(request.wire)
    if request.kind == ADASUM:
        adasum.reduce(flat, [request.count], compressor, group)
        return
    work, finish = reduction.start(flat, compressor, request.op, group)
    if work is not None:
        work.wait()
    finish()


def _identity(op: ReduceOp, dtype: torch.dtype):
    """The value that leaves ``op``'s result unchanged (0 for sums and Adasum)."""
    if op is ReduceOp.PRODUCT:
        return 1
    if op not in (ReduceOp.MIN, ReduceOp.MAX):
        return 0
    if dtype == torch.bool:
        return op is ReduceOp.MIN
    if dtype.is_floating_point:
        return float("inf") if op is ReduceOp.MIN else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if op is ReduceOp.MIN else info.min
