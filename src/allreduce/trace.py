"""Chrome trace files (what chrome://tracing and ui.perfetto.dev open), written alike by a real run's
timeline and by the simulator, so that a run and its prediction can be laid side by side.

A trace is ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``. Every span is a
complete event (``"ph": "X"``) with a start ``ts`` and a duration ``dur`` in microseconds, on process
``pid`` = the rank and thread ``tid`` = a *lane*: ``collective``, ``step``, ``send -> 3``,
``recv <- 2``, ``reduce``. Lanes are numbered per rank in order of first use and named by metadata
events, so the viewer shows their names. :func:`merge` joins per-rank files into one.
"""

from __future__ import annotations

import json

LANES = ("collective", "step")  # the lanes every rank shows first, in this order


class Trace:
    """Spans collected in memory, written as one trace file."""

    def __init__(self, **info):
        self.events: list[dict] = []
        self.info = dict(info)  # goes to "otherData": what produced the trace
        self._lanes: dict[tuple[int, str], int] = {}

    def span(self, rank: int, lane: str, name: str, start: float, end: float, **args) -> None:
        """Record ``name`` on ``lane`` of ``rank`` from ``start`` to ``end`` (seconds)."""
        event = {"name": name, "ph": "X", "pid": rank, "tid": self._lane(rank, lane),
                 "ts": round(start * 1e6, 3), "dur": round(max(0.0, end - start) * 1e6, 3)}
        if args:
            event["args"] = args
        self.events.append(event)

    def to_json(self) -> dict:
        return {"traceEvents": self._metadata() + self.events, "displayTimeUnit": "ms", "otherData": self.info}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))

    def _lane(self, rank: int, lane: str) -> int:
        if (rank, lane) not in self._lanes:
            for first in LANES:  # keep the common lanes on top whatever comes first
                self._lanes.setdefault((rank, first), sum(r == rank for r, _ in self._lanes))
            self._lanes.setdefault((rank, lane), sum(r == rank for r, _ in self._lanes))
        return self._lanes[rank, lane]

    def _metadata(self) -> list[dict]:
        ranks = sorted({rank for rank, _ in self._lanes})
        meta = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}} for r in ranks]
        meta += [{"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}} for r in ranks]
        for (rank, lane), tid in self._lanes.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
        return meta


def merge(paths: list[str], out: str) -> None:
    """Write the events of the trace files ``paths`` (e.g. one per rank) into one file ``out``."""
    events, info = [], {}
    for path in paths:
        with open(path) as f:
            trace = json.load(f)
        events += trace["traceEvents"]
        info.setdefault("sources", []).append(trace.get("otherData", {}))
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": info}, f, separators=(",", ":"))
