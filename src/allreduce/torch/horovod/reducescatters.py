"""Horovod's ``reducescatter`` (and its grouped and async forms) on torch tensors.

Each tensor is reduced across the set and split along dim 0: with ``d`` rows over ``n`` ranks, rank
``r`` keeps ``d // n`` rows, one more when ``r < d % n`` (Horovod's split). The rows are padded to
equal blocks, reduce-scattered in the compressor's wire dtype, and each rank keeps its block's real
rows; factors are applied as in :mod:`.reductions`. A grouped call is one negotiated operation.

The gradient is Horovod's: the output gradients all-gathered, times the set's size for Sum and times
the factors.
"""

from __future__ import annotations

import math

import torch

from ... import api
from ...ops import ReduceOp

from ..common.compression import Compression, Compressor
from ..common.tensors import host_copy
from . import negotiation
from .gathers import grouped_allgather
from .handles import Pending, register
from .process_sets import global_process_set, group_of
from .reductions import resolve_op, scale_


def _start_one(tensor, op, compression: Compressor, group, prescale_factor: float,
               postscale_factor: float) -> Pending:
    """Begin one tensor's reduce-scatter over ``group`` (agreed already)."""
    n, rows = group.size, tensor.shape[0]
    counts = [rows // n + (r < rows % n) for r in range(n)]  # the first rows % n ranks get one more row
    per_row, block = math.prod(tensor.shape[1:]), -(-rows // n)
    flat = host_copy([tensor])
    scale_(flat, prescale_factor)
    padded = torch.zeros(n, block * per_row, dtype=flat.dtype)
    start = 0
    for r, count in enumerate(counts):
        padded[r, :count * per_row] = flat[start:start + count * per_row]
        start += count * per_row
    wire, ctx = compression.compress(padded.view(-1))
    received = torch.empty(block * per_row, dtype=wire.dtype)
    work = api.reduce_scatter_tensor(received, wire, ReduceOp.SUM, group, async_op=True)
    factor = postscale_factor / n if op is ReduceOp.AVG else postscale_factor

    def done():
        mine = compression.decompress(received, ctx)[:counts[group.rank] * per_row].clone()
        scale_(mine, factor)
        return mine.view(counts[group.rank], *tensor.shape[1:]).to(tensor.device)

    return Pending([work], done)


def submit_reducescatter(tensors, op, compression: Compressor, process_set, prescale_factor: float,
                         postscale_factor: float, name=None) -> negotiation.Ticket:
    """Negotiate the reduce-scatter of each of ``tensors``; the ticket's result is the list of this
    rank's parts.

    Raises:
        NotImplementedError: an op other than Average or Sum (a RuntimeError, as Horovod's).
        ValueError: a tensor of no dimension, or this rank not in the set.
        TypeError: the tensors have different dtypes.
    """
    if op not in (ReduceOp.AVG, ReduceOp.SUM):
        raise NotImplementedError(f"reducescatter supports Average and Sum (as Horovod), not {op!r}")
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("reducescatter needs tensors of at least one dimension (it splits dim 0)")
    dtypes = sorted({str(t.dtype) for t in tensors})
    if len(dtypes) > 1:
        raise TypeError(f"tensors of one call must share a dtype, got {dtypes}")
    group = group_of(process_set)
    agreed = {"op": repr(op), "dtype": dtypes[0] if dtypes else None, "shapes": [list(t.shape) for t in tensors],
              "prescale_factor": prescale_factor, "postscale_factor": postscale_factor}

    def start() -> Pending:
        started = [_start_one(t, op, compression, group, prescale_factor, postscale_factor) for t in tensors]
        return Pending([w for p in started for w in p.works], lambda: [p.finish() for p in started])

    return negotiation.submit(group, negotiation.Operation("reducescatter", name, agreed, start))


class _Reducescatter(torch.autograd.Function):
    """``grouped_reducescatter`` for autograd, with Horovod's gradient (see the module docstring)."""

    @staticmethod
    def forward(ctx, options, name, *tensors):
        ctx.options = options
        op, compression, process_set, prescale_factor, postscale_factor = options
        return tuple(submit_reducescatter(tensors, op, compression, process_set, prescale_factor,
                                          postscale_factor, name).wait())

    @staticmethod
    def backward(ctx, *grads):
        op, _, process_set, prescale_factor, postscale_factor = ctx.options
        factor = (len(process_set.ranks) if op is ReduceOp.SUM else 1) * prescale_factor * postscale_factor
        return (None, None, *grouped_allgather([g * factor for g in grads], process_set=process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=ReduceOp.AVG,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """:func:`reducescatter` of each tensor of ``tensors``, as one operation; differentiable."""
    options = (resolve_op(op), compression, process_set, prescale_factor, postscale_factor)
    return list(_Reducescatter.apply(options, name, *tensors))


def reducescatter(tensor, name=None, compression=Compression.none, op=ReduceOp.AVG, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` across the ranks of ``process_set`` and keep this rank's rows of dim 0 (see the
    module docstring); differentiable.

    Example (two ranks, 3 rows)::

        hvd.reducescatter(torch.ones(3, 2), op=hvd.Sum)   # rank 0: 2 x [2., 2.]; rank 1: 1 x [2., 2.]

    Raises:
        Mismatch: the ranks disagree on the op, dtype, shape or factors (on every rank; the set stays usable).
    """
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor)[0]


def reducescatter_async(tensor, name=None, op=ReduceOp.AVG, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start :func:`reducescatter`; ``synchronize(handle)`` returns this rank's rows."""
    return register(submit_reducescatter([tensor], resolve_op(op), Compression.none, process_set, prescale_factor,
                                         postscale_factor, name), single=True)


def grouped_reducescatter_async(tensors, name=None, op=ReduceOp.AVG, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start :func:`grouped_reducescatter`; ``synchronize(handle)`` returns the list of results."""
    return register(submit_reducescatter(tensors, resolve_op(op), Compression.none, process_set, prescale_factor,
                                         postscale_factor, name))
