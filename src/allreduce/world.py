"""The world: the default group and the groups formed from it, and what this rank knows about them.

:func:`init_process_group` forms the default group (and opens the job's lifelines, :mod:`.resilience`);
:func:`new_group`, :func:`split_group` and :func:`self_group` form others from it, and
:func:`destroy_process_group` closes them. They are kept in the :mod:`.roster`, whose
:func:`~.roster.resolve_group` turns a ``group`` argument into the :class:`ProcessGroup` that the calls
(:mod:`.calls`) and the layers above issue to.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable

from . import rendezvous, topology
from .arguments import Timeout, timeout_seconds
from .bootstrap import form_group, leave, release
from .planner import determinism
from .resilience import recovery
from .roster import Group, NonMember, Roster, default_group, entry_settings, resolve_group
from .runtime import ProcessGroup
from .security import Security

BACKENDS = (None, "allreduce", "tcp")


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
    if Roster.world is not None:
        raise RuntimeError("init_process_group was already called; call destroy_process_group() first")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allreduce offers {', '.join(map(repr, BACKENDS))}")
    seconds = timeout_seconds(timeout)
    settings, shm_options, lobby_at = entry_settings(os.environ)
    if store is None:
        joining = rendezvous.Joining(rendezvous.from_environment(), Security.of(settings))
        store, rank, world_size = rendezvous.rendezvous(init_method, rank, world_size, seconds, joining)
    elif rank < 0 or world_size < 1:
        raise ValueError("with store=..., pass rank= and world_size= too")
    world = form_group(store, rank, world_size, seconds, group_name or "default", list(range(world_size)),
                       settings, shm_options)
    try:
        recovery.start(world, settings, lobby_at)
    except BaseException:
        world.close()
        leave(world.store, world_size, wait=False)
        raise
    Roster.world = world
    Roster.settings, Roster.shm_options, Roster.new_groups = settings, shm_options, 0


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Finish queued work and close the group (the default group: every group, and the store)."""
    if group is not None and group is not Roster.world:
        if isinstance(group, ProcessGroup):
            group.close()
            Roster.groups.remove(group)
            release(group.store, group.size)
        return
    world = default_group()
    for g in [*Roster.groups, world]:
        g.close()
        release(g.store, g.size)
    Roster.world, Roster.groups = None, []
    lost = world.membership is not None and bool(world.membership.failed())  # the dead will never count out
    leave(world.store, world.size, wait=world.healthy and not lost)
    recovery.close()


def is_initialized() -> bool:
    """Whether this process has joined the default group (and not yet destroyed it)."""
    return Roster.world is not None


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
    return determinism.enabled(Roster.settings)


def get_rank(group: Group = None) -> int:
    """This rank's index in ``group`` (the default group if ``None``); -1 if not a member."""
    if isinstance(group, NonMember):
        return -1
    return resolve_group(group).rank


def get_world_size(group: Group = None) -> int:
    """Number of ranks in ``group``; -1 if this rank is not a member."""
    if isinstance(group, NonMember):
        return -1
    return resolve_group(group).size


def get_topology(group: Group = None) -> topology.Topology:
    """Where this rank sits among the hosts of ``group`` (default: the world).

    Example (2 hosts x 2 ranks, on rank 3): ``Topology(rank=3, size=4, local_rank=1, local_size=2,
    cross_rank=1, cross_size=2, hosts=((0, 1), (2, 3)))``.
    """
    return resolve_group(group).topology


def new_group(ranks: Iterable[int] | None = None, timeout: Timeout = None) -> ProcessGroup | NonMember:
    """A subgroup of the given world ranks; every rank of the job must call it, in the same order.

    Returns the group on members and a :class:`NonMember` elsewhere (collectives on it raise).
    """
    world = default_group()
    Roster.new_groups += 1
    members = sorted(set(range(world.size) if ranks is None else ranks))
    if not members or members[0] < 0 or members[-1] >= world.size:
        raise ValueError(f"new_group ranks must be a non-empty subset of 0..{world.size - 1}, got {ranks}")
    if world.rank not in members:
        return NonMember(members)
    name = f"group{Roster.new_groups}"
    return _subgroup(name, members.index(world.rank), members, timeout, world.timeout)


