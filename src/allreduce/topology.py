"""Which ranks share a host, found once when a group forms.

A *host* is a set of ranks that can share memory and reach each other's abstract Unix sockets: one
kernel boot and one network namespace. Its identity is ``hostname/boot id/network namespace``, read
from ``/proc``; a forced identity (``ALLREDUCE_HOST_ID``) replaces it, so tests can pretend that one machine is several
hosts (and a real cluster can group ranks by hand). Every rank publishes its identity in the group's
store and reads everyone else's, so all ranks build the same :class:`Topology`.

Hosts are numbered in the order of their lowest rank. The record follows Horovod's vocabulary:
``local_rank``/``local_size`` place a rank among the ranks of its host, ``cross_rank``/``cross_size``
among the ranks that have the same local rank on every host (one per host when hosts are uniform).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Topology:
    """Where one rank of a group sits among the group's hosts."""

    rank: int  # rank in the group
    size: int  # ranks in the group
    local_rank: int  # index of this rank among the ranks of its host
    local_size: int  # ranks on this rank's host
    cross_rank: int  # index of this rank's host among the hosts that have a rank ``local_rank``
    cross_size: int  # hosts that have a rank ``local_rank``
    hosts: tuple[tuple[int, ...], ...]  # each host's group ranks, ascending; hosts by lowest rank

    @property
    def host(self) -> int:
        """Index of this rank's host in :attr:`hosts`."""
        return next(h for h, ranks in enumerate(self.hosts) if self.rank in ranks)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """The group ranks on this rank's host (this one included)."""
        return self.hosts[self.host]

    @property
    def uniform(self) -> bool:
        """Whether every host has the same number of ranks."""
        return len({len(ranks) for ranks in self.hosts}) == 1


def host_id(forced: str = "") -> str:
    """This process's host identity: ``forced`` if given, else hostname, boot id and network namespace."""
    if forced:
        return forced
    return "/".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id") or _read("/etc/machine-id"),
                     _link("/proc/self/ns/net")))


def from_host_ids(rank: int, ids: list[str]) -> Topology:
    """The topology of ``rank`` in a group whose rank ``r`` runs on host ``ids[r]``.

    Example: ``from_host_ids(3, ["a", "a", "b", "b"])`` is local rank 1 of 2 on host 1, cross rank 1 of 2.
    """
    if not 0 <= rank < len(ids):
        raise ValueError(f"rank {rank} is outside a group of {len(ids)}")
    by_host: dict[str, list[int]] = {}
    for r, hid in enumerate(ids):
        by_host.setdefault(hid, []).append(r)
    hosts = tuple(tuple(ranks) for ranks in by_host.values())
    mine = by_host[ids[rank]]
    local_rank = mine.index(rank)
    cross = [ranks[local_rank] for ranks in hosts if len(ranks) > local_rank]
    return Topology(rank, len(ids), local_rank, len(mine), cross.index(rank), len(cross), hosts)


def discover(store: Any, rank: int, size: int, timeout: float, forced_host: str = "") -> Topology:
    """Publish this rank's host identity (``forced_host`` if given) in ``store`` and build the topology
    from everyone's.

    Raises:
        RendezvousError: (from the store) when a rank does not publish within ``timeout`` seconds.
    """
    store.set(f"host/{rank}", host_id(forced_host).encode())
    ids = [store.get(f"host/{r}", timeout=timeout).decode() for r in range(size)]
    return from_host_ids(rank, ids)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
