"""The world: the default group and the groups formed from it, and what this rank knows about them.

:func:`init_process_group` forms the default group; :func:`new_group` and :func:`split_group` form
others from it, and :func:`destroy_process_group` closes them. :func:`resolve_group` turns a ``group``
argument into the :class:`ProcessGroup` that the calls (:mod:`.calls`) and the layers above issue to.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from typing import Union

from . import growth, logs, rendezvous, survival, topology
from .arguments import Timeout, timeout_seconds
from .bootstrap import form_group, leave, release
from .runtime import ProcessGroup
from .runtime.membership import Agreement, Membership, Survival
from .planner import determinism
from .security import Security
from .settings import Settings
from .transport.shm import ShmOptions

BACKENDS = (None, "allreduce", "tcp")
SHRINK_DEFAULT = 0x00  # shrink_group's flags, as torch.distributed's
SHRINK_ABORT = 0x01  # revoke the group first, so that members blocked in a collective of it come out


class NonMember:
    """What :func:`new_group` returns on ranks outside the group: using it raises ``ValueError``."""

    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def __repr__(self) -> str:
        return f"<allreduce group {self.ranks}: this rank is not a member>"


Group = Union[ProcessGroup, NonMember, None]  # None: the default group


class _State:
    world: ProcessGroup | None = None
    groups: list[ProcessGroup] = []
    new_groups = 0
    survival: Survival | None = None  # the lifelines among the processes of the job
    lobby: rendezvous.Store | None = None  # where replacements wait to join (allreduce run --max-np), once looked up
    lobby_at: str | None = None  # its host:port, as the launcher said at entry (None: the job cannot grow)
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
    seconds = timeout_seconds(timeout)
    settings, shm_options, lobby_at = _environment()
    if store is None:
        joining = rendezvous.Joining(rendezvous.from_environment(), Security.of(settings))
        store, rank, world_size = rendezvous.rendezvous(init_method, rank, world_size, seconds, joining)
    elif rank < 0 or world_size < 1:
        raise ValueError("with store=..., pass rank= and world_size= too")
    world = form_group(store, rank, world_size, seconds, group_name or "default", list(range(world_size)),
                       settings, shm_options)
    try:
        _State.survival = survival.start(world, settings)
    except BaseException:
        world.close()
        leave(world.store, world_size, wait=False)
        raise
    _State.world = world
    _State.settings, _State.shm_options, _State.new_groups = settings, shm_options, 0
    _State.lobby_at = lobby_at


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Finish queued work and close the group (the default group: every group, and the store)."""
    if group is not None and group is not _State.world:
        if isinstance(group, ProcessGroup):
            group.close()
            _State.groups.remove(group)
            release(group.store, group.size)
        return
    world = default_group()
    for g in [*_State.groups, world]:
        g.close()
        release(g.store, g.size)
    _State.world, _State.groups = None, []
    lost = world.membership is not None and bool(world.membership.failed())  # the dead will never count out
    leave(world.store, world.size, wait=world.healthy and not lost)
    if _State.survival is not None:
        _State.survival.close()
        _State.survival = None
    if _State.lobby is not None:
        _State.lobby.close()
        _State.lobby = None


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
    if _State.world is None:
        raise RuntimeError("the default process group is not initialized; call allreduce.init_process_group() first")
    return _State.world


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
    _State.new_groups += 1
    members = sorted(set(range(world.size) if ranks is None else ranks))
    if not members or members[0] < 0 or members[-1] >= world.size:
        raise ValueError(f"new_group ranks must be a non-empty subset of 0..{world.size - 1}, got {ranks}")
    if world.rank not in members:
        return NonMember(members)
    name = f"group{_State.new_groups}"
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


def resolve_group(group: Group = None) -> ProcessGroup:
    """The :class:`ProcessGroup` a ``group`` argument names (``None``: the default group).

    Raises:
        RuntimeError: not initialized. ValueError: this rank is not a member. TypeError: not a group.
    """
    if group is None:
        return default_group()
    if isinstance(group, NonMember):
        raise ValueError(f"rank {default_group().rank} is not a member of group {group.ranks}")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a group from new_group(), got {type(group).__name__}")
    return group


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
        raise ValueError(f"split_ranks must be disjoint, non-empty lists of ranks in 0..{parent.size - 1}, got {split_ranks}")
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
                       timeout_seconds(timeout) if timeout else inherited, name, ranks, _State.settings,
                       _State.shm_options)
    _State.groups.append(group)
    world = default_group()
    if world.membership is not None:
        world.membership.survival.enroll(group, [world.membership.ids[r] for r in ranks])
    return group


# ---- surviving a member's death ------------------------------------------------------------------

def failed_ranks(group: Group = None) -> list[int]:
    """The ranks of ``group`` (default: the default group) whose processes this rank knows have died or
    left: their lifelines to this process ended. Each rank learns of a death on its own, within moments;
    :func:`agree` gives every survivor the same view.

    Example (rank 2 of 4 killed): ``dist.failed_ranks()`` on the others -> ``[2]``.

    Raises:
        RuntimeError: not initialized, or a group without lifelines.
    """
    return _membership(resolve_group(group)).failed()


def agree(value: int = -1, group: Group = None) -> Agreement:
    """Agree with the living members of ``group`` (default: the default group), even one that is broken,
    revoked or losing members meanwhile (ULFM's ``MPI_Comm_agree``): every member that returns gets the
    same :class:`Agreement`, its ``value`` the bitwise AND of every contribution (so ``1`` for "I
    succeeded" is 1 only if all did; the default ``-1`` has every bit set) and its ``failed`` the ranks
    known dead when it was decided. Runs over the lifelines, without the group's links or the store.

    Every living member must call it, in the same order as its other agreements and shrinks.

    Example (four ranks, rank 3 killed, the others pass their last finished step)::

        dist.agree(1 if ok else 0)   # on 0, 1, 2 -> Agreement(value=..., failed=[3])

    Raises:
        CommTimeout: a living member did not call it within the group's timeout (it is named).
        RuntimeError: not initialized, or a group without lifelines.
    """
    target = resolve_group(group)
    return _membership(target).agree(int(value), target.timeout)


def shrink_group(ranks_to_exclude: list[int] | None = None, group: Group = None, shrink_flags: int = SHRINK_DEFAULT,
                 pg_options: object = None) -> ProcessGroup:
    """A new group of ``group``'s members (default: the default group) less ``ranks_to_exclude``, the others
    renumbered in their order (torch.distributed's ``shrink_group``). ``None`` excludes the failed members,
    as the survivors agree on them (:func:`agree`); if none failed, it is a fresh group of every member, as
    after a :meth:`ProcessGroup.revoke`. ``group`` may be broken or revoked: that is what it is for.

    Shrinking the default group makes the new group the default, destroys every other group, and
    renumbers the world (``get_rank()`` is the rank in the new group). Only the members that stay call it,
    all of them, in the same order as their other agreements. ``shrink_flags=SHRINK_ABORT`` revokes
    ``group`` first. ``pg_options`` is accepted for torch's signature and unused.

    Example (four ranks, rank 1 killed, on ranks 0, 2 and 3)::

        g = dist.shrink_group()      # ranks 0, 2, 3 become 0, 1, 2 of the new default group

    Raises:
        TypeError: ``ranks_to_exclude`` is not a list. ValueError: it is empty, repeats or names a rank outside
        the group, names this rank, or every rank. PeerLost: a member that is not excluded is dead.
        CommTimeout: a living member did not take part in time. RuntimeError: a group without lifelines.
    """
    target = resolve_group(group)
    if ranks_to_exclude is not None:
        _check_excluded(ranks_to_exclude, target)
    if shrink_flags & SHRINK_ABORT:
        target.revoke()
    default = target is _State.world
    shrunk = survival.shrink(target, ranks_to_exclude, _State.settings, _State.shm_options, renumber=default)
    if default:
        for old in [*_State.groups, target]:
            old.close()
        if shrunk.store.base is not target.store.base:
            target.store.close()
        _State.world, _State.groups = shrunk, []
    else:
        _State.groups.append(shrunk)
    return shrunk


