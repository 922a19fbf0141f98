"""Horovod's reductions on torch tensors: ``allreduce`` (and its in-place, async and grouped forms).

Each call copies its tensors into one flat host buffer (a grouped call fuses them, as Horovod's tensor
fusion does), applies ``prescale_factor``, reduces, applies ``postscale_factor`` and copies the result
out on the tensors' device. A factor is applied as Horovod's CPU ops do: in the tensor's own dtype for
float32, float64 and complex tensors, in float32 for 16-bit floats, in float64 for integers, then cast
back. ``op=Average`` of floating tensors divides the sum by the set's size; of integer tensors
it is Horovod's: the sum times ``1/size`` by that rule, so truncated toward zero. Sums of 16-bit floats
are formed in float32 (:func:`~allreduce.torch.common.reduction.reduce_flat`), where Horovod sums in the
16-bit type, so an fp16 average whose sum passes 65504 does not overflow.

Every call is negotiated first (:mod:`.negotiation`): the ranks pair it up by ``name`` and agree on
its op, dtype, shapes, factors and wire dtype, or every rank gets the same ``Mismatch``.

A Sum or Average whose tensors travel as they are (no 16-bit wire) is a plain sum, an Average then
dividing by the set's size as the core's AVG does (same bits). Up to :data:`SMALL` bytes the sum runs
at once, on the buffer's numpy view, which the group's compiled shortcut takes in one call once the
group has run that shape; larger sums run in the background.

``allreduce`` and ``grouped_allreduce`` are differentiable as in Horovod: the gradient of a reduction
is the same reduction of the output gradients.

Example (two ranks)::

    hvd.allreduce(torch.tensor([rank + 1.0]))                 # both: tensor([1.5000])
    hvd.allreduce(torch.tensor([rank + 1]), op=hvd.Sum)       # both: tensor([3])
    hvd.allreduce(torch.tensor([rank + 1]))                   # both: tensor([1])  (int(3 * 0.5))
"""

from __future__ import annotations

import torch

from ... import api
from ...ops import ReduceOp, as_op, finish_reduction

from ..common import reduction
from ..common.compression import Compression, Compressor
from ..common.tensors import host_copy, is_direct
from . import adasum, joining, negotiation
from .adasum import ADASUM
from .handles import Pending, register
from .process_sets import global_process_set, group_of

OPS = (ReduceOp.AVG, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ADASUM)
SMALL = 1 << 16  # bytes: a plain sum this small is bound by latency, so it runs at once (see the module docstring)


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


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype Horovod's CPU ops scale ``dtype`` in: its own for float32/64 and complex, float32 for
    16-bit floats, float64 for integers."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.float64


def scale_(flat: torch.Tensor, factor: float) -> None:
    """``flat = dtype(math(flat) * math(factor))`` in place (:func:`math_dtype`; no-op for 1)."""
    if factor != 1.0:
        math = math_dtype(flat.dtype)
        flat.copy_(flat.to(math).mul_(torch.tensor(factor, dtype=math)))


def submit_allreduce(tensors, outputs, op, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     compression: Compressor = Compression.none, process_set=global_process_set,
                     name=None) -> negotiation.Ticket:
    """Negotiate reducing ``tensors`` together into ``outputs`` (which may be the same tensors).

    Raises:
        TypeError: the tensors have different dtypes. ValueError: this rank is not in ``process_set``,
            or an operation named ``name`` is in flight.
    """
    group = group_of(process_set)
    dtypes = sorted({str(t.dtype) for t in tensors})
    if len(dtypes) > 1:
        raise TypeError(f"tensors of one call must share a dtype, got {dtypes}")
    dtype = tensors[0].dtype if tensors else torch.float32
    wire = compression.wire_dtype_for(dtype)
    count = sum(t.numel() for t in tensors)
    divides = dtype.is_floating_point or dtype.is_complex  # else: Horovod's truncating scale
    plain = op in reduction.REDUCTIONS and wire == dtype and dtype not in reduction.HALF  # summed as it is
    reduce_op = ReduceOp.SUM if op is ReduceOp.AVG and (plain or not divides) else op
    serves = (joining.Reduction(joining.ADASUM, count, dtype, ReduceOp.SUM, wire) if op is ADASUM else
              joining.Reduction(joining.REDUCE, count, dtype, reduce_op, wire))
    agreed = {"op": repr(op), "dtype": str(dtype), "shapes": [list(t.shape) for t in tensors],
              "prescale_factor": prescale_factor, "postscale_factor": postscale_factor, "wire dtype": str(wire)}

    def start() -> Pending:
        if not tensors:
            return Pending([], lambda: outputs)
        own = len(outputs) == 1 and is_direct(outputs[0])  # the result's memory is the buffer: no copy out
        if own:
            flat = outputs[0].detach().view(-1)
            if outputs[0] is not tensors[0]:
                flat.copy_(tensors[0].detach().reshape(-1))
        else:
            flat = host_copy(tensors)
        scale_(flat, prescale_factor)
        if op is ADASUM:
            work, finish = adasum.start(flat, [t.numel() for t in tensors], compression, group)
        elif plain:
            work, finish = _sum(flat, group), finish_reduction(op if divides else ReduceOp.SUM, flat.numpy(),
                                                                group.size)  # AVG's division, or None
        else:
            work, finish = reduction.start(flat, compression, reduce_op, group)
        divisor = group.size if op is ReduceOp.AVG and not divides else 1

        def done():
            if finish is not None:
                finish()
            scale_(flat, postscale_factor / divisor)
            if not own:
                with torch.no_grad():
                    for out, part in zip(outputs, flat.split([t.numel() for t in tensors])):
                        out.copy_(part.view(out.shape))
            return outputs

        return Pending([work], done)

    return negotiation.submit(group, negotiation.Operation("allreduce", name, agreed, start, serves))


