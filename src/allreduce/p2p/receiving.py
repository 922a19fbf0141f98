"""What the engine does with the frames that arrive on its links: matching messages to receives,
taking their payloads (eager, cleared, or read from a sender on this host), returning credit.

Part of :class:`.engine.Engine` (as :class:`Receiving`), under its lock; the protocol is the engine's
module docstring.
"""

from __future__ import annotations

import numpy as np

from .. import wire
from ..dtypes import dtype_of
from ..errors import Mismatch, ProtocolError, with_peer
from . import nearby
from .link import Link
from .records import OVERHEAD, WINDOW, Message, Peer, Recv


class Receiving:
    """The receiving half of the engine. Needs its ``_peers``, ``_matcher`` and the settling and failure
    methods (``_finish``, ``_fail``, ``_lost``, ``_flush``)."""

    def _on_header(self, link: Link, header: wire.Header) -> None:
        """A frame from ``link``'s peer (a poller, under the lock)."""
        peer = self._peers[link.peer]
        kind = header.kind
        if kind == wire.MESSAGE and not link.dialed:
            eager = header.step == wire.EAGER
            nbytes = header.nbytes if eager else header.count * dtype_of(header.dtype).itemsize
            message = Message(link.peer, header.root, header.seq, header.dtype, header.count, nbytes, eager)
            if not eager:  # the address of its payload follows; it is matched once that is in, in order
                where = bytearray(wire.WHERE.size)
                link.expect(memoryview(where), lambda: self._announced(message, where))
                return
            receive = self._matcher.arrive(message, keep=False)
            if receive is not None:
                if self._fits(receive, message):
                    view = self._destination(receive, message)
                    receive.got = message
                    self._expect(link, view, lambda: self._taken_eager(receive, message))
            else:
                message.data = bytearray(nbytes)
                self._expect(link, memoryview(message.data), lambda: self._kept(message))
        elif kind == wire.PAYLOAD and not link.dialed:
            receive, view = peer.cleared.pop(header.seq, (None, None))
            if receive is None or header.nbytes != view.nbytes:
                raise with_peer(ProtocolError(f"rank {link.peer} sent {header.nbytes} bytes for message "
                                              f"#{header.seq}, which this rank did not clear"), link.peer)
            self._expect(link, view, lambda: self._finish(receive))
        elif kind == wire.CLEAR and link.dialed:
            op = peer.announced.pop(header.seq, None)
            if op is None:
                raise with_peer(ProtocolError(f"rank {link.peer} cleared message #{header.seq}, which this rank "
                                              "did not announce"), link.peer)
            op.state = "sending"
            link.push(wire.control(wire.PAYLOAD, op.number, op.nbytes), op.payload, lambda: self._finish(op))
        elif kind == wire.TAKEN and link.dialed:
            op = peer.announced.pop(header.seq, None)
            if op is None:
                raise with_peer(ProtocolError(f"rank {link.peer} took message #{header.seq}, which this rank "
                                              "did not announce"), link.peer)
            self._finish(op)
        elif kind == wire.CREDIT and link.dialed:
            peer.credit += header.count
        elif kind == wire.IDENT and not link.dialed:
            identity = bytearray(wire.IDENTITY.size)
            link.expect(memoryview(identity), lambda: setattr(peer, "reader", nearby.reader_for(link.sock, identity)))
        else:
            raise with_peer(ProtocolError(f"rank {link.peer} sent a frame of kind {kind} on a "
                                          f"{'dialed' if link.dialed else 'accepted'} point-to-point link"), link.peer)

    def _expect(self, link: Link, view: memoryview, then) -> None:
        if view.nbytes:
            link.expect(view, then)
        else:
            then()

    def _announced(self, message: Message, where: bytearray) -> None:
        message.address = wire.WHERE.unpack(where)[0]
        receive = self._matcher.arrive(message)
        if receive is not None:
            self._take(receive, message)

    def _kept(self, message: Message) -> None:
        """An eager message no receive had taken is all in: a receive posted meanwhile takes it, or it waits."""
        receive = self._matcher.arrive(message)
        if receive is not None:
            self._take(receive, message)

    def _take(self, receive: Recv, message: Message) -> None:
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
        peer = self._peers[message.source]
        if peer.in_lost is not None:
            self._lost(receive, peer.in_lost)
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
                self._finish(receive)
                return
        peer.cleared[message.number] = (receive, view)
        self._control(peer, wire.control(wire.CLEAR, message.number))

    def _taken_eager(self, receive: Recv, message: Message) -> None:
        self._finish(receive)
        if message.sender is not None:  # a synchronous send to this rank: done now its receive took it
            self._finish(message.sender)
        if message.source != self.rank:
            peer = self._peers[message.source]
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
            self._flush(link)

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
        self._fail(with_peer(Mismatch(f"rank {self.rank}/{self.size}: {receive.what} {have} but rank "
                                      f"{message.source} sent {sent} in its send #{message.number} "
                                      f"(tag {message.tag})"), message.source), receive)
        return False

    def _destination(self, receive: Recv, message: Message) -> memoryview:
        if receive.array is None:
            receive.data = bytearray(message.nbytes)
            return memoryview(receive.data)
        return memoryview(receive.array.view(np.uint8).reshape(-1))[:message.nbytes]
