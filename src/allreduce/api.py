"""The public functions, shaped like torch.distributed: same names, argument order and meaning.

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

import datetime
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Union, cast

import numpy as np

from . import logs, rendezvous, topology, uneven
from .bootstrap import form_group, leave
from .buffers import as_array, flat
from .runtime import ProcessGroup, Request
from .ops import ReduceOp, check_op, finish_reduction
from .p2p import TAG_UB, P2PWork
from .planner import determinism
from .security import Security
from .settings import DEFAULT_TIMEOUT, Settings
from .transport.shm import ShmOptions
from .work import Work

if TYPE_CHECKING:
    import torch

BACKENDS = (None, "allreduce", "tcp")


class NonMember:
    """What :func:`new_group` returns on ranks outside the group: using it raises ``ValueError``."""

    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def __repr__(self) -> str:
        return f"<allreduce group {self.ranks}: this rank is not a member>"


# What the public functions take, named so that signatures say it (and type checkers see it).
Tensor = Union[np.ndarray, "torch.Tensor"]  # a numpy array or a torch CPU tensor, read and written in place
Group = Union[ProcessGroup, NonMember, None]  # None: the default group
Op = Union[ReduceOp, int]  # a ReduceOp, or its value
Timeout = Union[float, datetime.timedelta, None]  # seconds; None: the default group's, else DEFAULT_TIMEOUT
Number = Union[int, float, complex]


class _State:
    world: ProcessGroup | None = None
    groups: list[ProcessGroup] = []
    new_groups = 0
    settings = Settings()  # read from the environment by init_process_group
    shm_options = ShmOptions()


# ---- setup --------------------------------------------------------------------------------------

def init_process_group(backend: str | None = None, init_method: str | None = None, timeout: Timeout = None,
                       world_size: int = -1, rank: int = -1, store: rendezvous.Store | None = None,
                       group_name: str = "") -> None:
    """Join the job's default group: find the other ranks, then connect to every one of them.

    Args:
        backend: ``None``/``"allreduce"``/``"tcp"``.
        init_method: ``env://`` (default; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, or the variables of
            torchrun, Open MPI, MPICH or Slurm), ``tcp://host:port`` or ``file:///path``.
        timeout: deadline (seconds or ``timedelta``) of the rendezvous and of every collective,
            default 10 minutes (torch's is 30; a hung job should fail sooner).
        world_size, rank: override the environment; required with ``store``.
        store: an existing key-value store to rendezvous through.

    Raises:
        RuntimeError: already initialized. ValueError: bad arguments or a bad ``ALLREDUCE_*`` variable.
        RendezvousError: peers not found.

    Example (each of two ranks)::

        dist.init_process_group()          # under `allreduce run -n 2 -- python script.py`
    """
    if _State.world is not None:
        raise RuntimeError("init_process_group was already called; call destroy_process_group() first")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allreduce offers {', '.join(map(repr, BACKENDS))}")
    seconds = _seconds(timeout)
    settings, shm_options = Settings.from_env(), ShmOptions.from_env()  # the environment, read once
    logs.configure(settings.debug)
    if store is None:
        joining = rendezvous.Joining(rendezvous.from_environment(), Security.of(settings))
        store, rank, world_size = rendezvous.rendezvous(init_method, rank, world_size, seconds, joining)
    elif rank < 0 or world_size < 1:
        raise ValueError("with store=..., pass rank= and world_size= too")
    _State.world = form_group(store, rank, world_size, seconds, group_name or "default", list(range(world_size)),
                              settings, shm_options)
    _State.settings, _State.shm_options, _State.new_groups = settings, shm_options, 0


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Finish queued work and close the group (the default group: every group, and the store)."""
    if group is not None and group is not _State.world:
        if isinstance(group, ProcessGroup):
            group.close()
            _State.groups.remove(group)
        return
    world = _require()
    for g in _State.groups:
        g.close()
    world.close()
    _State.world, _State.groups = None, []
    leave(world.store, world.size, wait=world.healthy)


def is_initialized() -> bool:
    """Whether this process has joined the default group (and not yet destroyed it)."""
    return _State.world is not None


def use_deterministic_algorithms(mode: bool) -> None:
    """Make every ``all_reduce``, ``reduce`` and ``reduce_scatter`` with SUM, AVG or PRODUCT (of a
    floating dtype) return exactly the left fold over ranks in rank order, ``((x0 + x1) + x2) + ...``,
    computed elementwise in the dtype: the same bits whatever the algorithm, transport, world size or
    timing. Process-wide, for every group, and it overrides ``ALLREDUCE_DETERMINISTIC``.

    Only algorithms that reduce in rank order then run (on more than two ranks, ``ordered``, even when
    another algorithm is named): they send the bytes of a ring, but reduce after the transfer, not
    during it. MIN, MAX, the bitwise ops and integer dtypes are unaffected: any order gives their bits.

    Example: ``dist.use_deterministic_algorithms(True)``, then ``dist.all_reduce(x)`` on 4 ranks returns
    ``((x0 + x1) + x2) + x3`` on every rank, run after run.
    """
    determinism.use_deterministic_algorithms(mode)


def are_deterministic_algorithms_enabled() -> bool:
    """Whether deterministic mode is on (see :func:`use_deterministic_algorithms`): as last set there,
    else as ``ALLREDUCE_DETERMINISTIC`` said when :func:`init_process_group` read it."""
    return determinism.enabled(_State.settings)


def default_group() -> ProcessGroup:
    """The default group that :func:`init_process_group` formed.

    Raises:
        RuntimeError: not initialized.
    """
    return _require()


def get_rank(group: Group = None) -> int:
    """This rank's index in ``group`` (the default group if ``None``); -1 if not a member."""
    if isinstance(group, NonMember):
        return -1
    return _group(group).rank


def get_world_size(group: Group = None) -> int:
    """Number of ranks in ``group``; -1 if this rank is not a member."""
    if isinstance(group, NonMember):
        return -1
    return _group(group).size


def get_topology(group: Group = None) -> topology.Topology:
    """Where this rank sits among the hosts of ``group`` (default: the world).

    Example (2 hosts x 2 ranks, on rank 3): ``Topology(rank=3, size=4, local_rank=1, local_size=2,
    cross_rank=1, cross_size=2, hosts=((0, 1), (2, 3)))``.
    """
    return _group(group).topology


def new_group(ranks: Iterable[int] | None = None, timeout: Timeout = None) -> ProcessGroup | NonMember:
    """A subgroup of the given world ranks; every rank of the job must call it, in the same order.

    Returns the group on members and a :class:`NonMember` elsewhere (collectives on it raise).
    """
    world = _require()
    _State.new_groups += 1
    members = sorted(set(range(world.size) if ranks is None else ranks))
    if not members or members[0] < 0 or members[-1] >= world.size:
        raise ValueError(f"new_group ranks must be a non-empty subset of 0..{world.size - 1}, got {ranks}")
    if world.rank not in members:
        return NonMember(members)
    name = f"group{_State.new_groups}"
    store = world.store.prefix(name)
    group = form_group(store, members.index(world.rank), len(members), _seconds(timeout) if timeout else world.timeout,
                       name, members, _State.settings, _State.shm_options)
    _State.groups.append(group)
    return group


# ---- collectives --------------------------------------------------------------------------------

def all_reduce(tensor: Tensor, op: Op = ReduceOp.SUM, group: Group = None, async_op: bool = False,
               algorithm: str | None = None) -> Work | None:
    """Reduce ``tensor`` across all ranks in place; every rank ends with the same result.

    ``algorithm``: ``"auto"`` (default), ``"ring"``, ``"tree"``, ``"reduce_bcast"`` or any registered one.

    Example (two ranks)::

        x = np.array([rank + 1.0])   # rank 0: [1.], rank 1: [2.]
        dist.all_reduce(x)           # both: [3.]
    """
    g = _group(group)
    arr = as_array(tensor)
    op = _checked_op(op, arr.dtype)
    data = arr if arr.ndim == 1 else flat(arr)
    return g.collective(Request("all_reduce", {"data": data}, data.size, arr.dtype, op, 0, algorithm,
                                finish_reduction(op, data, g.size)), async_op)


def reduce(tensor: Tensor, dst: int, op: Op = ReduceOp.SUM, group: Group = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Reduce ``tensor`` from all ranks into ``tensor`` on rank ``dst``; other ranks' tensors are unchanged."""
    g = _group(group)
    arr = as_array(tensor)
    op = check_op(op, arr.dtype)
    _check_rank(dst, g, "dst")
    data = flat(arr)
    after = finish_reduction(op, data, g.size) if g.rank == dst else None
    return g.collective(Request("reduce", {"data": data}, data.size, arr.dtype, op, dst, algorithm, after), async_op)


def broadcast(tensor: Tensor, src: int, group: Group = None, async_op: bool = False,
              algorithm: str | None = None) -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank."""
    g = _group(group)
    arr = as_array(tensor)
    _check_rank(src, g, "src")
    data = flat(arr)
    return g.collective(Request("broadcast", {"data": data}, data.size, arr.dtype, ReduceOp.SUM, src, algorithm), async_op)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Group = None, async_op: bool = False,
                           algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor`` on every rank."""
    g = _group(group)
    out, inp = as_array(output_tensor, "output_tensor"), as_array(input_tensor, "input_tensor", writable=False)
    _check_same_dtype(out, inp)
    if out.size != g.size * inp.size:
        raise ValueError(f"output_tensor has {out.size} elements; all_gather needs world size x input = {g.size * inp.size}")
    return g.collective(Request("all_gather", {"data": _apart(inp, out), "out": flat(out)}, inp.size, inp.dtype,
                                algorithm=algorithm), async_op)


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Group = None, async_op: bool = False,
               algorithm: str | None = None) -> Work | None:
    """Fill ``tensor_list[i]`` with rank i's ``tensor`` on every rank."""
    g = _group(group)
    inp = as_array(tensor, "tensor", writable=False)
    outs = _tensor_list(tensor_list, g.size, inp, "tensor_list")
    staged = np.empty(g.size * inp.size, inp.dtype)

    def scatter_out() -> None:
        for i, o in enumerate(outs):
            flat(o)[:] = staged[i * inp.size:(i + 1) * inp.size]

    return g.collective(Request("all_gather", {"data": flat(inp), "out": staged}, inp.size, inp.dtype,
                                algorithm=algorithm, after=scatter_out), async_op)


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: Op = ReduceOp.SUM, group: Group = None,
                          async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``input`` (world size x ``output``) across ranks; rank r keeps block r in ``output``."""
    g = _group(group)
    out, inp = as_array(output, "output"), as_array(input, "input", writable=False)
    _check_same_dtype(out, inp)
    op = check_op(op, out.dtype)
    if inp.size != g.size * out.size:
        raise ValueError(f"input has {inp.size} elements; reduce_scatter needs world size x output = {g.size * out.size}")
    result = flat(out)
    return g.collective(Request("reduce_scatter", {"data": _apart(inp, out), "out": result}, out.size, out.dtype, op, 0,
                                algorithm, finish_reduction(op, result, g.size)), async_op)


def reduce_scatter(output: Tensor, input_list: list[Tensor], op: Op = ReduceOp.SUM, group: Group = None,
                   async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``input_list[r]`` across ranks into ``output`` on rank r."""
    g = _group(group)
    out = as_array(output, "output")
    ins = _tensor_list(input_list, g.size, out, "input_list", writable=False)
    staged = np.concatenate([flat(i) for i in ins]) if ins else np.empty(0, out.dtype)
    return reduce_scatter_tensor(out, staged, op, group, async_op, algorithm)


def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Group = None,
                      async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Rank r sends block j of ``input`` to rank j, which stores it as block r of ``output``.

    Blocks are equal unless split sizes (rows of dim 0 per rank, as in torch) are given; uneven
    blocks are padded to the largest (:mod:`.uneven`).
    """
    g = _group(group)
    if output_split_sizes is not None or input_split_sizes is not None:
        return uneven.all_to_all_single(g, as_array(output, "output"), as_array(input, "input", writable=False),
                                        output_split_sizes, input_split_sizes, async_op, algorithm)
    out, inp = as_array(output, "output"), as_array(input, "input", writable=False)
    _check_same_dtype(out, inp)
    if out.size != inp.size or inp.size % g.size:
        raise ValueError(f"input and output must have the same size, divisible by the world size {g.size}; "
                         f"got {inp.size} and {out.size}")
    return g.collective(Request("all_to_all", {"data": _apart(inp, out), "out": flat(out)}, inp.size // g.size,
                                inp.dtype, algorithm=algorithm), async_op)


def gather(tensor: Tensor, gather_list: list[Tensor] | None = None, dst: int = 0, group: Group = None,
           async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (``None`` elsewhere)."""
    g = _group(group)
    _check_rank(dst, g, "dst")
    inp = as_array(tensor, "tensor", writable=False)
    buffers, after = {"data": flat(inp)}, None
    if g.rank == dst:
        outs = _tensor_list(gather_list, g.size, inp, "gather_list")
        staged = buffers["out"] = np.empty(g.size * inp.size, inp.dtype)

        def after() -> None:
            for i, o in enumerate(outs):
                flat(o)[:] = staged[i * inp.size:(i + 1) * inp.size]
    elif gather_list is not None:
        raise ValueError(f"gather_list must be None on ranks other than dst={dst}")
    return g.collective(Request("gather", buffers, inp.size, inp.dtype, ReduceOp.SUM, dst, algorithm, after), async_op)


def scatter(tensor: Tensor, scatter_list: list[Tensor] | None = None, src: int = 0, group: Group = None,
            async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Rank ``src`` sends ``scatter_list[r]`` to rank r, which receives it into ``tensor``."""
    g = _group(group)
    _check_rank(src, g, "src")
    out = as_array(tensor)
    buffers = {"out": flat(out)}
    if g.rank == src:
        ins = _tensor_list(scatter_list, g.size, out, "scatter_list", writable=False)
        buffers["data"] = np.concatenate([flat(i) for i in ins]) if out.size else np.empty(0, out.dtype)
    elif scatter_list is not None:
        raise ValueError(f"scatter_list must be None on ranks other than src={src}")
    return g.collective(Request("scatter", buffers, out.size, out.dtype, ReduceOp.SUM, src, algorithm), async_op)


def barrier(group: Group = None, async_op: bool = False) -> Work | None:
    """Return only once every rank of ``group`` has entered the barrier."""
    g = _group(group)
    return g.collective(Request("barrier", {}, 0, np.dtype(np.uint8)), async_op)


def send(tensor: Tensor, dst: int, group: Group = None, tag: int = 0) -> None:
    """Send ``tensor`` to rank ``dst``; returns once it is sent (see :func:`isend`).

    Example (two ranks)::

        if rank == 0: dist.send(np.arange(3.0), dst=1, tag=7)
        else: dist.recv(x, src=0, tag=7)   # x: [0., 1., 2.]
    """
    isend(tensor, dst, group, tag).wait()


def recv(tensor: Tensor, src: int | None = None, group: Group = None, tag: int = 0) -> int:
    """Receive into ``tensor`` a message sent with ``tag`` by rank ``src`` (``None``: any rank).

    Returns the rank the message came from (in ``group``), as torch does.

    Raises:
        Mismatch: the message has another dtype or number of elements (the group breaks).
        CommTimeout: none came within the group's timeout. PeerLost: ``src`` exited.
    """
    work = irecv(tensor, src, group, tag)
    work.wait()
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
    g = _group(group)
    _check_rank(dst, g, "dst", peer=True)
    _check_tag(tag)
    return g.point_to_point(flat(as_array(tensor, writable=False)), int(dst), int(tag), True)


def irecv(tensor: Tensor, src: int | None = None, group: Group = None, tag: int = 0) -> P2PWork:
    """Start receiving into ``tensor`` from rank ``src`` (``None``: any rank) with ``tag``.

    Returns a :class:`~allreduce.p2p.P2PWork`; once it is done, its ``source`` is the sender's rank.
    The message must have ``tensor``'s dtype and number of elements.

    Example (three ranks, on rank 0)::

        works = [dist.irecv(buf[i]) for i in range(2)]   # from whichever ranks send first
        [w.wait() for w in works]; sorted(w.source for w in works)   # [1, 2]
    """
    g = _group(group)
    if src is not None:
        _check_rank(src, g, "src", peer=True)
    _check_tag(tag)
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

# (op, dtype) -> the ReduceOp check_op returned: the hot path checks each pair once
_CHECKED: dict[tuple[object, np.dtype], ReduceOp] = {}


def _checked_op(op: object, dtype: np.dtype) -> ReduceOp:
    """:func:`check_op`, remembered per (op, dtype) pair that it accepted."""
    try:
        return _CHECKED[op, dtype]
    except (KeyError, TypeError):  # not seen yet, or an op that cannot be a key: check it in full
        checked = check_op(op, dtype)
    if type(op) is ReduceOp and len(_CHECKED) < 1024:
        _CHECKED[op, dtype] = checked
    return checked


def _require() -> ProcessGroup:
    if _State.world is None:
        raise RuntimeError("the default process group is not initialized; call allreduce.init_process_group() first")
    return _State.world


def _group(group: Group) -> ProcessGroup:
    if group is None:
        return _require()
    if isinstance(group, NonMember):
        raise ValueError(f"rank {_require().rank} is not a member of group {group.ranks}")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a group from new_group(), got {type(group).__name__}")
    return group


def _check_rank(rank: int | None, g: ProcessGroup, name: str, peer: bool = False) -> None:
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < g.size:
        raise ValueError(f"{name}={rank!r} is not a rank of this group (0..{g.size - 1})")
    if peer and rank == g.rank:
        raise ValueError(f"{name}={rank} is this rank; point-to-point needs another rank")


def _check_tag(tag: int) -> None:
    if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= TAG_UB:
        raise ValueError(f"tag={tag!r} must be an integer in 0..{TAG_UB}")


def _apart(inp: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The flat input, copied where it overlaps ``out`` (the same array, a view, a slice of one buffer).

    Schedules read their input while they write their output, so an overlapping input would be
    overwritten before it is sent. Both are C-contiguous, so overlapping bounds are overlapping memory.
    """
    return flat(inp).copy() if np.may_share_memory(inp, out) else flat(inp)


def _check_same_dtype(a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"input and output dtypes differ: {b.dtype} vs {a.dtype}")


def _tensor_list(tensors: Sequence[Tensor] | None, size: int, like: np.ndarray, name: str,
                 writable: bool = True) -> list[np.ndarray]:
    if tensors is None or len(tensors) != size:
        raise ValueError(f"{name} must hold one tensor per rank ({size}), got {None if tensors is None else len(tensors)}")
    arrays = [as_array(t, f"{name}[{i}]", writable) for i, t in enumerate(tensors)]
    for i, a in enumerate(arrays):
        if a.dtype != like.dtype or a.size != like.size:
            raise ValueError(f"{name}[{i}] must match the tensor ({like.size} x {like.dtype}), got {a.size} x {a.dtype}")
    return arrays


def _seconds(timeout: Timeout) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return seconds


# ---- queries and groups that layers above build on ----------------------------------------------

def is_available() -> bool:
    """Whether collectives can be used in this build (always: there is nothing optional to lack)."""
    return True


def get_backend(group: Group = None) -> str:
    """The backend of ``group``: ``"allreduce"`` (shared memory inside a host, TCP across)."""
    _group(group)
    return "allreduce"


def get_local_rank(group: Group = None) -> int:
    """This rank's index among the ranks of ``group`` on its host (Horovod's ``local_rank``)."""
    return _group(group).topology.local_rank


def get_local_size(group: Group = None) -> int:
    """How many ranks of ``group`` share this rank's host."""
    return _group(group).topology.local_size


def resolve_group(group: Group = None) -> ProcessGroup:
    """The :class:`ProcessGroup` a ``group`` argument names (``None``: the default group).

    Raises:
        RuntimeError: not initialized. ValueError: this rank is not a member. TypeError: not a group.
    """
    return _group(group)


_SPLITS: weakref.WeakKeyDictionary[ProcessGroup, int] = weakref.WeakKeyDictionary()  # parent group -> splits made of it


def split_group(parent_pg: Group = None, split_ranks: Iterable[Iterable[int]] | None = None,
                timeout: Timeout = None) -> ProcessGroup | NonMember:
    """Split ``parent_pg`` into disjoint new groups; every rank of the parent calls it, with the same splits.

    Unlike :func:`new_group`, only the parent's ranks take part, so a subgroup can be split again
    (MPI's ``Comm.Split`` and ``Dup``). ``split_ranks`` lists each new group's ranks in the parent,
    in the order that becomes their rank in the new group; ``None`` is one group of every rank.

    Returns the new group that holds this rank, or a :class:`NonMember` if none does.

    Example (four ranks)::

        g = dist.split_group(split_ranks=[[0, 1], [3, 2]])
        dist.get_rank(g)   # rank 0: 0, rank 1: 1, rank 2: 1, rank 3: 0

    Raises:
        ValueError: a rank out of range, in two splits, or an empty split.
    """
    parent = _group(parent_pg)
    splits = [[int(r) for r in ranks] for ranks in ([range(parent.size)] if split_ranks is None else split_ranks)]
    listed = [r for ranks in splits for r in ranks]
    if not all(splits) or len(set(listed)) != len(listed) or not all(0 <= r < parent.size for r in listed):
        raise ValueError(f"split_ranks must be disjoint, non-empty lists of ranks in 0..{parent.size - 1}, got {split_ranks}")
    _SPLITS[parent] = count = _SPLITS.get(parent, 0) + 1  # the same on every rank of the parent
    mine = next((i for i, ranks in enumerate(splits) if parent.rank in ranks), None)
    if mine is None:
        return NonMember(sorted(parent.ranks[r] for r in listed))
    members = splits[mine]
    name = f"{parent.name}.split{count}.{mine}"
    group = form_group(_require().store.prefix(name), members.index(parent.rank), len(members),
                       _seconds(timeout) if timeout else parent.timeout, name, [parent.ranks[r] for r in members],
                       _State.settings, _State.shm_options)
    _State.groups.append(group)
    return group
