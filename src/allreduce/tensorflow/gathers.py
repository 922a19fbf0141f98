"""Horovod's gathers, broadcasts and scatters on TensorFlow tensors, eager or in a ``tf.function``.

``allgather`` takes ranks whose first dimension differs: it all-gathers every rank's row count, then
the rows padded to the longest, and keeps the real ones in rank order. ``alltoall`` first exchanges the
split sizes (each rank learns how many rows every other rank sends it) and returns them beside the
rows. ``reducescatter`` hands rank ``r`` its share of dim 0 (the first ``d0 % size`` ranks one row
more), as Horovod does. ``broadcast_variables`` fuses the variables of each dtype into one broadcast.

Gradients, as Horovod's TensorFlow ops have them: ``allgather``'s is the averaged output gradient's
rows of this rank; ``broadcast``'s the averaged gradient on the root and zeros elsewhere;
``alltoall``'s the output gradient sent back; ``reducescatter``'s the gathered output gradient
(times the size for Sum).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import api
from ..objects import all_gather_object, broadcast_object_list
from ..ops import ReduceOp

from . import bridge
from .basics import Average, Sum, world
from .compression import Compression
from .reductions import grouped_dense, reduce_flat


def _gathered(array: np.ndarray, group):
    """Every rank's ``array`` concatenated along dim 0 (lengths may differ), and every rank's row count."""
    rows = np.empty(group.size, np.int64)
    api.all_gather_into_tensor(rows, np.array([array.shape[0]], np.int64), group=group)
    longest = int(rows.max())
    send = np.zeros((longest,) + array.shape[1:], array.dtype)
    send[:array.shape[0]] = array
    received = np.empty((group.size,) + send.shape, array.dtype)
    api.all_gather_into_tensor(received, send, group=group)
    return np.concatenate([received[r, :count] for r, count in enumerate(rows)]), rows


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Every rank's ``tensor`` concatenated along dim 0, which may differ by rank.

    Example (two ranks)::

        hvd.allgather(tf.fill([rank + 1, 2], rank))    # both: [[0, 0], [1, 1], [1, 1]]

    Raises:
        ValueError: ``tensor`` has no dimension.
    """
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("allgather takes tensors of at least one dimension (it concatenates dim 0)")
    group = world(process_set)

    def forward(x):
        return tuple(bridge.call(lambda a: _gathered(a, group), [x], [x.dtype, tf.int64],
                                 [[None] + x.shape[1:].as_list(), [group.size]], "allgather"))

    def grad(outs, dy, _):
        rows = outs[1]
        averaged = grouped_dense([dy], Average, 1.0, 1.0, Compression.none)[0]
        start = tf.reduce_sum(rows[:group.rank])
        return averaged[start:start + rows[group.rank]]

    return bridge.differentiable(forward, grad, [tensor])[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None) -> list:
    """:func:`allgather` of each of ``tensors`` (one all-gather each, in list order)."""
    return [allgather(t, process_set=process_set) for t in tensors]


def _broadcast_arrays(arrays, root: int, group) -> list[np.ndarray]:
    """``root``'s ``arrays`` (one dtype) on every rank, in one fused broadcast."""
    flat = np.concatenate([np.ravel(a) for a in arrays]) if arrays else np.empty(0)
    api.broadcast(flat, src=root, group=group)
    bounds = np.cumsum([a.size for a in arrays])[:-1]
    return [part.reshape(a.shape).astype(a.dtype, copy=False) for part, a in zip(np.split(flat, bounds), arrays)]


def _broadcast_group(tensors, root_rank: int) -> list:
    """``root_rank``'s ``tensors`` (one dtype) on every rank; differentiable."""
    group = world()

    def forward(*xs):
        return bridge.call(lambda *arrays: _broadcast_arrays(list(arrays), root_rank, group), xs,
                           [x.dtype for x in xs], [x.shape for x in xs], "broadcast")

    def grad(_, *dys):
        averaged = grouped_dense(list(dys), Average, 1.0, 1.0, Compression.none)
        return averaged if group.rank == root_rank else [tf.zeros_like(d) for d in averaged]

    return list(bridge.differentiable(forward, grad, tensors))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """``root_rank``'s ``tensor`` on every rank.

    Example (two ranks)::

        hvd.broadcast(tf.constant([rank]), root_rank=1)    # both: [1]
    """
    world(process_set)
    return _broadcast_group([tf.convert_to_tensor(tensor)], root_rank)[0]


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assign ``root_rank``'s values to ``variables`` on every rank (one broadcast per dtype); the
    assignments' ops (a ``tf.group``; nothing needed eagerly, where they are done)."""
    world(process_set)
    by_dtype: dict = {}
    for v in variables:
        by_dtype.setdefault(v.dtype, []).append(v)
    assigned = []
    for same in by_dtype.values():
        values = _broadcast_group([v.read_value() if hasattr(v, "read_value") else v.value for v in same], root_rank)
        assigned += [v.assign(value) for v, value in zip(same, values)]
    return tf.group(*assigned) if not tf.executing_eagerly() else None


