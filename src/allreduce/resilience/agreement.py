"""Fault-tolerant agreement among the living members of a group, over the lifelines (:mod:`.lifeline`).

Every member that returns from agreement *k* of a group returns the same :class:`Decision`: the bitwise
AND of the values contributed (MPI_Comm_agree's combination) and the members known failed, even when
members, the coordinator included, die during it. How:

- the *coordinator* is the first member in group order not known dead. Every other member
  sends it a ``contrib`` (its value, and the members it knows failed) and waits for a ``decided``;
- the coordinator first ``ask``s everyone, then waits until every living member has answered, with a
  contribution or with a decision it already holds. It adopts a decision if one comes back (a
  coordinator before it decided and died while telling the others), else it decides, and sends the
  decision to every member. A member holding a decision answers any ``contrib`` or ``ask`` for it,
  even after it has returned, so a late coordinator always learns it;
- a member that learns its coordinator died moves to the next one and contributes again.

A decision is made only once every living member has been heard, and a member ignores whatever comes
from a member it already knows dead (word of a death, in a ``failed`` list or from the lifelines, may
come before the dead member's last bytes), so a member that moved on from a coordinator never takes
that coordinator's late decision: no member can return one decision while another returns a different
one. The price: one slow member holds every
agreement of its group until the deadline, which then raises :class:`~allreduce.errors.CommTimeout`
naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CommTimeout, with_peer
from .lifeline import Lifeline


@dataclass(frozen=True)
class Decision:
    """What every survivor of agreement *k* returns: ``value`` (the AND of the contributions), the
    ``failed`` ids, and ``extra``, what the coordinator's ``choose`` added (JSON)."""

    value: int
    failed: tuple[int, ...]
    extra: object = None

    def message(self, tag: str, number: int) -> dict:
        return {"t": "decided", "g": tag, "k": number, "value": self.value, "failed": list(self.failed),
                "extra": self.extra}


class Agreements:
    """The agreements of one process: contributions heard, decisions known, members that asked."""

    def __init__(self, line: Lifeline):
        self.line = line
        self._heard: dict[tuple[str, int], dict[int, int]] = {}  # (tag, k) -> {id: value}
        self._decided: dict[tuple[str, int], Decision] = {}
        self._askers: dict[tuple[str, int], set[int]] = {}
        line.handlers.append(self._on_message)

    def _on_message(self, sender: int, message: dict) -> None:
        """A lifeline message (with the lifeline's ``cv`` held)."""
        kind, key = message.get("t"), (message.get("g"), message.get("k"))
        if kind not in ("contrib", "ask", "decided") or sender in self.line.dead:
            return  # from a process known dead: as if it died before sending (see the module docstring)
        self.line.forget(message.get("failed", ()))
        if kind == "decided" and key not in self._decided:  # pass it on to whoever waits on this process
            self._decided[key] = Decision(int(message["value"]), tuple(message["failed"]), message.get("extra"))
            for waiter in {*self._askers.pop(key, ()), *self._heard.pop(key, {})}:
                self.line.send(waiter, self._decided[key].message(*key))
        elif kind in ("contrib", "ask") and key in self._decided:
            self.line.send(sender, self._decided[key].message(*key))
        elif kind == "contrib":
            self._heard.setdefault(key, {})[sender] = int(message["value"])
        else:
            self._askers.setdefault(key, set()).add(sender)

    def agree(self, tag: str, number: int, members: list[int], value: int, deadline: float, who: str,
              rank_of: dict[int, int], choose: Callable[[tuple[int, ...]], object] | None = None) -> Decision:
        """Agreement ``number`` of the group ``tag`` among ``members`` (ids, in group order).

        ``choose(failed)``, run by the coordinator that decides, gives the decision's ``extra``.
        ``who`` opens error messages (this rank, the group, the call), which name a member by ``rank_of[id]``.

        Raises:
            CommTimeout: a living member did not take part by ``deadline`` (named by its rank in the group).
        """
        line, me, key = self.line, self.line.me, (tag, number)
        contributed_to, asked = None, False
        with line.cv:
            while key not in self._decided:
                alive = line.alive(members)
                coordinator = alive[0]
                failed = [m for m in members if m in line.dead]
                if coordinator == me:
                    if not asked:
                        for m in alive[1:]:
                            line.send(m, {"t": "ask", "g": tag, "k": number, "failed": failed})
                        asked = True
                    heard = self._heard.get(key, {})
                    waiting = [m for m in alive[1:] if m not in heard]
                    if not waiting:
                        self._decide(key, members, value, heard, choose)
                        break
                else:
                    waiting = [coordinator]
                    if contributed_to != coordinator:
                        line.send(coordinator, {"t": "contrib", "g": tag, "k": number, "value": value,
                                                "failed": failed})
                        contributed_to = coordinator
                left = deadline - time.monotonic()
                if left <= 0:
                    late = [rank_of[m] for m in waiting]
                    raise with_peer(CommTimeout(f"{who} #{number} timed out waiting for "
                                                f"rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))}"),
                                    late[0])
                line.cv.wait(min(left, 1.0))
            decision = self._decided[key]
            self._heard.pop(key, None)
        return decision

    def _decide(self, key: tuple[str, int], members: list[int], value: int, heard: dict[int, int],
                choose: Callable[[tuple[int, ...]], object] | None) -> None:
        """Decide agreement ``key`` as its coordinator and tell every living member (``cv`` held)."""
        for contribution in heard.values():
            value &= contribution
        failed = tuple(m for m in members if m in self.line.dead)
        decision = Decision(value, failed, choose(failed) if choose is not None else None)
        self._decided[key] = decision
        for m in self.line.alive(members):
            if m != self.line.me:
                self.line.send(m, decision.message(*key))
        for asker in self._askers.pop(key, ()):
            self.line.send(asker, decision.message(*key))
