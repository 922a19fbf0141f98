"""Horovod's reductions on torch tensors: ``allreduce`` (and its in-place, async and grouped forms),
``reducescatter``.

Each call copies its tensors into one flat host buffer (a grouped call fuses them, as Horovod's tensor
fusion does), applies ``prescale_factor``, reduces, applies ``postscale_factor`` and copies the result
out on the tensors' device. A factor is applied as Horovod's CPU ops do: ``x = dtype(float64(x) *
factor)``. ``op=Average`` of floating tensors divides the sum by the set's size; of integer tensors
it is Horovod's: the sum times ``1/size`` by that rule, so truncated toward zero. Sums of 16-bit floats
are formed in float32 (:func:`~allreduce.torch.common.reduction.reduce_flat`), where Horovod sums in the
16-bit type, so an fp16 average whose sum passes 65504 does not overflow. ``name`` is accepted and
unused: collectives pair up by issue order, which every rank shares.

``allreduce`` and ``grouped_allreduce`` are differentiable as in Horovod: the gradient of a reduction
is the same reduction of the output gradients.

Example (two ranks)::

    hvd.allreduce(torch.tensor([rank + 1.0]))                 # both: tensor([1.5000])
    hvd.allreduce(torch.tensor([rank + 1]), op=hvd.Sum)       # both: tensor([3])
    hvd.allreduce(torch.tensor([rank + 1]))                   # both: tensor([1])  (int(3 * 0.5))
"""

from __future__ import annotations

import math

import torch

from ... import api
from ...ops import ReduceOp, as_op

from ..common import reduction
from ..common.compression import Compression, Compressor
from ..common.tensors import host_copy
from . import adasum, joining
from .adasum import ADASUM
from .handles import Pending, register
from .process_sets import global_process_set, group_of

OPS = (ReduceOp.AVG, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ADASUM)


def resolve_op(op, average=None, default=ReduceOp.AVG):
    """Horovod's ``op``/deprecated ``average`` pair as one op.

    Raises:
        ValueError: both given, or an op Horovod does not have.
    """
    if op is not None and average is not None:
        raise ValueError("the op parameter supersedes average; pass only one of them")
    if op is None:
        return default if average is None else (ReduceOp.AVG if average else ReduceOp.SUM)
    if op is ADASUM:
        return op
    try:
        ours = as_op(op)  # a foreign op (torch's) by name, never by its number
    except TypeError:
        ours = None
    if ours not in OPS:
        raise ValueError(f"op must be one of Average, Sum, Min, Max, Product, Adasum; got {op!r}")
    return ours


def scale_(flat: torch.Tensor, factor: float) -> None:
    """``flat = dtype(float64(flat) * factor)`` in place (complex: complex128; no-op for 1)."""
    if factor != 1.0:
        flat.copy_(flat.to(torch.complex128 if flat.is_complex() else torch.float64).mul_(factor))


def start_allreduce(tensors, outputs, op, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    compression: Compressor = Compression.none, process_set=global_process_set) -> Pending:
    """Begin reducing ``tensors`` together into ``outputs`` (which may be the same tensors)."""
    group = group_of(process_set)
    if not tensors:
        return Pending([], lambda: outputs)
    flat = host_copy(tensors)
    sizes = [t.numel() for t in tensors]
    scale_(flat, prescale_factor)
    wire = compression.wire_dtype_for(flat.dtype)
    channel = joining.channel_of(group)
    if op is ADASUM:
        joining.agree(channel, joining.Request(joining.ADASUM, flat.numel(), flat.dtype, ReduceOp.SUM, wire))
        work, finish = adasum.start(flat, sizes, compression, group)
    else:
        divides = flat.dtype.is_floating_point or flat.dtype.is_complex  # else: Horovod's truncating scale
        reduce_op = ReduceOp.SUM if op is ReduceOp.AVG and not divides else op
        joining.agree(channel, joining.Request(joining.REDUCE, flat.numel(), flat.dtype, reduce_op, wire))
        work, finish = reduction.start(flat, compression, reduce_op, group)
    factor = postscale_factor / group.size if op is ReduceOp.AVG and reduce_op is ReduceOp.SUM else postscale_factor

    def done():
        finish()
        scale_(flat, factor)
        with torch.no_grad():
            for out, part in zip(outputs, flat.split(sizes)):
                out.copy_(part.view(out.shape))
        return outputs

    return Pending([work], done)


