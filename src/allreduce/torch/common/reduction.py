"""All-reduce of one flat gradient buffer, with the wire in a compressed dtype and sums in float32.

Uncompressed buffers of float32 or wider take a plain all-reduce. When the wire carries 16-bit floats
(an fp16/bf16 compressor, or a half-precision buffer), summing on the wire would round at every
addition and overflow once a partial sum passes 65504 (fp16). So the reduction takes two steps that
move the same bytes as a ring all-reduce, half of them at 16 bits:

1. **exchange**: each rank splits its compressed buffer into ``n`` chunks (zero-padded to equal
   size) and an all-to-all sends chunk ``r`` to rank ``r``; rank ``r`` now holds every rank's copy of
   chunk ``r``, decompresses them and sums them in float32 (in rank order, so every run gives the
   same bits);
2. **gather**: rank ``r`` divides its sum by ``n`` and casts the *mean* to the wire dtype (the mean of
   values that fit fits too), and an all-gather hands every chunk to every rank, which decompresses
   it and, for SUM, multiplies by ``n`` (in float32 or wider).

Every rank decodes the same gathered bits, so all ranks end with identical results.

:func:`start` is the general entry of the Horovod layer: it also takes MIN/MAX/PRODUCT (reduced in the
wire dtype, where no sum can overflow) and leaves plain all-reduces in flight.
"""

from __future__ import annotations

import torch

from ... import api
from ...buffers import as_array
from ...ops import ReduceOp

from .compression import Compressor

HALF = (torch.float16, torch.bfloat16)
REDUCTIONS = (ReduceOp.SUM, ReduceOp.AVG)


def reduce_flat(flat: torch.Tensor, compressor: Compressor, op: ReduceOp, group=None) -> None:
    """All-reduce the 1-D contiguous CPU tensor ``flat`` in place (SUM or AVG) through ``compressor``.

    Blocking; every rank of ``group`` (an allreduce group, ``None`` for the default one) must call it
    with the same size, dtype, compressor and op.

    Example (two ranks, fp16 on the wire)::

        g = torch.full((3,), 60000.0)                   # both ranks
        reduce_flat(g, Compression.fp16, ReduceOp.SUM)  # both: 120000 (an fp16 sum would be inf)

    Raises:
        ValueError: ``op`` is neither SUM nor AVG, or ``flat`` is not a flat contiguous CPU tensor.
    """
    if op not in REDUCTIONS:
        raise ValueError(f"gradient reduction supports ReduceOp.SUM and ReduceOp.AVG, got {op!r}")
    if flat.dim() != 1 or flat.device.type != "cpu" or not flat.is_contiguous():
        raise ValueError(f"reduce_flat needs a 1-D contiguous CPU tensor, got {tuple(flat.shape)} on {flat.device}")
    wire_dtype = compressor.wire_dtype_for(flat.dtype)
    size = api.get_world_size(group)
    if wire_dtype not in HALF or size == 1:
        api.all_reduce(as_array(flat), op, group)  # a numpy view: a shape the group ran before takes its shortcut
        return
    chunk = -(-flat.numel() // size)
    wire, ctx = compressor.compress(flat)
    outgoing = torch.zeros(size * chunk, dtype=wire_dtype)
    outgoing[:flat.numel()] = wire
    incoming = torch.empty_like(outgoing)
    api.all_to_all_single(incoming, outgoing, group=group)

    accumulate = torch.promote_types(flat.dtype, torch.float32)
    copies = compressor.decompress(incoming.view(size, chunk), ctx)
    mean = torch.sum(copies, dim=0, dtype=accumulate).div_(size)
    gathered = torch.empty(size * chunk, dtype=wire_dtype)
    api.all_gather_into_tensor(gathered, mean.to(wire_dtype), group=group)
    result = compressor.decompress(gathered[:flat.numel()], ctx).to(accumulate)
    if op is ReduceOp.SUM:
        result.mul_(size)
    flat.copy_(result)


def start(flat: torch.Tensor, compressor: Compressor, op: ReduceOp, group=None):
    """Begin reducing the 1-D contiguous CPU tensor ``flat`` in place: ``(work, finish)``; once ``work``
    (``None``: already done) completes, ``finish()`` puts the result in ``flat``.

    SUM and AVG go as :func:`reduce_flat` (16-bit wires synchronously: it takes two collectives with a
    sum between them); other ops are reduced in the compressor's wire dtype.

    Example (two ranks)::

        work, finish = start(x, Compression.none, ReduceOp.MAX)
        work.wait(); finish()             # x: the element-wise maximum
    """
    size = api.get_world_size(group)
    if op in REDUCTIONS:
        if compressor.wire_dtype_for(flat.dtype) in HALF and size > 1:
            reduce_flat(flat, compressor, op, group)
            return None, _nothing
        return api.all_reduce(flat, op, group, async_op=True), _nothing
    wire, ctx = compressor.compress(flat)
    work = api.all_reduce(wire, op, group, async_op=True)
    return work, lambda: flat.copy_(compressor.decompress(wire, ctx))


def _nothing() -> None:
    """The ``finish`` of a reduction that wrote into its buffer directly."""
