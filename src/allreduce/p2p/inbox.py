"""The receiving side of a messenger: receives posted and matched (:mod:`.matching`) with the messages that
arrive on the links peers dialed, payloads taken (eager, cleared, or read from a sender on this host),
credit given back. Under the ledger's lock; the protocol is :mod:`.messenger`'s docstring.
"""

from __future__ import annotations

import numpy as np

from .. import wire
from ..dtypes import dtype_of
from ..errors import Mismatch, ProtocolError, with_peer
from . import nearby
from .connections import Connections
from .ledger import Ledger
from .link import MessageLink
from .matching import Matcher
from .records import OVERHEAD, WINDOW, Message, Peer, Recv, Send


class Inbox:
    """Posted receives, messages kept for receives not yet posted, and the frames that bring them."""

    def __init__(self, ledger: Ledger, connections: Connections):
        self._ledger, self._connections = ledger, connections
        self.matcher = Matcher()
        self._received = 0  # receives posted (their numbers)

    def post(self, array: np.ndarray | None, source: int | None, tag: int | None, exact: bool) -> Recv:
        """A receive, matched with what has arrived, else waiting (under the lock)."""
        self._received += 1
        op = Recv(source, tag, self._received, array, exact)
        self._ledger.pending.add(op)
        message = self.matcher.post(op)
        if message is not None:
            self.take(op, message)
        elif source is not None and source != self._ledger.rank:
            connections = self._connections
            peer = connections.peer(source)
            if peer.in_lost is not None:
                connections.lost(op, peer.in_lost)
            elif peer.inn is None and peer.out is None and not peer.dialing:
                connections.dial(peer)  # a link to watch: if the peer dies, this receive hears of it
        return op

    def deliver(self, op: Send) -> None:
        """A send of this rank to itself: copied now (a synchronous one is done once a receive took it)."""
        message = Message(self._ledger.rank, op.tag, op.number, op.dtype, op.count, op.nbytes, eager=True)
        receive = self.matcher.arrive(message, keep=False)
        if receive is not None:
            message.data = op.payload
            self.take(receive, message)
        else:
            message.data = bytearray(op.payload)
            self.matcher.keep(message)
            if op.synchronous:  # done when a receive takes it (_taken_eager)
                message.sender = op
                self._ledger.pending.add(op)
                return
        self._ledger.finish(op)

    def on_header(self, link: MessageLink, header: wire.Header) -> None:
        """A frame on a link ``link``'s peer dialed: its messages to this rank (a poller, under the lock)."""
        kind = header.kind
        if kind == wire.MESSAGE:
            self._on_message(link, header)
        elif kind == wire.PAYLOAD:
            receive, view = self._connections.peers[link.peer].cleared.pop(header.seq, (None, None))
            if receive is None or header.nbytes != view.nbytes:
                raise with_peer(ProtocolError(f"rank {link.peer} sent {header.nbytes} bytes for message "
                                              f"#{header.seq}, which this rank did not clear"), link.peer)
            _expect(link, view, lambda: self._ledger.finish(receive))
        elif kind == wire.IDENT:
            peer, identity = self._connections.peers[link.peer], bytearray(wire.IDENTITY.size)
            link.expect(memoryview(identity), lambda: setattr(peer, "reader", nearby.reader_for(link.sock, identity)))
        else:
            raise with_peer(ProtocolError(f"rank {link.peer} sent a frame of kind {kind} on a "
                                          "accepted point-to-point link"), link.peer)

    def _on_message(self, link: MessageLink, header: wire.Header) -> None:
        eager = header.step == wire.EAGER
        nbytes = header.nbytes if eager else header.count * dtype_of(header.dtype).itemsize
        message = Message(link.peer, header.root, header.seq, header.dtype, header.count, nbytes, eager)
        if not eager:  # the address of its payload follows; it is matched once that is in, in order
            where = bytearray(wire.WHERE.size)
            link.expect(memoryview(where), lambda: self._announced(message, where))
            return
        receive = self.matcher.arrive(message, keep=False)
        if receive is not None:
            if self._fits(receive, message):
                view = self._destination(receive, message)
                receive.got = message
                _expect(link, view, lambda: self._taken_eager(receive, message))
        else:
            message.data = bytearray(nbytes)
            _expect(link, memoryview(message.data), lambda: self._kept(message))

    def _announced(self, message: Message, where: bytearray) -> None:
        message.address = wire.WHERE.unpack(where)[0]
        receive = self.matcher.arrive(message)
        if receive is not None:
            self.take(receive, message)

    def _kept(self, message: Message) -> None:
        """An eager message no receive had taken is all in: a receive posted meanwhile takes it, or it waits."""
        receive = self.matcher.arrive(message)
        if receive is not None:
            self.take(receive, message)

    def take(self, receive: Recv, message: Message) -> None:
        """``receive`` takes ``message`` (under the lock): its payload now, or once cleared."""
        if not self._fits(receive, message):
            return
        receive.got = message
        if message.eager:
            if receive.array is None and isinstance(message.data, bytearray):
                receive.data = message.data  # made for it on arrival: no copy
            elif message.nbytes:
                self._destination(receive, message)[:] = message.data
            else:
                self._destination(receive, message)
            self._taken_eager(receive, message)
            return
        peer = self._connections.peers[message.source]
        if peer.in_lost is not None:
            self._connections.lost(receive, peer.in_lost)
            return
        view = self._destination(receive, message)
        if peer.reader is not None:  # on this host: copy it out of the sender's memory (see .nearby)
            try:
                if message.nbytes:
                    peer.reader.read(nearby.address_of(view), message.address, message.nbytes)
            except OSError:  # refused after all: it comes over the link
                peer.reader = None
            else:
                self._control(peer, wire.control(wire.TAKEN, message.number))
                self._ledger.finish(receive)
                return
        peer.cleared[message.number] = (receive, view)
        self._control(peer, wire.control(wire.CLEAR, message.number))

    def _taken_eager(self, receive: Recv, message: Message) -> None:
        ledger = self._ledger
        ledger.finish(receive)
        if message.sender is not None:  # a synchronous send to this rank: done now its receive took it
            ledger.finish(message.sender)
        if message.source != ledger.rank:
            peer = self._connections.peers[message.source]
            peer.owed += message.nbytes + OVERHEAD
            if peer.owed >= WINDOW // 4:
                self._control(peer, wire.control(wire.CREDIT, nbytes=peer.owed))
                peer.owed = 0

    def _control(self, peer: Peer, frame: bytes) -> None:
        """A frame back to the sender, on the link its messages come on."""
        link = peer.inn
        if link is None or link.closed:
            return
        idle = not link.out
        link.push(frame)
        if idle:
            self._connections.flush(link)

    def _fits(self, receive: Recv, message: Message) -> bool:
        """Whether ``message`` may land in ``receive``; if not, fail it with :class:`Mismatch`."""
        array = receive.array
        if array is None or (message.nbytes <= array.nbytes if not receive.exact
                             else receive.dtype == message.dtype and receive.count == message.count):
            return True
        if receive.exact:
            have = f"expects {receive.count} x {dtype_of(receive.dtype)}"
            sent = f"{message.count} x {dtype_of(message.dtype)}"
        else:
            have, sent = f"has room for {array.nbytes} bytes", f"{message.nbytes} bytes (message truncated)"
        self._ledger.fail(with_peer(Mismatch(f"{self._ledger.who}: {receive.what} {have} but rank "
                                             f"{message.source} sent {sent} in its send #{message.number} "
                                             f"(tag {message.tag})"), message.source), receive)
        return False

    @staticmethod
    def _destination(receive: Recv, message: Message) -> memoryview:
        if receive.array is None:
            receive.data = bytearray(message.nbytes)
            return memoryview(receive.data)
        return memoryview(receive.array.view(np.uint8).reshape(-1))[:message.nbytes]


def _expect(link: MessageLink, view: memoryview, then) -> None:
    """The frame's payload goes into ``view``, then ``then()`` runs (at once if it is empty)."""
    if view.nbytes:
        link.expect(view, then)
    else:
        then()
