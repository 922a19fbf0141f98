"""How the engine fails: links that close, receives orphaned by them, errors that break it, and
the ABORT frames that tell the peers why.

Part of :class:`.engine.Engine` (as :class:`Failing`), under its lock. A peer that exits closes its
links: the operations that needed it fail with :class:`PeerLost` (:class:`Mismatch` when the peer
aborted on one); any error breaks the engine as it breaks the group: every pending operation fails.
"""

from __future__ import annotations

import socket
import time

from .. import wire
from ..errors import AllreduceError, GroupBroken, Mismatch, PeerLost, with_peer
from .link import Link
from .records import Op, Peer, Send

ORPHAN_S = 0.5  # seconds receives from a peer wait, once the link to it closed, for one from it to appear


class Failing:
    """The failure half of the engine. Needs its ``_peers``, ``_pending``, ``_cv`` and ``_finish``,
    ``_wake``, ``_on_header``."""

    def _link_lost(self, link: Link | None, error: AllreduceError, peer: Peer | None = None) -> None:
        """``link`` (or, if ``None``, the one ``peer`` could not dial) is gone: fail what needed it."""
        peer = peer or self._peers[link.peer]
        also = None
        if link is not None:
            link.shutdown(socket.SHUT_RDWR)
            link.dead = True
            self._wake()
            other = peer.inn if link is peer.out else peer.out
            if " aborted: " not in str(error) and other is not None and not (other.dead or other.closed):
                try:  # a peer that gave up sent its reason on every link: it may already be in on the other
                    other.pump(self._on_header)
                except PeerLost as exc:
                    also = exc
                    if " aborted: " in str(exc):
                        error = with_peer(PeerLost(str(exc)), peer.rank)
                except AllreduceError:
                    pass
        known = peer.out_lost or peer.in_lost
        if known is not None and " aborted: " in str(known) and " aborted: " not in str(error):
            error = known  # the reason it gave, read on its other link before this one closed
        outgoing = link is None or link.dialed
        if outgoing:
            peer.out_lost = peer.out_lost or error
            peer.backlog = []
            if peer.inn is None:  # nothing from it can arrive, unless its own link is being answered
                peer.orphan_at = time.monotonic() + ORPHAN_S
                self._wake()
        else:
            peer.in_lost = peer.in_lost or error
        for op in sorted(self._pending, key=lambda o: o.number):
            if self._needs(op, peer, outgoing):
                self._lost(op, error)
                break
        if also is not None:
            self._link_lost(peer.inn if link is peer.out else peer.out, also)

    def _needs(self, op: Op, peer: Peer, outgoing: bool) -> bool:
        """Whether ``op`` cannot finish without the link to (``outgoing``) or from ``peer``."""
        if isinstance(op, Send):
            return outgoing and op.dest == peer.rank
        if outgoing:
            return False
        return op.source == peer.rank or any(r is op for r, _ in peer.cleared.values())

    def _lost(self, op: Op, error: AllreduceError) -> None:
        """``op`` cannot finish: its peer is gone. A peer that aborted on a mismatch makes it a
        :class:`Mismatch` here too (it was this rank's call that did not match), as the group does."""
        text = f"rank {self.rank}/{self.size}: {op.what}: {error}"
        kind = Mismatch if " aborted: Mismatch: " in text else PeerLost
        self._fail(with_peer(kind(text), self._peer_of(op)), op)

    def _orphans(self) -> float | None:
        """Fail receives from peers whose link closed and none came from them; seconds to the next check."""
        now, soonest = time.monotonic(), None
        for peer in self._peers.values():
            if peer.orphan_at is None:
                continue
            if peer.inn is not None:
                peer.orphan_at = None
            elif now >= peer.orphan_at:
                peer.orphan_at = None
                peer.in_lost = peer.in_lost or peer.out_lost
                for op in sorted(self._pending, key=lambda o: o.number):
                    if self._needs(op, peer, outgoing=False):
                        self._lost(op, peer.in_lost)
                        break
            else:
                soonest = min(soonest or peer.orphan_at, peer.orphan_at)
        return None if soonest is None else max(0.0, soonest - now)

    # ---- failure ---------------------------------------------------------------------------------

    def _fail(self, error: AllreduceError, culprit: Op | None = None) -> None:
        """Break the engine (under the lock): ``culprit`` fails with ``error``, every other pending
        operation with :class:`GroupBroken` naming it; peers get ABORT frames; ``on_failure`` is told."""
        if self._failure is not None:
            if culprit is not None:
                self._finish(culprit, error)
            return
        self._failure = self._told = error
        self._abort_all(f"{type(error).__name__}: {error}", error, culprit)

    def _abort_all(self, reason: str, error: AllreduceError, culprit: Op | None) -> None:
        for op in sorted(self._pending, key=lambda o: o.number):
            if op is culprit:
                self._finish(op, error)
            else:
                self._finish(op, GroupBroken(f"rank {self.rank}/{self.size}: {op.what} cannot finish: point-to-point "
                                             f"on process group '{self.name}' failed: {error}"))
        try:  # refuse dials from now on (and reset those queued), so a peer hears at once, not at its deadline
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        frame = wire.abort_frame(reason)
        for peer in self._peers.values():
            peer.backlog = []
            for link in (peer.out, peer.inn):
                if link is not None:
                    link.abort(frame)
                    link.dead = True
        self._cv.notify_all()
        self._wake()

    def abort(self, reason: str) -> None:
        """The group failed (``reason``): fail every pending operation and tell the peers. Idempotent."""
        with self._cv:
            if self._failure is None:
                self._failure = GroupBroken(f"rank {self.rank}/{self.size}: process group '{self.name}' failed: "
                                            f"{reason}")
                self._abort_all(reason, self._failure, None)
            done = self._settle()
        self._resolve(done)

    def _check(self) -> None:
        if self._closed:
            raise GroupBroken(f"rank {self.rank}/{self.size}: process group '{self.name}' was destroyed")
        if self._failure is not None:
            raise GroupBroken(f"rank {self.rank}/{self.size}: process group '{self.name}' is unusable after an "
                              f"earlier failure; destroy it and form a new one. The failure was: {self._failure}")

    def _peer_of(self, op: Op) -> int | None:
        if isinstance(op, Send):
            return op.dest
        return op.got.source if op.got is not None else op.source

    def _waiting_for(self, op: Op) -> str:
        if isinstance(op, Send):
            return {"connecting": f"waiting to connect to rank {op.dest}",
                    "announced": f"waiting for rank {op.dest} to post a matching receive"}.get(
                        op.state, f"waiting to send to rank {op.dest}")
        if op.got is not None:
            return f"receiving its payload from rank {op.got.source}"
        return f"waiting for a matching send from {'any rank' if op.source is None else f'rank {op.source}'}"
