"""Horovod's gathers on torch tensors: ``allgather`` (ranks may differ in dim 0), ``alltoall`` (with
splits), and ``allgather_object``.

``allgather`` first all-gathers every rank's dtype and shape (a fixed header of ``2 + MAX_DIMS``
int64s), so every rank checks that dtypes and all but the first dimension agree and raises the same
``ValueError`` if not; then it all-gathers the rows, each rank's padded to the longest, and
concatenates the real ones in rank order. ``alltoall`` first exchanges the split sizes (each rank
learns how many rows every other rank sends it), then the rows. In the async forms these small first
exchanges run at the call; the bulk transfer is what the handle waits for.

``allgather`` and ``alltoall`` are differentiable as in Horovod: ``allgather``'s gradient is this
rank's rows of the averaged output gradient, ``alltoall``'s is the output gradient sent back.
"""

from __future__ import annotations

import math

import torch

from ... import api
from ...objects import all_gather_object

from ..common import dtypes
from .basics import Average
from .handles import Pending, register
from .reductions import allreduce
from .process_sets import global_process_set, group_of

MAX_DIMS = 16  # dimensions an allgathered tensor may have (the shape header is fixed-size)


def start_allgather(tensor: torch.Tensor, process_set) -> tuple[Pending, list[int]]:
    """Begin :func:`allgather`: ``(pending, rows of every rank)``.

    Raises:
        ValueError: a rank-0 or too high-dimensional tensor; ranks whose dtypes or trailing dims differ.
    """
    if not 1 <= tensor.dim() <= MAX_DIMS:
        raise ValueError(f"allgather takes tensors of 1 to {MAX_DIMS} dimensions, got {tensor.dim()}")
    group = group_of(process_set)
    n = group.size
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
    header[0], header[1] = dtypes.code_of(tensor.dtype), tensor.dim()
    header[2:2 + tensor.dim()] = torch.tensor(tensor.shape)
    headers = torch.empty(n, header.numel(), dtype=torch.int64)
    api.all_gather_into_tensor(headers, header, group=group)
    for r, other in enumerate(headers):
        if not torch.equal(other[:2], header[:2]) or not torch.equal(other[3:], header[3:]):
            raise ValueError(f"allgather: rank {r} of the set passed {_describe(other)}, this rank "
                             f"{_describe(header)}; dtypes and all but the first dimension must agree")
    rows = headers[:, 2].tolist()
    per_row, longest = math.prod(tensor.shape[1:]), max(rows)
    send = torch.zeros(longest * per_row, dtype=tensor.dtype)
    send[:tensor.numel()] = tensor.detach().reshape(-1).cpu()
    received = torch.empty(n, longest * per_row, dtype=tensor.dtype)
    work = api.all_gather_into_tensor(received, send, group=group, async_op=True)

    def done() -> torch.Tensor:
        gathered = torch.cat([received[r, :count * per_row] for r, count in enumerate(rows)])
        return gathered.view(sum(rows), *tensor.shape[1:]).to(tensor.device)

    return Pending([work], done), rows


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        pending, rows = start_allgather(tensor, process_set)
        mine = group_of(process_set).rank
        ctx.process_set, ctx.span = process_set, (sum(rows[:mine]), rows[mine])
        return pending.wait()

    @staticmethod
    def backward(ctx, grad):
        return allreduce(grad, op=Average, process_set=ctx.process_set).narrow(0, *ctx.span), None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (dim 0 may differ by rank).

    Example (two ranks)::

        hvd.allgather(torch.full((rank + 1, 2), rank))   # both: [[0, 0], [1, 1], [1, 1]]
    """
    return _Allgather.apply(tensor, process_set)


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start :func:`allgather`; ``synchronize(handle)`` returns the concatenation."""
    return register(start_allgather(tensor, process_set)[0])


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """:func:`allgather` of each tensor."""
    return [allgather(t, name, process_set) for t in tensors]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Start :func:`grouped_allgather`; ``synchronize(handle)`` returns the list of concatenations."""
    started = [start_allgather(t, process_set)[0] for t in tensors]
    return register(Pending([w for p in started for w in p.works], lambda: [p.finish() for p in started]))


def start_alltoall(tensor: torch.Tensor, splits, process_set) -> Pending:
    """Begin :func:`alltoall`; the result is ``(output, received_splits)``.

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
    counts = torch.empty(n, dtype=torch.int64)
    api.all_to_all_single(counts, torch.tensor(sent, dtype=torch.int64), group=group)
    received = counts.tolist()
    output = torch.empty(sum(received), *tensor.shape[1:], dtype=tensor.dtype)
    work = api.all_to_all_single(output, tensor.detach().contiguous().cpu(), received, sent, group=group,
                                 async_op=True)
    return Pending([work], lambda: (output.to(tensor.device), torch.tensor(received, dtype=torch.int32)))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, process_set):
        output, received = start_alltoall(tensor, splits, process_set).wait()
        ctx.process_set, ctx.received = process_set, received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _):
        return start_alltoall(grad, ctx.received, ctx.process_set).wait()[0], None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send ``splits[j]`` rows of ``tensor`` (dim 0, in order) to rank ``j`` of ``process_set``, and
    return the rows received, in rank order; with ``splits``, also the int32 row counts received.
    Without ``splits`` dim 0 is split equally.

    Example (two ranks)::

        out, got = hvd.alltoall(torch.arange(3) + 10 * rank, splits=[1, 2] if rank == 0 else [2, 1])
        # rank 0: out [0, 10, 11], got [1, 2]; rank 1: out [1, 2, 12], got [2, 1]
    """
    output, received = _Alltoall.apply(tensor, splits, process_set)
    return output if splits is None else (output, received)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start :func:`alltoall`; ``synchronize(handle)`` returns ``(output, received_splits)``."""
    return register(start_alltoall(tensor, splits, process_set))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable ``obj``, in rank order.

    Example (two ranks)::

        hvd.allgather_object({"rank": rank})   # both: [{'rank': 0}, {'rank': 1}]
    """
    group = group_of(process_set)
    gathered = [None] * group.size
    all_gather_object(gathered, obj, group=group)
    return gathered


def _describe(header: torch.Tensor) -> str:
    code, dims = int(header[0]), header[2:2 + int(header[1])].tolist()
    return f"{dtypes.dtype_of(code)} of shape {dims}"
