"""MPI point-to-point on the group's point-to-point engine (:mod:`allreduce.p2p`), and the Request
and Status objects.

A communicator's messages are the engine's: matched by source and tag as MPI matches them (tags and
sources may be ``ANY_*``; two messages from one sender with one tag never overtake each other), sent
straight between the two ranks, and progressed whatever order sends and receives are posted in. A
buffer message carries its bytes (MPI does not match types: a receive takes any message that fits its
buffer, else raises ``Mismatch``, message truncated); an object message carries its pickle, received
into memory of its size. As in MPI's standard mode, a small ``Send`` returns once handed to the kernel,
a large one (over ``allreduce.p2p.EAGER_MAX`` bytes) once its receive is posted: post the receive first
(``Irecv``, ``Sendrecv``) where two ranks send each other large messages.
"""

from __future__ import annotations

import numpy as np

from ..arguments import check_rank, check_tag

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2


class Status:
    """Where a received message came from, its tag and its size in bytes."""

    def __init__(self):
        self.source, self.tag, self.error, self.nbytes = ANY_SOURCE, ANY_TAG, 0, 0

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error

    def Get_count(self, datatype=None) -> int:
        """Elements of ``datatype`` (default: bytes) in the message."""
        return self.nbytes // (datatype.size if datatype is not None else 1)

    Get_elements = Get_count

    @property
    def count(self) -> int:
        return self.nbytes

    def fill(self, source: int, tag: int, nbytes: int) -> None:
        self.source, self.tag, self.nbytes = source, tag, nbytes


class Request:
    """A nonblocking operation; ``Wait``/``Test`` it, or ``wait``/``test`` for a received object.

    ``work`` is the engine's :class:`~allreduce.p2p.P2PWork`, or a collective's ``Work`` (``None``: done
    already, as with ``PROC_NULL``); ``finish()`` runs once, when it is done, and returns the operation's
    value (``None`` for sends and buffer receives).
    """

    def __init__(self, work=None, finish=None, envelope: tuple[int, int, int] | None = None):
        self._work, self._finish = work, finish
        self._done, self._value = False, None
        self._envelope = envelope  # (source, tag, nbytes) of a received message, once known

    def _complete(self, block: bool, status: Status | None, blocking: bool = False):
        if not self._done:
            work = self._work
            if work is not None:
                if not block and not work.is_completed():
                    return False
                if blocking:
                    work.complete()
                else:
                    work.wait()  # raises the operation's error
                if getattr(work, "source", None) is not None:
                    self._envelope = (work.source, work.tag, work.nbytes)
            self._done = True
            self._value = self._finish() if self._finish else None
        if status is not None and self._envelope is not None:
            status.fill(*self._envelope)
        return True

    def Wait(self, status: Status | None = None) -> bool:
        self._complete(True, status)
        return True

    def finish(self, status: Status | None = None):
        """Wait as a blocking call (``Send``, ``Recv``) does, and return the value: an exception escaping
        the wait cancels the operation or breaks the group (:meth:`~allreduce.p2p.P2PWork.complete`)."""
        self._complete(True, status, blocking=True)
        return self._value

    def interrupted(self, exc: BaseException) -> None:
        """The blocking call this request is part of was cut short by ``exc`` (see :meth:`finish`)."""
        if self._work is not None and not self._done:
            self._work.interrupted(exc)

    def Test(self, status: Status | None = None) -> bool:
        return self._complete(False, status)

    def wait(self, status: Status | None = None):
        self._complete(True, status)
        return self._value

    def test(self, status: Status | None = None):
        done = self._complete(False, status)
        return done, (self._value if done else None)

    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        for request, status in zip(requests, statuses or [None] * len(requests)):
            request.Wait(status)
        return True

    @staticmethod
    def waitall(requests, statuses=None) -> list:
        return [r.wait(s) for r, s in zip(requests, statuses or [None] * len(requests))]

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        return all([r.Test(s) for r, s in zip(requests, statuses or [None] * len(requests))])

    @staticmethod
    def testall(requests, statuses=None):
        done = Request.Testall(requests, statuses)
        return done, ([r.wait() for r in requests] if done else None)


def exchange(receiving: Request, sending: Request, status: Status | None):
    """Finish a sendrecv's receive, then its send, as blocking calls: an exception escaping the receive
    cancels the send too (or breaks the group), so the caller's send buffer is free once it returns."""
    try:
        value = receiving.finish(status)
    except BaseException as exc:
        sending.interrupted(exc)
        raise
    sending.finish()
    return value


def send(engine, size: int, payload: np.ndarray, dest: int, tag: int) -> Request:
    """Start sending the bytes of the flat array ``payload`` to ``dest`` (a rank or ``PROC_NULL``).

    Raises:
        ValueError: ``dest`` is not a rank of the communicator, or ``tag`` is negative or too large.
    """
    check_rank(dest, size, "dest", PROC_NULL, within="communicator")
    if dest == PROC_NULL:
        return Request()
    check_tag(tag)
    return Request(engine.isend(payload.view(np.uint8).reshape(-1), int(dest), int(tag)))


def receive(engine, size: int, target: np.ndarray | None, source: int, tag: int, deliver) -> Request:
    """Start receiving from ``source`` (or ``ANY_SOURCE``/``PROC_NULL``) with ``tag`` (or ``ANY_TAG``)
    into the flat array ``target`` (any message that fits), or, if ``None``, into memory of the
    message's size; ``deliver(payload)`` (the bytes, ``None`` from ``PROC_NULL``) makes the value."""
    check_rank(source, size, "source", PROC_NULL, ANY_SOURCE, within="communicator")
    if source == PROC_NULL:
        return Request(None, lambda: deliver(None), (PROC_NULL, ANY_TAG, 0))
    check_tag(tag, ANY_TAG)
    array = target.view(np.uint8).reshape(-1) if target is not None else None
    work = engine.irecv(array, None if source == ANY_SOURCE else int(source), None if tag == ANY_TAG else int(tag),
                        exact=False)
    return Request(work, lambda: deliver(work.payload if target is None else None))


def probe(engine, size: int, source: int, tag: int, block: bool) -> tuple[int, int, int] | None:
    """``(source, tag, nbytes)`` of the message a receive would take now (``None``: none yet, if not
    ``block``); waits up to the group's timeout if ``block``."""
    check_rank(source, size, "source", PROC_NULL, ANY_SOURCE, within="communicator")
    if source == PROC_NULL:
        return PROC_NULL, ANY_TAG, 0
    return engine.probe(None if source == ANY_SOURCE else int(source), None if tag == ANY_TAG else int(tag), block)
