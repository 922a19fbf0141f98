"""Hierarchical all-reduce: reduce-scatter inside each host, all-reduce across hosts, all-gather inside.

Vocabulary: ``hosts`` lists each host's ranks (a partition of the world; every host the same size
``k``). On its host, a rank has *local rank* ``i`` and owns *local chunk* ``i`` of ``k`` near-equal
chunks of the tensor. The ranks with local rank ``i`` on every host form *cross group* ``i``
(``c`` ranks, one per host, in host order).

1. Local reduce-scatter (one step, ``direct.py``): each rank reduces its host's contributions to its
   local chunk.
2. Cross all-reduce: cross group ``i`` all-reduces local chunk ``i`` with any registered all-reduce
   (``cross``, the ring by default), embedded: its ranks renamed to the group's world ranks and its
   regions moved to the chunk. Every host sends each byte once, split over its ``k`` ranks, so the
   hosts' network links carry ``2 (c-1)/c m`` bytes per host instead of the flat ring's per rank.
3. Local all-gather (one step): each rank copies the finished chunks of its host peers.

The cross phase is padded to the same number of steps for every local rank, so a step index means the
same thing on every rank of a host. With one host this is the direct all-reduce; with one rank per
host, the cross algorithm alone.

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced): with the default single
host, the direct all-reduce's ``2(n-1) alpha + (n-1)/n m (2 beta + gamma)``; in general
``2(k-1) alpha + (k-1)/k m (2 beta_host + gamma)`` plus the cross algorithm's cost on ``c`` ranks and
``m / k`` bytes over the network.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from . import direct, ring
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, chunk_bounds, region, without_empty

def check_hosts(hosts, size: int) -> tuple:
    """``hosts`` as a tuple of rank tuples (``None``: one host of all ranks).

    Raises:
        ValueError: unless ``hosts`` partitions ``0..size-1`` into non-empty hosts of equal size.
    """
    if hosts is None:
        return (tuple(range(size)),)
    hosts = tuple(tuple(h) for h in hosts)
    ranks = sorted(r for h in hosts for r in h)
    if ranks != list(range(size)) or not all(hosts):
        raise ValueError(f"hosts {hosts} must split ranks 0..{size - 1} into non-empty hosts, each rank once")
    if len({len(h) for h in hosts}) != 1:
        raise ValueError(f"hierarchical all-reduce needs the same number of ranks on every host, got {hosts}")
    return hosts


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0, hosts=None,
               cross: Callable[..., Schedule] = ring.all_reduce) -> Schedule:
    """Hierarchical all-reduce of ``count`` elements in place in ``data``.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (all-reduce has none).
        hosts: each host's ranks (tuple of tuples); ``None`` for one host.
        cross: the all-reduce that runs across hosts, ``cross(rank, size, count)`` (the registry passes
            its entry for the algorithm named by the ``cross`` option).

    Returns:
        This rank's :class:`Schedule`; scratch as the cross algorithm needs.

    Raises:
        ValueError: for a rank, root or count out of range, or hosts that are not a partition into equal
            hosts.

    Example (hosts ``((0, 1), (2, 3))``, 4 elements): rank 2 reduces rank 3's ``data[0:2]`` into its
    own, rings ``data[0:2]`` with rank 0 (two steps), then sends ``data[0:2]`` to rank 3 and receives
    ``data[2:4]`` from it.
    """
    check_call(rank, size, count, root)
    hosts = check_hosts(hosts, size)
    here = next(h for h in hosts if rank in h)
    k, i = len(here), here.index(rank)
    bounds = chunk_bounds(count, k)
    peers = [here[j] for j in direct.turns(i, k)]
    chunks = [region("data", bounds, j) for j in direct.turns(i, k)]
    mine = region("data", bounds, i)
    group = [h[i] for h in hosts]
    inner = cross(group.index(rank), len(group), mine.count)
    span = max(len(cross(0, len(group), bounds[j + 1] - bounds[j]).steps) for j in range(k))
    moved = [tuple(_moved(op, group, mine.start) for op in step) for step in inner.steps]
    moved += [()] * (span - len(moved))
    steps = [direct.scatter_reduce(peers, chunks, mine), *moved, direct.gather(peers, mine, chunks)]
    return Schedule(without_empty(steps), tmp=inner.tmp)


def _moved(op, group: list[int], offset: int):
    """``op`` of a cross-group schedule, with its peer renamed to a world rank and ``data`` shifted."""
    def shift(r: Region | None) -> Region | None:
        return Region(r.buf, r.start + offset, r.stop + offset) if r is not None and r.buf == "data" else r

    if isinstance(op, Send):
        return Send(group[op.peer], shift(op.src))
    if isinstance(op, Recv):
        return Recv(group[op.peer], shift(op.dst), shift(op.reduce))
    return Copy(shift(op.src), shift(op.dst), shift(op.reduce))


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` with its default single host (the direct all-reduce)."""
    return direct.all_reduce_cost(n, m, alpha, beta, gamma)
