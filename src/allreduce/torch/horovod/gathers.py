"""Horovod's gathers on torch tensors: ``allgather`` (ranks may differ in dim 0), ``alltoall`` (with
splits), and ``allgather_object``.

Every call is negotiated first (:mod:`.negotiation`): the ranks pair it up by ``name`` and agree on
the dtype and all but the first dimension of each tensor (``broadcast``-style ``Mismatch`` on every
rank if not). ``allgather`` then all-gathers every rank's row count, then the rows, each rank's padded
to the longest, and concatenates the real ones in rank order. ``alltoall`` first exchanges the split
sizes (each rank learns how many rows every other rank sends it), then the rows. A grouped call is one
negotiated operation.

``allgather`` and ``alltoall`` are differentiable as in Horovod: ``allgather``'s gradient is this
rank's rows of the averaged output gradient, ``alltoall``'s is the output gradient sent back.
"""

from __future__ import annotations

import math

import torch

from ... import api
from ...objects import all_gather_object

from . import negotiation
from .basics import Average, Sum
from .handles import Pending, register, synchronize
from .reductions import grouped_allreduce, resolve_op
from .process_sets import global_process_set, group_of

def _start_allgather(tensor: torch.Tensor, group) -> tuple[Pending, list[int]]:
    """Begin one tensor's all-gather over ``group`` (agreed already): ``(pending, rows of every rank)``."""
    n = group.size
    rows = torch.empty(n, dtype=torch.int64)
    api.all_gather_into_tensor(rows, torch.tensor([tensor.shape[0]], dtype=torch.int64), group=group)
    rows = rows.tolist()
    per_row, longest = math.prod(tensor.shape[1:]), max(rows)
    send = torch.zeros(longest * per_row, dtype=tensor.dtype)
    send[:tensor.numel()] = tensor.detach().reshape(-1).cpu()
    received = torch.empty(n, longest * per_row, dtype=tensor.dtype)
    work = api.all_gather_into_tensor(received, send, group=group, async_op=True)

    def done() -> torch.Tensor:
        gathered = torch.cat([received[r, :count * per_row] for r, count in enumerate(rows)])
        return gathered.view(sum(rows), *tensor.shape[1:]).to(tensor.device)

    return Pending([work], done), rows


