"""What each collective is, in one table that the wire format, the registry, the group, the benchmark
and the simulator all read.

A fact about a collective (its wire code, whether it takes a root, whether it reduces, whether its
buffer is one block per rank, whether its root only sends, how nccl-tests turns its algorithm
bandwidth into bus bandwidth) lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Collective:
    """The facts about one collective."""

    name: str
    code: int  # its number in a frame header; never reused, so old peers are told apart
    rooted: bool  # takes a meaningful root (``dst`` or ``src``)
    reduces: bool  # combines values with an op (and so takes ``op``)
    split: bool  # the buffer is one block per rank: a schedule's ``count`` is one block
    root_sends_only: bool  # its root receives nothing (so it would never hear of a disagreement)
    bus: str  # nccl-tests' bus factor: "allreduce" 2(n-1)/n, "split" (n-1)/n, "one" 1

    def bus_factor(self, size: int) -> float:
        """nccl-tests' factor from algorithm bandwidth to bus bandwidth on ``size`` ranks."""
        if self.bus == "allreduce":
            return 2 * (size - 1) / size
        if self.bus == "split":
            return (size - 1) / size
        return 1.0

    def count_for(self, nbytes: int, size: int, itemsize: int) -> int:
        """The schedule's ``count`` for a whole buffer of ``nbytes``: whole elements, per block if split."""
        if self.name == "barrier":
            return 0
        items = nbytes // itemsize
        return max(1, items // size) if self.split else items

    def whole(self, count: int, size: int) -> int:
        """Elements of the whole buffer for a schedule's ``count``."""
        return count * size if self.split else count


_TABLE = (
    #           name              code rooted reduces split  root_sends_only bus
    Collective("all_reduce",      0,  False, True,  False, False, "allreduce"),
    Collective("reduce",          1,  True,  True,  False, False, "one"),
    Collective("broadcast",       2,  True,  False, False, True,  "one"),
    Collective("all_gather",      3,  False, False, True,  False, "split"),
    Collective("reduce_scatter",  4,  False, True,  True,  False, "split"),
    Collective("all_to_all",      5,  False, False, True,  False, "split"),
    Collective("gather",          6,  True,  False, True,  False, "split"),
    Collective("scatter",         7,  True,  False, True,  True,  "split"),
    Collective("barrier",         8,  False, False, False, False, "one"),
    Collective("send",            9,  False, False, False, False, "one"),  # point-to-point send/recv
)

BY_NAME = MappingProxyType({c.name: c for c in _TABLE})
BY_CODE = MappingProxyType({c.code: c for c in _TABLE})
NAMES: tuple[str, ...] = tuple(c.name for c in _TABLE)


def get(name: str) -> Collective:
    """The facts about ``name``; ``ValueError`` listing the collectives for an unknown one."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(NAMES)}") from None
