"""Growing a group: replacement processes join the survivors at a point the survivors agree on.

A job that may grow has a *lobby*, a store that outlives every worker (``allreduce run --max-np`` hosts
it in the launcher and names it to its workers: :func:`allreduce.rendezvous.lobby_address`). A
replacement registers there (:func:`join`: it takes the next joiner number) and waits. The members of
the group, at a point of their loop they all reach (:func:`grow`), hold one agreement
(:mod:`.agreement`) whose coordinator reads the lobby: the joiners registered since the last admission
are admitted, numbered after the members, and told their rank and the new group's name through the
lobby. Members and joiners then form the new group on a prefix of the lobby, which no death can take
away, and join it by fresh lifelines (:func:`.membership.open_lifelines`), so the grown group can shrink
again.
"""

from __future__ import annotations

import json
import os

from .. import rendezvous
from ..bootstrap import form_group
from ..runtime import ProcessGroup
from ..security import Security
from ..settings import Settings
from ..transport.shm import ShmOptions
from .membership import Survival, open_lifelines


def lobby(where: str | None, settings: Settings, timeout: float) -> rendezvous.TCPStore | None:
    """The job's lobby at ``where`` (``host:port``; ``None``: the job cannot grow)."""
    if not where:
        return None
    host, _, port = where.rpartition(":")
    return rendezvous.TCPStore(host, int(port), timeout=timeout, security=Security.of(settings))


def grow(group: ProcessGroup, settings: Settings, shm_options: ShmOptions,
         hall: rendezvous.Store) -> tuple[ProcessGroup, Survival] | None:
    """The group of ``group``'s members (ranks kept) and the joiners waiting in the lobby ``hall``, with
    its lifelines; ``None`` when nobody waits. Every member calls it, at the same point.

    Raises:
        RuntimeError: the group has no lifelines. PeerLost: a member died. CommTimeout: a member or an
        admitted joiner did not take part in time.
    """
    membership = group.membership
    if membership is None:
        raise RuntimeError(f"rank {group.rank}/{group.size}: process group '{group.name}' has no lifelines "
                           "(only the groups of init_process_group and those formed from it can grow)")

    def choose(failed: list[int]) -> dict:  # on the coordinator: who is let in
        registered, admitted = int(hall.add("joiners", 0)), int(hall.add("admitted", 0))
        return {"take": list(range(admitted + 1, registered + 1))}

    membership.agree(-1, group.timeout, "grow_group", choose)
    take = membership.decided.extra["take"]
    if not take:
        return None
    size, name = group.size + len(take), f"grown{take[-1]}"
    if group.rank == 0:
        hall.add("admitted", len(take))
        for i, number in enumerate(take):
            hall.set(f"admit/{number}", json.dumps({"name": name, "rank": group.size + i, "size": size}).encode())
    return _form(hall.prefix(name), name, group.rank, size, group.timeout, settings, shm_options)


def waiting(group: ProcessGroup, hall: rendezvous.Store) -> int:
    """How many joiners wait in the lobby ``hall`` to be let into ``group``, as its members agree (one
    agreement; every member calls it at the same point)."""
    def choose(failed: list[int]) -> dict:
        return {"waiting": int(hall.add("joiners", 0)) - int(hall.add("admitted", 0))}

    group.membership.agree(-1, group.timeout, "joiners_waiting", choose)
    return group.membership.decided.extra["waiting"]


def join(where: str | None, settings: Settings, shm_options: ShmOptions,
         timeout: float) -> tuple[ProcessGroup, Survival]:
    """Register in the lobby at ``where``, wait (up to ``timeout`` seconds) to be admitted, then form the grown group.

    Raises:
        RuntimeError: the job has no lobby. CommTimeout: not admitted in time.
    """
    hall = lobby(where, settings, timeout)
    if hall is None:
        raise RuntimeError(f"join_group: the job cannot grow ({rendezvous.environment.LOBBY} is not set: start it with "
                           "`allreduce run --max-np K`)")
    number = int(hall.add("joiners", 1))
    hall.set(f"pid/{number}", str(os.getpid()).encode())  # for the launcher: which replacement got in
    admitted = json.loads(hall.get(f"admit/{number}", timeout))
    return _form(hall.prefix(admitted["name"]), admitted["name"], admitted["rank"], admitted["size"], timeout,
                 settings, shm_options)


def _form(store: rendezvous.Store, name: str, rank: int, size: int, timeout: float, settings: Settings,
          shm_options: ShmOptions) -> tuple[ProcessGroup, Survival]:
    grown = form_group(store, rank, size, timeout, name, list(range(size)), settings, shm_options)
    try:
        return grown, open_lifelines(grown, settings)
    except BaseException:
        grown.close()
        raise
