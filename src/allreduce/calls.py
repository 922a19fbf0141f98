"""The collectives and point-to-point calls, shaped like torch.distributed: same names, argument order and meaning.

Every collective follows one pattern: validate the arguments (``TypeError``/``ValueError`` before
anything is sent), describe the buffers, hand them to the group, and return a :class:`Work` when
``async_op=True``. ``src``/``dst`` are ranks within ``group``; calling a collective on a group this
rank is not a member of is an error, never a silent ``None``. An input that overlaps its output is
copied first, so ``all_to_all_single(x, x)`` and in-place gathers are right.

One thread at a time per group: any thread may call collectives on it, in turns; a call while another
thread's calls are in flight raises ``RuntimeError`` and breaks the group (calls from two threads at once
would pair up in a different order on each rank), and so does a blocking call from a ``Work`` callback.
Threads that need collectives at the same time use a group each.
"""

from __future__ import annotations

from typing import ParamSpec, TypeVar, cast
from collections.abc import Callable

import numpy as np

from . import uneven
from .arguments import (
    Number, Op, Tensor, arrays_per_rank, check_peer, check_rank, check_same_dtype, check_tag, checked_op,
)
from .buffers import as_array, flat
from .ops import ReduceOp, check_op, finish, finish_reduction
from .p2p import P2PWork
from .refusal import refusing
from .roster import Group, resolve_group
from .runtime import ProcessGroup, Request, Shape
from .work import Work


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _refusing(collective: str, group_at: int) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a collective whose ``group`` argument is positional argument ``group_at``: an argument it
    refuses (``TypeError``/``ValueError``, raised before the call is issued) is told to the group's
    peers (:func:`~allreduce.refusal.refusing`)."""
    def group_of(*args: object, **kwargs: object) -> ProcessGroup | None:
        try:
            return resolve_group(args[group_at] if len(args) > group_at else kwargs.get("group"))  # type: ignore[arg-type]
        except (RuntimeError, TypeError, ValueError):  # no group: the call raises so, and nobody waits
            return None
    return lambda function: refusing(function, collective, group_of, (TypeError, ValueError))


def all_reduce(tensor: Tensor, op: Op = ReduceOp.SUM, group: Group = None, async_op: bool = False,
               algorithm: str | None = None) -> Work | None:
    """Reduce ``tensor`` across all ranks in place; every rank ends with the same result.

    ``algorithm``: ``"auto"`` (default), ``"ring"``, ``"tree"``, ``"reduce_bcast"`` or any registered one.

    Example (two ranks)::

        x = np.array([rank + 1.0])   # rank 0: [1.], rank 1: [2.]
        dist.all_reduce(x)           # both: [3.]
    """
    g = resolve_group(group)
    if type(tensor) is np.ndarray and tensor.ndim == 1 and type(op) is ReduceOp and not async_op and algorithm is None:
        # a shape this group ran before (checked, planned): straight to its shortcut, AVG's division after it
        known = g.shortcuts.get(Shape.all_reduce(tensor.dtype, tensor.size, op))
        if known is not None and known.run(tensor):
            if op is ReduceOp.AVG:
                finish(op, tensor, g.size)
            return None
    return _all_reduce(g, tensor, op, async_op, algorithm)


@_refusing("all_reduce", 0)  # the general path: the shortcut above stays as short as it is
def _all_reduce(g: ProcessGroup, tensor: Tensor, op: Op, async_op: bool, algorithm: str | None) -> Work | None:
    arr = as_array(tensor)
    op = checked_op(op, arr.dtype)
    data = arr if arr.ndim == 1 else flat(arr)
    return g.collective(Request("all_reduce", {"data": data}, data.size, arr.dtype, op, 0, algorithm,
                                finish_reduction(op, data, g.size)), async_op)


@_refusing("reduce", 3)
def reduce(tensor: Tensor, dst: int, op: Op = ReduceOp.SUM, group: Group = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Reduce ``tensor`` from all ranks into ``tensor`` on rank ``dst``; other ranks' tensors are unchanged."""
    g = resolve_group(group)
    arr = as_array(tensor)
    op = check_op(op, arr.dtype)
    check_rank(dst, g.size, "dst")
    data = flat(arr)
    after = finish_reduction(op, data, g.size) if g.rank == dst else None
    return g.collective(Request("reduce", {"data": data}, data.size, arr.dtype, op, dst, algorithm, after), async_op)


