"""One line instead of a chain of tracebacks, for the errors a worker of a job dies of.

When a peer dies, every other rank's collective fails with an :class:`~allreduce.AllreduceError`
whose message already says all a user needs (rank, collective, sequence number, algorithm, step,
peer and cause); Python prints it after two or three chained tracebacks through the library's
internals. :class:`Condenser` reads a worker's standard error line by line (bytes in, bytes out, no
I/O) and turns each traceback that ends in an allreduce error, or in ``KeyboardInterrupt``, into
that last line plus where the user's code was; any other traceback (a bug in the user's program)
passes through whole. ``ALLREDUCE_DEBUG=INFO`` or ``DETAIL`` shows every traceback whole.
"""

from __future__ import annotations

import os
import re
import sysconfig

_CHAIN = (b"Traceback (most recent call last):", b"During handling of the above exception",
          b"The above exception was the direct cause")  # lines that continue a traceback after its error, or blank
_FRAME = re.compile(rb'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_HIDDEN = (os.path.dirname(os.path.dirname(__file__)).encode(), sysconfig.get_paths()["stdlib"].encode())


class Condenser:
    """Feed one worker's standard error, a line at a time; print what :meth:`feed` and :meth:`end` return."""

    def __init__(self) -> None:
        self._held: list[bytes] = []  # the traceback read so far
        self._error: bytes | None = None  # its last error line, once one came
        self._after_error = False  # the last line that was not blank was an error line

    def feed(self, line: bytes) -> list[bytes]:
        """The lines to print now, given the next ``line`` (with its newline)."""
        text = line.rstrip(b"\r\n")
        if not self._held:
            if text == _CHAIN[0]:
                self._held.append(line)
                return []
            return [line]
        if self._after_error and text:
            if not text.startswith(_CHAIN):  # the traceback ended with the line before
                return self.end() + self.feed(line)
            self._after_error = False  # a chained traceback follows
        self._held.append(line)
        if text and not text.startswith((b" ", b"\t")) and not text.startswith(_CHAIN):
            self._error, self._after_error = text, True
        return []

    def end(self) -> list[bytes]:
        """The lines still held (at the end of the stream, or of a traceback)."""
        held, error = self._held, self._error
        self._held, self._error, self._after_error = [], None, False
        if error is None and held:  # the stream ended inside a traceback: the worker was stopped while printing it
            return [b"(stopped while printing a traceback)\n"]
        if error is None or not (error.startswith(b"allreduce.") or error == b"KeyboardInterrupt"):
            return held
        where = [m for m in map(_FRAME.match, (h.rstrip(b"\r\n") for h in held))
                 if m and not m["path"].startswith(_HIDDEN)]
        at = b" (at %s:%s, in %s)" % (where[-1]["path"], where[-1]["line"], where[-1]["func"]) if where else b""
        return [error.removeprefix(b"allreduce.errors.") + at + b"\n"]
