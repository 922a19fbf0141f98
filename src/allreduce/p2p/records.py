"""The records of point-to-point: a send (and the states it passes through), a receive, a message that
arrived, a peer, and the Work handle (with :func:`wait_any`, a wait for the first of several).

The messenger (:mod:`.messenger`) changes them under its lock; :class:`P2PWork` only reads them.
"""

from __future__ import annotations

import enum
import threading
import time
from concurrent.futures import Future

import numpy as np

from ..dtypes import code_of
from ..errors import AllreduceError
from ..work import Work
from .link import MessageLink
from .matching import Envelope, Receive

WINDOW = 1 << 20  # bytes of eager messages a sender may have unreceived at one receiver
OVERHEAD = 256  # bytes each eager message counts against the window beyond its payload (bookkeeping)
NAP_S = 50e-6  # seconds wait_any first sleeps between looks at works of several messengers (or collectives)
NAP_CAP_S = 1e-3  # and at most, doubling from NAP_S


class Op:
    """One send or receive in flight; ``what`` names it in errors, e.g. ``send #3 to rank 1 (tag 0)``."""

    future: Future
    what: str
    number: int
    finished: bool  # set under the messenger's lock; the future settles just after, outside it

    def partner(self) -> int | None:
        raise NotImplementedError

    def waiting(self) -> str:
        raise NotImplementedError


class SendState(enum.Enum):
    CONNECTING = "connecting"  # its link is being dialed: its frames wait in the peer's backlog
    SENDING = "sending"  # its frames (or, once cleared, its payload) are queued on the link
    ANNOUNCED = "announced"  # its envelope is in the kernel: it waits for CLEAR or TAKEN
    DONE = "done"  # finished, or failed


MOVES = {
    SendState.CONNECTING: {SendState.SENDING, SendState.DONE},
    SendState.SENDING: {SendState.ANNOUNCED, SendState.DONE},
    SendState.ANNOUNCED: {SendState.SENDING, SendState.DONE},  # cleared: the payload follows; taken: done
    SendState.DONE: set(),
}


class Send(Op):
    """``isend`` of ``data`` (a flat array, read in place until done)."""

    def __init__(self, dest: int, tag: int, number: int, data: np.ndarray, synchronous: bool = False):
        self.dest, self.tag, self.number = dest, tag, number
        self.synchronous = synchronous  # announced even if small: done once a receive took it
        self.payload = memoryview(data.view(np.uint8).reshape(-1)) if data.size else memoryview(b"")
        self.address = data.__array_interface__["data"][0] if data.size else 0  # where a reader on this host finds it
        self.dtype, self.count, self.nbytes = code_of(data.dtype), data.size, data.nbytes
        self.future, self.finished = Future(), False
        self.state = SendState.CONNECTING
        self.what = f"send #{number} to rank {dest} (tag {tag})"

    def move(self, to: SendState) -> None:
        """Take the transition to ``to`` (:data:`MOVES`); news of a send already done (it failed, or the
        group closed, while its frames were on their way) changes nothing."""
        if self.state is SendState.DONE:
            return
        if to not in MOVES[self.state]:
            raise RuntimeError(f"{self.what} cannot go from {self.state.value} to {to.value}")
        self.state = to

    def finish(self) -> None:
        self.state = SendState.DONE

    def partner(self) -> int | None:
        """The rank it cannot finish without."""
        return self.dest

    def waiting(self) -> str:
        """What it waits for, in the words of a timeout."""
        if self.state is SendState.CONNECTING:
            return f"waiting to connect to rank {self.dest}"
        if self.state is SendState.ANNOUNCED:
            return f"waiting for rank {self.dest} to post a matching receive"
        return f"waiting to send to rank {self.dest}"


class Recv(Op, Receive):
    """``irecv`` into ``array`` (flat), or into new memory when ``array`` is ``None``."""

    def __init__(self, source: int | None, tag: int | None, number: int, array: np.ndarray | None, exact: bool):
        Receive.__init__(self, source, tag)
        self.number, self.exact = number, exact  # exact: same dtype and count; else any bytes that fit
        self.array = array
        self.dtype, self.count = (code_of(array.dtype), array.size) if array is not None else (0, 0)
        self.data = None  # the received bytes, for a receive without an array
        self.got: Message | None = None  # the message it took
        self.future, self.finished = Future(), False
        self.what = (f"recv #{number} from {'any rank' if source is None else f'rank {source}'} "
                     f"({'any tag' if tag is None else f'tag {tag}'})")

    def partner(self) -> int | None:
        """The rank it cannot finish without: its message's sender once it took one (``None``: any)."""
        return self.got.source if self.got is not None else self.source

    def waiting(self) -> str:
        """What it waits for, in the words of a timeout."""
        if self.got is not None:
            return f"receiving its payload from rank {self.got.source}"
        return f"waiting for a matching send from {'any rank' if self.source is None else f'rank {self.source}'}"


class Message(Envelope):
    """A message that arrived: its envelope, and its payload once in, if it came eagerly."""

    __slots__ = ("number", "dtype", "count", "nbytes", "eager", "data", "address", "sender")

    def __init__(self, source: int, tag: int, number: int, dtype: int, count: int, nbytes: int, eager: bool):
        super().__init__(source, tag)
        self.number, self.dtype, self.count, self.nbytes, self.eager = number, dtype, count, nbytes, eager
        self.data = None  # the payload (bytes-like) of an eager message, once in
        self.address = 0  # where an announced message's payload lies in the sender
        self.sender = None  # a synchronous send to this rank itself: done once a receive takes this