def broadcast(tensor: Tensor, src: int, group: Group = None, async_op: bool = False,
              algorithm: str | None = None) -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank."""
    g = resolve_group(group)
    if type(tensor) is np.ndarray and tensor.ndim == 1 and type(src) is int and not async_op and algorithm is None:
        known = g.shortcuts.get(Shape.broadcast(tensor.dtype, tensor.size, src))
        if known is not None and known.run(tensor):
            return None
    return _broadcast(g, tensor, src, async_op, algorithm)


@_refusing("broadcast", 0)
def _broadcast(g: ProcessGroup, tensor: Tensor, src: int, async_op: bool, algorithm: str | None) -> Work | None:
    arr = as_array(tensor)
    check_rank(src, g.size, "src")
    data = flat(arr)
    request = Request("broadcast", {"data": data}, data.size, arr.dtype, ReduceOp.SUM, src, algorithm)
    return g.collective(request, async_op)


@_refusing("all_gather_into_tensor", 2)
def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Group = None, async_op: bool = False,
                           algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor`` on every rank."""
    g = resolve_group(group)
    out, inp = as_array(output_tensor, "output_tensor"), as_array(input_tensor, "input_tensor", writable=False)
    check_same_dtype(out, inp)
    if out.size != g.size * inp.size:
        raise ValueError(f"output_tensor has {out.size} elements; all_gather needs world size x input = "
                         f"{g.size * inp.size}")
    return g.collective(Request("all_gather", {"data": _apart(inp, out), "out": flat(out)}, inp.size, inp.dtype,
                                algorithm=algorithm), async_op)


@_refusing("all_gather", 2)
def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Group = None, async_op: bool = False,
               algorithm: str | None = None) -> Work | None:
    """Fill ``tensor_list[i]`` with rank i's ``tensor`` on every rank."""
    g = resolve_group(group)
    inp = as_array(tensor, "tensor", writable=False)
    outs = arrays_per_rank(tensor_list, g.size, inp, "tensor_list")
    staged = np.empty(g.size * inp.size, inp.dtype)
    return g.collective(Request("all_gather", {"data": flat(inp), "out": staged}, inp.size, inp.dtype,
                                algorithm=algorithm, after=_copied_out(staged, outs, inp.size)), async_op)


