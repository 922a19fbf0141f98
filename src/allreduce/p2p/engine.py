"""The point-to-point engine of one group: its sends and receives, the frames that carry them, failure.

Each rank listens on a port of its own for point-to-point links and publishes it in the group's store
(``p2p/<rank>``) when the group forms. A link to a peer is made on first use, by a helper thread: the
rank that sends dials (:func:`..transport.mesh.dial`, the hello and challenge-response of
:class:`..transport.tcp.TcpPeering`), so a rank's messages to one peer all travel on the one
connection it dialed, in order. The receiver answers on the same connection with control frames. A
pair that sends both ways has two connections; no dial ever races another.

Whatever arrives is read at once (:mod:`.progress` says by which thread, :mod:`.receiving` what is done
with it): an envelope
(:func:`..wire.message`) is matched (:mod:`.matching`) with the posted receives; an eager payload goes
straight into the matched receive's array, or into memory kept until a receive is posted. Posting a
receive matches it against what has arrived, and a send whose link is idle goes into the kernel before
``isend`` returns. Nothing waits in the group's queue of collectives, and collectives never wait for it.

**Memory.** A message of at most :data:`EAGER_MAX` bytes goes eagerly (its payload right after its
envelope) while the sender holds *credit*: each eager message costs its size plus :data:`OVERHEAD`,
from ``WINDOW`` (1 MiB) per sender and receiver, and the receiver gives credit back (CREDIT frames)
as receives take the messages. So the messages a rank keeps for receives not yet posted take at most
``WINDOW`` bytes per sending peer. Larger messages, and all messages while credit is short, are
*announced* instead (the envelope and the payload's address, a few dozen bytes kept); once a receive
takes the envelope, the receiver reads the payload straight out of the sender's array if they share a
host (:mod:`.nearby`) and says TAKEN, or else sends CLEAR and the payload follows on the link (the
rendezvous protocol). So an eager ``isend`` is done once its bytes are in the kernel, an announced one
once its receive is posted and its bytes have moved. Messages to oneself are copied at once.

**Time.** Every wait (``Work.wait``, a blocking probe, :func:`.records.wait_any`) ends at the group's
timeout: the operation then fails with :class:`CommTimeout` naming the peer, tag and number. An
operation nobody waits for has no deadline. **Failure.** A peer that exits closes its links: the
operations that needed it fail at once with :class:`PeerLost`. Any error breaks the engine as it
breaks the group (``on_failure``): every pending operation fails, peers get ABORT frames with the
reason, later calls raise (:mod:`.failure`).
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from .. import wire
from ..errors import AllreduceError, CommTimeout, Interrupted, PeerLost, with_peer
from ..security import Security
from ..transport.tcp import TcpPeering
from . import nearby
from .failure import Failing
from .link import Link
from .matching import Matcher
from .progress import Progress
from .receiving import Receiving
from .records import OVERHEAD, Message, Op, P2PWork, Peer, Recv, Send

EAGER_MAX = 1 << 16  # bytes: larger messages are announced, and move once their receive is posted
TAG_UB = (1 << 31) - 1  # the largest tag


class P2PPeering(TcpPeering):
    """The TCP peering of point-to-point links: any other rank of the group may dial."""

    kind = "p2p"  # the store key prefix of the addresses

    def dial(self, peer: int, address: str, deadline: float) -> socket.socket:
        try:
            return super().dial(peer, address, deadline)
        except PeerLost as exc:  # refused: the group formed long ago, so the peer is gone since
            raise with_peer(PeerLost(f"rank {self.rank} could not connect to rank {peer} at {address}: "
                                     f"connection refused, so rank {peer} exited or failed"), peer) from exc


class Engine(Receiving, Failing, Progress):
    """Point-to-point messages among the ranks of one group; see the module docstring.

    Made by :meth:`start` when the group forms; ``on_failure(error)`` is called (outside every lock)
    when an error breaks it, so that the group breaks too. Ranks are ranks of the group.

    Example (two ranks; what ``allreduce.irecv``/``isend`` do)::

        got = engine.irecv(np.zeros(3), source=None, tag=0)   # from any rank, posted first
        engine.isend(np.ones(3), dest=1 - rank, tag=0).wait()
        got.wait(); got.source                                # 1 - rank
    """

    def __init__(self, rank: int, size: int, store, peering: P2PPeering, listener: socket.socket,
                 timeout: float, name: str):
        self.rank, self.size, self.timeout, self.name = rank, size, timeout, name
        self.on_failure = None
        self._store = store
        self._peering = peering
        self._listener = listener
        listener.setblocking(False)
        self._cv = threading.Condition()
        self._matcher = Matcher()
        self._peers: dict[int, Peer] = {}
        self._pending: set[Op] = set()
        self._resolved: list = []  # (future, error or None) to settle outside the lock
        self._failure: AllreduceError | None = None
        self._told: AllreduceError | None = None  # a failure to report to on_failure, outside the lock
        self._closed = False
        self._foreign: str | None = None  # set in a fork() child: every call raises it (see disown)
        self.identity = nearby.Identity()  # the first frame on every link this rank dials
        self._self_sent = 0  # messages sent to this rank itself
        self._received = 0  # receives posted (their numbers)
        self._start_progress(name)

    @classmethod
    def start(cls, store, rank: int, size: int, host: str, name: str, timeout: float,
              security: Security) -> "Engine":
        """Listen on ``host``, publish the address in ``store`` and start the progress thread; links
        prove themselves with ``security``.

        Raises:
            OSError: cannot listen. CommTimeout/RendezvousError: the store is unreachable.
        """
        peering = P2PPeering(rank, size, host, f"{name}/p2p", security, [r for r in range(size) if r != rank])
        listener, address = peering.listen(max(size, 16))
        try:
            store.set(f"{P2PPeering.kind}/{rank}", address.encode())
        except BaseException:
            listener.close()
            raise
        return cls(rank, size, store, peering, listener, timeout, name)

    # ---- posting ---------------------------------------------------------------------------------

    def isend(self, data: np.ndarray, dest: int, tag: int, synchronous: bool = False) -> P2PWork:
        """Send the flat array ``data`` to ``dest`` with ``tag``; see the module docstring for when it is done.
        ``synchronous``: announced whatever its size, so that it is done only once a receive took it
        (MPI's synchronous mode).

        Raises:
            GroupBroken: after a failure, or once closed.
        """
        self._owned()
        with self._cv:
            self._check()
            if dest == self.rank:
                self._self_sent += 1
                op = Send(dest, tag, self._self_sent, data, synchronous)
                self._send_to_self(op)
            else:
                peer = self._peer(dest)
                peer.sent += 1
                op = Send(dest, tag, peer.sent, data, synchronous)
                self._pending.add(op)
                if peer.out_lost is not None:
                    self._lost(op, peer.out_lost)
                else:
                    self._post_send(peer, op)
            done = self._settle()
        self._resolve(done)
        return P2PWork(self, op)

    def irecv(self, array: np.ndarray | None, source: int | None, tag: int | None, exact: bool = True) -> P2PWork:
        """Receive from ``source`` (``None``: any) with ``tag`` (``None``: any) into the flat ``array``.

        ``exact``: the message must have ``array``'s dtype and size (else :class:`Mismatch`); otherwise it
        may be any bytes that fit. ``array=None`` takes a message of any size into new memory
        (:attr:`P2PWork.payload`).

        Raises:
            GroupBroken: after a failure, or once closed.
        """
        self._owned()
        with self._cv:
            self._check()
            self._received += 1
            op = Recv(source, tag, self._received, array, exact)
            self._pending.add(op)
            message = self._matcher.post(op)
            if message is not None:
                self._take(op, message)
            elif source is not None and source != self.rank:
                peer = self._peer(source)
                if peer.in_lost is not None:
                    self._lost(op, peer.in_lost)
                elif peer.inn is None and peer.out is None and not peer.dialing:
                    self._dial(peer)  # a link to watch: if the peer dies, this receive hears of it
            done = self._settle()
        self._resolve(done)
        return P2PWork(self, op)

    def probe(self, source: int | None, tag: int | None, block: bool) -> tuple[int, int, int] | None:
        """``(source, tag, nbytes)`` of the message a receive from ``source`` with ``tag`` would take now,
        left in place; ``None`` if there is none and not ``block``, else wait for one (the group's timeout).

        Raises:
            CommTimeout: none came in time (the group breaks). GroupBroken: after a failure.
        """
        found = []

        def seen() -> bool:
            if self._closed or self._failure is not None:
                return True
            message = self._matcher.peek(source, tag)
            if message is not None:
                found.append((message.source, message.tag, message.nbytes))
            return bool(found)

        self._owned()
        with self._cv:
            self._check()
            if seen():
                return found[0] if found else None
        if not block:
            self.drive(seen, None)  # one look: a loop of non-blocking probes moves the messages itself
            with self._cv:
                self._check()
            return found[0] if found else None
        if self.drive(seen, time.monotonic() + self.timeout) and found:
            return found[0]
        with self._cv:
            self._check()
            where = "any rank" if source is None else f"rank {source}"
            error = CommTimeout(f"rank {self.rank}/{self.size}: probe from {where} "
                                f"({'any tag' if tag is None else f'tag {tag}'}) timed out after "
                                f"{self.timeout:g}s: no matching message arrived")
            self._fail(error)
            settled = self._settle()
        self._resolve(settled)
        raise error

    def look(self, op: Op) -> bool:
        """Whether ``op`` is done, after one look at the links that waits for nothing (:meth:`drive` with
        no deadline): what a test does, so that a loop of tests moves the messages itself."""
        if not op.finished and self._foreign is None:  # a fork() child leaves the parent's links alone
            self.drive(lambda: op.finished, None)
        return op.finished

    def expire(self, op: Op) -> None:
        """``op`` reached the group's timeout: fail it with :class:`CommTimeout` (and break the engine)."""
        with self._cv:
            if not op.finished:
                self._fail(with_peer(CommTimeout(f"rank {self.rank}/{self.size}: {op.what} timed out after "
                                                 f"{self.timeout:g}s {self._waiting_for(op)}"), self._peer_of(op)), op)
            done = self._settle()
        self._resolve(done)

    def disown(self, why: str) -> None:
        """This process is a fork() child of the engine's: every call raises ``RuntimeError(why)``, and the
        parent's links and threads are left alone."""
        self._foreign = why

    def _owned(self) -> None:
        if self._foreign is not None:  # before the lock, which the parent may have held at fork
            raise RuntimeError(self._foreign)

    def interrupted(self, op: Op, exc: BaseException) -> None:
        """``exc`` (the caller's: a signal handler's, ``KeyboardInterrupt``) escaped the blocking wait for
        ``op``. A receive nothing has matched yet is unposted; anything else unfinished (a receive taking
        its payload, a send not all in the kernel or announced) breaks the engine: no later operation
        may take its message, nor send from the caller's buffer once it is refilled."""
        with self._cv:
            if not op.finished:
                error = Interrupted(f"rank {self.rank}/{self.size}: {op.what} was interrupted by {type(exc).__name__}")
                if isinstance(op, Recv) and op.got is None:
                    self._matcher.withdraw(op)
                    self._finish(op, error)
                else:
                    self._fail(error, op)
            done = self._settle()
        self._resolve(done)

    # ---- sending ---------------------------------------------------------------------------------

    def _post_send(self, peer: Peer, op: Send) -> None:
        op.state = "sending" if peer.out is not None else "connecting"
        charge = op.nbytes + OVERHEAD
        if op.nbytes <= EAGER_MAX and peer.credit >= charge and not op.synchronous:
            peer.credit -= charge
            frame = wire.message(op.tag, op.number, op.dtype, op.count, op.nbytes)
            self._queue(peer, frame, op.payload, lambda: self._finish(op))
        else:
            frame = wire.message(op.tag, op.number, op.dtype, op.count, op.nbytes, where=op.address)
            peer.announced[op.number % wire.SEQ_MODULUS] = op
            self._queue(peer, frame, None, lambda: setattr(op, "state", "announced"))

    def _queue(self, peer: Peer, header: bytes, payload, done) -> None:
        if peer.out is None:
            peer.backlog.append((header, payload, done))
            if not peer.dialing:
                self._dial(peer)
            return
        link = peer.out
        idle = not link.out
        link.push(header, payload, done)
        if idle:
            self._flush(link)

    def _send_to_self(self, op: Send) -> None:
        message = Message(self.rank, op.tag, op.number, op.dtype, op.count, op.nbytes, eager=True)
        receive = self._matcher.arrive(message, keep=False)
        if receive is not None:
            message.data = op.payload
            self._take(receive, message)
        else:
            message.data = bytearray(op.payload)
            self._matcher.keep(message)
            if op.synchronous:  # done when a receive takes it (_taken_eager)
                message.sender = op
                self._pending.add(op)
                return
        self._finish(op)

    def _flush(self, link: Link) -> None:
        if link.closed or link.sock is None:
            return
        done: list = []
        try:
            link.flush(done)
        except PeerLost as exc:
            self._link_lost(link, exc)
        for then in done:
            then()
        if link.out and not self._polling():
            self._wake()

    # ---- settling --------------------------------------------------------------------------------

    def _finish(self, op: Op, error: BaseException | None = None) -> None:
        if op.finished:
            return
        op.finished = True
        if isinstance(op, Send):
            op.state = "done"
        self._pending.discard(op)
        self._resolved.append((op.future, error))

    def _settle(self) -> list:
        """The futures to settle, taken under the lock, after the failure to report, if any: the group
        is broken before a waiter wakes, so that its next call cannot start on a group being aborted."""
        done, self._resolved = self._resolved, []
        told, self._told = self._told, None
        if told is not None:
            done.insert(0, (None, told))
        return done

    def _resolve(self, done: list) -> None:
        """Settle futures (their callbacks run here) and report a failure, outside the lock. An exception
        raised meanwhile (a signal handler's) waits until all are settled: a future left unsettled would
        hold its waiter forever."""
        raised = None
        for future, error in done:
            try:
                if future is None:
                    if self.on_failure is not None:
                        self.on_failure(error)
                elif error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            except BaseException as exc:
                raised = raised or exc
        if raised is not None:
            raise raised

    # ---- links -----------------------------------------------------------------------------------

    def _peer(self, rank: int) -> Peer:
        peer = self._peers.get(rank)
        if peer is None:
            peer = self._peers[rank] = Peer(rank)
        return peer

    def _connected(self, rank: int) -> None:
        """The link to ``rank`` is up: its sends that waited for it are on their way."""
        for op in self._pending:
            if isinstance(op, Send) and op.dest == rank and op.state == "connecting":
                op.state = "sending"
