"""Horovod's ``horovod.tensorflow`` operations: ``allreduce`` (dense or ``tf.IndexedSlices``),
``grouped_allreduce`` and the gathers, broadcasts and scatters of :mod:`.gathers`.

A ``tf.IndexedSlices`` is all-gathered, values and indices, as in Horovod (Average divides the values
by the size); dense tensors are reduced by :mod:`.reductions`.
"""

from __future__ import annotations

import tensorflow as tf

from .basics import Average, Sum, world
from .compression import Compression
from .gathers import (
    allgather, allgather_object, alltoall, broadcast, broadcast_object, broadcast_variables, grouped_allgather,
    grouped_reducescatter, reducescatter,
)
from .reductions import grouped_dense, resolve_op

__all__ = [
    "allgather", "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_object",
    "broadcast_variables", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "reducescatter",
]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None, name=None) -> list:
    """Reduce each of ``tensors`` across the ranks (``op`` default: Average), the dense ones (one dtype)
    in one fused message; a ``tf.IndexedSlices`` among them is all-gathered.

    Raises:
        ValueError: a bad ``op``. TypeError: mixed dtypes.
    """
    op, _ = resolve_op(op, average), world(process_set)
    tensors = [t if isinstance(t, tf.IndexedSlices) else tf.convert_to_tensor(t) for t in tensors]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if len({tensors[i].dtype for i in dense}) > 1:
        raise TypeError(f"tensors of one call must share a dtype, got {sorted({tensors[i].dtype.name for i in dense})}")
    outs = list(tensors)
    reduced = grouped_dense([tensors[i] for i in dense], op, prescale_factor, postscale_factor, compression)
    for i, out in zip(dense, reduced):
        outs[i] = out
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            outs[i] = _sparse(t, op, prescale_factor * postscale_factor)
    return outs


def _sparse(slices: tf.IndexedSlices, op, factor: float) -> tf.IndexedSlices:
    """Horovod's sparse allreduce: every rank's values and indices, gathered (Average: values / size)."""
    if op not in (Sum, Average):
        raise NotImplementedError(f"a tf.IndexedSlices allreduce supports Sum and Average, not {op!r}")
    factor /= world().size if op is Average else 1
    values = allgather(slices.values)
    values = values if factor == 1.0 else values * tf.cast(factor, values.dtype)
    return tf.IndexedSlices(values, allgather(slices.indices), slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """``tensor`` reduced across the ranks (``op`` default: Average), as a new tensor.

    Example (two ranks)::

        hvd.allreduce(tf.constant([rank + 1.0]))              # both: [1.5]
        hvd.allreduce(tf.constant([rank + 1.0]), op=hvd.Sum)  # both: [3.]
    """
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op, prescale_factor,
                             postscale_factor, process_set, name)[0]