def _sum(flat: torch.Tensor, group):
    """Start summing ``flat`` across ``group``: its :class:`~allreduce.Work`, or ``None`` where the sum is
    done already (up to :data:`SMALL` bytes: at once, on the numpy view the group's shortcut takes)."""
    if flat.numel() * flat.element_size() <= SMALL:
        api.all_reduce(flat.numpy(), ReduceOp.SUM, group)
        return None
    return api.all_reduce(flat, ReduceOp.SUM, group, async_op=True)


def _reduced(options: tuple, name, tensors) -> list:
    """New tensors holding ``tensors`` reduced as ``options`` say (:func:`grouped_allreduce`'s)."""
    return submit_allreduce(tensors, [torch.empty_like(t) for t in tensors], *options, name=name).wait()


class _Allreduce(torch.autograd.Function):
    """``grouped_allreduce`` for autograd: the backward pass reduces the gradients the same way."""

    @staticmethod
    def forward(ctx, options, name, *tensors):
        ctx.options = options
        return tuple(_reduced(options, name, tensors))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_Allreduce.apply(ctx.options, None, *grads))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> list:
    """Reduce each tensor of ``tensors`` across the ranks of ``process_set`` in one fused message;
    returns new tensors (``op`` default: Average). See the module docstring.

    Raises:
        ValueError: bad ``op``, or this rank is not in ``process_set``. TypeError: mixed dtypes.
        Mismatch: the ranks disagree on the op, dtype, shapes or factors (on every rank; the set stays usable).
    """
    options = (resolve_op(op, average), prescale_factor, postscale_factor, compression, process_set)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_Allreduce.apply(options, name, *tensors))
    return _reduced(options, name, tensors)  # nothing to differentiate: autograd's bookkeeping is skipped


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
    return register(submit_allreduce(tensors, outputs, resolve_op(op, average), prescale_factor, postscale_factor,
                                     process_set=process_set, name=name))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> int:
    """Start reducing ``tensors`` in place; ``synchronize(handle)`` returns them."""
    return register(submit_allreduce(tensors, list(tensors), resolve_op(op, average), prescale_factor,
                                     postscale_factor, process_set=process_set, name=name))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    """Reduce ``tensors`` in place (not differentiable) and return them."""
    return submit_allreduce(tensors, list(tensors), resolve_op(op, average), prescale_factor, postscale_factor,
                            process_set=process_set, name=name).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> int:
    """Start :func:`allreduce`; ``synchronize(handle)`` returns the new tensor."""
    return register(submit_allreduce([tensor], [torch.empty_like(tensor)], resolve_op(op, average), prescale_factor,
                                     postscale_factor, process_set=process_set, name=name), single=True)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> int:
    """Start reducing ``tensor`` in place; ``synchronize(handle)`` returns it."""
    return register(submit_allreduce([tensor], [tensor], resolve_op(op, average), prescale_factor,
                                     postscale_factor, process_set=process_set, name=name), single=True)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place (not differentiable) and return it."""
    return grouped_allreduce_([tensor], average, name, op, prescale_factor, postscale_factor, process_set)[0]
