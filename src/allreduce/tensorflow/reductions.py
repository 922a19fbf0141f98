"""Horovod's reductions of dense TensorFlow tensors, fused, eager or in a ``tf.function``.

A call fuses its tensors into one flat numpy buffer, applies ``prescale_factor``, reduces, applies
``postscale_factor`` and splits the result back (:func:`reduce_arrays`; eagerly at once, in a
``tf.function`` as one op: :mod:`.bridge`). A factor is applied as Horovod's CPU ops do: in the
tensor's own dtype for float32/float64, in float32 for 16-bit floats, in float64 for integers.
Floating ``Average`` divides the sum by the size; integer ``Average`` is Horovod's, the sum times
``1/size`` truncated toward zero. Sums with 16-bit floats on the wire (16-bit tensors, or
``Compression.fp16``/``bf16``) are formed in float32, in two steps that move the bytes of a ring
all-reduce: an all-to-all of chunks, a float32 sum of each rank's chunk, an all-gather of the means.
(``hvd.allreduce`` itself, which also takes ``tf.IndexedSlices``, is in :mod:`.mpi_ops`.)

The gradient of a reduction is the same reduction of the output gradients (``Sum`` and ``Average``).

Example (two ranks)::

    hvd.allreduce(tf.constant([rank + 1.0]))                 # both: [1.5]
    hvd.allreduce(tf.constant([rank + 1]), op=hvd.Sum)       # both: [3]
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import api
from ..ops import ReduceOp

from . import bridge
from .basics import Average, Sum, world

OPS = (ReduceOp.AVG, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)


def resolve_op(op, average=None):
    """Horovod's ``op``/deprecated ``average`` pair as one op (default: Average).

    Raises:
        ValueError: both given, or an op this module does not have (Adasum is not here).
    """
    if op is not None and average is not None:
        raise ValueError("the op parameter supersedes average; pass only one of them")
    if op is None:
        return ReduceOp.AVG if average in (None, True) else ReduceOp.SUM
    if op not in OPS:
        raise ValueError(f"op must be one of Average, Sum, Min, Max, Product; got {op!r}")
    return op


def math_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a factor is applied in: float32 for 16-bit floats, float64 for integers, else ``dtype``."""
    if dtype.kind == "f" and dtype.itemsize == 2 or dtype == np.dtype(tf.bfloat16.as_numpy_dtype):
        return np.dtype(np.float32)
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


def _scaled(flat: np.ndarray, factor: float) -> np.ndarray:
    if factor == 1.0:
        return flat
    math = math_dtype(flat.dtype)
    return (flat.astype(math) * math.type(factor)).astype(flat.dtype)


def _half_mean(wire: np.ndarray, group) -> np.ndarray:
    """The float32 mean over ``group`` of the 16-bit ``wire``: chunks exchanged, summed in float32,
    the means all-gathered (see the module docstring)."""
    n = group.size
    chunk = -(-wire.size // n)
    outgoing = np.zeros(n * chunk, wire.dtype)
    outgoing[:wire.size] = wire
    incoming = np.empty_like(outgoing)
    api.all_to_all_single(incoming, outgoing, group=group)
    mean = incoming.reshape(n, chunk).astype(np.float32).sum(axis=0) / np.float32(n)
    gathered = np.empty(n * chunk, wire.dtype)
    api.all_gather_into_tensor(gathered, mean.astype(wire.dtype), group=group)
    return gathered[:wire.size].astype(np.float32)


def reduce_flat(flat: np.ndarray, op, compressor, group) -> np.ndarray:
    """``flat`` (1-D, this rank's copy) reduced over ``group`` by ``op`` through ``compressor``."""
    wire = compressor.wire_dtype_for(flat.dtype)
    half = wire.kind == "f" and wire.itemsize == 2 or wire == np.dtype(tf.bfloat16.as_numpy_dtype)
    if op in (ReduceOp.SUM, ReduceOp.AVG) and half and group.size > 1:
        mean = _half_mean(flat.astype(wire), group)
        return (mean if op is ReduceOp.AVG else mean * np.float32(group.size)).astype(flat.dtype)
    if op is ReduceOp.AVG and flat.dtype.kind not in "fc":  # Horovod's integer average: truncated
        api.all_reduce(flat, ReduceOp.SUM, group)
        return (flat.astype(np.float64) * (1.0 / group.size)).astype(flat.dtype)
    sent = flat.astype(wire) if wire != flat.dtype else flat
    api.all_reduce(sent, op, group)
    return sent.astype(flat.dtype) if sent is not flat else flat


def reduce_arrays(arrays, op, prescale: float, postscale: float, compressor, group) -> list[np.ndarray]:
    """Each of ``arrays`` (one dtype) reduced over ``group``, in one fused buffer."""
    if not arrays:
        return []
    fused = len(arrays) > 1
    flat = np.concatenate([np.ravel(a) for a in arrays]) if fused else np.array(arrays[0]).reshape(-1)
    flat = _scaled(reduce_flat(_scaled(flat, prescale), op, compressor, group), postscale)
    if not fused:
        return [flat.reshape(arrays[0].shape)]
    bounds = np.cumsum([a.size for a in arrays])[:-1]
    return [part.reshape(a.shape) for part, a in zip(np.split(flat, bounds), arrays)]


def grouped_dense(tensors, op, prescale, postscale, compression):
    """``tensors`` (dense, one dtype) reduced in one fused message; differentiable for Sum and Average."""
    if not tensors:
        return []
    group = world()

    def forward(*xs):
        return bridge.call(lambda *arrays: reduce_arrays(arrays, op, prescale, postscale, compression, group),
                           xs, [x.dtype for x in xs], [x.shape for x in xs], "allreduce")

    def grad(_, *dys):
        if op not in (Sum, Average):
            raise NotImplementedError(f"the gradient of an allreduce is defined for Sum and Average, not {op!r}")
        return grouped_dense(list(dys), op, prescale, postscale, compression)

    return list(bridge.differentiable(forward, grad, tensors))
