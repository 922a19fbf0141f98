"""Going on without the dead: shrinking a group to its survivors.

The lifelines that :func:`.membership.open_lifelines` opened with the default group outlive the store, so the
survivors of any death can agree (:mod:`.agreement`) without it. :func:`shrink` forms the group of the
survivors: one agreement settles which ranks go and where the new group's store is, then the survivors
form it as any group forms. The store stays where it was if its coordinator can still reach it; else
(its host died: rank 0 under ``env://`` and ``allreduce run``) the coordinator hosts a fresh one, and
the decision carries its address.
"""

from __future__ import annotations

import dataclasses
import math
import time

from .. import rendezvous
from ..bootstrap import bind_host, form_group
from ..errors import AllreduceError, PeerLost, RendezvousError, with_peer
from ..rendezvous import Store
from ..rendezvous.store import View
from ..rendezvous import storewire as wire
from ..runtime import ProcessGroup
from ..security import Security
from ..settings import Settings
from ..transport.shm import ShmOptions
from .lifeline import Lifeline

PROBE_S = 1.0  # seconds the coordinator of a shrink gives the old store to answer before hosting a new one
REACH_S = 5.0  # seconds a survivor gives the new store of a shrink to answer (its host may have died since)
WATCH_MS = 200  # a shrunk group's store waits look at the members' lifelines this often (Watched)


def shrink(group: ProcessGroup, exclude: list[int] | None, settings: Settings, shm_options: ShmOptions,
           renumber: bool) -> ProcessGroup:
    """The group of ``group``'s members less ``exclude`` (``None``: its failed members, as agreed), the
    survivors in their order; ``renumber``: its world ranks are its own (it becomes the default group).

    A member that dies while the new group forms fails that attempt on every survivor alike (they agree
    on whether it formed); with ``exclude=None`` they then try again without it, until the group's timeout.

    Raises:
        RuntimeError: the group has no lifelines. ValueError: ``exclude`` names a rank out of range, or this one.
        PeerLost: a member that is not excluded is dead. CommTimeout: a member did not take part.
    """
    membership = group.membership
    if membership is None:
        raise RuntimeError(f"rank {group.rank}/{group.size}: process group '{group.name}' has no lifelines "
                           "(only the groups of init_process_group and those formed from it can shrink)")
    if exclude is not None:
        exclude = sorted({int(r) for r in exclude})
        if any(not 0 <= r < group.size for r in exclude) or group.rank in exclude:
            raise ValueError(f"rank {group.rank}/{group.size}: shrink_group ranks_to_exclude must be ranks of "
                             f"0..{group.size - 1} other than this one, got {exclude}")

    among = None if exclude is None else [r for r in range(group.size) if r not in exclude]
    deadline = time.monotonic() + group.timeout
    while True:
        try:
            shrunk, error = _attempt(group, membership, exclude, among, settings, shm_options, renumber,
                                     deadline), None
        except Exception as exc:  # a member died, or the store did, while the group formed; the others are told
            shrunk, error = None, exc
        verdict = membership.agree(int(shrunk is not None), max(deadline - time.monotonic(), 0.001),
                                   "shrink_group (did it form?)", among=among)
        if verdict.value == 1:  # formed on every survivor
            return shrunk
        if shrunk is not None:
            shrunk.close()
        if error is not None and not isinstance(error, (AllreduceError, OSError)):
            raise error
        if exclude is not None or time.monotonic() >= deadline:  # the same ranks again would fail again
            raise error or PeerLost(f"rank {group.rank}/{group.size}: shrink_group of process group "
                                    f"'{group.name}': the shrunk group failed to form on another member")


def _attempt(group: ProcessGroup, membership, exclude: list[int] | None, among: list[int] | None,
             settings: Settings, shm_options: ShmOptions, renumber: bool, deadline: float) -> ProcessGroup:
    """Agree, by ``deadline``, on who goes and where the store is, then form the survivors' group on it."""
    def choose(failed: list[int]) -> dict:  # on the coordinator: who goes, and where the store is
        gone = sorted(set(failed) if exclude is None else exclude)
        return {"gone": gone, "store": _store_for(group, settings, group.size - len(gone)),
                "host": group.rank}

    membership.agree(-1, max(deadline - time.monotonic(), 0.001), "shrink_group", choose, among)
    gone, where = membership.decided.extra["gone"], membership.decided.extra["store"]
    lost = [r for r in membership.failed() if r not in gone]
    if lost:
        raise with_peer(PeerLost(f"rank {group.rank}/{group.size}: shrink_group of process group '{group.name}': "
                                 f"rank {lost[0]} is dead but not excluded"), lost[0])
    members = [r for r in range(group.size) if r not in gone]
    ids = [membership.ids[r] for r in members]
    name = f"{group.name}.shrink{membership.agreements}"
    host = membership.decided.extra["host"]
    store = Watched(_reach(group, where, settings, name, len(members), host), membership.survival.line, ids)
    ranks = list(range(len(members))) if renumber else [group.ranks[r] for r in members]
    shrunk = form_group(store, members.index(group.rank), len(members), group.timeout, name, ranks, settings,
                        shm_options)
    membership.survival.enroll(shrunk, ids)
    return shrunk


