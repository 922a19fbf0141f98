"""What a store holds: its keys and values, the bytes they take, and the limits on them.

A store's host keeps every value a client sets, so without a limit one client (a bug in a loop, or
someone who has the job's secret) could grow the host's memory until the rank that hosts it dies.
:class:`StoreLimits` caps one value and the whole store; :class:`Contents` keeps the running total
and refuses a change that would break a limit, so the request fails with a message naming the
limit and the host stays up. The defaults are far above what a job puts in its store: the library
writes a few hundred bytes per rank and group (addresses, host names, progress records).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import storewire

ENTRY_BYTES = 128  # bytes counted per key beyond its key and value: what a dict entry and its objects cost


@dataclass(frozen=True)
class StoreLimits:
    """How much one store may hold; its host refuses a set that would go beyond.

    Example: ``TCPStore("10.0.0.1", 29500, is_server=True, limits=StoreLimits(max_bytes=1 << 30))``.

    Raises:
        ValueError: a limit that is not a positive int, or a value limit above the wire's ceiling.
    """

    max_value: int = storewire.MAX_VALUE  # bytes in one value: 64 MiB, the most one frame can carry
    max_bytes: int = 256 << 20  # bytes in the whole store, keys and values, plus ENTRY_BYTES per key

    def __post_init__(self):
        if not isinstance(self.max_value, int) or not 0 < self.max_value <= storewire.MAX_VALUE:
            raise ValueError(f"max_value must be an int in 1..{storewire.MAX_VALUE}, got {self.max_value!r}")
        if not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {self.max_bytes!r}")


class Contents:
    """The keys and values of one store, with the bytes they take counted against ``limits``
    (``None``: no limits, for a store in this process's memory or a file every process replays)."""

    def __init__(self, limits: StoreLimits | None = None):
        self._items: dict[str, bytes] = {}
        self._limits = limits
        self.nbytes = 0  # the total the limits apply to

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or ``None``."""
        return self._items.get(key)

    def put(self, key: str, value: bytes) -> str:
        """Store ``value`` under ``key`` and return ``""``, or return why a limit forbids it (and change nothing)."""
        old = self._items.get(key)
        total = self.nbytes + _cost(key, value) - (0 if old is None else _cost(key, old))
        if self._limits is not None:
            if len(value) > self._limits.max_value:
                return (f"a value of {len(value)} bytes is over the store's limit of {self._limits.max_value} "
                        f"bytes per value (StoreLimits.max_value on the rank that hosts it)")
            if total > self._limits.max_bytes:
                return (f"the store would hold {total} bytes, over its limit of {self._limits.max_bytes} "
                        f"(StoreLimits.max_bytes on the rank that hosts it); delete keys that are no longer needed")
        self._items[key] = value
        self.nbytes = total
        return ""

    def pop(self, key: str) -> bytes | None:
        """Remove ``key``; return its value, or ``None`` if it was not there."""
        value = self._items.pop(key, None)
        if value is not None:
            self.nbytes -= _cost(key, value)
        return value


def _cost(key: str, value: bytes) -> int:
    return len(key.encode("utf-8")) + len(value) + ENTRY_BYTES
