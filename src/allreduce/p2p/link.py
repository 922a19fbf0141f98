"""One point-to-point connection: a framed TCP link (:class:`..transport.tcp.link.Link`: buffers going
out with ``sendmsg``, an entry's callback run once it is all in the kernel, when a send is done), and
frames coming in, read in place.

In: bytes land in a buffer of :data:`CHUNK` bytes and are cut into frames there, so many small
frames cost one ``recv``. A frame's payload goes where the messenger says (:meth:`MessageLink.expect`): a
user's array, or memory kept for a message nobody waits for yet; a large one is read straight into
it rather than through the buffer. The messenger (:mod:`.messenger`) decides what each frame means; this
module only moves bytes, and never blocks. Over TLS (:mod:`..tls`) it sends one buffer per call, and
reads on past :data:`TURN` while the TLS layer holds bytes it has already decrypted, which no poll
would announce.
"""

from __future__ import annotations

import socket

from .. import tls, wire
from ..errors import PeerLost, ProtocolError, with_peer
from ..transport.tcp.link import Link
from ..transport.tcp.wording import read_abort_reason

CHUNK = 1 << 16  # bytes read at once into a link's buffer
DIRECT = 1 << 16  # a payload still missing at least this much is read straight into its destination
TURN = 4 << 20  # bytes one link may read before the progress loop turns to the others


class MessageLink(Link):
    """A connected socket to ``peer``; ``dialed`` says whether this rank opened it (its sends go there)."""

    __slots__ = ("dialed", "dead", "closed", "_buf", "_view", "_start", "_end", "_dest", "_got", "_then")

    def __init__(self, peer: int, sock: socket.socket, dialed: bool):
        super().__init__(peer, sock)
        self.dialed = dialed
        self.dead = False  # given up (reset, aborted, shut down): the background thread closes it
        self.closed = False
        self._buf = bytearray(CHUNK)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # the unread bytes of _buf
        self._dest: memoryview | None = None  # where the current frame's payload goes
        self._got = 0  # bytes of it so far
        self._then = None  # called once it is complete

    # ---- in --------------------------------------------------------------------------------------

    def expect(self, dest: memoryview, then) -> None:
        """The payload of the frame just read goes into ``dest`` (its size); ``then()`` runs once it is in."""
        self._dest, self._got, self._then = dest, 0, then

    def pump(self, on_header) -> None:
        """Read what has arrived: ``on_header(link, header)`` for each frame (which may call
        :meth:`expect`), payloads into their destinations; stops when the socket is empty or after
        :data:`TURN` bytes.

        Raises:
            PeerLost: the peer closed the connection, sent ABORT (its reason is in the message) or the
                connection broke.
            ProtocolError: a frame that is not ours.
        """
        taken = 0
        while (taken < TURN or tls.buffered(self.sock)) and not self.dead:
            if self._dest is not None:
                left = self._dest.nbytes - self._got
                have = self._end - self._start
                if have:
                    n = min(have, left)
                    self._dest[self._got:self._got + n] = self._view[self._start:self._start + n]
                    self._start += n
                elif left >= DIRECT:
                    n = self._read_into(self._dest[self._got:])
                    if n is None:
                        return
                    taken += n
                else:
                    if self._fill() is None:
                        return
                    continue
                self._got += n
                if self._got == self._dest.nbytes:
                    then, self._dest, self._then = self._then, None, None
                    then()
                continue
            if self._end - self._start >= wire.HEADER_SIZE:
                raw = self._view[self._start:self._start + wire.HEADER_SIZE]
                self._start += wire.HEADER_SIZE
                try:
                    header = wire.decode(raw)
                except ProtocolError as exc:
                    raise with_peer(ProtocolError(f"from rank {self.peer}: {exc}"), self.peer) from None
                if header.kind == wire.ABORT:
                    raise with_peer(PeerLost(f"rank {self.peer} aborted: {self._abort_reason(header.nbytes)}"),
                                    self.peer)
                on_header(self, header)
                continue
            n = self._fill()
            if n is None:
                return
            taken += n

    def _fill(self) -> int | None:
        """Read into the buffer after what is unread (moved to the front); ``None`` if nothing came."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == CHUNK:
            rest = self._end - self._start
            self._buf[:rest] = self._buf[self._start:self._end]
            self._start, self._end = 0, rest
        n = self._read_into(self._view[self._end:])
        if n is not None:
            self._end += n
        return n

    def _read_into(self, view: memoryview) -> int | None:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise self.lost(exc) from exc
        if not n:
            raise self.lost()
        return n

    def _abort_reason(self, nbytes: int) -> str:
        """The ABORT frame's reason: what is buffered, and what follows within a second."""
        data = bytes(self._view[self._start:self._start + min(nbytes, self._end - self._start)])
        self._start += len(data)
        return read_abort_reason(self.sock, data, nbytes)

    # ---- end -------------------------------------------------------------------------------------

    def abort(self, frame: bytes) -> None:
        """Tell the peer why this rank gives up (unless mid-frame: the close says enough), and stop both ways."""
        if not self.closed:
            if not self.mid_frame:
                try:
                    self.sock.send(frame)
                except OSError:
                    pass
            self.drop()
            self.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