def grow_group() -> ProcessGroup:
    """Let the replacement processes waiting to join the job in (see :func:`join_group`): the default
    group becomes the group of its members, ranks kept, and the joiners, numbered after them (one
    agreement among the members; a new group only when someone waits). Every member calls it at the
    same point of its loop, e.g. every ``k`` steps; like :func:`shrink_group` on the default group, a new
    group destroys every other one. A job started without a lobby (``allreduce run --max-np K``) has
    nobody to let in, and the default group is returned as it is.

    Example (every rank, under ``allreduce run -n 4 --min-np 2 --max-np 4``)::

        if step % 10 == 0:
            dist.grow_group()                     # a replacement of a dead rank joins here
            step = dist.broadcast_object_list([step])[0]   # and learns where the others are

    Raises:
        PeerLost: a member died (shrink first). CommTimeout: a member or an admitted joiner did not
        take part in time.
    """
    world = default_group()
    if _State.lobby is None:
        _State.lobby = growth.lobby(_State.lobby_at, _State.settings, world.timeout)
    if _State.lobby is None:
        return world
    grown = growth.grow(world, _State.settings, _State.shm_options, _State.lobby)
    if grown is None:
        return world
    _adopt(*grown)
    return grown[0]


def joiners_waiting() -> int:
    """How many replacement processes wait to join the default group, as its members agree (0 in a job
    without a lobby). Every member calls it at the same point: an agreement, no collective."""
    world = default_group()
    if _State.lobby is None:
        _State.lobby = growth.lobby(_State.lobby_at, _State.settings, world.timeout)
    return 0 if _State.lobby is None else growth.waiting(world, _State.lobby)


def _environment() -> tuple[Settings, ShmOptions, str | None]:
    """The job's settings and its lobby's address (``None``: it cannot grow), read from the environment
    once at a process's entry (init or join), and the logging they ask for."""
    env = os.environ
    settings, shm_options = Settings.from_env(env), ShmOptions.from_env(env)
    logs.configure(settings.debug)
    return settings, shm_options, rendezvous.lobby_address(env)


def join_group(timeout: Timeout = None) -> ProcessGroup:
    """Instead of :func:`init_process_group` in a replacement process (:func:`is_replacement`): wait in the
    job's lobby until the members let it in at their next :func:`grow_group`, and make the grown group
    the default. Its rank comes after the members'; the state of the work comes from them (e.g. by
    ``broadcast_object_list``).

    Raises:
        RuntimeError: already initialized, or the job has no lobby. CommTimeout: not let in within
        ``timeout`` (default: the default timeout).
    """
    if _State.world is not None:
        raise RuntimeError("join_group: this process is in a group already; it is for replacement processes")
    settings, shm_options, lobby_at = _environment()
    _State.settings, _State.shm_options = settings, shm_options
    grown, lifelines = growth.join(lobby_at, settings, shm_options, timeout_seconds(timeout))
    _adopt(grown, lifelines)
    _State.lobby_at, _State.lobby = lobby_at, growth.lobby(lobby_at, settings, grown.timeout)
    return grown


def is_replacement() -> bool:
    """Whether ``allreduce run --max-np`` started this process to take a dead worker's place: it calls
    :func:`join_group` rather than :func:`init_process_group`."""
    return rendezvous.is_replacement(os.environ)  # asked before init: this is the entry


def _adopt(world: ProcessGroup, lifelines: Survival) -> None:
    """Make ``world`` (joined by ``lifelines``) the default group, closing the old one and its groups."""
    old, old_lifelines = _State.world, _State.survival
    if old is not None:
        for g in [*_State.groups, old]:
            g.close()
        if old.store.base is not world.store.base:
            old.store.close()
    if old_lifelines is not None:
        old_lifelines.close()
    _State.world, _State.groups, _State.survival, _State.new_groups = world, [], lifelines, 0


def _check_excluded(ranks: list[int], group: ProcessGroup) -> None:
    """torch.distributed's checks of ``ranks_to_exclude``."""
    if not isinstance(ranks, list):
        raise TypeError(f"ranks_to_exclude must be a list of ranks, got {type(ranks).__name__}")
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < group.size for r in ranks):
        raise ValueError(f"ranks_to_exclude must be distinct ranks of 0..{group.size - 1}, at least one, got {ranks}")
    if len(ranks) == group.size:
        raise ValueError(f"ranks_to_exclude {ranks} excludes every rank of the group")


def _membership(group: ProcessGroup) -> Membership:
    membership: Membership | None = group.membership
    if membership is None:
        raise RuntimeError(f"rank {group.rank}/{group.size}: process group '{group.name}' has no lifelines: only "
                           "init_process_group's groups and those formed from them can agree and shrink")
    return membership
