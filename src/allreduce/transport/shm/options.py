"""The shared-memory transport's sizes and waiting policy, read once from ``ALLREDUCE_SHM_<FIELD>``.

Its own file because these change for tuning, not for protocol reasons: every knob, its default, what
values it may take, and the one place that reads the environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "ALLREDUCE_SHM_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class ShmOptions:
    """Sizes and waiting policy of the shared-memory transport."""

    slots: int = 4  # slots in each channel's ring
    chunk: int = 128 << 10  # payload bytes per slot (a multiple of 64), at most
    ring_budget: int = 16 << 20  # slot bytes per rank at most: many peers get smaller chunks
    inline_max: int = 64 << 10  # larger payloads go registered or cross-memory where possible
    buffered_max: int = 64 << 20  # point-to-point sends up to this size never wait for their receiver
    staged_max: int = 4 << 20  # collective sends up to this size are copied into staging, not read cross-memory
    cma_piece: int = 256 << 10  # bytes read per process_vm_readv call, handed to progress
    line_max: int = 64 << 10  # collectives of up to this many bytes per rank take the lines at once (0: never)
    chunked_max: int = 1 << 40  # larger all-reduces and reduces take the lines in chunks up to this (0: never)
    line_chunk: int = 1 << 20  # payload bytes of a line in those chunks (a multiple of 64)
    spin_s: float = 50e-6  # busy-wait this long (not when ranks outnumber cores or the cores are busy)
    spin_max_s: float = 300e-6  # the lines spin at most this long for a peer (the Python lines widen to it)
    yield_s: float = 150e-6  # then sched_yield until this long (not when the cores are busy), then sleep
    awake_s: float = 5e-3  # the compiled lines keep a rank awake while the peer it awaits posted within this
    sleep_ms: int = 1  # longest sleep when no peer wakes us (a wake-up lost to a race costs this)
    check_s: float = 0.02  # how often a waiting rank looks for dead, closed or aborted peers
    cross_memory: bool = True  # read large private payloads with process_vm_readv where allowed

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            allowed, words = _RULES[field.name]
            if not allowed(value):
                raise ValueError(f"{field.name}={value!r}: must be {words}")

    @property
    def line_capacity(self) -> int:
        """Payload bytes of each line: a call at once or a chunk, whichever is more (0: no lines)."""
        return max(self.line_max, self.line_chunk if self.chunked_max else 0)

    def chunk_for(self, members: int) -> int:
        """Payload bytes per slot with ``members`` ranks on the host: ``chunk``, smaller where the rings
        of all peers would pass ``ring_budget`` (never below 4 KiB)."""
        fair = self.ring_budget // (self.slots * max(1, members - 1)) // 64 * 64
        return max(min(self.chunk, 4096), min(self.chunk, fair))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ShmOptions:
        """The defaults, each replaced by ``ALLREDUCE_SHM_<FIELD>`` where set and not empty
        (``ALLREDUCE_SHM_CROSS_MEMORY=0`` turns cross-memory reads off).

        Raises:
            ValueError: for a value its field does not allow, naming the variable and the valid values.
        """
        values = {}
        for field in dataclasses.fields(cls):
            name = PREFIX + field.name.upper()
            text = environ.get(name)
            if text:
                value = _parse(text, type(field.default))
                allowed, words = _RULES[field.name]
                if value is None or not allowed(value):
                    raise ValueError(f"{name}={text!r}: must be {words}")
                values[field.name] = value
        return cls(**values)


def _parse(text: str, kind: type):
    """``text`` as a value of ``kind`` (bool, int or float), or ``None`` if it is not one."""
    if kind is bool:
        word = text.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else None
    try:
        return kind(text)
    except ValueError:
        return None


def _at_least(low):
    return lambda value: value >= low


_RULES = {  # field -> (whether a value is allowed, the values allowed, in words)
    "slots": (_at_least(1), "a whole number, at least 1"),
    "chunk": (lambda value: value >= 64 and value % 64 == 0, "a positive multiple of 64"),
    "ring_budget": (_at_least(0), "a whole number of bytes, at least 0"),
    "inline_max": (_at_least(0), "a whole number of bytes, at least 0"),
    "buffered_max": (_at_least(0), "a whole number of bytes, at least 0"),
    "staged_max": (_at_least(0), "a whole number of bytes, at least 0"),
    "cma_piece": (_at_least(1), "a whole number of bytes, at least 1"),
    "line_max": (_at_least(0), "a whole number of bytes, at least 0"),
    "chunked_max": (_at_least(0), "a whole number of bytes, at least 0"),
    "line_chunk": (lambda value: value >= 64 and value % 64 == 0, "a positive multiple of 64"),
    "spin_s": (_at_least(0), "a number of seconds, at least 0"),
    "spin_max_s": (_at_least(0), "a number of seconds, at least 0"),
    "yield_s": (_at_least(0), "a number of seconds, at least 0"),
    "awake_s": (_at_least(0), "a number of seconds, at least 0"),
    "sleep_ms": (_at_least(0), "a whole number of milliseconds, at least 0"),
    "check_s": (_at_least(0), "a number of seconds, at least 0"),
    "cross_memory": (lambda value: True, f"one of {', '.join(_TRUE + _FALSE)}"),
}
