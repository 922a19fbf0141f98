"""The modelled machine: two classes of link (inside a host, between hosts) and the cost of local work.

Every rank has one port per class of link, with an egress and an ingress direction of bandwidth
``1 / beta`` each. A message pays ``alpha`` once, then its bytes at the rate its busiest resource
leaves it: a port carrying ``k`` messages in one direction of one step gives each ``1 / k`` of the
bandwidth, and ``duplex`` says what sending and receiving at once costs (1: a true full-duplex link,
whose directions are independent; 2: a link whose directions share one pipe, as loopback TCP does when
the CPU copies every byte). Messages between hosts also cross both hosts' NICs, which the host's ranks
share in the same way: the inter-host ``beta`` is the NIC's. Reductions cost ``gamma`` per byte and
local copies ``copy`` per byte, on the rank that does them.

A host with fewer ``cores`` than ranks runs its ranks in turns: everything a rank's CPU does (alpha,
the intra-host beta, which is copying by the CPU on loopback and shared memory, gamma, copy) is
stretched by ``ranks per host / cores``; the NIC's beta is not.

Hosts are equal, contiguous blocks of ranks: rank ``r`` is on host ``r // (size // hosts)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One class of link."""

    alpha: float  # seconds per message: latency plus the software cost of one send/receive
    beta: float  # seconds per byte in one direction (1 / bandwidth)
    duplex: float = 1.0  # slowdown of each direction while a port both sends and receives (1..2)

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"alpha and beta must not be negative, got {self.alpha} and {self.beta}")
        if not 1.0 <= self.duplex <= 2.0:
            raise ValueError(f"duplex must be between 1 (full duplex) and 2 (half duplex), got {self.duplex}")


@dataclass(frozen=True)
class Network:
    """Links, local costs and the number of hosts the ranks are spread over."""

    intra: Link  # between ranks of one host
    inter: Link  # between hosts; beta is the host NIC's, shared by the host's ranks
    gamma: float = 0.0  # seconds per byte reduced
    copy: float = 0.0  # seconds per byte copied within a rank
    hosts: int = 1  # ranks form this many equal, contiguous blocks
    cores: int = 0  # cores per host; 0: never fewer than its ranks

    def __post_init__(self):
        if self.gamma < 0 or self.copy < 0:
            raise ValueError(f"gamma and copy must not be negative, got {self.gamma} and {self.copy}")
        if self.hosts < 1 or self.cores < 0:
            raise ValueError(f"hosts must be at least 1 and cores at least 0, got {self.hosts} and {self.cores}")

    def stretch(self, size: int) -> float:
        """How much slower a rank's own work is when ``size`` ranks share the hosts' cores (at least 1)."""
        return max(1.0, size / self.hosts / self.cores) if self.cores else 1.0

    def for_ranks(self, size: int) -> "Network":
        """This network with every CPU-bound cost stretched for ``size`` ranks and ``cores`` dropped."""
        slow = self.stretch(size)
        if slow == 1.0:
            return self
        return Network(Link(self.intra.alpha * slow, self.intra.beta * slow, self.intra.duplex),
                       Link(self.inter.alpha * slow, self.inter.beta, self.inter.duplex),
                       self.gamma * slow, self.copy * slow, self.hosts)

    def ranks_per_host(self, size: int) -> int:
        """Ranks on each host; ``ValueError`` unless ``hosts`` divides ``size``."""
        if size % self.hosts:
            raise ValueError(f"{size} ranks cannot be spread evenly over {self.hosts} hosts")
        return size // self.hosts
