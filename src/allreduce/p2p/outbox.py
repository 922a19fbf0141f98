"""The sending side of a messenger: eager sends while credit lasts, announced ones otherwise, and the
frames peers answer with on the links this rank dialed (CLEAR, TAKEN, CREDIT). Under the ledger's lock;
the protocol is :mod:`.messenger`'s docstring, a send's states :class:`.records.SendState`.
"""

from __future__ import annotations

import numpy as np

from .. import wire
from ..errors import ProtocolError, with_peer
from .connections import Connections
from .inbox import Inbox
from .ledger import Ledger
from .link import MessageLink
from .records import OVERHEAD, Peer, Send, SendState

EAGER_MAX = 1 << 16  # bytes: larger messages are announced, and move once their receive is posted


class Outbox:
    """The sends of one rank, numbered per destination, on their way."""

    def __init__(self, ledger: Ledger, connections: Connections, inbox: Inbox):
        self._ledger, self._connections, self._inbox = ledger, connections, inbox
        self._self_sent = 0  # messages sent to this rank itself

    def send(self, data: np.ndarray, dest: int, tag: int, synchronous: bool) -> Send:
        """A send, into the kernel at once if its link is idle (under the lock)."""
        if dest == self._ledger.rank:
            self._self_sent += 1
            op = Send(dest, tag, self._self_sent, data, synchronous)
            self._inbox.deliver(op)
            return op
        peer = self._connections.peer(dest)
        peer.sent += 1
        op = Send(dest, tag, peer.sent, data, synchronous)
        self._ledger.pending.add(op)
        if peer.out_lost is not None:
            self._connections.lost(op, peer.out_lost)
            return op
        if peer.out is not None:
            op.move(SendState.SENDING)
        charge = op.nbytes + OVERHEAD
        if op.nbytes <= EAGER_MAX and peer.credit >= charge and not op.synchronous:
            peer.credit -= charge
            frame = wire.message(op.tag, op.number, op.dtype, op.count, op.nbytes)
            self._queue(peer, frame, op.payload, lambda: self._ledger.finish(op))
        else:
            frame = wire.message(op.tag, op.number, op.dtype, op.count, op.nbytes, where=op.address)
            peer.announced[op.number % wire.SEQ_MODULUS] = op
            self._queue(peer, frame, None, lambda: op.move(SendState.ANNOUNCED))
        return op

    def _queue(self, peer: Peer, header: bytes, payload, done) -> None:
        if peer.out is None:
            peer.backlog.append((header, payload, done))
            if not peer.dialing:
                self._connections.dial(peer)
            return
        link = peer.out
        idle = not link.out
        link.push(header, payload, done)
        if idle:
            self._connections.flush(link)

    def connected(self, rank: int) -> None:
        """The link to ``rank`` is up: its sends that waited for it are on their way."""
        for op in self._ledger.pending:
            if isinstance(op, Send) and op.dest == rank and op.state is SendState.CONNECTING:
                op.move(SendState.SENDING)

    def on_header(self, link: MessageLink, header: wire.Header) -> None:
        """A frame on a link this rank dialed: the peer's answers to its sends (a poller, under the lock)."""
        kind = header.kind
        peer = self._connections.peers[link.peer]
        if kind == wire.CLEAR:
            op = self._announced(peer, link, header, "cleared")
            op.move(SendState.SENDING)
            link.push(wire.control(wire.PAYLOAD, op.number, op.nbytes), op.payload, lambda: self._ledger.finish(op))
        elif kind == wire.TAKEN:
            self._ledger.finish(self._announced(peer, link, header, "took"))
        elif kind == wire.CREDIT:
            peer.credit += header.count
        else:
            raise with_peer(ProtocolError(f"rank {link.peer} sent a frame of kind {kind} on a "
                                          "dialed point-to-point link"), link.peer)

    @staticmethod
    def _announced(peer: Peer, link: MessageLink, header: wire.Header, did: str) -> Send:
        op = peer.announced.pop(header.seq, None)
        if op is None:
            raise with_peer(ProtocolError(f"rank {link.peer} {did} message #{header.seq}, which this rank "
                                          "did not announce"), link.peer)
        return op
