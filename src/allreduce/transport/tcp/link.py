"""One framed non-blocking TCP link: the socket to a peer and the frames queued on it, sent with
``sendmsg`` in batches of up to :data:`IOV_MAX` buffers straight from where they lie (headers, payloads
in the caller's arrays). What comes in is read by the side that owns the link, which alone knows what
to expect: the collective transport reads exactly the frames of a step (:class:`.transport.ExchangeLink`),
point-to-point whatever arrives (``p2p.link.MessageLink``).

The queue knows where each frame ends, so that a link given up on mid-frame can finish that frame
(:meth:`Link.end_frame`) before its ABORT, or leave the ABORT out (:attr:`Link.mid_frame`); an entry
may carry a callback, run once its frame is all in the kernel (a point-to-point send is then done).
"""

from __future__ import annotations

import fcntl
import socket
import termios
from collections import deque
from collections.abc import Callable
from itertools import islice

from ...errors import AllreduceError, PeerLost
from .wording import lost

IOV_MAX = 64  # buffers per sendmsg call


class Link:
    """The connection to ``peer`` (non-blocking from now on) and its queue of frames going out."""

    __slots__ = ("peer", "sock", "fd", "out", "then", "frames", "sent")

    def __init__(self, peer: int, sock: socket.socket):
        sock.setblocking(False)
        self.peer = peer
        self.sock = sock
        self.fd = sock.fileno()
        self.out: deque[memoryview] = deque()  # the buffers still to send, the first perhaps in part
        self.then: deque[Callable[[], None] | None] = deque()  # for each, what runs once it is sent
        self.frames: deque[int] = deque()  # the sizes of the frames in ``out``
        self.sent = 0  # bytes of the first of them already sent

    def push(self, header, payload: memoryview | None = None, done: Callable[[], None] | None = None) -> None:
        """Queue one frame: ``header`` (bytes-like, never empty) and ``payload`` (a byte view, or ``None``);
        ``done()`` runs once all of it is in the kernel."""
        out, then = self.out, self.then
        out.append(memoryview(header))
        if payload is None or not payload.nbytes:
            then.append(done)
            self.frames.append(out[-1].nbytes)
        else:
            then.append(None)
            out.append(payload)
            then.append(done)
            self.frames.append(out[-2].nbytes + payload.nbytes)

    def send_some(self, finished: list | None = None) -> None:
        """Send until the socket is full or nothing is left; append the callbacks due to ``finished``.

        Raises:
            PeerLost (or what :meth:`broken` makes of the OS's error): the connection broke.
        """
        out, then = self.out, self.then
        while out:
            try:
                n = self.sock.sendmsg(list(islice(out, IOV_MAX)))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise self.broken(exc) from exc
            self.sent += n
            while self.frames and self.sent >= self.frames[0]:
                self.sent -= self.frames.popleft()
            while n:
                head = out[0]
                if n >= head.nbytes:
                    n -= head.nbytes
                    out.popleft()
                    done = then.popleft()
                    if done is not None:
                        finished.append(done)
                else:
                    out[0] = head[n:]
                    n = 0

    @property
    def mid_frame(self) -> bool:
        """Whether part of a frame has left and the rest not: nothing else may be sent in between."""
        return self.sent > 0

    def end_frame(self) -> None:
        """Drop what is queued after the frame being sent (all of it when none is half sent), and copy
        the rest of that frame out of the caller's memory."""
        rest = self.frames[0] - self.sent if self.sent else 0
        kept: deque[memoryview] = deque()
        then: deque[Callable[[], None] | None] = deque()
        while rest:
            head = memoryview(bytes(self.out.popleft()[:rest]))
            kept.append(head)
            then.append(self.then.popleft())
            rest -= head.nbytes
        self.out, self.then = kept, then
        self.frames = deque([self.frames[0]] if kept else [])

    def resume(self, rest: bytes, frame: int) -> None:
        """Queue ``rest``, the end of a ``frame``-byte frame whose start another sender (the compiled
        engine) already sent, in place of anything queued."""
        self.out, self.then = deque([memoryview(rest)]), deque([None])
        self.frames, self.sent = deque([frame]), frame - len(rest)

    def drop(self) -> None:
        """Forget everything queued."""
        self.out.clear()
        self.then.clear()
        self.frames.clear()
        self.sent = 0

    def pending(self) -> int:
        """Bytes queued here or sent but not yet acknowledged by the peer."""
        return sum(b.nbytes for b in self.out) + _unacked(self.sock)

    def lost(self, exc: BaseException | None = None) -> PeerLost:
        return lost(self.peer, exc)

    def broken(self, exc: OSError) -> AllreduceError:
        """The error for a link that failed while sending."""
        return self.lost(exc)

    def shutdown(self, how: int) -> None:
        try:
            self.sock.shutdown(how)
        except OSError:
            pass


def _unacked(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not acknowledged (0 where the OS cannot tell)."""
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"), "little")
    except OSError:
        return 0