# ---- queries and groups that layers above build on ----------------------------------------------

def is_available() -> bool:
    """Whether collectives can be used in this build (always: there is nothing optional to lack)."""
    return True


def get_backend(group: Group = None) -> str:
    """The backend of ``group``: ``"allreduce"`` (shared memory inside a host, TCP across)."""
    resolve_group(group)
    return "allreduce"


def get_local_rank(group: Group = None) -> int:
    """This rank's index among the ranks of ``group`` on its host (Horovod's ``local_rank``)."""
    return resolve_group(group).topology.local_rank


def get_local_size(group: Group = None) -> int:
    """How many ranks of ``group`` share this rank's host."""
    return resolve_group(group).topology.local_size


def self_group(timeout: Timeout = None) -> ProcessGroup:
    """A group of this rank alone (MPI's ``COMM_SELF``), formed by this rank without any peer taking part.

    Each call forms a new group; the default group's destruction closes it.
    """
    world = default_group()
    _SELVES[world] = count = _SELVES.get(world, 0) + 1  # this rank's own count: no peer needs to agree
    return _subgroup(f"self{world.rank}.{count}", 0, [world.rank], timeout, world.timeout)


_SELVES: weakref.WeakKeyDictionary[ProcessGroup, int] = weakref.WeakKeyDictionary()  # world group -> selves formed
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
    parent = resolve_group(parent_pg)
    splits = [[int(r) for r in ranks] for ranks in ([range(parent.size)] if split_ranks is None else split_ranks)]
    listed = [r for ranks in splits for r in ranks]
    if not all(splits) or len(set(listed)) != len(listed) or not all(0 <= r < parent.size for r in listed):
        raise ValueError(f"split_ranks must be disjoint, non-empty lists of ranks in 0..{parent.size - 1}, "
                         f"got {split_ranks}")
    _SPLITS[parent] = count = _SPLITS.get(parent, 0) + 1  # the same on every rank of the parent
    mine = next((i for i, ranks in enumerate(splits) if parent.rank in ranks), None)
    if mine is None:
        return NonMember(sorted(parent.ranks[r] for r in listed))
    members = splits[mine]
    name = f"{parent.name}.split{count}.{mine}"
    return _subgroup(name, members.index(parent.rank), [parent.ranks[r] for r in members], timeout, parent.timeout)


def _subgroup(name: str, rank: int, ranks: list[int], timeout: Timeout, inherited: float) -> ProcessGroup:
    """Form the group ``name`` of the world ranks ``ranks`` (this one is ``rank`` in it), with the
    default group's settings; the default group's destruction closes it. ``timeout``: ``inherited`` if unset."""
    default_group().check_owner()  # a fork() child must not talk on its parent's store connection
    group = form_group(default_group().store.prefix(name), rank, len(ranks),
                       timeout_seconds(timeout) if timeout else inherited, name, ranks, Roster.settings,
                       Roster.shm_options)
    Roster.groups.append(group)
    world = default_group()
    if world.membership is not None:
        world.membership.survival.enroll(group, [world.membership.ids[r] for r in ranks])
    return group


def join_group(timeout: Timeout = None) -> ProcessGroup:
    """Instead of :func:`init_process_group` in a replacement process (:func:`is_replacement`): wait in the
    job's lobby until the members let it in at their next :func:`grow_group`, and make the grown group
    the default. Its rank comes after the members'; the state of the work comes from them (e.g. by
    ``broadcast_object_list``).

    Raises:
        RuntimeError: already initialized, or the job has no lobby. CommTimeout: not let in within
        ``timeout`` (default: the default timeout).
    """
    return recovery.join_group(os.environ, timeout)


def is_replacement() -> bool:
    """Whether ``allreduce run --max-np`` started this process to take a dead worker's place: it calls
    :func:`join_group` rather than :func:`init_process_group`."""
    return recovery.is_replacement(os.environ)  # asked before init: this is the entry
