"""One point-to-point connection: a queue of buffers going out, and frames coming in, read in place.

Out: buffers (frame headers, payloads straight from the sender's array) leave with ``sendmsg`` in
batches; an entry may carry a callback to run once it is all in the kernel (a send is then done).

In: bytes land in a buffer of :data:`CHUNK` bytes and are cut into frames there, so many small
frames cost one ``recv``. A frame's payload goes where the engine says (:meth:`Link.expect`): a
user's array, or memory kept for a message nobody waits for yet; a large one is read straight into
it rather than through the buffer. The engine (:mod:`.engine`) decides what each frame means; this
module only moves bytes, and never blocks. Over TLS (:mod:`..tls`) it sends one buffer per call, and
reads on past :data:`TURN` while the TLS layer holds bytes it has already decrypted, which no poll
would announce.
"""

from __future__ import annotations

import socket
from collections import deque
from itertools import islice

from .. import tls, wire
from ..errors import PeerLost, ProtocolError, with_peer
from ..transport.tcp import read_abort_reason

CHUNK = 1 << 16  # bytes read at once into a link's buffer
DIRECT = 1 << 16  # a payload still missing at least this much is read straight into its destination
IOV_MAX = 64  # buffers per sendmsg
TURN = 4 << 20  # bytes one link may read before the progress loop turns to the others


class Link:
    """A connected socket to ``peer``; ``dialed`` says whether this rank opened it (its sends go there).

    ``out`` holds ``[buffer, done, whole]`` entries: ``done`` (or ``None``) runs when the buffer is all
    sent; ``whole`` is true while nothing of the frame it is part of has left.
    """

    def __init__(self, peer: int, sock: socket.socket, dialed: bool):
        sock.setblocking(False)
        self.peer = peer
        self.sock = sock
        self.fd = sock.fileno()
        self.dialed = dialed
        self.out: deque = deque()
        self.dead = False  # given up (reset, aborted, shut down): the background thread closes it
        self.closed = False
        self._buf = bytearray(CHUNK)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # the unread bytes of _buf
        self._dest: memoryview | None = None  # where the current frame's payload goes
        self._got = 0  # bytes of it so far
        self._then = None  # called once it is complete

    # ---- out -------------------------------------------------------------------------------------

    def push(self, header: bytes, payload=None, done=None) -> None:
        """Queue a frame: ``header`` and ``payload`` (a byte view, or ``None``); ``done()`` runs once all
        of it is in the kernel."""
        if payload is None or not payload.nbytes:
            self.out.append([memoryview(header), done, True])
        else:
            self.out.append([memoryview(header), None, True])
            self.out.append([payload, done, False])

    def flush(self, finished: list) -> None:
        """Send until the socket is full or nothing is left; append the ``done`` callbacks due to ``finished``.

        Raises:
            PeerLost: the connection broke.
        """
        out = self.out
        while out:
            try:
                n = self.sock.sendmsg([entry[0] for entry in islice(out, IOV_MAX)])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise self.lost(exc) from exc
            while n and out:
                entry = out[0]
                size = entry[0].nbytes
                if n >= size:
                    n -= size
                    out.popleft()
                    if entry[1] is not None:
                        finished.append(entry[1])
                else:
                    entry[0] = entry[0][n:]
                    entry[2] = False
                    n = 0

    @property
    def mid_frame(self) -> bool:
        """Whether part of a frame has left and the rest not: nothing else may be sent in between."""
        return bool(self.out) and not self.out[0][2]

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

    def lost(self, exc: BaseException | None = None) -> PeerLost:
        why = f" ({exc.strerror or exc})" if isinstance(exc, OSError) else ""
        return with_peer(PeerLost(f"connection to rank {self.peer} closed{why}: it exited, crashed or aborted"),
                         self.peer)

    def abort(self, frame: bytes) -> None:
        """Tell the peer why this rank gives up (unless mid-frame: the close says enough), and stop both ways."""
        if not self.closed:
            if not self.mid_frame:
                try:
                    self.sock.send(frame)
                except OSError:
                    pass
            self.out.clear()
            self.shutdown(socket.SHUT_RDWR)

    def shutdown(self, how: int) -> None:
        try:
            self.sock.shutdown(how)
        except OSError:
            pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass

