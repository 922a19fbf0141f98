"""Several transports behind one: each peer is reached through the transport that serves it.

A group that spans hosts talks shared memory to the ranks of its own host and TCP to the others. A
step's sends and receives are split by transport, keeping their order, and the parts are exchanged one
transport after the other, in the same order on every rank. That cannot deadlock: a step's messages on
one transport are matched among themselves, and every rank finishes one transport's part of a step
before it starts the next, so each part only waits for peers that will reach it. Steps of the
hierarchical all-reduce use one transport each, so nothing is serialized there.
"""

from __future__ import annotations

from .base import RecvSpec, SendSpec, Transport


class RoutedTransport(Transport):
    """Each ``(transport, peers)`` of ``routes`` serves its peers; parts are exchanged in list order."""

    def __init__(self, rank: int, size: int, routes: list[tuple[Transport, list[int]]]):
        self.rank = rank
        self.size = size
        self._routes = {peer: transport for transport, peers in routes for peer in peers}
        self._transports = [transport for transport, _ in routes]

    def exchange(self, sends: list[SendSpec], recvs: list[RecvSpec], deadline: float,
                 idle=None, idle_every: float = 1.0) -> None:
        for transport in self._transports:
            mine = [s for s in sends if self._routes[s.peer] is transport]
            theirs = [r for r in recvs if self._routes[r.peer] is transport]
            if mine or theirs:
                transport.exchange(mine, theirs, deadline, idle, idle_every)

    def abort(self, reason: str) -> None:
        for transport in self._transports:
            transport.abort(reason)

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