class Watched(View):
    """A view of a shrunk group's store whose waits end, with :class:`PeerLost` naming the member, once the
    lifeline of one of its members (``ids``, in group order) has: a member that dies while the group
    forms is named at once, where a plain wait for its keys would last the whole timeout."""

    def __init__(self, store: Store, line: Lifeline, ids: list[int]):
        super().__init__(store, store.timeout)
        self._line, self._ids = line, ids

    def execute(self, request: wire.Request) -> wire.Response:
        return self._watched(request, None)

    def execute_by(self, request: wire.Request, due: float) -> wire.Response:
        return self._watched(request, due)

    def _watched(self, request: wire.Request, due: float | None) -> wire.Response:
        """``request`` answered in slices of :data:`WATCH_MS`, each after a look at the lifelines (so are
        the requests that do not wait: the transports poll the store while they wait for a peer to dial)."""
        end = time.monotonic() + getattr(request, "timeout_ms", 0) / 1000
        while True:
            with self._line.cv:
                lost = [rank for rank, i in enumerate(self._ids) if i in self._line.dead]
            if lost:
                raise with_peer(PeerLost(f"rank {lost[0]} of the shrunk group died while it formed"), lost[0])
            if not isinstance(request, (wire.Get, wire.Wait)) or request.timeout_ms <= WATCH_MS:
                return self._store.execute(request) if due is None else self._store.execute_by(request, due)
            left_ms = math.ceil((end - time.monotonic()) * 1000)
            part = dataclasses.replace(request, timeout_ms=max(0, min(WATCH_MS, left_ms)))
            response = self._store.execute(part) if due is None else self._store.execute_by(part, due)
            if not isinstance(response, wire.TimedOut) or left_ms <= WATCH_MS:
                return response


def _store_for(group: ProcessGroup, settings: Settings, size: int):
    """``None`` if the group's store still answers the coordinator, else ``[host, port]`` of a new store
    this process hosts for the shrunk group."""
    try:
        group.store.within(PROBE_S).check(["lifeline"])
        return None
    except Exception:  # gone (its host died) or silent: host one here
        pass
    host = bind_host(group.store, settings)
    store = rendezvous.TCPStore(host, 0, is_server=True, timeout=group.timeout, world_size=size,
                                security=Security.of(settings))
    _hosted.append(store)
    return [host, store.port]


_hosted: list = []  # the stores this process hosts for shrunk groups until it reaches them as a member


def _reach(group: ProcessGroup, where, settings: Settings, name: str, size: int, host: int):
    """The store the shrunk group ``name`` forms on: a view of the old one, or the new one at ``where``, which
    ``group``'s rank ``host`` serves.

    Raises:
        PeerLost: the new store's host died before this process reached it.
        RendezvousError: it did not answer within :data:`REACH_S`.
    """
    if where is None:
        return group.store.prefix(name)
    address, port = where
    for store in _hosted:
        if store.port == port:
            _hosted.remove(store)
            return store
    # its host listened before it decided: if not reached at once, it died since, which its lifeline tells
    # (a wait of the whole timeout for a host that may start later is for a rendezvous, not here)
    line, end = group.membership.survival.line, time.monotonic() + REACH_S
    while True:
        with line.cv:
            dead = group.membership.ids[host] in line.dead
        if dead:
            raise with_peer(PeerLost(f"rank {group.rank}/{group.size}: shrink_group of process group "
                                     f"'{group.name}': rank {host}, the new store's host, died before this rank "
                                     "reached it"), host)
        try:
            store = rendezvous.TCPStore(address, port, timeout=min(WATCH_MS / 1000, max(end - time.monotonic(), 0.001)),
                                        world_size=size, security=Security.of(settings))
        except RendezvousError:
            if time.monotonic() >= end:
                raise
            continue
        store.timeout = group.timeout
        return store
