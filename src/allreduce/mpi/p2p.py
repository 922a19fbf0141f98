"""MPI point-to-point on the group's point-to-point messenger (:mod:`allreduce.p2p`).

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

from .requests import Request
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL, Status


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


def send(engine, size: int, payload: np.ndarray, dest: int, tag: int, synchronous: bool = False) -> Request:
    """Start sending the bytes of the flat array ``payload`` to ``dest`` (a rank or ``PROC_NULL``);
    ``synchronous``: done only once a receive took it (``Ssend``).

    Raises:
        ValueError: ``dest`` is not a rank of the communicator, or ``tag`` is negative or too large.
    """
    check_rank(dest, size, "dest", PROC_NULL, within="communicator")
    if dest == PROC_NULL:
        return Request(None, None, (PROC_NULL, ANY_TAG, 0))
    check_tag(tag)
    return Request(engine.isend(payload.view(np.uint8).reshape(-1), int(dest), int(tag), synchronous))


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
