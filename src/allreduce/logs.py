"""The ``allreduce`` logger: silent unless the application or ``ALLREDUCE_DEBUG`` asks for it.

The library logs through the standard :mod:`logging` module, under the logger named ``allreduce``
(and its children, e.g. ``allreduce.rendezvous``). It installs only a ``NullHandler``, so nothing
is printed unless the application configures logging, as libraries should. For a quick look without
touching the code, ``ALLREDUCE_DEBUG`` (read when a group forms) sends the records to standard error,
one line each, tagged with the rank, in the manner of ``NCCL_DEBUG``:

- ``WARN``: only what needs attention, such as a rendezvous still waiting for ranks (``allreduce run``
  sets this for its workers unless the variable is set);
- ``INFO``: also where the store is, who joined, which transport each peer gets, which algorithm
  each call shape gets;
- ``DETAIL``: also every collective's fingerprint and time, per rank.

``DETAIL`` wraps a group's executor when the group forms (and each small-message plan when it is
made), so that with it off a collective pays nothing for logging.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = logging.getLogger("allreduce")
LOGGER.addHandler(logging.NullHandler())
LEVELS = {"": None, "WARN": logging.WARNING, "INFO": logging.INFO, "DETAIL": logging.DEBUG}  # ALLREDUCE_DEBUG
DETAIL = False  # whether groups formed from now on log every collective (ALLREDUCE_DEBUG=DETAIL)
_rank = "?"  # the tag of this process's lines: its rank in the world, once known


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _rank
        return True


_HANDLER = logging.StreamHandler(sys.stderr)
_HANDLER.addFilter(_RankFilter())
_HANDLER.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d allreduce[%(rank)s] %(message)s",
                                        "%H:%M:%S"))


def get(name: str) -> logging.Logger:
    """The child logger ``allreduce.<name>`` (e.g. ``get("rendezvous")``)."""
    return LOGGER.getChild(name)


def tag(rank: int) -> None:
    """Tag this process's lines with ``rank`` (its rank in the world) from now on."""
    global _rank
    _rank = str(rank)


def configure(level: str) -> None:
    """Apply ``ALLREDUCE_DEBUG=level``: "" leaves logging as the application set it, and so does ``WARN``
    when the application has configured logging (its handlers receive the warnings).

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    global DETAIL
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"ALLREDUCE_DEBUG={level!r} is not one of {', '.join(k for k in LEVELS if k)}")
    if not level or (level == "WARN" and logging.getLogger().handlers):  # the application's handlers print warnings
        return
    LOGGER.setLevel(LEVELS[level])
    if _HANDLER not in LOGGER.handlers:
        LOGGER.addHandler(_HANDLER)
        LOGGER.propagate = False  # our own stderr line; the application's handlers would print it twice
    DETAIL = level == "DETAIL"


class TimedPlanned:
    """A planned call (:mod:`allreduce.engines`) that logs each run's fingerprint and time
    (``ALLREDUCE_DEBUG=DETAIL``); everything else passes through."""

    def __init__(self, planned, rank: int):
        self._planned = planned
        self._log = get("collective")
        self._rank = rank
        if hasattr(planned, "shortcut"):  # a compiled plan (engines.Resumable): its shortcut's runs are logged too
            self.shortcut = self._logged_shortcut

    def _logged_shortcut(self, state, timeout: float, resume):
        """The planned call's compiled shortcut, each call it runs logged (as ``state.issued``, its number)."""
        return _LoggedShortcut(self._planned.shortcut(state, timeout, resume), state, self)

    def run(self, buffers, seq: int, *args, **kwargs):
        """Run the planned call as call ``seq``, then log it with the seconds it took."""
        start = time.perf_counter()
        try:
            return self._planned.run(buffers, seq, *args, **kwargs)
        finally:
            _log_call(self._log, self._rank, self._planned.call, seq, start)

    def __getattr__(self, name: str):
        return getattr(self._planned, name)


class _LoggedShortcut:
    """A compiled shortcut whose runs are logged (a Python object: compiled callers go the general way)."""

    __slots__ = ("_shortcut", "_state", "_timed")

    def __init__(self, shortcut, state, timed: TimedPlanned):
        self._shortcut, self._state, self._timed = shortcut, state, timed

    def __call__(self, data) -> bool:
        start, ran = time.perf_counter(), None
        try:
            ran = self._shortcut(data)
            return ran
        finally:
            if ran is not False:  # it ran the call (and returned, or raised its error)
                timed = self._timed
                _log_call(timed._log, timed._rank, timed._planned.call, self._state.issued, start)

    def retire(self) -> None:
        self._shortcut.retire()


def _log_call(log: logging.Logger, rank: int, call, seq: int, start: float) -> None:
    """One ``DETAIL`` line: the call's fingerprint fields and its time since ``start`` (``perf_counter``)."""
    log.debug("rank %d: %s #%d %s count=%d %s %s root=%d digest=%s: %.1f us", rank, call.collective, seq,
              call.algorithm, call.count, call.dtype, getattr(call.op, "name", call.op), call.root,
              getattr(call, "digest", "-"), (time.perf_counter() - start) * 1e6)
