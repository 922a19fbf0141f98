"""The issue order: which thread may issue calls on a group now, and how many of its calls are in flight.

Any thread may use a group, one thread at a time (torch's contract). Calls issued from two threads at
once would be numbered in a different order on different ranks and pair up wrongly, silently: so a
call from one thread while another thread's calls are in flight raises ``RuntimeError`` in the late
thread before anything is sent, and the calls in flight fail instead of returning (the group breaks,
peers are told), so that no rank keeps a result paired across threads. A call from a :class:`Work`
callback, which runs on the progress thread where a blocking call would wait for itself, raises too.
Every path a call takes claims here first, with the group's lock held.
"""

from __future__ import annotations

import threading

from ..engines.callstate import CallStateLike


class Claims:
    """The issuing thread of one group (``calls.issuer``), whose calls are in flight while the group is
    busy or holds queued ones (see the module docstring). ``calls`` is the group's call state
    (:mod:`..engines.callstate`): a call claimed is run or queued before the lock is let go."""

    def __init__(self, rank: int, size: int, name: str, calls: CallStateLike):
        self._calls = calls
        self._who = f"rank {rank}/{size}"
        self._name = name

    def claim(self, collective: str, me: int) -> None:
        """Let thread ``me`` issue a call, or raise ``RuntimeError`` (see the module docstring)."""
        calls = self._calls
        if me == calls.progress:
            raise self._wrong_thread(collective, "from a Work callback, which runs on the group's progress "
                                     "thread: a blocking call there would wait for itself. Issue it once the "
                                     "work is done, from the thread that issued it")
        if (calls.busy or calls.queued) and calls.issuer != me:
            other = next((f"'{t.name}'" for t in threading.enumerate() if t.ident == calls.issuer), "another")
            calls.conflict = self._wrong_thread(
                collective, f"from thread '{threading.current_thread().name}' while thread {other} has calls in "
                "flight on it: calls from two threads at once pair up in different orders on different ranks. "
                "Use a group from one thread at a time, or give each thread its own group (new_group())")
            raise calls.conflict
        calls.issuer = me

    def _wrong_thread(self, collective: str, why: str) -> RuntimeError:
        return RuntimeError(f"{self._who}: {collective} on process group '{self._name}' {why}")
