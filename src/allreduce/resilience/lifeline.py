"""The lifeline: one small connection between every two processes of a job, kept for as long as they live.

It carries the few messages that must still flow once a group is broken (the agreement's, a revoke)
and it is the failure detector: a process that dies closes its sockets, so its peers read the end of
its lifeline at once, and that is the only thing that makes a process *failed* here. A slow process is
never suspected; waits on it end at their deadline with an error instead (an agreement must not be
decided over a rank that is alive and merely late). The lifeline needs no store once it is up, so it
outlives the store's host.

Processes are named by their *id*, their rank in the world group as first formed, which never changes
when groups shrink. The lower id of a pair dials the higher one, after the job's challenge-response
(:mod:`..auth`), and one socket then carries both directions; one reader thread per process serves
them all. A message is a JSON object, framed by :func:`encode` and :class:`Decoder` (no I/O there).
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from .. import auth, logs
from ..errors import RendezvousError
from ..security import Security

_log = logs.get("transport")
KIND = "lifeline"  # the store key prefix where each process publishes its address (``lifeline/<id>``)
CONTEXT = b"allreduce-lifeline"  # what the challenge-response binds the connection to
SEND_S = 5.0  # seconds a message may take to be handed to the kernel (they are a few hundred bytes)
_LENGTH = struct.Struct("<I")
MAX_MESSAGE = 1 << 20


def encode(message: dict) -> bytes:
    """One message as framed on a lifeline: its length, then its JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


class Decoder:
    """Bytes of one lifeline in, whole messages out."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        """The messages ``data`` completes; ``ValueError`` for a frame too long or not a JSON object."""
        self._data += data
        messages = []
        while len(self._data) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._data)
            if length > MAX_MESSAGE:
                raise ValueError(f"lifeline frame of {length} bytes (at most {MAX_MESSAGE})")
            if len(self._data) < _LENGTH.size + length:
                break
            message = json.loads(bytes(self._data[_LENGTH.size:_LENGTH.size + length]))
            del self._data[:_LENGTH.size + length]
            if not isinstance(message, dict):
                raise ValueError("lifeline frame is not a JSON object")
            messages.append(message)
        return messages


class Lifeline:
    """This process's ends of the lifelines to every other process of the job (see the module docstring).

    ``cv`` guards :attr:`dead` and whatever the message handlers keep; it is notified on every message
    and every death, so a waiter re-reads both. Nothing is read before :meth:`start`, so that no message
    comes before the handlers are there to take it.
    """

    def __init__(self, me: int, socks: dict[int, socket.socket]):
        self.me = me
        self.cv = threading.Condition()
        self.dead: set[int] = set()  # ids whose lifeline ended: they died, or left the job
        self.handlers: list[Callable[[int, dict], None]] = []  # called with cv held, for every message
        self._socks = socks
        self._send_locks = {peer: threading.Lock() for peer in socks}
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._read, name="allreduce-lifeline", daemon=True)

    def start(self) -> None:
        """Start reading the lifelines (once :attr:`handlers` are in place)."""
        self._thread.start()

    @classmethod
    def connect(cls, store, me: int, size: int, host: str, security: Security, timeout: float) -> Lifeline:
        """Listen, publish the address under ``lifeline/<me>`` in ``store``, dial every higher id and take a
        connection from every lower one, by ``timeout`` seconds.

        Raises:
            RendezvousError: a peer could not be reached, or did not dial, in time.
        """
        deadline = time.monotonic() + timeout
        socks: dict[int, socket.socket] = {}
        with socket.create_server((host, 0), backlog=max(size, 16)) as listener:
            try:
                store.set(f"{KIND}/{me}", f"{host}:{listener.getsockname()[1]}".encode())
                for peer in range(me + 1, size):
                    socks[peer] = _dial(store, me, peer, security, deadline)
                while len(socks) < size - 1:
                    answered = _answer(listener, security, deadline, me)
                    if answered is None:
                        continue
                    peer, sock = answered
                    if peer < me and peer not in socks:
                        socks[peer] = sock
                    else:
                        sock.close()
            except BaseException:
                for sock in socks.values():
                    sock.close()
                raise
        return cls(me, socks)

    def send(self, peer: int, message: dict) -> bool:
        """Hand ``message`` to ``peer``'s lifeline; ``False`` if it is gone (its death is read from it)."""
        sock = self._socks.get(peer)
        if sock is None or peer in self.dead:
            return False
        with self._send_locks[peer]:
            try:
                sock.sendall(encode(message))
                return True
            except OSError:
                return False

    def alive(self, ids) -> list[int]:
        """``ids`` less the dead, in their order (with ``cv`` held)."""
        return [i for i in ids if i not in self.dead]

    def forget(self, ids) -> None:
        """Count ``ids`` as dead: another process read the end of their lifelines first (with ``cv`` held)."""
        self.dead.update(i for i in ids if i != self.me)
        self.cv.notify_all()

    def close(self) -> None:
        """Close every lifeline: to the peers, this process has now left."""
        self._closed = True
        self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=SEND_S)
        for sock in self._socks.values():
            try:
                sock.close()
            except OSError:
                pass
        self._wake_r.close()
        self._wake_w.close()

    def _read(self) -> None:
        selector = selectors.DefaultSelector()
        decoders = {}
        for peer, sock in self._socks.items():
            selector.register(sock, selectors.EVENT_READ, peer)
            decoders[peer] = Decoder()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        while not self._closed:
            for key, _ in selector.select():
                peer = key.data
                if peer is None:
                    continue
                try:
                    data = key.fileobj.recv(1 << 16)
                    messages = decoders[peer].feed(data) if data else []
                except (OSError, ValueError) as exc:
                    _log.warning("lifeline to %d: %s", peer, exc)
                    data, messages = b"", []
                with self.cv:
                    for message in messages:
                        for handle in self.handlers:
                            try:
                                handle(peer, message)
                            except Exception:  # a message it cannot take must not end the failure detector
                                _log.exception("lifeline from %d: message %.200s", peer, message)
                    if not data:
                        self.dead.add(peer)
                        selector.unregister(key.fileobj)
                    self.cv.notify_all()
        selector.close()


