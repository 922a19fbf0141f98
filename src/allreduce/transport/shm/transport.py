"""The shared-memory transport itself: set-up, the exchange loop, spotting gone peers, teardown.

Its own file because this is where the parts meet: the mesh (:mod:`..mesh`, with
:class:`.peering.ShmPeering`) links the ranks, :mod:`.dataplane` moves frames, :mod:`.waiting` says
how to wait, and only this file decides when a peer's absence is an error.
"""

from __future__ import annotations

import time

from ...errors import PeerLost, with_peer
from .. import cma, mesh, shmseg
from ..base import RecvSpec, SendSpec, Transport
from . import layout
from .dataplane import DataPlane, In, Out
from .layout import ABORTED, ADDRESS, CHANNELS_AT, CLOSED, OPEN, STATE, UNMAPS
from .linepath import Lines
from .options import ShmOptions
from .link import ShmLink
from .peering import ShmPeering
from .waiting import Stretch, Waiting


class ShmTransport(Transport):
    """Shared-memory links among the ranks of one host; see :mod:`allreduce.transport.shm`."""

    kind = "shm"

    def __init__(self, rank: int, size: int, segment: shmseg.Segment, peers: dict[int, ShmLink],
                 options: ShmOptions, chunk: int):
        self.rank = rank
        self.size = size
        self.options = options
        self._segment = segment
        self._bytes = memoryview(segment.map)
        self._words = self._bytes.cast("q")
        self._peers = peers
        self._plane = DataPlane(self._bytes, self._words, peers, options, chunk)
        self._waiting = Waiting(options, self._words, peers)
        self._freed = shmseg.released_count()  # registered segments freed before now (none shared)
        self._closed = False
        self.lines: Lines | None = None  # the small-message path, where every rank of the group is on this host

    @classmethod
    def connect(cls, rank: int, size: int, store, tag: str, timeout: float, members: list[int],
                options: ShmOptions = ShmOptions()) -> ShmTransport:
        """Link ``rank`` with the other ``members`` (group ranks on this host, this one included).

        Raises:
            RendezvousError: when a member cannot be reached before ``timeout`` seconds, or lays out its
                channels differently (other ``ALLREDUCE_SHM_*`` settings).
        """
        members = sorted(members)
        deadline = time.monotonic() + timeout
        chunk, slots = options.chunk_for(len(members)), options.slots
        channel = layout.channel_size(chunk, slots)
        segment = layout.create_control(len(members), channel, layout.lines_size(options.line_capacity))
        try:
            shared = (chunk, slots, options.line_max, options.chunked_max, options.line_chunk)
            peering = ShmPeering(rank, members, tag, shared, segment.fd)
            links = mesh.form(peering, store, rank, members, deadline)
        except BaseException:
            segment.close()
            raise
        peers = {}
        for peer, link in links.items():
            peers[peer] = ShmLink(peer, link.sock, shmseg.attach(link.fd, 0),
                               CHANNELS_AT + members.index(peer) * channel,
                               CHANNELS_AT + members.index(rank) * channel, link.pid)
            link.sock.setblocking(False)
        transport = cls(rank, size, segment, peers, options, chunk)
        transport._probe_cross_memory()
        if len(members) == size and options.line_capacity:
            transport.lines = Lines(rank, segment, transport._words, peers, layout.lines_at(len(members), channel),
                                    options, transport._waiting)
        return transport

    def _probe_cross_memory(self) -> None:
        """Read each peer's header words back through ``process_vm_readv``; use it where that works."""
        if not self.options.cross_memory:
            return
        for peer in self._peers.values():
            if cma.readable(peer.pid, peer.words[ADDRESS], bytes(peer.bytes[:16])):
                peer.reader = cma.Reader(peer.pid)

    # ---- exchange --------------------------------------------------------------------------------

    def exchange(self, sends: list[SendSpec], recvs: list[RecvSpec], deadline: float,
                 idle=None, idle_every: float = 1.0) -> None:
        if self._closed:
            raise PeerLost("the shared-memory transport is closed")
        if shmseg.released_count() != self._freed:
            self._unshare()
        pending: list = []
        last: dict = {}  # the latest op per link and direction: frames to or from a peer keep their order
        for spec in sends:
            op = Out(self._peers[spec.peer], spec, last.get(spec.peer), self.options.buffered_max)
            pending.append(op)
            last[spec.peer] = op
        absorbing = 0
        for spec in recvs:
            peer = self._peers[spec.peer]
            if peer.words[UNMAPS] != peer.unmaps:  # it freed segments we map
                peer.unmaps = peer.words[UNMAPS]
                peer.drain()
            order = -1
            if spec.absorb is not None:
                order, absorbing = absorbing, absorbing + 1
            op = In(peer, spec, order, last.get(~spec.peer))
            pending.append(op)
            last[~spec.peer] = op
        plane, waiting = self._plane, self._waiting
        plane.absorbed = 0
        plane.deadline = deadline
        stretch = None
        while pending:
            progressed = plane.advance(pending)
            pending = [op for op in pending if not op.done]  # a peer check may have finished some too
            if progressed:
                if stretch is not None:
                    waiting.moved(stretch)
                stretch = None
            elif stretch is None:
                stretch = Stretch()
            elif pending:
                waiting.pause(stretch, pending, deadline, idle, idle_every, self._check_peers)

    def _unshare(self) -> None:
        """Tell peers about our registered segments freed since the last call."""
        freed = shmseg.released(self._freed)
        self._freed += len(freed)
        for peer in self._peers.values():
            peer.unshare(freed, self._words)

    def _check_peers(self, pending: list) -> None:
        """Raise ``PeerLost`` for a peer that is gone while an op still needs it (after taking its slots)."""
        lost = {}
        for op in pending:
            if op.peer.rank not in lost:
                reason = op.peer.gone()
                if reason is not None:
                    lost[op.peer.rank] = reason
        if not lost:
            return
        for peer in self._peers.values():
            if peer.rank in lost:
                self._waiting.forget(peer)
        self._plane.advance(pending)  # what it posted before it went is still ours to take
        for op in pending:
            if op.peer.rank in lost and self._plane.ready(op):  # (ops still waiting their turn may find it later)
                raise with_peer(PeerLost(lost[op.peer.rank]), op.peer.rank)

    # ---- teardown --------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        if self._closed:
            return
        layout.write_reason(self._bytes, self._words, reason)
        self._words[STATE] = ABORTED
        for peer in self._peers.values():
            peer.wake(always=True)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.lines is not None:
            self.lines.close()
        if self._words[STATE] == OPEN:
            self._words[STATE] = CLOSED
        for peer in self._peers.values():
            peer.close()
        self._plane.close()
        self._peers = {}
        self._words.release()
        self._bytes.release()
        self._segment.close()
