"""Horovod's asynchronous handles: an integer per operation in flight, redeemed by ``synchronize``.

An operation is started in the caller's thread (a group serves one thread at a time), in
program order, so every rank issues the same collectives in the same order. What it leaves in flight
is a :class:`Pending`: the :class:`~allreduce.Work` objects of its collectives and a ``finish``
function that turns their buffers into the operation's result (scaling, unpacking, copying to the
caller's device). ``poll`` asks whether the collectives are done; ``synchronize`` waits and finishes.
"""

from __future__ import annotations

import itertools


class Pending:
    """An operation in flight: ``works`` (``None`` entries ran synchronously) and its ``finish()``."""

    __slots__ = ("works", "finish")

    def __init__(self, works, finish):
        self.works = [w for w in works if w is not None]
        self.finish = finish

    def done(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self):
        """Wait for the collectives (re-raising their error), then return ``finish()``."""
        for work in self.works:
            work.wait()
        return self.finish()


_TABLE: dict[int, Pending] = {}
_NUMBERS = itertools.count(1)


def register(pending: Pending) -> int:
    """A new handle for ``pending``."""
    handle = next(_NUMBERS)
    _TABLE[handle] = pending
    return handle


def poll(handle: int) -> bool:
    """Whether the operation of ``handle`` has completed (``synchronize`` will not block).

    Raises:
        ValueError: ``handle`` is unknown or was already synchronized.
    """
    if handle not in _TABLE:
        raise ValueError(f"unknown handle {handle!r}: it was never returned, or was already synchronized")
    return _TABLE[handle].done()


def synchronize(handle: int):
    """Wait for the operation of ``handle`` and return its result; ``None`` for an unknown handle
    (Horovod's behaviour, so that synchronizing twice is harmless).

    Example (two ranks)::

        h = hvd.allreduce_async(torch.tensor([rank + 1.0]), op=hvd.Sum)
        hvd.synchronize(h)              # both: tensor([3.])

    Raises:
        AllreduceError: the collective failed (the handle is gone all the same).
    """
    pending = _TABLE.pop(handle, None)
    return None if pending is None else pending.wait()


def clear() -> None:
    """Forget every handle (at ``shutdown``)."""
    _TABLE.clear()
