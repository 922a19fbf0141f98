"""The shared-memory link to another rank on this host, as this rank sees it: its socket, its process, its control
segment, the two channels between us, and the registered segments we have traded.

Its own file because this is the state kept per peer and the questions asked of it (has it posted,
is it gone, where is its segment ``gen``), apart from how frames move (:mod:`.dataplane`).
"""

from __future__ import annotations

import collections
import os
import select
import socket
import time

from ...errors import CommTimeout, PeerLost, with_peer
from .. import shmseg
from . import layout, peering
from .layout import ABORTED, CLOSED, SENT, SLEEPING, SLOTS_AT, STATE, TAKEN, UNMAPS


class ShmLink:
    """The link to another rank on this host: its socket, its process, its control segment and our two
    channels."""

    def __init__(self, rank: int, sock: socket.socket, segment: shmseg.Segment, out_at: int, in_at: int,
                 pid: int):
        self.rank = rank
        self.sock = sock
        self.segment = segment
        self.bytes = memoryview(segment.map)
        self.words = self.bytes.cast("q")
        self.out_slots = out_at + SLOTS_AT  # our channel to this peer, in our segment: its first slot,
        self.out_sent, self.out_taken = (out_at + SENT) >> 3, (out_at + TAKEN) >> 3  # and counter words
        self.in_slots = in_at + SLOTS_AT  # its channel to us, in its segment
        self.in_sent, self.in_taken = (in_at + SENT) >> 3, (in_at + TAKEN) >> 3
        self.pid = pid
        self.pidfd = _pidfd(pid)
        self.reader = None  # a cma.Reader once the probe succeeded
        self.posted = 0  # slots we have posted to it
        self.consumed = 0  # slots we have taken from it
        self.shared: set[int] = set()  # generations of our registered segments it has the descriptor of
        self.fds: dict[int, int] = {}  # descriptors it sent that we have not mapped yet, by generation
        self.maps: dict[int, shmseg.Segment] = {}  # its registered segments mapped here, by generation
        self.unmaps = 0  # its count of unmap notices that we have acted on
        self.staged: collections.deque = collections.deque()  # (slot count, staging segment) it may read
        self.hung_up = False  # its socket reached its end
        self.exited = False  # its pidfd said so

    def wake(self, always: bool = False) -> None:
        """Nudge the peer if it sleeps (it raised its flag), or ``always``; a lost nudge costs it one
        sleep period."""
        if always or self.words[SLEEPING]:
            try:
                self.sock.send(peering.WAKE, socket.MSG_DONTWAIT)
            except OSError:
                pass

    def drain(self) -> None:
        """Read what the socket holds without waiting (see :meth:`_read`)."""
        try:
            while not self.hung_up:
                self._read(socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass

    def _read(self, flags: int = 0) -> None:
        """One notice (:func:`.peering.notice`): a descriptor is kept, an unmap acted on."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 64, 4, flags)
        except (BlockingIOError, TimeoutError):
            raise
        except OSError:
            data, fds = b"", []
        what, gen = peering.notice(data, fds)
        if what == "end":
            self.hung_up = True
        elif what == "share":
            self.fds[gen] = fds.pop()
        elif what == "unmap":
            if gen in self.maps:
                self.maps.pop(gen).close()
            if gen in self.fds:
                os.close(self.fds.pop(gen))
        for fd in fds:
            os.close(fd)

    def gone(self) -> str | None:
        """Why the peer can no longer take part (aborted, closed, exited), or ``None`` while it can."""
        state = self.words[STATE]
        if state == ABORTED:
            return f"rank {self.rank} aborted: {layout.read_reason(self.bytes, self.words)}"
        if state == CLOSED:
            return f"rank {self.rank} closed its shared-memory links"
        if self.hung_up or self.exited or (self.pidfd is not None and _readable(self.pidfd)):
            return f"rank {self.rank} exited or crashed (pid {self.pid})"
        return None

    def registered(self, gen: int, deadline: float) -> shmseg.Segment:
        """The peer's registered segment ``gen``, mapped here (its descriptor arrives before the slot)."""
        segment = self.maps.get(gen)
        if segment is not None:
            return segment
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            while gen not in self.fds and not self.hung_up:
                self._read()
        except TimeoutError:
            raise with_peer(CommTimeout(f"waiting for rank {self.rank}'s segment {gen}"), self.rank) from None
        finally:
            self.sock.setblocking(False)
        if gen not in self.fds:
            raise with_peer(PeerLost(f"rank {self.rank} left before sending segment {gen}"), self.rank)
        segment = self.maps[gen] = shmseg.attach(self.fds.pop(gen), gen)
        return segment

    def share(self, segment: shmseg.Segment) -> bool:
        """Send the descriptor of our registered ``segment`` unless the peer has it; ``False`` if the
        socket cannot take it now."""
        if segment.gen in self.shared:
            return True
        try:
            socket.send_fds(self.sock, [peering.share_notice(segment.gen)], [segment.fd], socket.MSG_DONTWAIT)
        except OSError:
            return False
        self.shared.add(segment.gen)
        return True

    def unshare(self, gens: list[int], words: memoryview) -> None:
        """Tell the peer to unmap those of our freed segments it has (best effort), and count the
        notices in our ``UNMAPS`` word, which it watches."""
        for gen in self.shared.intersection(gens):
            self.shared.discard(gen)
            try:
                self.sock.send(peering.unmap_notice(gen), socket.MSG_DONTWAIT)
            except OSError:
                continue
            words[UNMAPS] += 1

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        for segment in self.maps.values():
            segment.close()
        for _, segment in self.staged:
            segment.close()
        self.fds, self.maps = {}, {}
        self.words.release()
        self.bytes.release()
        self.segment.close()
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _pidfd(pid: int) -> int | None:
    """A descriptor that polls readable once process ``pid`` has exited (Linux 5.3+), else ``None``."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