def _exchanged(array: np.ndarray, splits: np.ndarray, group):
    """``array``'s rows, ``splits[j]`` of them to rank ``j``: the rows received and the received splits."""
    received = np.empty(group.size, np.int64)
    api.all_to_all_single(received, splits.astype(np.int64), group=group)
    out = np.empty((int(received.sum()),) + array.shape[1:], array.dtype)
    api.all_to_all_single(out, np.ascontiguousarray(array), received.tolist(), splits.tolist(), group=group)
    return out, received


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Rows ``splits[j]`` of ``tensor`` (default: equal shares of dim 0) sent to rank ``j``; returns the
    rows received, in rank order, and how many came from each rank.

    Example (two ranks)::

        out, received = hvd.alltoall(tf.constant([rank, rank, rank]), splits=[1, 2])
        # rank 0: [0, 1], [1, 1]; rank 1: [0, 0, 1, 1], [2, 2]

    Raises:
        InvalidArgumentError: dim 0 does not divide by the size and no ``splits`` were given.
    """
    tensor = tf.convert_to_tensor(tensor)
    group = world(process_set)
    if splits is None:
        share = tf.shape(tensor, out_type=tf.int64)[0] // group.size
        tf.debugging.assert_equal(share * group.size, tf.shape(tensor, out_type=tf.int64)[0],
                                  message=f"alltoall: dim 0 must divide by the size {group.size} without splits")
        splits = tf.fill([group.size], share)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)

    def forward(x):
        return tuple(bridge.call(lambda a, s: _exchanged(a, s, group), [x, splits], [x.dtype, tf.int64],
                                 [[None] + x.shape[1:].as_list(), [group.size]], "alltoall"))

    def grad(outs, dy, _):
        return alltoall(dy, splits=outs[1])[0]

    return bridge.differentiable(forward, grad, [tensor])


def _scattered(array: np.ndarray, op, prescale: float, postscale: float, group) -> np.ndarray:
    """This rank's share of dim 0 of ``array`` reduced over ``group`` (see the module docstring)."""
    n, rows = group.size, array.shape[0]
    counts = [rows // n + (r < rows % n) for r in range(n)]
    start = sum(counts[:group.rank])
    flat = array.reshape(-1) * array.dtype.type(prescale) if prescale != 1.0 else array.reshape(-1).copy()
    if rows % n:  # uneven shares: the whole, reduced, then this rank's rows
        whole = reduce_flat(flat, op, Compression.none, group).reshape(array.shape)
        out = whole[start:start + counts[group.rank]]
    else:
        out = np.empty((counts[group.rank],) + array.shape[1:], array.dtype)
        api.reduce_scatter_tensor(out, flat, op, group=group)
    return out * array.dtype.type(postscale) if postscale != 1.0 else out


def reducescatter(tensor, op=Average, name=None, ignore_name_scope=False, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """``tensor`` reduced across ranks (Sum or Average), rank ``r`` keeping its share of dim 0.

    Example (two ranks)::

        hvd.reducescatter(tf.constant([[1.], [2.]]) * (rank + 1), op=hvd.Sum)   # rank 0: [[3.]], rank 1: [[6.]]

    Raises:
        NotImplementedError: an op other than Sum and Average.
    """
    if op not in (Sum, Average):
        raise NotImplementedError(f"reducescatter supports Sum and Average, not {op!r}")
    tensor = tf.convert_to_tensor(tensor)
    group = world(process_set)
    reduce_op = ReduceOp.AVG if op is Average else ReduceOp.SUM

    def forward(x):
        return bridge.call(lambda a: [_scattered(a, reduce_op, prescale_factor, postscale_factor, group)], [x],
                           [x.dtype], [[None] + x.shape[1:].as_list()], "reducescatter")[0]

    def grad(_, dy):
        return allgather(dy * tf.cast(group.size, dy.dtype) if op is Sum else dy)

    return bridge.differentiable(forward, grad, [tensor])


def grouped_reducescatter(tensors, op=Average, name=None, ignore_name_scope=False, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0) -> list:
    """:func:`reducescatter` of each of ``tensors`` (one reduce-scatter each, in list order)."""
    return [reducescatter(t, op, process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor) for t in tensors]


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """``root_rank``'s ``obj`` (any picklable object) on every rank (eager)."""
    holder = [obj]
    broadcast_object_list(holder, src=root_rank, group=world(process_set))
    return holder[0]


def allgather_object(obj, session=None, name=None, process_set=None) -> list:
    """Every rank's ``obj`` (any picklable object), in rank order (eager)."""
    gathered: list = [None] * world(process_set).size
    all_gather_object(gathered, obj, group=world())
    return gathered
