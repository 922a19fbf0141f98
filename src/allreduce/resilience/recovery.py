"""Surviving a member's death, as the public functions offer it: who failed, agreeing, shrinking a group
to its survivors, and growing the default group with replacement processes.

This process's lifelines (:mod:`.membership`) open with the default group (:func:`start`, called by
:func:`allreduce.init_process_group`) and close with it (:func:`close`); the job's lobby, where
replacements wait (:mod:`.grow`), is looked up on first use. Shrinking or growing the default group
replaces it in the :mod:`~allreduce.roster`.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import rendezvous
from ..arguments import Timeout, timeout_seconds
from ..roster import Group, Roster, default_group, entry_settings, replace_default, resolve_group
from ..runtime import ProcessGroup
from ..settings import Settings
from .grow import grow, join, lobby, waiting
from .membership import Agreement, Membership, Survival, open_lifelines
from .shrink import shrink

SHRINK_DEFAULT = 0x00  # shrink_group's flags, as torch.distributed's
SHRINK_ABORT = 0x01  # revoke the group first, so that members blocked in a collective of it come out


class _Job:
    """What this process holds to survive its peers: the lifelines, and the lobby of a job that can grow."""

    survival: Survival | None = None  # the lifelines among the processes of the job
    lobby: rendezvous.Store | None = None  # where replacements wait to join (allreduce run --max-np), once looked up
    lobby_at: str | None = None  # its host:port, as the launcher said at entry (None: the job cannot grow)


def start(world: ProcessGroup, settings: Settings, lobby_at: str | None) -> None:
    """Join the processes of the freshly formed default group ``world`` by their lifelines, and remember
    where the job's lobby is (``lobby_at``; ``None``: the job cannot grow)."""
    _Job.survival = open_lifelines(world, settings)
    _Job.lobby_at = lobby_at


def close() -> None:
    """Close the lifelines and the lobby (after the groups, when the default group is destroyed)."""
    if _Job.survival is not None:
        _Job.survival.close()
        _Job.survival = None
    if _Job.lobby is not None:
        _Job.lobby.close()
        _Job.lobby = None


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
    default = target is Roster.world
    shrunk = shrink(target, ranks_to_exclude, Roster.settings, Roster.shm_options, renumber=default)
    if default:
        replace_default(shrunk)
    else:
        Roster.groups.append(shrunk)
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
    if _Job.lobby is None:
        _Job.lobby = lobby(_Job.lobby_at, Roster.settings, world.timeout)
    if _Job.lobby is None:
        return world
    grown = grow(world, Roster.settings, Roster.shm_options, _Job.lobby)
    if grown is None:
        return world
    _adopt(*grown)
    return grown[0]


def joiners_waiting() -> int:
    """How many replacement processes wait to join the default group, as its members agree (0 in a job
    without a lobby). Every member calls it at the same point: an agreement, no collective."""
    world = default_group()
    if _Job.lobby is None:
        _Job.lobby = lobby(_Job.lobby_at, Roster.settings, world.timeout)
    return 0 if _Job.lobby is None else waiting(world, _Job.lobby)


def join_group(env: Mapping[str, str], timeout: Timeout = None) -> ProcessGroup:
    """:func:`allreduce.join_group`, the job's settings read from ``env`` (the entry's environment)."""
    if Roster.world is not None:
        raise RuntimeError("join_group: this process is in a group already; it is for replacement processes")
    settings, shm_options, lobby_at = entry_settings(env)
    Roster.settings, Roster.shm_options = settings, shm_options
    grown, lifelines = join(lobby_at, settings, shm_options, timeout_seconds(timeout))
    _adopt(grown, lifelines)
    _Job.lobby_at, _Job.lobby = lobby_at, lobby(lobby_at, settings, grown.timeout)
    return grown


def is_replacement(env: Mapping[str, str]) -> bool:
    """:func:`allreduce.is_replacement`, asked of ``env`` (the entry's environment)."""
    return rendezvous.is_replacement(env)


def _adopt(world: ProcessGroup, lifelines: Survival) -> None:
    """Make ``world`` (joined by ``lifelines``) the default group, closing the old one, its groups and lifelines."""
    replace_default(world)
    if _Job.survival is not None:
        _Job.survival.close()
    _Job.survival, Roster.new_groups = lifelines, 0


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
