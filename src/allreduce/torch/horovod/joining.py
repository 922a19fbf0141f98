"""Horovod's ``join``: ranks that ran out of data keep answering the reductions of those that did not.

On the global process set, ``join`` is negotiated like every Horovod operation
(:mod:`.negotiation`): a joined rank runs each reduction the others agree on with the op's identity as
its share (:func:`contribute`), so the active ranks get the result of their own contributions, Average
still dividing by the set's size as Horovod does.

The gradient group of each :func:`DistributedOptimizer` built after ``hvd.init`` is a *channel*: each
of its reductions is preceded by an *agreement*, a SUM all-reduce of six int64s, ``[1, kind, count,
dtype, op, wire dtype]``. Ranks still computing contribute their request; a rank inside :func:`join`
contributes zeros. The sum tells a joined rank how many ranks are active and, divided by that, which
reduction they run. A round whose first element is 0 means that every rank has joined. The agreement
also catches active ranks that ask for different reductions (``Mismatch``). Its price is one 48-byte
all-reduce per reduction (a fused bucket of the optimizer is one reduction).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import torch

from ... import api
from ...errors import Mismatch
from ...ops import ReduceOp

from ..common import dtypes, reduction
from ..common.compression import Cast, Compression
from . import adasum

REDUCE, ADASUM = 1, 2  # the kinds of reduction: reduction.start, adasum.start


@dataclass(frozen=True)
class Reduction:
    """One reduction, as the agreement describes it."""

    kind: int  # REDUCE or ADASUM
    count: int  # elements of the flat buffer
    dtype: torch.dtype  # of the buffer
    op: ReduceOp  # for REDUCE (Adasum: SUM, unused)
    wire: torch.dtype  # the compressor's wire dtype for ``dtype``

    def header(self, active: int = 1) -> torch.Tensor:
        """The agreement's sum when ``active`` ranks make this request (1: this rank's share)."""
        return torch.tensor([active] + [active * c for c in describe(self)], dtype=torch.int64)


def describe(request: Reduction) -> list[int]:
    """``request`` as five ints (what an agreement sums, what a negotiation announces)."""
    return [request.kind, request.count, dtypes.code_of(request.dtype), int(request.op), dtypes.code_of(request.wire)]


def parse(codes: list[int]) -> Reduction:
    """The request that :func:`describe` gave ``codes`` for."""
    kind, count, dtype, op, wire = codes
    return Reduction(kind, count, dtypes.dtype_of(dtype), ReduceOp(op), dtypes.dtype_of(wire))


class Channel:
    """A group that :func:`join` serves, with ``submit(fn, *args) -> Future`` running ``fn`` on the
    thread that owns the group (``None``: the caller's thread owns it)."""

    def __init__(self, group, submit=None):
        self.group = group
        self.submit = submit


_CHANNELS: list[Channel] = []


def enable(world) -> None:
    """Start serving joins (``hvd.init``: the global process set's group); later optimizers open channels."""
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


def agree(channel: Channel | None, request: Reduction) -> None:
    """Tell joined ranks which reduction comes next (nothing to do without a channel).

    Raises:
        Mismatch: the active ranks asked for different reductions.
    """
    if channel is None:
        return
    total = request.header()
    api.all_reduce(total, ReduceOp.SUM, channel.group)
    if not torch.equal(total, request.header(int(total[0]))):
        g = channel.group
        raise Mismatch(f"rank {g.rank}/{g.size}: ranks of group '{g.name}' asked for different reductions: this rank "
                       f"for {request}, the {int(total[0])} active ranks' requests sum to {total.tolist()}")


def join(serve_world: Callable[[], int]) -> int:
    """Serve other ranks' reductions until every rank has joined: the optimizers' channels here, the
    global process set by ``serve_world()``, whose answer (the rank that joined last) is returned.

    Raises:
        ValueError: ``hvd.init()`` has not been called.
    """
    if not _CHANNELS:
        raise ValueError("Horovod has not been initialized; use hvd.init()")
    futures = [c.submit(_serve, c) for c in _CHANNELS[1:]]
    last = serve_world()
    for future in futures:
        future.result()
    return last


def _serve(channel: Channel) -> None:
    """Answer agreements with zeros, and take part in each reduction they announce, until all have joined."""
    g = channel.group
    while True:
        total = torch.zeros(6, dtype=torch.int64)
        api.all_reduce(total, ReduceOp.SUM, g)
        active = int(total[0])
        if active == 0:
            return
        codes = (total[1:] // active).tolist()
        known = all(dtypes.known(c) for c in codes[2::2])
        if not known or not torch.equal(total[1:], total[1:] // active * active):
            raise Mismatch(f"rank {g.rank}/{g.size} (joined): the {active} active ranks of group '{g.name}' asked "
                           f"for different reductions; their requests sum to {total.tolist()}")
        contribute(parse(codes), g)


def contribute(request: Reduction, group) -> None:
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
