"""What a group's survivors can still do once a member died: know who failed, agree, revoke.

A :class:`Membership` ties a group to its members' lifelines (:mod:`.lifeline`), by their ids; the
process's :class:`Survival` holds the lifelines, the agreements (:mod:`.agreement`) and the groups a
``revoke`` message names. :func:`open_lifelines` opens the lifelines when the default group forms,
while the store is certainly up; none of the rest uses the group's transport or the store, which a
death may have taken with it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

from ..bootstrap import bind_host
from ..errors import Revoked
from ..runtime import ProcessGroup
from ..security import Security
from ..settings import Settings
from .agreement import Agreements, Decision
from .lifeline import Lifeline


class Agreement(NamedTuple):
    """What every survivor of an agreement returns: the AND of the values, the failed ranks of the group."""

    value: int
    failed: list[int]


class Survival:
    """This process's lifelines, agreements, and groups by name (for the revoke messages that name them)."""

    def __init__(self, line: Lifeline):
        self.line = line
        self.agreements = Agreements(line)
        self._groups: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        line.handlers.append(self._on_message)
        line.start()

    def enroll(self, group, ids: list[int]) -> Membership:
        """Give ``group`` (whose rank ``r`` is the process of id ``ids[r]``) its :class:`Membership`."""
        group.membership = Membership(self, group, ids)
        self._groups[group.name] = group
        return group.membership

    def _on_message(self, sender: int, message: dict) -> None:
        if message.get("t") != "revoke":
            return
        group = self._groups.get(message.get("g"))
        if group is not None:
            group.revoked(Revoked(f"rank {group.rank}/{group.size}: process group '{group.name}' was revoked: "
                                  f"{message.get('why', '')}"))

    def close(self) -> None:
        self.line.close()


class Membership:
    """One group's members as lifeline ids: their failures, their agreements, the group's revocation."""

    def __init__(self, survival: Survival, group, ids: list[int]):
        self.survival = survival
        self.ids = list(ids)
        self._group = weakref.ref(group)
        self._name, self._rank, self._size = group.name, group.rank, group.size
        self.agreements = 0  # how many this rank began on the group: the same count on every member
        self.decided: Decision | None = None  # the last agreement's decision

    def failed(self) -> list[int]:
        """The group ranks whose processes this one knows failed (their lifelines ended)."""
        line = self.survival.line
        with line.cv:
            return [rank for rank, i in enumerate(self.ids) if i in line.dead]

    def agree(self, value: int, timeout: float, what: str = "agree",
              choose: Callable[[list[int]], object] | None = None, among: list[int] | None = None) -> Agreement:
        """The group's next agreement (see :mod:`.agreement`) among the ranks ``among`` (default: all), its
        failed members as group ranks.

        ``choose(failed ranks)`` runs on the coordinator that decides and gives :attr:`decided`'s ``extra``.
        """
        self.agreements += 1
        rank_of = {i: rank for rank, i in enumerate(self.ids)}
        ids = self.ids if among is None else [self.ids[r] for r in among]
        pick = None if choose is None else (lambda failed: choose([rank_of[i] for i in failed]))
        who = f"rank {self._rank}/{self._size}: {what} on process group '{self._name}'"
        decision = self.survival.agreements.agree(self._name, self.agreements, ids, int(value),
                                                  time.monotonic() + timeout, who, rank_of, pick)
        self.decided = decision
        return Agreement(decision.value, [rank_of[i] for i in decision.failed])

    def revoke(self, why: str) -> None:
        """Tell every living member that the group is revoked (``why``: the revoker's words)."""
        line = self.survival.line
        with line.cv:
            living = [i for i in line.alive(self.ids) if i != line.me]
        for i in living:
            line.send(i, {"t": "revoke", "g": self._name, "why": why})


def open_lifelines(world: ProcessGroup, settings: Settings) -> Survival:
    """Join the processes of the freshly formed default group ``world`` by their lifelines, ids being
    their world ranks, and give it its membership."""
    security = Security.of(settings).among(len(world.topology.hosts))
    line = Lifeline.connect(world.store, world.rank, world.size, bind_host(world.store, settings), security,
                            world.timeout)
    survival = Survival(line)
    survival.enroll(world, list(range(world.size)))
    return survival
