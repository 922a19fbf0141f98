"""Horovod's process sets: named subsets of the job's ranks, each carried by an allreduce group.

A :class:`ProcessSet` lists world ranks. Registering it (``hvd.init(process_sets=[...])`` or
:func:`add_process_set`, called by every rank in the same order) forms the group of those ranks with
:func:`allreduce.new_group`; ranks outside the set keep a :class:`~allreduce.NonMember` and may not
use it. :data:`global_process_set` stands for the default group. As in Horovod, the ``root_rank`` of
a broadcast on a set is a *world* rank; :func:`root_in` turns it into the rank within the set's group.
"""

from __future__ import annotations

import itertools

from ... import api
from ...runtime import ProcessGroup

from . import negotiation


class ProcessSet:
    """A set of world ranks that run collectives together; pass it as ``process_set=``.

    ``process_set_id`` is ``None`` until the set is registered (0 is :data:`global_process_set`).

    Example (four ranks, every rank)::

        evens = hvd.add_process_set([0, 2])
        if evens.included():
            hvd.allreduce(x, process_set=evens)   # over ranks 0 and 2 only

    Raises:
        TypeError: ``ranks`` is not a list of ints (an mpi4py communicator is not supported).
    """

    def __init__(self, ranks):
        try:
            ranks = sorted(ranks)
        except TypeError:
            raise TypeError(f"a ProcessSet takes a list of world ranks, got {type(ranks).__name__} "
                            "(building one from an MPI communicator is not supported)") from None
        if not all(isinstance(r, int) for r in ranks):
            raise TypeError(f"a ProcessSet takes a list of int ranks, got {ranks}")
        self.ranks = ranks
        self.process_set_id: int | None = None
        self.group = None  # the allreduce group (a NonMember outside the set) once registered

    def size(self) -> int | None:
        """The number of ranks in the set; ``None`` before it is registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set; ``None`` before it is registered.

        Raises:
            ValueError: this process is not in the set.
        """
        if self.process_set_id is None:
            return None
        if not self.included():
            raise ValueError(f"rank {world().rank} is not in {self}")
        return self.ranks.index(world().rank)

    def included(self) -> bool | None:
        """Whether this process is in the set; ``None`` before ``hvd.init``."""
        if _STATE.world is None:
            return None
        return world().rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _State:
    def __init__(self, world: ProcessGroup | None = None):
        self.world = world  # the global set's group, from hvd.init to hvd.shutdown
        self.registered: dict[int, ProcessSet] = {}  # process_set_id -> set
        self.numbers = itertools.count(1)  # the next process_set_id


_STATE = _State()
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def setup(world: ProcessGroup) -> None:
    """Make ``world`` the group of :data:`global_process_set` (``hvd.init``)."""
    global _STATE
    _STATE = _State(world)
    global_process_set.ranks = list(range(world.size))
    global_process_set.group = world


def teardown() -> None:
    """Close every registered set's group (``hvd.shutdown``)."""
    for process_set in list(_STATE.registered.values()):
        remove_process_set(process_set)
    _STATE.world = None
    global_process_set.group = None


def add_process_set(process_set) -> ProcessSet:
    """Register ``process_set`` (a :class:`ProcessSet` or a list of world ranks) and return it.

    Every rank of the job calls it, with the same sets in the same order (it forms a group).

    Raises:
        ValueError: not initialized, ranks outside the job, or a set with these ranks exists already.
    """
    size = world().size
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks
    if not ranks or ranks[0] < 0 or ranks[-1] >= size or len(set(ranks)) != len(ranks):
        raise ValueError(f"a process set needs distinct ranks in 0..{size - 1}, got {ranks}")
    if ranks == global_process_set.ranks or any(ps.ranks == ranks for ps in _STATE.registered.values()):
        raise ValueError(f"a process set with ranks {ranks} exists already")
    process_set.group = api.new_group(ranks)
    process_set.process_set_id = next(_STATE.numbers)
    _STATE.registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Close ``process_set``'s group and unregister it; ``False`` if it was not registered (or is global)."""
    if _STATE.registered.pop(process_set.process_set_id, None) is None:
        return False
    if isinstance(process_set.group, ProcessGroup):
        negotiation.forget(process_set.group)
        api.destroy_process_group(process_set.group)
    process_set.process_set_id, process_set.group = None, None
    return True


def group_of(process_set: ProcessSet) -> ProcessGroup:
    """The group a collective on ``process_set`` runs on.

    Raises:
        ValueError: the set is not registered, or this process is not in it.
    """
    world()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init() or hvd.add_process_set()")
    if not isinstance(process_set.group, ProcessGroup):
        raise ValueError(f"rank {world().rank} is not in {process_set}; only its members may use it")
    return process_set.group


def root_in(process_set: ProcessSet, root_rank: int) -> int:
    """The rank within ``process_set``'s group of world rank ``root_rank``.

    Raises:
        ValueError: ``root_rank`` is not in the set.
    """
    if root_rank not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set}")
    return process_set.ranks.index(root_rank)


def world() -> ProcessGroup:
    """The group of :data:`global_process_set`.

    Raises:
        ValueError: ``hvd.init()`` has not been called (Horovod's error).
    """
    if _STATE.world is None:
        raise ValueError("Horovod has not been initialized; use hvd.init()")
    return _STATE.world
