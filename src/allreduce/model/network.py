"""The modelled machine: two classes of link (inside a host, between hosts) and the cost of local work.

Every rank has one port per class of link, with an egress and an ingress direction of bandwidth
``1 / beta`` each. A message pays ``alpha`` once, then its bytes at the rate its busiest resource
leaves it: a port carrying ``k`` messages in one direction of one step gives each ``1 / k`` of the
bandwidth, and ``duplex`` says what sending and receiving at once costs (1: a true full-duplex link,
whose directions are independent; 2: a link whose directions share one pipe, as loopback TCP does when
the CPU copies every byte). Messages between hosts also cross both hosts' NICs, which the host's
ranks share in the same way: the inter-host ``beta`` is the NIC's. Reductions cost
``gamma`` per byte and local copies ``copy`` per byte, on the rank that does them. Each schedule step
also costs a rank a fixed ``step`` on the link its messages take (waiting for the step's messages and
waking up when they arrive), whatever the step's number of messages; ``alpha`` is what each message
adds.

A host with fewer ``cores`` than busy ranks runs them in turns: everything a rank's CPU does (alpha,
the intra-host beta, which is copying by the CPU on loopback and shared memory, gamma, copy) is
stretched by ``busy ranks per host / cores``; the NIC's beta is not. A rank is busy in a step when
it sends or receives in it: in a binomial tree's later steps most ranks wait, and the few that work
have the cores to themselves. The fixed costs of messages and steps (alpha, step) are stretched by
``crowded`` times that ratio instead (never below 1), as ``allreduce tune`` measures it: a rank that
waits gives up its core to a peer, so part of its waiting is work done for others.

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
    step: float = 0.0  # seconds per schedule step, whatever its number of messages
    crowded: float = 1.0  # share of the ranks / cores stretch that alpha and step take (ranks > cores)

    def __post_init__(self):
        if min(self.alpha, self.beta, self.step) < 0:
            raise ValueError(f"alpha, beta and step must not be negative, "
                             f"got {self.alpha}, {self.beta} and {self.step}")
        if not 0.25 <= self.crowded <= 4.0:
            raise ValueError(f"crowded must be between 0.25 and 4, got {self.crowded}")
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

    def stretch(self, size: int, busy: float | None = None) -> float:
        """How much slower a rank's own work is when ``size`` ranks share the hosts' cores (at least 1),
        ``busy`` of each host's ranks working at once (default: all)."""
        per_host = size / self.hosts if busy is None else busy
        return max(1.0, per_host / self.cores) if self.cores else 1.0

    def for_ranks(self, size: int, busy: float | None = None) -> Network:
        """This network with every CPU-bound cost stretched for ``size`` ranks (``busy`` of each
        host's working at once) and ``cores`` dropped."""
        return self.stretched(self.stretch(size, busy))

    def stretched(self, slow: float, latency: float | None = None) -> Network:
        """This network with the CPU's per-byte costs ``slow`` times slower and its fixed costs
        ``latency`` times (default ``slow``; each link's ``crowded`` share of it where above 1)."""
        latency = slow if latency is None else latency
        if slow == 1.0 and latency == 1.0:
            return self
        intra, inter = (max(1.0, latency * link.crowded) if latency > 1.0 else 1.0 for link in (self.intra, self.inter))
        return Network(Link(self.intra.alpha * intra, self.intra.beta * slow, self.intra.duplex,
                            self.intra.step * intra),
                       Link(self.inter.alpha * inter, self.inter.beta, self.inter.duplex, self.inter.step * inter),
                       self.gamma * slow, self.copy * slow, self.hosts)

    def ranks_per_host(self, size: int) -> int:
        """Ranks on each host; ``ValueError`` unless ``hosts`` divides ``size``."""
        if size % self.hosts:
            raise ValueError(f"{size} ranks cannot be spread evenly over {self.hosts} hosts")
        return size // self.hosts
