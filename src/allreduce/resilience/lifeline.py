"""The lifelines: the connections that carry a job's failure detector and its few messages once a group breaks.

A process that dies closes its sockets, so whoever holds a connection to it reads its end at once, and
that (or a peer's word that it read one) is the only thing that makes a process *failed* here. A slow
process is never suspected; waits on it end at their deadline with an error instead (an agreement must
not be decided over a rank that is alive and merely late). Nothing here needs the store once the
lifelines are up (each process learns every address as they form), so they outlive the store's host.

No process holds a connection to every other, as in ULFM's detector:

- a *ring*: when the job forms, each process dials its successor, and its fingers (below) to gather every
  process's address without reading them all from the store (Bruck's all-gather, log n rounds), so every
  process is watched by its neighbours from the start, even one that dies before anything else dialled it;
- a death read by a process is *spread*: it tells its fingers (the living processes 1, 2, 4, ... places
  after it on the ring), each of which tells its own once, so every survivor knows within log n hops;
  the ring's neighbours of the dead one link up around it, to keep every survivor watched;
- a message (the agreement's, a revoke) goes on a connection to its addressee made at its first use and
  kept. Word of a death counts only once the connection to the dead one, if there is one, has ended too,
  so that every byte it sent comes first, as :mod:`.agreement` needs.

Processes are named by their *id*, their rank in the world group as first formed, which never changes
when groups shrink. A connection is made by :mod:`.linkage`'s handshake and carries both directions;
one reader thread per process serves them all. A message is a JSON object, framed by :func:`encode` and
:class:`Decoder` (no I/O there).
"""

from __future__ import annotations

import json
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from .. import logs
from ..errors import RendezvousError
from ..security import Security
from . import linkage

