"""The connection mesh every transport forms, written once: each rank dials each lower rank and
accepts each higher one, checking a hello that names the group.

A rank listens, publishes its address in the store under ``<kind>/<rank>``, dials every lower member,
then accepts until every higher member has linked. A connection that is not a higher member of this
group (its hello says so, or it proves nothing) is dropped and the mesh forms without it. While it
waits, a rank looks every ``PROBE_S`` quiet seconds at the missing ranks that have published an
address: one whose listener refuses is gone, and waiting for it would only delay the error.

What differs between transports (the kind of socket, what a hello carries, authentication, passing
descriptors) is a :class:`Peering` that this module drives.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from typing import Protocol, TypeVar
from collections.abc import Callable

from ..errors import CommTimeout, PeerLost, RendezvousError, exhausted, with_peer

PROBE_S = 0.5  # quiet seconds while forming the mesh before checking that the missing ranks still listen
STRANGER_S = 5.0  # seconds an accepted connection may take over its hello (and proof) before it is dropped
FAILED = "failed"  # the store key prefix where a rank says why it gave up (``failed/<rank>``)


class Closable(Protocol):
    """Whatever a transport's links are (a socket, a record holding one): the mesh only closes them."""

    def close(self) -> None: ...


L = TypeVar("L", bound=Closable)


class Peering(Protocol[L]):
    """One transport's part in forming the mesh."""

    kind: str  # the store key prefix of the addresses: "tcp", "shm"
    joining: str  # what the missing ranks have not done yet, for the timeout message: "connect"
    knock: Callable[[str], None] | None  # raise ConnectionRefusedError if nothing listens at an address

    def listen(self, backlog: int) -> tuple[socket.socket, str]:
        """A listening socket and the address peers dial it at."""

    def dial(self, peer: int, address: str, deadline: float) -> L:
        """A checked link to lower rank ``peer``, listening at ``address``; raises if there is none."""

    def answer(self, sock: socket.socket, due: float) -> tuple[int, L] | None:
        """``(sender, link)`` for an accepted connection that proved itself by ``due``, else ``None``
        (``sock`` closed). May raise for a peer of the group that cannot link (a settings mismatch)."""


def form(peering: Peering[L], store, rank: int, members: Iterable[int], deadline: float) -> dict[int, L]:
    """Links from ``rank`` to every other of ``members`` (which include ``rank``), by peer.

    Raises:
        RendezvousError: a member did not link before ``deadline`` (a ``time.monotonic()`` value).
        PeerLost: a member is known to have died while the mesh formed.
    """
    members = sorted(members)
    higher = [peer for peer in members if peer > rank]
    listener, address = peering.listen(max(len(members), 16))
    links: dict[int, L] = {}
    try:
        with listener:
            store.set(f"{peering.kind}/{rank}", address.encode())
            for peer in members:
                if peer < rank:
                    links[peer] = dial(peering, store, peer, deadline)
            while missing := [peer for peer in higher if peer not in links]:
                now = time.monotonic()
                if now >= deadline:
                    raise RendezvousError(f"rank {rank} timed out waiting for ranks {missing} to {peering.joining}")
                got = _accept(peering, listener, min(deadline, now + PROBE_S), deadline)
                if got is None:
                    _probe(peering, store, rank, missing)
                elif got[0] in missing:
                    links[got[0]] = got[1]
                else:
                    got[1].close()
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


def dial(peering: Peering[L], store, peer: int, deadline: float) -> L:
    """Look up where ``peer`` listens (waiting for it to publish, unless it says it failed) and dial it."""
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            address = store.get(f"{peering.kind}/{peer}", timeout=min(left, PROBE_S)).decode()
            break
        except CommTimeout:
            _gave_up(store, peer)
            if left <= PROBE_S:
                raise
    return peering.dial(peer, address, deadline)


def _gave_up(store, peer: int) -> None:
    """``PeerLost`` with ``peer``'s own reason, if it said in the store that it failed."""
    key = f"{FAILED}/{peer}"
    if store.check([key]):
        raise with_peer(PeerLost(f"rank {peer} failed: {store.get(key, timeout=1.0).decode(errors='replace')}"), peer)


def _accept(peering: Peering[L], listener: socket.socket, until: float, deadline: float):
    """The sender and link of one connection accepted by ``until``, or ``None``."""
    listener.settimeout(max(until - time.monotonic(), 0.001))
    try:
        sock, _ = listener.accept()
    except TimeoutError:
        return None
    except OSError as exc:
        raise exhausted(exc, f"accepting a {peering.kind} link") or exc  # noqa: B904 (the OSError stays its context)
    now = time.monotonic()
    return peering.answer(sock, max(now + 0.1, min(now + STRANGER_S, deadline)))


def _probe(peering: Peering, store, rank: int, missing: list[int]) -> None:
    """``PeerLost`` if a missing rank said it failed, or published its address but no longer listens there."""
    for peer in missing:
        _gave_up(store, peer)
        if peering.knock is None or not store.check([f"{peering.kind}/{peer}"]):
            continue
        try:
            peering.knock(store.get(f"{peering.kind}/{peer}", timeout=1.0).decode())
        except ConnectionRefusedError as exc:
            raise with_peer(PeerLost(f"rank {rank}: rank {peer} stopped listening before it connected to this "
                                     f"rank: it exited or failed while the group was forming"), peer) from exc
        except OSError:  # unreachable or slow: no verdict, keep waiting
            pass
