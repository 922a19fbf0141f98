"""The links of one messenger: made (dialed, or accepted and answered, by helper threads, since a handshake
blocks), flushed, lost, broken and closed; and the operations that fail with them.

A peer that exits closes its links: the operations that needed it fail with :class:`PeerLost`
(:class:`Mismatch` when the peer aborted on one). Any error breaks the messenger as it breaks the group
(:meth:`.ledger.Ledger.fail`): every pending operation fails and the links carry ABORT frames with the
reason (:meth:`Connections.break_links`). Everything here runs under the ledger's lock, but for the
handshakes and the final drain.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

from .. import wire
from ..errors import AllreduceError, Mismatch, PeerLost, ResourceExhausted, exhausted, with_peer
from ..transport import mesh
from ..transport.tcp import TcpPeering
from . import nearby
from .bell import Bells
from .ledger import Ledger
from .link import MessageLink
from .records import Op, Peer, Send

ORPHAN_S = 0.5  # seconds receives from a peer wait, once the link to it closed, for one from it to appear
CLOSE_S = 1.0  # seconds a closing messenger waits for its peers to see its links close
FAILED_S = 0.5  # seconds a failed dial gives the store to say why the peer gave up


class Connections:
    """The peers of one rank and the links to and from them.

    ``on_header(link, header)`` reads a frame that arrived (the messenger's); ``on_connected(rank)`` is
    told that the link to ``rank`` is up, its backlog queued on it.
    """

    def __init__(self, ledger: Ledger, bells: Bells, store, peering: TcpPeering, listener: socket.socket,
                 timeout: float, on_header: Callable[[MessageLink, wire.Header], None],
                 on_connected: Callable[[int], None]):
        self._ledger, self._bells = ledger, bells
        self._store, self._peering, self._timeout = store, peering, timeout
        self.listener = listener
        listener.setblocking(False)
        self.peers: dict[int, Peer] = {}
        self.identity = nearby.Identity()  # the first frame on every link this rank dials
        self.on_header, self._on_connected = on_header, on_connected

    def peer(self, rank: int) -> Peer:
        peer = self.peers.get(rank)
        if peer is None:
            peer = self.peers[rank] = Peer(rank)
        return peer

    def links(self) -> Iterator[MessageLink]:
        for peer in self.peers.values():
            for link in (peer.out, peer.inn):
                if link is not None and not link.closed:
                    yield link

    def flush(self, link: MessageLink) -> None:
        """Send what ``link`` holds until the socket is full; run the callbacks of what left."""
        if link.closed or link.sock is None:
            return
        done: list = []
        try:
            link.send_some(done)
        except PeerLost as exc:
            self.link_lost(link, exc)
        for then in done:
            then()
        if link.out and not self._bells.polling():
            self._bells.wake()

    # ---- links coming ----------------------------------------------------------------------------

    def accept(self) -> None:
        who = self._ledger.who
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError as exc:  # none left (BlockingIOError), closed, or out of descriptors: fail at once
                error = exhausted(exc, f"{who}: accepting a point-to-point link")
                if error is not None:
                    self._ledger.fail(error)
                return
            threading.Thread(target=self._answer, args=(sock,), name=f"allreduce-{self._ledger.name}-p2p-answer",
                             daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        """Check an accepted connection (a helper thread), then hand its link to the messenger."""
        got = self._peering.answer(sock, time.monotonic() + mesh.STRANGER_S)
        if got is None:
            return
        sender, sock = got
        ledger = self._ledger
        with ledger.cv:
            peer = self.peer(sender)
            if ledger.closed or ledger.failure is not None or (peer.inn is not None and not peer.inn.dead):
                sock.close()
                return
            peer.inn = MessageLink(sender, sock, dialed=False)
            peer.orphan_at = None
            self._bells.wake()

    def dial(self, peer: Peer) -> None:
        peer.dialing = True
        threading.Thread(target=self._connect, args=(peer.rank,), name=f"allreduce-{self._ledger.name}-p2p-dial",
                         daemon=True).start()

    def _connect(self, rank: int) -> None:
        """Dial ``rank`` (a helper thread), then hand the link and what waited for it to the messenger."""
        ledger = self._ledger
        sock, error = None, None
        try:
            sock = mesh.dial(self._peering, self._store, rank, time.monotonic() + self._timeout)
        except ResourceExhausted as exc:  # this rank's own failure, not the peer's
            error = ResourceExhausted(f"{ledger.who}: {exc}")
        except (AllreduceError, OSError) as exc:
            error = with_peer(PeerLost(f"no point-to-point link to rank {rank}: {exc}{self._reason_of(rank)}"), rank)
        with ledger.cv:
            peer = self.peer(rank)
            peer.dialing = False
            if isinstance(error, ResourceExhausted):
                ledger.fail(error)
            elif error is not None:
                self.link_lost(None, error, peer)
            elif ledger.closed or ledger.failure is not None:
                sock.close()
            else:
                link = peer.out = MessageLink(rank, sock, dialed=True)
                link.push(self.identity.frame)
                for header, payload, done in peer.backlog:
                    link.push(header, payload, done)
                peer.backlog = []
                self._on_connected(rank)
                self.flush(link)
                self._bells.wake()
            settled = ledger.settle()
        ledger.resolve(settled)

    def _reason_of(self, rank: int) -> str:
        """Why ``rank`` gave up, if it said so in the store (briefly, best effort)."""
        try:
            store = self._store.within(FAILED_S)
            key = f"{mesh.FAILED}/{rank}"
            if store.check([key]):
                return f"; rank {rank} failed: {store.get(key).decode(errors='replace')}"
        except Exception:  # the store may be gone or slow: the error stands without the reason
            pass
        return ""

    # ---- links lost ------------------------------------------------------------------------------

    def link_lost(self, link: MessageLink | None, error: AllreduceError, peer: Peer | None = None) -> None:
        """``link`` (or, if ``None``, the one ``peer`` could not dial) is gone: fail what needed it."""
        peer = peer or self.peers[link.peer]
        also = None
        if link is not None:
            link.shutdown(socket.SHUT_RDWR)
            link.dead = True
            self._bells.wake()
            other = peer.inn if link is peer.out else peer.out
            if " aborted: " not in str(error) and other is not None and not (other.dead or other.closed):
                try:  # a peer that gave up sent its reason on every link: it may already be in on the other
                    other.pump(self.on_header)
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
                self._bells.wake()
        else:
            peer.in_lost = peer.in_lost or error
        self._fail_first(peer, outgoing, error)
        if also is not None:
            self.link_lost(peer.inn if link is peer.out else peer.out, also)

    def _fail_first(self, peer: Peer, outgoing: bool, error: AllreduceError) -> None:
        """Fail the first pending operation that cannot finish without the link to (``outgoing``) or from
        ``peer`` (the messenger breaks, and the others fail with it)."""
        for op in self._ledger.in_order():
            if _needs(op, peer, outgoing):
                self.lost(op, error)
                break

    def lost(self, op: Op, error: AllreduceError) -> None:
        """``op`` cannot finish: its peer is gone. A peer that aborted on a mismatch makes it a
        :class:`Mismatch` here too (it was this rank's call that did not match), as the group does."""
        text = f"{self._ledger.who}: {op.what}: {error}"
        kind = Mismatch if " aborted: Mismatch: " in text else PeerLost
        self._ledger.fail(with_peer(kind(text), op.partner()), op)

    def orphans(self) -> float | None:
        """Fail receives from peers whose link closed and none came from them; seconds to the next check."""
        now, soonest = time.monotonic(), None
        for peer in self.peers.values():
            if peer.orphan_at is None:
                continue
            if peer.inn is not None:
                peer.orphan_at = None
            elif now >= peer.orphan_at:
                peer.orphan_at = None
                peer.in_lost = peer.in_lost or peer.out_lost
                self._fail_first(peer, False, peer.in_lost)
            else:
                soonest = min(soonest or peer.orphan_at, peer.orphan_at)
        return None if soonest is None else max(0.0, soonest - now)

    def break_links(self, reason: str) -> None:
        """The messenger failed: refuse dials from now on (and reset those queued), so a peer hears at
        once, not at its deadline; tell every peer ``reason`` in an ABORT frame."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        frame = wire.abort_frame(reason)
        for peer in self.peers.values():
            peer.backlog = []
            for link in (peer.out, peer.inn):
                if link is not None:
                    link.abort(frame)
                    link.dead = True
        self._ledger.cv.notify_all()
        self._bells.wake()

    # ---- closing ---------------------------------------------------------------------------------

    def close_dead(self) -> None:
        """Close the links given up on (background thread only, while no other thread polls their fds)."""
        if len(self._bells.of) == 1:
            for link in list(self.links()):
                if link.dead:
                    link.close()

    def close(self) -> None:
        """Close every link and the listener (no poller left). Peers see the links close after everything
        sent before: this rank waits up to :data:`CLOSE_S` for them to notice."""
        links = list(self.links())
        for link in links:
            if not link.dead:
                link.shutdown(socket.SHUT_WR)  # after what is in the kernel: the peer reads it all, then EOF
        _read_to_eof([link for link in links if not link.dead], time.monotonic() + CLOSE_S)
        for link in links:
            link.close()
        self.listener.close()


def _needs(op: Op, peer: Peer, outgoing: bool) -> bool:
    """Whether ``op`` cannot finish without the link to (``outgoing``) or from ``peer``."""
    if isinstance(op, Send):
        return outgoing and op.dest == peer.rank
    if outgoing:
        return False
    return op.source == peer.rank or any(r is op for r, _ in peer.cleared.values())


def _read_to_eof(links: list[MessageLink], deadline: float) -> None:
    """Read and drop what peers still send until each closes its end: closing with unread bytes would
    reset the connection, and a reset may destroy data the peer has not read yet."""
    open_ = {link.fd: link for link in links}
    poller = select.poll()
    for fd in open_:
        poller.register(fd, select.POLLIN)
    scratch = bytearray(1 << 16)
    while open_ and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000.0):
            try:
                n = open_[fd].sock.recv_into(scratch)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                n = 0
            if not n:
                poller.unregister(fd)
                del open_[fd]