@_refusing("reduce_scatter_tensor", 3)
def reduce_scatter_tensor(output: Tensor, input: Tensor, op: Op = ReduceOp.SUM, group: Group = None,
                          async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``input`` (world size x ``output``) across ranks; rank r keeps block r in ``output``."""
    g = resolve_group(group)
    out, inp = as_array(output, "output"), as_array(input, "input", writable=False)
    check_same_dtype(out, inp)
    op = check_op(op, out.dtype)
    if inp.size != g.size * out.size:
        raise ValueError(f"input has {inp.size} elements; reduce_scatter needs world size x output = "
                         f"{g.size * out.size}")
    result = flat(out)
    return g.collective(Request("reduce_scatter", {"data": _apart(inp, out), "out": result}, out.size, out.dtype, op, 0,
                                algorithm, finish_reduction(op, result, g.size)), async_op)


@_refusing("reduce_scatter", 3)
def reduce_scatter(output: Tensor, input_list: list[Tensor], op: Op = ReduceOp.SUM, group: Group = None,
                   async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``input_list[r]`` across ranks into ``output`` on rank r."""
    g = resolve_group(group)
    out = as_array(output, "output")
    ins = arrays_per_rank(input_list, g.size, out, "input_list", writable=False)
    staged = np.concatenate([flat(i) for i in ins]) if ins else np.empty(0, out.dtype)
    return reduce_scatter_tensor(out, staged, op, group, async_op, algorithm)


@_refusing("all_to_all_single", 4)
def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Group = None,
                      async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Rank r sends block j of ``input`` to rank j, which stores it as block r of ``output``.

    Blocks are equal unless split sizes (rows of dim 0 per rank, as in torch) are given; uneven
    blocks are padded to the largest (:mod:`.uneven`).
    """
    g = resolve_group(group)
    out, inp = as_array(output, "output"), as_array(input, "input", writable=False)
    check_same_dtype(out, inp)
    if output_split_sizes is not None or input_split_sizes is not None:
        return uneven.all_to_all_single(g, out, inp, output_split_sizes, input_split_sizes, async_op, algorithm)
    if out.size != inp.size or inp.size % g.size:
        raise ValueError(f"input and output must have the same size, divisible by the world size {g.size}; "
                         f"got {inp.size} and {out.size}")
    return g.collective(Request("all_to_all", {"data": _apart(inp, out), "out": flat(out)}, inp.size // g.size,
                                inp.dtype, algorithm=algorithm), async_op)


@_refusing("gather", 3)
def gather(tensor: Tensor, gather_list: list[Tensor] | None = None, dst: int = 0, group: Group = None,
           async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (``None`` elsewhere)."""
    g = resolve_group(group)
    check_rank(dst, g.size, "dst")
    inp = as_array(tensor, "tensor", writable=False)
    buffers, after = {"data": flat(inp)}, None
    if g.rank == dst:
        outs = arrays_per_rank(gather_list, g.size, inp, "gather_list")
        staged = buffers["out"] = np.empty(g.size * inp.size, inp.dtype)
        after = _copied_out(staged, outs, inp.size)
    elif gather_list is not None:
        raise ValueError(f"gather_list must be None on ranks other than dst={dst}")
    return g.collective(Request("gather", buffers, inp.size, inp.dtype, ReduceOp.SUM, dst, algorithm, after), async_op)


@_refusing("scatter", 3)
def scatter(tensor: Tensor, scatter_list: list[Tensor] | None = None, src: int = 0, group: Group = None,
            async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Rank ``src`` sends ``scatter_list[r]`` to rank r, which receives it into ``tensor``."""
    g = resolve_group(group)
    check_rank(src, g.size, "src")
    out = as_array(tensor)
    buffers = {"out": flat(out)}
    if g.rank == src:
        ins = arrays_per_rank(scatter_list, g.size, out, "scatter_list", writable=False)
        buffers["data"] = np.concatenate([flat(i) for i in ins]) if out.size else np.empty(0, out.dtype)
    elif scatter_list is not None:
        raise ValueError(f"scatter_list must be None on ranks other than src={src}")
    return g.collective(Request("scatter", buffers, out.size, out.dtype, ReduceOp.SUM, src, algorithm), async_op)


def barrier(group: Group = None, async_op: bool = False) -> Work | None:
    """Return only once every rank of ``group`` has entered the barrier."""
    g = resolve_group(group)
    if not async_op:
        known = g.shortcuts.get(Shape.barrier())
        if known is not None and known.run(None):
            return None
    return g.collective(Request("barrier", {}, 0, np.dtype(np.uint8)), async_op)


def send(tensor: Tensor, dst: int, group: Group = None, tag: int = 0) -> None:
    """Send ``tensor`` to rank ``dst``; returns once it is sent (see :func:`isend`).

    Example (two ranks)::

        if rank == 0: dist.send(np.arange(3.0), dst=1, tag=7)
        else: dist.recv(x, src=0, tag=7)   # x: [0., 1., 2.]
    """
    isend(tensor, dst, group, tag).complete()


def recv(tensor: Tensor, src: int | None = None, group: Group = None, tag: int = 0) -> int:
    """Receive into ``tensor`` a message sent with ``tag`` by rank ``src`` (``None``: any rank).

    Returns the rank the message came from (in ``group``), as torch does.

    Raises:
        Mismatch: the message has another dtype or number of elements (the group breaks).
        CommTimeout: none came within the group's timeout. PeerLost: ``src`` exited.
    """
    work = irecv(tensor, src, group, tag)
    work.complete()
    return cast(int, work.source)  # set once the receive is done


def isend(tensor: Tensor, dst: int, group: Group = None, tag: int = 0) -> P2PWork:
    """Start sending ``tensor`` to rank ``dst`` with ``tag``; returns a :class:`~allreduce.p2p.P2PWork`.

    Sends and receives may be posted in any order, between any pairs: each completes as soon as its
    partner is posted, never waiting behind collectives or other messages. Two messages to one rank
    with the same tag are received in the order sent. ``tensor`` must not change until the work is done:
    a small one is done once handed to the kernel, a large one (over 64 KiB) once ``dst`` has posted
    its receive and the bytes have left.

    Raises:
        ValueError: ``dst`` is not another rank of the group, or ``tag`` is not in 0..2**31-1.
    """
    g = resolve_group(group)
    check_peer(dst, g.size, g.rank, "dst")
    check_tag(tag)
    return g.point_to_point(flat(as_array(tensor, writable=False)), int(dst), int(tag), True)


def irecv(tensor: Tensor, src: int | None = None, group: Group = None, tag: int = 0) -> P2PWork:
    """Start receiving into ``tensor`` from rank ``src`` (``None``: any rank) with ``tag``.

    Returns a :class:`~allreduce.p2p.P2PWork`; once it is done, its ``source`` is the sender's rank.
    The message must have ``tensor``'s dtype and number of elements.

    Example (three ranks, on rank 0)::

        works = [dist.irecv(buf[i]) for i in range(2)]   # from whichever ranks send first
        [w.wait() for w in works]; sorted(w.source for w in works)   # [1, 2]
    """
    g = resolve_group(group)
    if src is not None:
        check_peer(src, g.size, g.rank, "src")
    check_tag(tag)
    return g.point_to_point(flat(as_array(tensor)), None if src is None else int(src), int(tag), False)


def all_reduce_scalar(value: Number, op: Op = ReduceOp.SUM, group: Group = None) -> Number:
    """All-reduce one Python number (the article's ``SimpleAllReduce``) and return the result.

    Example (two ranks)::

        dist.all_reduce_scalar(rank + 1.5)   # both: 4.0
    """
    arr = np.array([value])
    if arr.dtype.kind not in "biufc" or arr.ndim != 1:
        raise TypeError(f"all_reduce_scalar takes a number, got {type(value).__name__}")
    all_reduce(arr, op, group)
    result: Number = arr[0].item()
    return result


# ---- helpers ------------------------------------------------------------------------------------

def _apart(inp: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The flat input, copied where it overlaps ``out`` (the same array, a view, a slice of one buffer).

    Schedules read their input while they write their output, so an overlapping input would be
    overwritten before it is sent. Both are C-contiguous, so overlapping bounds are overlapping memory.
    """
    return flat(inp).copy() if np.may_share_memory(inp, out) else flat(inp)


def _copied_out(staged: np.ndarray, outs: list[np.ndarray], block: int) -> Callable[[], None]:
    """What copies block i of ``staged`` (``block`` elements) into ``outs[i]`` once a gather into a list is done."""
    def copy_out() -> None:
        for i, o in enumerate(outs):
            flat(o)[:] = staged[i * block:(i + 1) * block]

    return copy_out