def submit_allgather(tensors, process_set, name=None) -> negotiation.Ticket:
    """Negotiate the all-gather of each of ``tensors``; the ticket's result is ``[(gathered, rows of
    every rank), ...]``.

    Raises:
        ValueError: a tensor of no dimension, or this rank is not in ``process_set``.
    """
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("allgather takes tensors of at least one dimension (it concatenates dim 0)")
    group = group_of(process_set)
    agreed = {"dtypes": [str(t.dtype) for t in tensors], "trailing shapes": [list(t.shape[1:]) for t in tensors]}

    def start() -> Pending:
        started = [_start_allgather(t, group) for t in tensors]
        return Pending([w for p, _ in started for w in p.works], lambda: [(p.finish(), rows) for p, rows in started])

    return negotiation.submit(group, negotiation.Operation("allgather", name, agreed, start))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, process_set, name, *tensors):
        results = submit_allgather(tensors, process_set, name).wait()
        mine = group_of(process_set).rank
        ctx.process_set, ctx.spans = process_set, [(sum(rows[:mine]), rows[mine]) for _, rows in results]
        return tuple(gathered for gathered, _ in results)

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=Average, process_set=ctx.process_set)
        return (None, None, *(g.narrow(0, *span) for g, span in zip(reduced, ctx.spans)))


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (dim 0 may differ by rank).

    Example (two ranks)::

        hvd.allgather(torch.full((rank + 1, 2), rank))   # both: [[0, 0], [1, 1], [1, 1]]

    Raises:
        Mismatch: the ranks disagree on the dtype or the trailing dimensions (on every rank).
    """
    return _Allgather.apply(process_set, name, tensor)[0]


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start :func:`allgather`; ``synchronize(handle)`` returns the concatenation."""
    return register(_Gathered(submit_allgather([tensor], process_set, name)), single=True)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """:func:`allgather` of each tensor, as one operation."""
    return list(_Allgather.apply(process_set, name, *tensors))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Start :func:`grouped_allgather`; ``synchronize(handle)`` returns the list of concatenations."""
    return register(_Gathered(submit_allgather(tensors, process_set, name)))


class _Gathered:
    """An all-gather's ticket whose result is the concatenations alone."""

    def __init__(self, ticket):
        self.ticket = ticket

    def poll(self) -> bool:
        return self.ticket.poll()

    def wait(self) -> list:
        return [gathered for gathered, _ in self.ticket.wait()]


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Start reducing the sparse COO ``tensor`` across the set as Horovod does, by all-gathering its
    indices and values (duplicates add up when the result is coalesced); returns a function that waits
    and returns the sparse result (Horovod's form of the handle).

    Example (two ranks)::

        t = torch.sparse_coo_tensor([[rank]], [1.0], (2,))
        hvd.sparse_allreduce_async(t, name="t", op=hvd.Sum)().to_dense()   # both: tensor([1., 1.])

    Raises:
        ValueError: an op other than Average or Sum.
    """
    op = resolve_op(op)
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async supports Average and Sum (as Horovod), got {op!r}")
    t = tensor.coalesce()
    indices = allgather_async(t.indices().transpose(0, 1).contiguous(), None if name is None else f"{name}.indices",
                              process_set)
    values = allgather_async(t.values(), None if name is None else f"{name}.values", process_set)

    def wait() -> torch.Tensor:
        gathered_values, gathered_indices = synchronize(values), synchronize(indices)
        if op is Average:
            gathered_values = gathered_values / len(process_set.ranks)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, t.size())

    return wait


def submit_alltoall(tensor: torch.Tensor, splits, process_set, name=None) -> negotiation.Ticket:
    """Negotiate :func:`alltoall`; the ticket's result is ``(output, received_splits)``.

    Raises:
        ValueError: splits that are not one non-negative row count per rank summing to dim 0, or no
            splits and a dim 0 that does not divide by the set's size.
    """
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension (it splits dim 0)")
    group = group_of(process_set)
    n, rows = group.size, tensor.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall without splits needs dim 0 ({rows}) divisible by the set's size {n}")
        sent = [rows // n] * n
    else:
        sent = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sent) != n or min(sent) < 0 or sum(sent) != rows:
            raise ValueError(f"splits must be {n} non-negative row counts summing to dim 0 ({rows}), got {sent}")
    agreed = {"dtype": str(tensor.dtype), "trailing shape": list(tensor.shape[1:])}

    def start() -> Pending:
        counts = torch.empty(n, dtype=torch.int64)
        api.all_to_all_single(counts, torch.tensor(sent, dtype=torch.int64), group=group)
        received = counts.tolist()
        output = torch.empty(sum(received), *tensor.shape[1:], dtype=tensor.dtype)
        work = api.all_to_all_single(output, tensor.detach().contiguous().cpu(), received, sent, group=group,
                                     async_op=True)
        return Pending([work], lambda: (output.to(tensor.device), torch.tensor(received, dtype=torch.int32)))

    return negotiation.submit(group, negotiation.Operation("alltoall", name, agreed, start))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, process_set, name):
        output, received = submit_alltoall(tensor, splits, process_set, name).wait()
        ctx.process_set, ctx.received = process_set, received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _):
        return submit_alltoall(grad, ctx.received, ctx.process_set).wait()[0], None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send ``splits[j]`` rows of ``tensor`` (dim 0, in order) to rank ``j`` of ``process_set``, and
    return the rows received, in rank order; with ``splits``, also the int32 row counts received.
    Without ``splits`` dim 0 is split equally.

    Example (two ranks)::

        out, got = hvd.alltoall(torch.arange(3) + 10 * rank, splits=[1, 2] if rank == 0 else [2, 1])
        # rank 0: out [0, 10, 11], got [1, 2]; rank 1: out [1, 2, 12], got [2, 1]
    """
    output, received = _Alltoall.apply(tensor, splits, process_set, name)
    return output if splits is None else (output, received)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start :func:`alltoall`; ``synchronize(handle)`` returns ``(output, received_splits)``."""
    return register(submit_alltoall(tensor, splits, process_set, name))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable ``obj``, in rank order.

    Example (two ranks)::

        hvd.allgather_object({"rank": rank})   # both: [{'rank': 0}, {'rank': 1}]
    """
    group = group_of(process_set)
    gathered = [None] * group.size

    def start() -> Pending:
        all_gather_object(gathered, obj, group=group)
        return Pending([], lambda: gathered)

    return negotiation.run(group, negotiation.Operation("allgather_object", name, {}, start))
