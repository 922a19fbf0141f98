"""Horovod's timeline: what each operation spent negotiating and running, as a Chrome trace.

``hvd.start_timeline(path)`` (:mod:`.basics`; every rank calls it, rank 0 of the job writes) opens ``path`` as a JSON
array of trace events, the format ``chrome://tracing`` and Perfetto read. Each operation is a "process"
of the trace named by its negotiated name (``allreduce.<name>``, ``allreduce.noname.<n>``), with two
activities: ``NEGOTIATE_<KIND>`` from the call until every rank asked for it, then ``<KIND>`` until its
result was taken (``synchronize`` or the blocking call's return). ``mark_cycles=True`` adds an instant
``CYCLE_START`` event at each negotiation round. The first event carries
``start_time_since_epoch_in_micros``, the wall-clock time of the trace's zero. ``hvd.stop_timeline()``
closes the array; a file cut short by a crash still opens in the viewers, which accept a missing ``]``.
"""

from __future__ import annotations

import json
import time


class Timeline:
    """An open trace file (see the module docstring)."""

    def __init__(self, path: str, mark_cycles: bool):
        self.file = open(path, "w", encoding="utf-8")
        self.mark_cycles = mark_cycles
        self.zero = time.perf_counter_ns()
        self.pids: dict[str, int] = {}
        self.file.write("[\n")
        self._write({"name": "process_name", "ph": "M", "pid": 0,
                     "args": {"name": "timeline", "start_time_since_epoch_in_micros": time.time_ns() // 1000}},
                    first=True)

    def begin(self, name: str, activity: str) -> None:
        self._write({"name": activity, "ph": "B", "ts": self._now(), "pid": self._pid(name)})

    def end(self, name: str) -> None:
        self._write({"ph": "E", "ts": self._now(), "pid": self._pid(name)})

    def cycle(self) -> None:
        if self.mark_cycles:
            self._write({"name": "CYCLE_START", "ph": "i", "s": "g", "ts": self._now(), "pid": 0})

    def close(self) -> None:
        self.file.write("\n]\n")
        self.file.close()

    def _pid(self, name: str) -> int:
        pid = self.pids.get(name)
        if pid is None:
            pid = self.pids[name] = len(self.pids) + 1
            self._write({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def _now(self) -> int:
        return (time.perf_counter_ns() - self.zero) // 1000

    def _write(self, event: dict, first: bool = False) -> None:
        self.file.write(("" if first else ",\n") + json.dumps(event))


class _State:
    active: Timeline | None = None


def active() -> Timeline | None:
    """The open timeline, if any (what the negotiation records into)."""
    return _State.active


def open_timeline(file_path: str, mark_cycles: bool) -> None:
    """Close the open timeline, if any, and open one at ``file_path``."""
    close_timeline()
    _State.active = Timeline(file_path, mark_cycles)


def close_timeline() -> None:
    """Close the open timeline (nothing to do if none is open)."""
    if _State.active is not None:
        _State.active.close()
        _State.active = None
