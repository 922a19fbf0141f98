"""The point-to-point messenger of one group: its sends and receives, the frames that carry them, failure.

Each rank listens on a port of its own for point-to-point links and publishes it in the group's store
(``p2p/<rank>``) when the group forms. A link to a peer is made on first use, by a helper thread: the
rank that sends dials (:func:`..transport.mesh.dial`, the hello and challenge-response of
:class:`..transport.tcp.TcpPeering`), so a rank's messages to one peer all travel on the one
connection it dialed, in order. The receiver answers on the same connection with control frames. A
pair that sends both ways has two connections; no dial ever races another.

Whatever arrives is read at once (:mod:`.poller` says by which thread): an envelope
(:func:`..wire.message`) is matched (:mod:`.matching`) with the posted receives (:mod:`.inbox`); an
eager payload goes straight into the matched receive's array, or into memory kept until a receive is
posted. Posting a receive matches it against what has arrived, and a send whose link is idle goes into
the kernel before ``isend`` returns (:mod:`.outbox`). Nothing waits in the group's queue of
collectives, and collectives never wait for it.

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
operations that needed it fail at once with :class:`PeerLost`. Any error breaks the messenger as it
breaks the group (``on_failure``): every pending operation fails, peers get ABORT frames with the
reason, later calls raise (:mod:`.ledger`, :mod:`.connections`).

The :class:`Messenger` is a facade over the parts it holds: the :class:`.ledger.Ledger` (operations,
lock, life), the :class:`.connections.Connections` (links and their loss), the :class:`.inbox.Inbox`,
the :class:`.outbox.Outbox` and the :class:`.poller.Poller` (threads and polls).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import numpy as np

from .. import wire
from ..errors import AllreduceError, CommTimeout, Interrupted, PeerLost, with_peer
from ..security import Security
from ..transport.tcp import TcpPeering
from .bell import Bells
from .connections import Connections
from .inbox import Inbox
from .ledger import Ledger
from .link import MessageLink
from .outbox import Outbox
from .poller import Poller
from .records import Op, P2PWork, Recv

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


class Messenger:
    """Point-to-point messages among the ranks of one group; see the module docstring.

    Made by :meth:`start` when the group forms; ``on_failure(error)`` is called (outside every lock)
    when an error breaks it, so that the group breaks too. Ranks are ranks of the group.

    Example (two ranks; what ``allreduce.irecv``/``isend`` do)::

        got = messenger.irecv(np.zeros(3), source=None, tag=0)   # from any rank, posted first
        messenger.isend(np.ones(3), dest=1 - rank, tag=0).wait()
        got.wait(); got.source                                   # 1 - rank
    """

    def __init__(self, rank: int, size: int, store, peering: P2PPeering, listener: socket.socket,
                 timeout: float, name: str):
        self.rank, self.size, self.timeout, self.name = rank, size, timeout, name
        self._ledger = ledger = Ledger(rank, size, name, self._break)
        self._bells = Bells(ledger)
        self._connections = Connections(ledger, self._bells, store, peering, listener, timeout,
                                        self._on_header, self._connected)
        self._inbox = Inbox(ledger, self._connections)
        self._outbox = Outbox(ledger, self._connections, self._inbox)
        self._poller = Poller(ledger, self._bells, self._connections)
        self.progress_ident = self._poller.ident

    @classmethod
    def start(cls, store, rank: int, size: int, host: str, name: str, timeout: float,
              security: Security) -> Messenger:
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

    @property
    def on_failure(self) -> Callable[[AllreduceError], None] | None:
        return self._ledger.on_failure

    @on_failure.setter
    def on_failure(self, told: Callable[[AllreduceError], None] | None) -> None:
        self._ledger.on_failure = told

    # ---- posting ---------------------------------------------------------------------------------

    def isend(self, data: np.ndarray, dest: int, tag: int, synchronous: bool = False) -> P2PWork:
        """Send the flat array ``data`` to ``dest`` with ``tag``; see the module docstring for when it is done.
        ``synchronous``: announced whatever its size, so that it is done only once a receive took it
        (MPI's synchronous mode).

        Raises:
            GroupBroken: after a failure, or once closed.
        """
        ledger = self._ledger
        ledger.owned()
        with ledger.cv:
            ledger.check()
            op = self._outbox.send(data, dest, tag, synchronous)
            done = ledger.settle()
        ledger.resolve(done)
        return P2PWork(self, op)

    def irecv(self, array: np.ndarray | None, source: int | None, tag: int | None, exact: bool = True) -> P2PWork:
        """Receive from ``source`` (``None``: any) with ``tag`` (``None``: any) into the flat ``array``.

        ``exact``: the message must have ``array``'s dtype and size (else :class:`Mismatch`); otherwise it
        may be any bytes that fit. ``array=None`` takes a message of any size into new memory
        (:attr:`P2PWork.payload`).

        Raises:
            GroupBroken: after a failure, or once closed.
        """
        ledger = self._ledger
        ledger.owned()
        with ledger.cv:
            ledger.check()
            op = self._inbox.post(array, source, tag, exact)
            done = ledger.settle()
        ledger.resolve(done)
        return P2PWork(self, op)

    def probe(self, source: int | None, tag: int | None, block: bool) -> tuple[int, int, int] | None:
        """``(source, tag, nbytes)`` of the message a receive from ``source`` with ``tag`` would take now,
        left in place; ``None`` if there is none and not ``block``, else wait for one (the group's timeout).

        Raises:
            CommTimeout: none came in time (the group breaks). GroupBroken: after a failure.
        """
        ledger, found = self._ledger, []

        def seen() -> bool:
            if ledger.closed or ledger.failure is not None:
                return True
            message = self._inbox.matcher.peek(source, tag)
            if message is not None:
                found.append((message.source, message.tag, message.nbytes))
            return bool(found)

        ledger.owned()
        with ledger.cv:
            ledger.check()
            if seen():
                return found[0] if found else None
        if not block:
            self.drive(seen, None)  # one look: a loop of non-blocking probes moves the messages itself
            with ledger.cv:
                ledger.check()
            return found[0] if found else None
        if self.drive(seen, time.monotonic() + self.timeout) and found:
            return found[0]
        with ledger.cv:
            ledger.check()
            where = "any rank" if source is None else f"rank {source}"
            error = CommTimeout(f"rank {self.rank}/{self.size}: probe from {where} "
                                f"({'any tag' if tag is None else f'tag {tag}'}) timed out after "
                                f"{self.timeout:g}s: no matching message arrived")
            ledger.fail(error)
            settled = ledger.settle()
        ledger.resolve(settled)
        raise error

    # ---- waiting ---------------------------------------------------------------------------------

    def drive(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """Move the messages from this thread until ``done()`` or ``deadline`` (:meth:`.poller.Poller.drive`)."""
        return self._poller.drive(done, deadline)

    def look(self, op: Op) -> bool:
        """Whether ``op`` is done, after one look at the links that waits for nothing (:meth:`drive` with
        no deadline): what a test does, so that a loop of tests moves the messages itself."""
        if not op.finished and self._ledger.foreign is None:  # a fork() child leaves the parent's links alone
            self._poller.drive(lambda: op.finished, None)
        return op.finished

    def expire(self, op: Op) -> None:
        """``op`` reached the group's timeout: fail it with :class:`CommTimeout` (and break the messenger)."""
        ledger = self._ledger
        with ledger.cv:
            if not op.finished:
                ledger.fail(with_peer(CommTimeout(f"rank {self.rank}/{self.size}: {op.what} timed out after "
                                                  f"{self.timeout:g}s {op.waiting()}"), op.partner()), op)
            done = ledger.settle()
        ledger.resolve(done)

    def interrupted(self, op: Op, exc: BaseException) -> None:
        """``exc`` (the caller's: a signal handler's, ``KeyboardInterrupt``) escaped the blocking wait for
        ``op``. A receive nothing has matched yet is unposted; anything else unfinished (a receive taking
        its payload, a send not all in the kernel or announced) breaks the messenger: no later operation
        may take its message, nor send from the caller's buffer once it is refilled."""
        ledger = self._ledger
        with ledger.cv:
            if not op.finished:
                error = Interrupted(f"rank {self.rank}/{self.size}: {op.what} was interrupted by {type(exc).__name__}")
                if isinstance(op, Recv) and op.got is None:
                    self._inbox.matcher.withdraw(op)
                    ledger.finish(op, error)
                else:
                    ledger.fail(error, op)
            done = ledger.settle()
        ledger.resolve(done)

    # ---- the end ---------------------------------------------------------------------------------

    def disown(self, why: str) -> None:
        """This process is a fork() child of the messenger's: every call raises ``RuntimeError(why)``, and
        the parent's links and threads are left alone."""
        self._ledger.foreign = why

    def abort(self, reason: str) -> None:
        """The group failed (``reason``): fail every pending operation and tell the peers. Idempotent."""
        ledger = self._ledger
        with ledger.cv:
            ledger.abort(reason)
            done = ledger.settle()
        ledger.resolve(done)

    def close(self) -> None:
        """Fail what is still pending, close every link and stop; once. Peers see the links close after
        everything sent before (this rank waits up to :data:`.connections.CLOSE_S` for them to notice)."""
        ledger = self._ledger
        with ledger.cv:
            if ledger.closed:
                return
            ledger.close()
            self._bells.wake()  # then no more: the bells close below
            ledger.closed = True
            settled = ledger.settle()
        ledger.resolve(settled)
        self._poller.stop()
        self._connections.close()

    # ---- the parts' wiring -----------------------------------------------------------------------

    def _on_header(self, link: MessageLink, header: wire.Header) -> None:
        """A frame from ``link``'s peer: answers to this rank's sends on the links it dialed, the peer's
        messages on the others."""
        (self._outbox if link.dialed else self._inbox).on_header(link, header)

    def _connected(self, rank: int) -> None:
        self._outbox.connected(rank)

    def _break(self, reason: str) -> None:
        self._connections.break_links(reason)
