"""Horovod's asynchronous handles: an integer per operation in flight, redeemed by ``synchronize``.

An operation is negotiated and started in the caller's thread (a group serves one thread at a time;
see :mod:`.negotiation`). Once started it is a :class:`Pending`: the :class:`~allreduce.Work`
objects of its collectives and a ``finish`` function that turns their buffers into the operation's
result (scaling, unpacking, copying to the caller's device). A handle holds the negotiation's ticket:
``poll`` asks whether the collectives are done; ``synchronize`` negotiates if need be, waits and
finishes.
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


_TABLE: dict[int, tuple] = {}  # handle -> (operation with poll() and wait(), whether its result is a list of one)
_NUMBERS = itertools.count(1)


def register(operation, single: bool = False) -> int:
    """A new handle for ``operation`` (anything with ``poll()`` and ``wait()``); ``single``: its result is
    a list of one tensor, which ``synchronize`` returns alone."""
    handle = next(_NUMBERS)
    _TABLE[handle] = (operation, single)
    return handle


def poll(handle: int) -> bool:
    """Whether the operation of ``handle`` has completed (``synchronize`` will not block). Asked again
    about an operation not yet started, it holds a negotiation round, which waits for the set's other
    ranks to hold one (their next blocking Horovod call or ``poll``).

    Raises:
        ValueError: ``handle`` is unknown or was already synchronized.
    """
    if handle not in _TABLE:
        raise ValueError(f"unknown handle {handle!r}: it was never returned, or was already synchronized")
    return _TABLE[handle][0].poll()


def synchronize(handle: int):
    """Wait for the operation of ``handle`` and return its result; ``None`` for an unknown handle
    (Horovod's behaviour, so that synchronizing twice is harmless).

    Example (two ranks)::

        h = hvd.allreduce_async(torch.tensor([rank + 1.0]), op=hvd.Sum)
        hvd.synchronize(h)              # both: tensor([3.])

    Raises:
        AllreduceError: the collective failed (the handle is gone all the same).
    """
    operation, single = _TABLE.pop(handle, (None, False))
    if operation is None:
        return None
    result = operation.wait()
    return result[0] if single else result


def clear() -> None:
    """Forget every handle (at ``shutdown``)."""
    _TABLE.clear()