_log = logs.get("transport")
KIND = "lifeline"  # the store key prefix where each process publishes its address (``lifeline/<id>``)
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
    """This process's lifelines (see the module docstring).

    ``cv`` guards :attr:`dead` and whatever the message handlers keep; it is notified on every message
    and every death, so a waiter re-reads both. Messages read before :meth:`start` are held until then,
    so that none comes before the handlers are there to take it.
    """

    def __init__(self, me: int, socks: dict[int, socket.socket], size: int = 0, security: Security | None = None,
                 listener: socket.socket | None = None):
        self.me = me
        self.cv = threading.Condition()
        self.dead: set[int] = set()  # ids known dead: they died, or left the job
        self.handlers: list[Callable[[int, dict], None]] = []  # called with cv held, for every message
        self._ids = list(range(size)) if size else sorted({me, *socks})
        self._addresses: dict[int, str] = {}  # the other ids' lifeline listeners, as host:port
        self._tables: dict[int, dict[int, str]] = {}  # the addresses each round of the gathering brought
        self._security, self._listener = security, listener
        self._links = threading.Lock()  # guards the three below
        self._conns: dict[int, list[socket.socket]] = {}  # each peer's open connections; messages go on the first
        self._locks: dict[int, tuple[threading.Lock, threading.Lock]] = {}  # per peer: (dialling, sending)
        self._pending: list[tuple[int, socket.socket]] = []  # connections the reader has yet to watch
        self._held: list[tuple[int, dict]] | None = []  # messages read before start
        self._deaths: queue.Queue[int | None] = queue.Queue()  # for the spreader
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        for peer, sock in socks.items():
            self._adopt(peer, sock)
        self._threads = [threading.Thread(target=self._read, name="allreduce-lifeline", daemon=True),
                         threading.Thread(target=self._spread, name="allreduce-lifeline-spread", daemon=True)]
        if listener is not None:
            self._threads.append(threading.Thread(target=self._accept, name="allreduce-lifeline-accept",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()

    def start(self) -> None:
        """Hand messages to :attr:`handlers` from now on (once they are in place)."""
        with self.cv:
            held, self._held = self._held or [], None
            for sender, message in held:
                self._deliver(sender, message)
            self.cv.notify_all()

    @classmethod
    def connect(cls, store, me: int, size: int, host: str, security: Security, timeout: float) -> Lifeline:
        """Listen, publish the address under ``lifeline/<me>`` in ``store``, and gather every other one over
        the fingers (:meth:`_gather`), by ``timeout`` seconds.

        Raises:
            RendezvousError: a peer could not be reached, or did not dial, in time.
        """
        deadline = time.monotonic() + timeout
        listener = socket.create_server((host, 0), backlog=64)
        line = cls(me, {}, size, security, listener)
        try:
            address = f"{host}:{listener.getsockname()[1]}"
            store.set(f"{KIND}/{me}", address.encode())
            line._gather(store, address, deadline)
        except BaseException:
            line.close()
            raise
        return line

    def send(self, peer: int, message: dict) -> bool:
        """Hand ``message`` to ``peer``'s lifeline; ``False`` if it is gone (its death is read from it)."""
        if peer == self.me or peer in self.dead or self._closed:
            return False
        sock = self._link(peer)
        if sock is None:
            return False
        with self._locks_of(peer)[1]:
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
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            except OSError:
                pass
            self._listener.close()
        self._deaths.put(None)
        self._wake_w.send(b"x")
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=linkage.SEND_S)
        with self._links:
            socks = [sock for conns in self._conns.values() for sock in conns]
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass
        self._wake_r.close()
        self._wake_w.close()

    def _gather(self, store, address: str, deadline: float) -> None:
        """Bruck's all-gather of the addresses, with ``store`` read only for the fingers': at round ``k`` send
        what this process knows to ``me + 2**k`` and learn what ``me - 2**k`` knows. Round 0 links the ring.
        """
        size, me = len(self._ids), self.me
        assert self._security is not None
        for k in range(max(size - 1, 0).bit_length()):
            to, source = (me + (1 << k)) % size, (me - (1 << k)) % size
            if to not in self._addresses:
                left = max(deadline - time.monotonic(), 0.001)
                self._addresses[to] = store.get(f"{KIND}/{to}", timeout=left).decode()
            with self._links:
                linked = bool(self._conns.get(to))
            if not linked:  # (it may have dialled this process first)
                self._adopt(to, linkage.dial(self._addresses[to], me, to, self._security, deadline))
            with self.cv:
                known = {**{str(i): a for i, a in self._addresses.items()}, str(me): address}
            if not self.send(to, {"t": "table", "k": k, "a": known}):
                raise RendezvousError(f"id {me}: the lifeline of id {to} ended while the lifelines formed")
            with self.cv:
                if not self.cv.wait_for(lambda k=k, source=source: k in self._tables or source in self.dead,
                                        max(deadline - time.monotonic(), 0.001)):
                    raise RendezvousError(f"id {me}: id {source} did not send the lifeline addresses in time")
                if k not in self._tables:
                    raise RendezvousError(f"id {me}: id {source} died while the lifelines formed")
                for i, a in self._tables.pop(k).items():
                    if i != me:
                        self._addresses.setdefault(i, a)
        missing = [i for i in self._ids if i != me and i not in self._addresses]
        if missing:
            raise RendezvousError(f"id {me}: the lifeline addresses of ids {missing[:8]} never came")

    def _locks_of(self, peer: int) -> tuple[threading.Lock, threading.Lock]:
        with self._links:
            return self._locks.setdefault(peer, (threading.Lock(), threading.Lock()))

    def _link(self, peer: int) -> socket.socket | None:
        """The connection ``peer``'s messages go on, dialled now if there is none yet; ``None`` if it failed."""
        dialling, _ = self._locks_of(peer)
        with dialling:
            with self._links:
                sock = self._conns[peer][0] if self._conns.get(peer) else None
            address = self._addresses.get(peer)
            if sock is not None or address is None or self._security is None:
                return sock
            try:
                self._adopt(peer, linkage.dial(address, self.me, peer, self._security,
                                               time.monotonic() + linkage.SEND_S))
                with self._links:
                    conns = self._conns.get(peer)
                    return conns[0] if conns else None  # (or it ended at once)
            except linkage.Refused:  # its listener is closed: it died or left
                refused = True
            except RendezvousError as exc:  # leaving, or alive but not answering: never suspected for that
                _log.debug("%s", exc)
                refused = False
        if refused:  # told once the dialling lock is let go: a sender may hold cv and wait for that lock
            self._died(peer)
        return None

    def _adopt(self, peer: int, sock: socket.socket) -> None:
        """Watch ``sock``, a connection to ``peer``, and send on it unless another one is already used."""
        with self._links:
            self._conns.setdefault(peer, []).append(sock)
            self._pending.append((peer, sock))
        try:
            self._wake_w.send(b"x")
        except OSError:  # closed meanwhile
            pass

    def _died(self, peer: int, by_word: bool = False) -> None:
        """Count ``peer`` dead, first hand (its connection ended) or by word; spread it the first time.

        Word of a peer this process has a connection to waits for that connection's end, which comes
        after every byte the peer sent on it (:mod:`.agreement` relies on that order).
        """
        with self.cv:
            if peer == self.me or peer in self.dead:
                return
            if by_word:
                with self._links:
                    if self._conns.get(peer):
                        return
            self.dead.add(peer)
            self.cv.notify_all()
        self._deaths.put(peer)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(sock,), name="allreduce-lifeline-answer", daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        assert self._security is not None
        peer = linkage.answer(sock, self._security)
        if peer is None:
            return
        if self._closed:
            sock.close()
            return
        self._adopt(peer, sock)

    def _spread(self) -> None:
        """Tell the fingers of each death read, and link the ring up around the dead."""
        while True:
            news = [self._deaths.get()]
            while not self._deaths.empty():
                news.append(self._deaths.get())
            if None in news or self._closed:
                return
            with self.cv:
                living = self.alive(self._ids)
            at = living.index(self.me)
            fingers = dict.fromkeys(living[(at + (1 << k)) % len(living)] for k in range(len(living).bit_length()))
            for finger in fingers:  # the first is the ring successor: linked to, whatever it is sent
                if finger != self.me:
                    self.send(finger, {"t": "dead", "ids": news})

    def _read(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        decoders: dict[socket.socket, Decoder] = {}
        while not self._closed:
            with self._links:
                pending, self._pending = self._pending, []
            for peer, sock in pending:
                selector.register(sock, selectors.EVENT_READ, peer)
                decoders[sock] = Decoder()
            for key, _ in selector.select():
                if key.data is None:
                    self._wake_r.recv(4096)
                    continue
                sock, peer = key.fileobj, key.data
                try:
                    data = sock.recv(1 << 16)
                    messages = decoders[sock].feed(data) if data else []
                except ConnectionResetError:  # it ended with bytes of ours unread: an end like any other
                    data, messages = b"", []
                except (OSError, ValueError) as exc:
                    _log.warning("lifeline to %d: %s", peer, exc)
                    data, messages = b"", []
                with self.cv:
                    for message in messages:
                        self._deliver(peer, message)
                    self.cv.notify_all()
                if not data:
                    selector.unregister(sock)
                    if self._drop(peer, sock):  # its last: every byte it sent is read
                        self._died(peer)
        selector.close()

    def _deliver(self, sender: int, message: dict) -> None:
        """One message (with ``cv`` held): word of deaths is taken here, the rest goes to the handlers."""
        if message.get("t") == "dead":
            for peer in message.get("ids", ()):
                if isinstance(peer, int):
                    self._died(peer, by_word=True)
            return
        if message.get("t") == "table":
            try:
                self._tables[int(message["k"])] = {int(i): str(a) for i, a in message["a"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                _log.warning("lifeline from %d: malformed addresses %.200s", sender, message)
            return
        if self._held is not None:
            self._held.append((sender, message))
            return
        for handle in self.handlers:
            try:
                handle(sender, message)
            except Exception:  # a message it cannot take must not end the failure detector
                _log.exception("lifeline from %d: message %.200s", sender, message)

    def _drop(self, peer: int, sock: socket.socket) -> bool:
        """Close ``sock``, ended, once no message is being sent on it; whether it was ``peer``'s last."""
        with self._locks_of(peer)[1], self._links:
            conns = self._conns.get(peer, [])
            if sock in conns:
                conns.remove(sock)
            sock.close()
            if conns:
                return False
            self._conns.pop(peer, None)
            return True