def _dial(store, me: int, peer: int, security: Security, deadline: float) -> socket.socket:
    address = store.get(f"{KIND}/{peer}", timeout=max(deadline - time.monotonic(), 0.001)).decode()
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.001))
    except OSError as exc:
        raise RendezvousError(f"id {me}: cannot reach the lifeline of id {peer} at {address}: {exc}") from exc
    try:
        security.check_listener(sock)
        auth.client_handshake(sock, security.key, CONTEXT, deadline)
        sock.sendall(_LENGTH.pack(me))
    except OSError as exc:  # it died or stalled mid-handshake
        sock.close()
        raise RendezvousError(f"id {me}: the lifeline of id {peer} at {address} failed: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    sock.settimeout(SEND_S)
    return sock


def _answer(listener: socket.socket, security: Security, deadline: float, me: int) -> tuple[int, socket.socket] | None:
    """The id and socket of one peer that dialled, or ``None`` for a connection refused (a stranger's)."""
    listener.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        sock, _ = listener.accept()
    except TimeoutError as exc:
        raise RendezvousError(f"id {me}: a lower id did not dial its lifeline in time") from exc
    try:
        auth.server_handshake(sock, security.key, CONTEXT, deadline, security.admits)
        peer = _LENGTH.unpack(auth.recv_exactly(sock, _LENGTH.size, deadline, "saying who it is"))[0]
    except (OSError, auth.AuthError) as exc:
        sock.close()
        _log.warning("lifeline: refused a connection: %s", exc)
        return None
    sock.settimeout(SEND_S)
    return peer, sock