class _Allreduce(torch.autograd.Function):
    """``grouped_allreduce`` for autograd: the backward pass reduces the gradients the same way."""

    @staticmethod
    def forward(ctx, options, *tensors):
        ctx.options = options
        return tuple(start_allreduce(tensors, [torch.empty_like(t) for t in tensors], *options).wait())

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_Allreduce.apply(ctx.options, *grads))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> list:
    """Reduce each tensor of ``tensors`` across the ranks of ``process_set`` in one fused message;
    returns new tensors (``op`` default: Average). See the module docstring.

    Raises:
        ValueError: bad ``op``, or this rank is not in ``process_set``. TypeError: mixed dtypes.
    """
    options = (resolve_op(op, average), prescale_factor, postscale_factor, compression, process_set)
    return list(_Allreduce.apply(options, *tensors))


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """``tensor`` reduced across the ranks of ``process_set``, as a new tensor (``op`` default: Average).

    Example (two ranks)::

        hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum)   # both: tensor([3.])
    """
    return grouped_allreduce([tensor], average, name, compression, op, prescale_factor, postscale_factor,
                             process_set)[0]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set) -> int:
    """Start :func:`grouped_allreduce`; ``synchronize(handle)`` returns the list of new tensors."""
    outputs = [torch.empty_like(t) for t in tensors]
    return register(start_allreduce(tensors, outputs, resolve_op(op, average), prescale_factor, postscale_factor,
                                    process_set=process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> int:
    """Start reducing ``tensors`` in place; ``synchronize(handle)`` returns them."""
    return register(start_allreduce(tensors, list(tensors), resolve_op(op, average), prescale_factor,
                                    postscale_factor, process_set=process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    """Reduce ``tensors`` in place (not differentiable) and return them."""
    return start_allreduce(tensors, list(tensors), resolve_op(op, average), prescale_factor, postscale_factor,
                           process_set=process_set).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start :func:`allreduce`; ``synchronize(handle)`` returns the new tensor."""
    outputs = [torch.empty_like(tensor)]
    return register(_single(start_allreduce([tensor], outputs, resolve_op(op, average), prescale_factor,
                                            postscale_factor, process_set=process_set)))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """Start reducing ``tensor`` in place; ``synchronize(handle)`` returns it."""
    return register(_single(start_allreduce([tensor], [tensor], resolve_op(op, average), prescale_factor,
                                            postscale_factor, process_set=process_set)))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place (not differentiable) and return it."""
    return grouped_allreduce_([tensor], average, name, op, prescale_factor, postscale_factor, process_set)[0]


def _single(pending: Pending) -> Pending:
    """``pending`` whose result is its only output rather than a list of one."""
    finish = pending.finish
    pending.finish = lambda: finish()[0]
    return pending


def start_reducescatter(tensor, op, compression: Compressor, process_set, prescale_factor: float,
                        postscale_factor: float) -> Pending:
    """Begin :func:`reducescatter`: the rows are padded to equal blocks, reduce-scattered in the wire
    dtype, and this rank keeps its block's real rows."""
    if op not in (ReduceOp.AVG, ReduceOp.SUM):
        raise ValueError(f"reducescatter supports Average and Sum (as Horovod), got {op!r}")
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension (it splits dim 0)")
    group = group_of(process_set)
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


def reducescatter(tensor, name=None, compression=Compression.none, op=ReduceOp.AVG, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` across the ranks of ``process_set`` and keep this rank's rows of dim 0: with
    ``d`` rows over ``n`` ranks, rank ``r`` gets ``d // n`` rows, one more when ``r < d % n``.

    Example (two ranks, 3 rows)::

        hvd.reducescatter(torch.ones(3, 2), op=hvd.Sum)   # rank 0: 2 x [2., 2.]; rank 1: 1 x [2., 2.]
    """
    return start_reducescatter(tensor, resolve_op(op), compression, process_set, prescale_factor,
                               postscale_factor).wait()


def reducescatter_async(tensor, name=None, op=ReduceOp.AVG, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> int:
    """Start :func:`reducescatter`; ``synchronize(handle)`` returns this rank's rows."""
    return register(start_reducescatter(tensor, resolve_op(op), Compression.none, process_set, prescale_factor,
                                        postscale_factor))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=ReduceOp.AVG,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """:func:`reducescatter` of each tensor (one after the other)."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor) for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=ReduceOp.AVG, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start :func:`grouped_reducescatter`; ``synchronize(handle)`` returns the list of results."""
    started = [start_reducescatter(t, resolve_op(op), Compression.none, process_set, prescale_factor, postscale_factor)
               for t in tensors]
    return register(Pending([w for p in started for w in p.works], lambda: [p.finish() for p in started]))
