"""Progress for the long-running subcommands: a bar on a terminal, a line now and then elsewhere.

On a terminal (standard error a tty) a ``rich`` bar counts the work done, and result lines print
above it; in a log or a pipe, where a bar would be noise, a line ``label: done/total`` goes to
standard error every ``every_s`` seconds, so that a long quiet run still shows it is alive.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """``total`` units of work, of which :meth:`advance` reports the ones done; close it at the end."""

    def __init__(self, total: int, label: str, every_s: float = 10.0):
        self.total, self.label, self.every_s = total, label, every_s
        self.done = 0
        self._next = time.monotonic() + every_s
        self._bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[note]}"), console=Console(stderr=True), transient=True,
                            redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task(label, total=total, note="")
            self._bar.start()

    def print(self, line: str) -> None:
        """Print a result line on standard output (above the bar when both go to one terminal)."""
        if self._bar is not None and sys.stdout.isatty():
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, flush=True)

    def advance(self, units: int = 1, note: str = "") -> None:
        """Count ``units`` more done; ``note`` (e.g. "0 wrong") is shown beside the count."""
        self.done += units
        if self._bar is not None:
            self._bar.update(self._task, advance=units, note=note)
        elif time.monotonic() >= self._next:
            self._next = time.monotonic() + self.every_s
            print(f"{self.label}: {self.done}/{self.total}{', ' + note if note else ''}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Take the bar off the terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
