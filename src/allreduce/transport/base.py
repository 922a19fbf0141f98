"""The narrow interface between the executor and a transport."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from ..wire import Header


@dataclass(slots=True)
class SendSpec:
    """Send ``header`` then ``payload`` (raw bytes of a buffer region) to ``peer``."""

    peer: int
    header: Header
    payload: memoryview


@dataclass(slots=True)
class RecvSpec:
    """Receive a frame from ``peer`` whose header must equal ``header``, its payload into ``dest``.

    ``progress(nbytes)``, when set, is called as the payload arrives with the number of bytes received
    so far, so the caller can reduce what has landed while the rest is still on the wire.

    ``absorb(view, offset)``, when set, lets a transport that holds the incoming bytes in memory the
    receiver can read (shared memory) hand them over in place instead of copying them into ``dest``:
    ``view`` is bytes ``[offset, offset + len(view))`` of the payload, valid only during the call, and
    ``dest``/``progress`` are then not used for those bytes. Receives that have ``absorb`` are completed
    in list order, so their combination order is the schedule's.
    """

    peer: int
    header: Header
    dest: memoryview
    progress: Callable[[int], None] | None = None
    absorb: Callable[[memoryview, int], None] | None = None


class Transport:
    """Moves frames between this rank and its peers; see :meth:`exchange`."""

    rank: int
    size: int
    lines = None  # the shared-memory lines (shm.linepath.Lines) where every rank of the group is on this host

    def exchange(self, sends: list[SendSpec], recvs: list[RecvSpec], deadline: float,
                 idle: Callable[[], None] | None = None, idle_every: float = 1.0) -> None:
        """Progress every send and receive concurrently until all are done.

        ``idle()``, when given, is called after every ``idle_every`` seconds without progress; it may
        raise to give up early (the group uses it to spot peers that called something else).

        Frames to or from the same peer keep their list order. Raises ``CommTimeout`` at ``deadline``
        (a ``time.monotonic()`` value), ``PeerLost`` when a needed peer's connection closes or it
        aborts, ``Mismatch`` when a received header differs from the expected one. Each exception
        carries the peer in its ``peer`` attribute.
        """
        raise NotImplementedError

    def abort(self, reason: str) -> None:
        """Tell every peer, best effort, why this rank gives up, then close all links."""
        raise NotImplementedError

    def close(self) -> None:
        """Close all links; the transport cannot be used again."""
        raise NotImplementedError
