"""MPI groups: ordered sets of the world's ranks, and the comparison results of groups and communicators.

A group is a value, computed locally: ``Comm.Get_group`` names the communicator's ranks (as world
ranks), and the set operations (``Union``, ``Incl``, ``Range_excl``...) build new ones without
talking to any peer. ``Comm.Create(group)`` is what turns one into a communicator. Two groups are
equal (``==``) when they are the same handle, as MPI handles are; ``Compare`` compares members.
"""

from __future__ import annotations

from .errorcodes import ERR_ARG, ERR_GROUP, ERR_RANK, error
from .handles import Handle, constant
from .status import PROC_NULL, UNDEFINED

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3


class _Handle:
    """The members behind one group handle (``None``: the null group)."""

    def __init__(self, members: tuple[int, ...] | None, me: int | None):
        self.members, self.me = members, me


class Group(Handle):
    """An ordered set of ranks, each a rank of the world; ``Group()`` is ``GROUP_NULL``."""

    def __init__(self, group: Group | None = None):
        if group is not None and not isinstance(group, Group):
            raise TypeError(f"Group() takes a Group, got {type(group).__name__}")
        self._handle = group._handle if group is not None else _NULL

    @classmethod
    def of(cls, members, me: int | None) -> Group:
        """The group of the world ranks ``members``, in order; ``me`` is this process's world rank."""
        made = cls()
        made._handle = _Handle(tuple(int(m) for m in members), me)
        return made

    def _members(self) -> tuple[int, ...]:
        if self._handle.members is None:
            raise error(ERR_GROUP, "the group is MPI.GROUP_NULL")
        return self._handle.members

    def Get_size(self) -> int:
        return len(self._members())

    def Get_rank(self) -> int:
        """This process's rank in the group, ``UNDEFINED`` if it is not a member."""
        members = self._members()
        return members.index(self._handle.me) if self._handle.me in members else UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def __bool__(self) -> bool:
        return self._handle.members is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, Group) and self._handle is other._handle

    def _shared(self):
        return None if self._handle.members is None else self._handle

    def _is_predefined(self) -> bool:
        return self._handle is GROUP_EMPTY._handle

    def _release(self) -> None:
        self._handle = _NULL

    def __reduce__(self):
        for name, predefined in _PREDEFINED.items():
            if self is predefined:
                return _predefined, (name,)
        if self._handle is _NULL:
            return type(self), ()
        if self._handle is GROUP_EMPTY._handle:
            return type(self), (GROUP_EMPTY,)
        raise ValueError(f"cannot pickle {self!r}: only the predefined groups travel")

    def Dup(self) -> Group:
        return Group.of(self._members(), self._handle.me)

    def Free(self) -> None:
        """This handle becomes ``GROUP_NULL`` (the predefined ``GROUP_EMPTY`` stays what it is)."""
        self._members()
        if self is not GROUP_EMPTY:
            self._handle = _NULL

    def Compare(self, group: Group) -> int:
        """``IDENT`` (same members, same order), ``SIMILAR`` (same members) or ``UNEQUAL``."""
        mine, theirs = self._members(), group._members()
        if mine == theirs:
            return IDENT
        return SIMILAR if set(mine) == set(theirs) else UNEQUAL

    def Translate_ranks(self, ranks=None, group: Group | None = None) -> list[int]:
        """The ranks in ``group`` (default: the world's order) of the given ranks of this group
        (default: all); ``UNDEFINED`` where not a member, ``PROC_NULL`` stays ``PROC_NULL``."""
        mine = self._members()
        ranks = range(len(mine)) if ranks is None else [int(r) for r in ranks]
        theirs = group._members() if group is not None else None
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= r < len(mine):
                raise error(ERR_RANK, f"rank {r} is not in a group of {len(mine)}")
            world = mine[r]
            out.append(world if theirs is None else (theirs.index(world) if world in theirs else UNDEFINED))
        return out

    def _picked(self, members) -> Group:
        return Group.of(list(members), self._handle.me)

    def Incl(self, ranks) -> Group:
        mine = self._members()
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < len(mine) for r in ranks):
            raise error(ERR_RANK, f"Incl ranks must be distinct ranks of a group of {len(mine)}, got {ranks}")
        return self._picked(mine[r] for r in ranks)

    def Excl(self, ranks) -> Group:
        mine = self._members()
        ranks = {int(r) for r in ranks}
        if not all(0 <= r < len(mine) for r in ranks):
            raise error(ERR_RANK, f"Excl ranks must be ranks of a group of {len(mine)}, got {sorted(ranks)}")
        return self._picked(m for i, m in enumerate(mine) if i not in ranks)

    def Range_incl(self, ranks) -> Group:
        return self.Incl(_expand(ranks))

    def Range_excl(self, ranks) -> Group:
        return self.Excl(_expand(ranks))

    @classmethod
    def Union(cls, group1: Group, group2: Group) -> Group:
        first = group1._members()
        return group1._picked([*first, *(m for m in group2._members() if m not in first)])

    @classmethod
    def Intersection(cls, group1: Group, group2: Group) -> Group:
        second = set(group2._members())
        return group1._picked(m for m in group1._members() if m in second)

    @classmethod
    def Difference(cls, group1: Group, group2: Group) -> Group:
        second = set(group2._members())
        return group1._picked(m for m in group1._members() if m not in second)

    def __repr__(self) -> str:
        return "<Group GROUP_NULL>" if not self else f"<Group {list(self._handle.members)}>"


def _expand(ranges) -> list[int]:
    """The ranks of ``(first, last, stride)`` triples, ``last`` included."""
    out = []
    for triple in ranges:
        first, last, stride = (int(x) for x in triple)
        if stride == 0:
            raise error(ERR_ARG, f"a rank range needs a nonzero stride, got {triple}")
        out.extend(range(first, last + (1 if stride > 0 else -1), stride))
    return out


_NULL = _Handle(None, None)
GROUP_NULL = constant(Group())
GROUP_EMPTY = constant(Group.of((), None))
_PREDEFINED = {"GROUP_NULL": GROUP_NULL, "GROUP_EMPTY": GROUP_EMPTY}


def _predefined(name: str) -> Group:
    return _PREDEFINED[name]