class Peer:
    """What this rank knows of one other rank: its links, and the messages in flight between them."""

    def __init__(self, rank: int):
        self.rank = rank
        self.out: MessageLink | None = None  # the link this rank dialed: its messages to the peer
        self.inn: MessageLink | None = None  # the link the peer dialed: its messages to this rank
        self.dialing = False
        self.backlog: list = []  # frames to send once ``out`` is connected
        self.sent = 0  # messages sent to the peer (their numbers)
        self.credit = WINDOW  # eager bytes this rank may still send it
        self.owed = 0  # eager bytes taken from it and not yet credited back
        self.announced: dict[int, Send] = {}  # number -> send waiting for CLEAR
        self.cleared: dict[int, tuple[Recv, memoryview]] = {}  # number -> receive waiting for the payload
        self.out_lost: AllreduceError | None = None  # why ``out`` is gone (or could not be made)
        self.in_lost: AllreduceError | None = None  # why nothing more can come from the peer
        self.orphan_at: float | None = None  # when receives from it fail, if no link from it appears
        self.reader = None  # a cma.Reader of its memory, once its IDENT proved it readable (see .nearby)


class P2PWork(Work):
    """A send or receive in flight (``isend``/``irecv``): wait for it, poll it, or chain on its future.

    ``wait()`` moves the messages itself while it waits (no hand-off to another thread) and ends at the
    group's timeout at the latest, with :class:`~allreduce.errors.CommTimeout`. Once a receive is done,
    ``source`` is the rank its message came from (in the group: the answer to a receive from any
    source, like torch's ``recv`` return value), ``tag`` its tag and ``nbytes`` its size; a receive made
    without an array holds the bytes in ``payload``. A send's ``source`` is ``None``.

    Example (two ranks, on rank 0)::

        work = dist.irecv(x)            # from any rank
        work.wait(); work.source        # 1
    """

    def __init__(self, messenger, op: Op):
        super().__init__(op.future, f"rank {messenger.rank}/{messenger.size}: {op.what}", messenger.progress_ident)
        self._messenger = messenger
        self._op = op

    @property
    def source(self) -> int | None:
        got = getattr(self._op, "got", None)
        return got.source if got is not None else None

    @property
    def tag(self) -> int | None:
        got = getattr(self._op, "got", None)
        return got.tag if got is not None else getattr(self._op, "tag", None)

    @property
    def nbytes(self) -> int | None:
        got = getattr(self._op, "got", None)
        return got.nbytes if got is not None else getattr(self._op, "nbytes", None)

    @property
    def payload(self):
        """The bytes a receive made without an array took (``None`` otherwise, or before it is done)."""
        return getattr(self._op, "data", None)

    def complete(self) -> None:
        """Wait as a blocking call does (``send``, ``recv``, MPI's ``Send``/``Recv``): no handle outlives
        it, so an exception of the caller's escaping the wait cancels the operation, or breaks the group
        where it cannot be cancelled cleanly (:meth:`.messenger.Messenger.interrupted`)."""
        try:
            self.wait()
        except BaseException as exc:
            self.interrupted(exc)
            raise

    def interrupted(self, exc: BaseException) -> None:
        """The blocking call this operation is part of was cut short by ``exc``: cancel it, or break the group."""
        self._messenger.interrupted(self._op, exc)

    def is_completed(self) -> bool:
        """Whether it has finished, successfully or not; never blocks. Looks at the links first (once,
        waiting for nothing), so that a loop of tests moves the messages itself, as MPI's tests do."""
        if threading.get_ident() != self._completer:
            self._messenger.look(self._op)
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise its error. Returns ``True`` like torch.

        Raises ``TimeoutError`` if ``timeout`` (shorter than the group's) passes first; the operation
        goes on. At the group's timeout it fails with :class:`~allreduce.errors.CommTimeout`, naming
        the peer, and the group breaks. ``RuntimeError`` from a callback on the progress thread.
        """
        op, messenger = self._op, self._messenger
        if not op.finished:
            if threading.get_ident() == self._completer:
                return super().wait()  # raises: the progress thread would wait for itself
            limit = messenger.timeout if timeout is None else min(timeout, messenger.timeout)
            if not messenger.drive(lambda: op.finished, time.monotonic() + limit):
                if timeout is not None and timeout < messenger.timeout:
                    raise TimeoutError(f"{self._what} did not complete within {timeout}s")
                messenger.expire(op)
        error = self._future.exception()  # finished: settled now, or in a moment by the thread that finished it
        if error is not None:
            raise error
        return True


def wait_any(works: list) -> None:
    """Return once one of ``works`` (``Work`` handles: point-to-point ones, or collectives') is done,
    moving the point-to-point messages meanwhile. Works of one messenger wait in its poll, woken by the
    frame that finishes one of them; a mix is looked at in turn, with naps in between. Nobody waits
    past the group's timeout: a point-to-point operation still unfinished then fails with
    :class:`~allreduce.errors.CommTimeout` (the group breaks), as its own wait would.

    Raises:
        RuntimeError: on the progress thread (from a callback), which would wait for itself.
    """
    p2p = [work for work in works if isinstance(work, P2PWork)]
    for work in p2p:
        if threading.get_ident() == work._completer:
            work.wait()  # done already, or raises
            return
    messengers = {id(work._messenger) for work in p2p}
    if p2p and len(p2p) == len(works) and len(messengers) == 1:
        messenger, ops = p2p[0]._messenger, [work._op for work in p2p]
        if not messenger.drive(lambda: any(op.finished for op in ops), time.monotonic() + messenger.timeout):
            messenger.expire(ops[0])
        return
    start, nap = time.monotonic(), NAP_S
    while works and not any(work.is_completed() for work in works):
        for work in p2p:
            if time.monotonic() - start >= work._messenger.timeout:
                work._messenger.expire(work._op)
        time.sleep(nap)
        nap = min(2 * nap, NAP_CAP_S)
