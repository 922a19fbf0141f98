"""Shared-memory transport for the ranks of one host: rings of slots in memfd segments, no sockets on
the data path.

Set-up: every rank creates a *control segment* (``shmseg.py``) and listens on an abstract Unix socket
(no file system entry) whose random name it publishes in the store; ranks connect down and accept up,
as the TCP transport does, check that the other end runs as the same user (``SO_PEERCRED``), prove
they belong to the group with a hello, and pass each other their control segment's descriptor over
the socket (``SCM_RIGHTS``). After that the socket carries only wake-ups,
the descriptors of registered buffers and notices to unmap freed ones; it also tells at once, by
closing, that a peer has died.

Channels: the control segment of rank ``p`` holds one *channel* per peer ``q``: two counters, each on
its own cache line (``sent``, written only by ``p``, and ``taken``, written only by ``q``) and a ring
of ``slots``. A slot holds the 40-byte frame header (the same as on TCP, compared byte for byte with
the expected one before anything is read, so mismatched calls raise ``Mismatch``), a small
descriptor and up to ``chunk`` bytes of payload. A message travels in one of three ways:

- *inline*: copied into consecutive slots, ``chunk`` bytes at a time, as slots come free; the
  receiver reduces straight out of the slot (``RecvSpec.absorb``) or copies into ``dest``. The send
  is done when its last chunk is posted. Messages up to ``inline_max``, and larger ones where neither
  of the next two ways is open.
- *registered*: the payload already lies in a registered segment (``allreduce.empty``): the slot
  names the segment and offset, the receiver maps it (the descriptor came over the socket the first
  time) and reduces or copies straight out of it. Zero copies on the sending side.
- *cross-memory*: the slot names the payload's address; the receiver reads it out of the sender's
  private memory with ``process_vm_readv`` (``cma.py``), piece by piece: straight into ``dest``, or,
  for a receive that reduces, into a small bounce buffer whose pieces are absorbed while still in
  cache. One copy instead of two.

The last two are rendezvous: the send is done when the receiver has taken the slot, so the sender's
memory is not reused while it is read. Point-to-point sends (``send``/``isend``), whose receiver may
run later, are *buffered* instead: copied into a staging segment that is read like a registered one,
and done at once, as on TCP. Frames on one link keep their order, and receives that absorb complete
in list order, so reductions combine in the schedule's order.

Counters are aligned 8-byte words written with single stores; the protocol relies on the stores of
one process becoming visible to others in program order (x86-64 total store order), which is why
:func:`available` is limited to x86-64.

Waiting is cheap and fair on a busy machine: spin briefly, then ``sched_yield``, then sleep in
``poll`` on the peers' sockets and process descriptors after raising a *sleeping* flag that peers
check when they post, so a posted message wakes the sleeper at once. Spinning only pays while every
rank has a core: there is none when ranks outnumber cores, and neither spinning nor yielding while
other work keeps the cores busy (the load average is above the core count), because a waiting rank
would then only delay the peer it waits for. Every wait keeps the deadline; a peer that exits (its
pidfd or socket says so), closes or aborts (a state word and reason in its segment) raises
``PeerLost``, after anything it had already posted has been taken.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import platform
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass

from .. import wire
from ..errors import AllreduceError, CommTimeout, PeerLost, ProtocolError, RendezvousError
from . import cma, shmseg
from .base import RecvSpec, SendSpec, Transport


@dataclass(frozen=True)
class ShmOptions:
    """Sizes and waiting policy of the shared-memory transport."""

    slots: int = 4  # slots in each channel's ring
    chunk: int = 128 << 10  # payload bytes per slot (a multiple of 64), at most
    ring_budget: int = 16 << 20  # slot bytes per rank at most: many peers get smaller chunks
    inline_max: int = 64 << 10  # larger payloads go registered or cross-memory where possible
    buffered_max: int = 64 << 20  # point-to-point sends up to this size never wait for their receiver
    cma_piece: int = 256 << 10  # bytes read per process_vm_readv call, handed to progress
    spin_s: float = 50e-6  # busy-wait this long (not when ranks outnumber cores or the cores are busy)
    yield_s: float = 150e-6  # then sched_yield until this long (not when the cores are busy), then sleep
    sleep_ms: int = 1  # longest sleep when no peer wakes us (a wake-up lost to a race costs this)
    check_s: float = 0.02  # how often a waiting rank looks for dead, closed or aborted peers
    cross_memory: bool = True  # read large private payloads with process_vm_readv where allowed

    def __post_init__(self):
        if self.slots < 1 or self.chunk < 64 or self.chunk % 64:
            raise ValueError(f"need at least one slot and a chunk that is a positive multiple of 64, got {self}")

    def chunk_for(self, members: int) -> int:
        """Payload bytes per slot with ``members`` ranks on the host: ``chunk``, smaller where the rings
        of all peers would pass ``ring_budget`` (never below 4 KiB)."""
        fair = self.ring_budget // (self.slots * max(1, members - 1)) // 64 * 64
        return max(min(self.chunk, 4096), min(self.chunk, fair))

    @classmethod
    def from_env(cls) -> "ShmOptions":
        """The defaults, each replaced by ``ALLREDUCE_SHM_<FIELD>`` where set (``ALLREDUCE_SHM_CROSS_MEMORY=0``
        turns cross-memory reads off).

        Raises:
            ValueError: for a value that does not parse as its field's type.
        """
        values = {}
        for field in dataclasses.fields(cls):
            text = os.environ.get(f"ALLREDUCE_SHM_{field.name.upper()}")
            if text is not None:
                kind = type(field.default)
                try:
                    values[field.name] = text not in ("0", "false", "no") if kind is bool else kind(text)
                except ValueError:
                    raise ValueError(f"ALLREDUCE_SHM_{field.name.upper()}={text!r} is not a {kind.__name__}") from None
        return cls(**values)


# ---- segment layout ----------------------------------------------------------------------------
# Control segment header, in 8-byte words.
_MAGIC, _PID, _ADDRESS, _STATE, _SLEEPING, _REASON_LEN, _UNMAPS = range(7)
_MAGIC_VALUE = int.from_bytes(b"ARSHMSEG", "little")
_OPEN, _CLOSED, _ABORTED = 0, 1, 2
_REASON_AT = 64  # bytes; the abort reason follows the header words
_CHANNELS_AT = _REASON_AT + wire.MAX_ABORT_REASON + 64
# Channel: "sent" and "taken" on their own cache lines, then the slots.
_SENT, _TAKEN, _SLOTS_AT = 0, 64, 128
# Slot: the frame header, then descriptor words (indices from the slot's first word), then the payload.
_MODE, _NBYTES, _OFFSET, _WHERE = range(wire.HEADER_SIZE // 8, wire.HEADER_SIZE // 8 + 4)
_PAYLOAD_AT = 128
_INLINE, _REGISTERED, _CROSS = 1, 2, 3
_POINT_TO_POINT = wire.COLLECTIVES.index("send")  # frames of send/recv, whose receiver may come much later

_HELLO = struct.Struct("<4sii16sqq")  # magic, sender rank, receiver rank, group tag digest, chunk, slots
_HELLO_MAGIC = b"ARSM"
_FD_MSG = struct.Struct("<cq")  # b"F": a segment's generation, its descriptor alongside; b"D": unmap it
_WAKE = b"W"
_UCRED = struct.Struct("3i")


def available() -> bool:
    """Whether this machine can run the transport: Linux memfd, Unix seqpacket sockets, x86-64 ordering."""
    return (shmseg.available() and hasattr(socket, "AF_UNIX") and hasattr(socket, "SOCK_SEQPACKET")
            and hasattr(socket, "send_fds") and platform.machine().lower() in ("x86_64", "amd64"))


def _with_peer(exc: AllreduceError, peer: int) -> AllreduceError:
    exc.peer = peer
    return exc


class _Peer:
    """Another rank on this host: its socket, its process, its control segment and our two channels."""

    def __init__(self, rank: int, sock: socket.socket, segment: shmseg.Segment, out_at: int, in_at: int,
                 pid: int):
        self.rank = rank
        self.sock = sock
        self.segment = segment
        self.bytes = memoryview(segment.map)
        self.words = self.bytes.cast("q")
        self.out_slots = out_at + _SLOTS_AT  # our channel to this peer, in our segment: its first slot,
        self.out_sent, self.out_taken = (out_at + _SENT) >> 3, (out_at + _TAKEN) >> 3  # and counter words
        self.in_slots = in_at + _SLOTS_AT  # its channel to us, in its segment
        self.in_sent, self.in_taken = (in_at + _SENT) >> 3, (in_at + _TAKEN) >> 3
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

    def wake(self) -> None:
        """Nudge the peer if it sleeps (it raised its flag); a lost nudge costs it one sleep period."""
        if self.words[_SLEEPING]:
            try:
                self.sock.send(_WAKE, socket.MSG_DONTWAIT)
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
        """One socket message: a wake-up (dropped), a descriptor (kept), an unmap, or the end (hung up)."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 64, 4, flags)
        except (BlockingIOError, TimeoutError):
            raise
        except OSError:
            data, fds = b"", []
        if not data:
            self.hung_up = True
        elif len(data) == _FD_MSG.size and data[:1] == b"F" and len(fds) == 1:
            self.fds[_FD_MSG.unpack(data)[1]] = fds.pop()
        elif len(data) == _FD_MSG.size and data[:1] == b"D":
            gen = _FD_MSG.unpack(data)[1]
            if gen in self.maps:
                self.maps.pop(gen).close()
            if gen in self.fds:
                os.close(self.fds.pop(gen))
        for fd in fds:
            os.close(fd)

    def gone(self) -> str | None:
        """Why the peer can no longer take part (aborted, closed, exited), or ``None`` while it can."""
        state = self.words[_STATE]
        if state == _ABORTED:
            length = min(self.words[_REASON_LEN], wire.MAX_ABORT_REASON)
            reason = bytes(self.bytes[_REASON_AT:_REASON_AT + length]).decode("utf-8", "replace")
            return f"rank {self.rank} aborted: {reason or 'no reason given'}"
        if state == _CLOSED:
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
            raise _with_peer(CommTimeout(f"waiting for rank {self.rank}'s segment {gen}"), self.rank) from None
        finally:
            self.sock.setblocking(False)
        if gen not in self.fds:
            raise _with_peer(PeerLost(f"rank {self.rank} left before sending segment {gen}"), self.rank)
        segment = self.maps[gen] = shmseg.attach(self.fds.pop(gen), gen)
        return segment

    def share(self, segment: shmseg.Segment) -> bool:
        """Send the descriptor of our registered ``segment`` unless the peer has it; ``False`` if the
        socket cannot take it now."""
        if segment.gen in self.shared:
            return True
        try:
            socket.send_fds(self.sock, [_FD_MSG.pack(b"F", segment.gen)], [segment.fd], socket.MSG_DONTWAIT)
        except OSError:
            return False
        self.shared.add(segment.gen)
        return True

    def unshare(self, gens: list[int], words: memoryview) -> None:
        """Tell the peer to unmap those of our freed segments it has (best effort), and count the
        notices in our ``_UNMAPS`` word, which it watches."""
        for gen in self.shared.intersection(gens):
            self.shared.discard(gen)
            try:
                self.sock.send(_FD_MSG.pack(b"D", gen), socket.MSG_DONTWAIT)
            except OSError:
                continue
            words[_UNMAPS] += 1

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        for segment in self.maps.values():
            segment.close()
        self.fds, self.maps = {}, {}
        self.words.release()
        self.bytes.release()
        self.segment.close()
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class _Out:
    """A send in progress: bytes posted so far, or the slot a rendezvous send waits to see taken."""

    __slots__ = ("peer", "header", "payload", "nbytes", "posted", "await_slot", "done", "after", "buffered")

    def __init__(self, peer: _Peer, spec: SendSpec, after: "_Out | None", buffered_max: int):
        self.peer = peer
        self.header = wire.encode(spec.header)
        self.payload = spec.payload
        self.nbytes = spec.payload.nbytes
        self.buffered = spec.header.collective == _POINT_TO_POINT and self.nbytes <= buffered_max
        self.posted = -1  # payload bytes posted; -1 before the first slot
        self.await_slot = 0  # rendezvous: done once the peer has taken this many slots
        self.done = False
        self.after = after  # the previous send to the same peer, which goes first


class _In:
    """A receive in progress: bytes landed so far."""

    __slots__ = ("peer", "header", "spec", "nbytes", "got", "started", "order", "done", "after")

    def __init__(self, peer: _Peer, spec: RecvSpec, order: int, after: "_In | None"):
        self.peer = peer
        self.header = wire.encode(spec.header)
        self.spec = spec
        self.nbytes = spec.dest.nbytes
        self.got = 0
        self.started = False
        self.order = order  # position among the receives that absorb (they complete in list order)
        self.done = False
        self.after = after  # the previous receive from the same peer, which goes first


class ShmTransport(Transport):
    """Shared-memory links among the ranks of one host; see the module docstring."""

    kind = "shm"

    def __init__(self, rank: int, size: int, segment: shmseg.Segment, peers: dict[int, _Peer],
                 options: ShmOptions, chunk: int):
        self.rank = rank
        self.size = size
        self.options = options
        self._segment = segment
        self._bytes = memoryview(segment.map)
        self._words = self._bytes.cast("q")
        self._peers = peers
        self._chunk = chunk
        self._slot = chunk + _PAYLOAD_AT
        self._cores = len(os.sched_getaffinity(0))
        self._crowded = len(peers) + 1 > self._cores  # our own ranks outnumber the cores
        self._busy = False  # other work keeps the cores busy (load average above the core count)
        self._busy_checked = -1.0
        self._poller = select.poll()
        self._polled: dict[int, _Peer] = {}  # descriptor -> the peer whose socket or pidfd it is
        for peer in peers.values():
            for fd in (peer.sock.fileno(), peer.pidfd):
                if fd is not None:
                    self._poller.register(fd, select.POLLIN)
                    self._polled[fd] = peer
        self._freed = shmseg.released_count()  # registered segments freed before now (none shared)
        self._bounce: memoryview | None = None  # where cross-memory pieces land for a receive that absorbs
        self._spare: list[shmseg.Segment] = []  # staging segments no peer is reading
        self._closed = False

    # ---- set-up ----------------------------------------------------------------------------------

    @classmethod
    def connect(cls, rank: int, size: int, store, tag: str, timeout: float, members: list[int],
                options: ShmOptions = ShmOptions()) -> "ShmTransport":
        """Link ``rank`` with the other ``members`` (group ranks on this host, this one included).

        Raises:
            RendezvousError: when a member cannot be reached before ``timeout`` seconds.
        """
        members = sorted(members)
        deadline = time.monotonic() + timeout
        digest = hashlib.blake2b(tag.encode(), digest_size=16).digest()
        layout = (options.chunk_for(len(members)), options.slots)
        channel = _SLOTS_AT + layout[1] * (layout[0] + _PAYLOAD_AT)
        segment = shmseg.create(_CHANNELS_AT + len(members) * channel, "control")
        words = memoryview(segment.map).cast("q")
        words[_MAGIC], words[_PID], words[_ADDRESS] = _MAGIC_VALUE, os.getpid(), segment.address
        words.release()
        links: dict[int, tuple[socket.socket, int, int]] = {}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
                name = f"\0allreduce-{secrets.token_hex(12)}"
                listener.bind(name)
                listener.listen(max(len(members), 16))
                store.set(f"shm/{rank}", name[1:].encode())
                for peer in members:
                    if peer < rank:
                        links[peer] = _dial(store, rank, peer, digest, layout, segment.fd, deadline)
                while len(links) < len(members) - 1:
                    peer, link = _answer(listener, rank, members, digest, layout, segment.fd, deadline)
                    if peer is not None and peer not in links:
                        links[peer] = link
        except BaseException:
            for sock, fd, _ in links.values():
                sock.close()
                os.close(fd)
            segment.close()
            raise
        peers = {}
        for peer, (sock, fd, pid) in links.items():
            theirs = shmseg.attach(fd, 0)
            peers[peer] = _Peer(peer, sock, theirs, _CHANNELS_AT + members.index(peer) * channel,
                                _CHANNELS_AT + members.index(rank) * channel, pid)
            sock.setblocking(False)
        transport = cls(rank, size, segment, peers, options, layout[0])
        transport._probe_cross_memory()
        return transport

    def _probe_cross_memory(self) -> None:
        """Read each peer's header words back through ``process_vm_readv``; use it where that works."""
        if not self.options.cross_memory:
            return
        for peer in self._peers.values():
            if cma.readable(peer.pid, peer.words[_ADDRESS], bytes(peer.bytes[:16])):
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
            op = _Out(self._peers[spec.peer], spec, last.get(spec.peer), self.options.buffered_max)
            pending.append(op)
            last[spec.peer] = op
        absorbing = 0
        for spec in recvs:
            peer = self._peers[spec.peer]
            if peer.words[_UNMAPS] != peer.unmaps:  # it freed segments we map
                peer.unmaps = peer.words[_UNMAPS]
                peer.drain()
            order = -1
            if spec.absorb is not None:
                order, absorbing = absorbing, absorbing + 1
            op = _In(peer, spec, order, last.get(~spec.peer))
            pending.append(op)
            last[~spec.peer] = op
        self._absorbed = 0
        self._deadline = deadline
        wait = None
        while pending:
            progressed = self._advance(pending)
            pending = [op for op in pending if not op.done]  # a peer check may have finished some too
            if progressed:
                if wait is not None and wait.armed:
                    self._words[_SLEEPING] = 0
                wait = None
            elif wait is None:
                wait = _Wait(time.monotonic())
            elif pending:
                self._pause(pending, wait, deadline, idle, idle_every)

    def _unshare(self) -> None:
        """Tell peers about our registered segments freed since the last call."""
        freed = shmseg.released(self._freed)
        self._freed += len(freed)
        for peer in self._peers.values():
            peer.unshare(freed, self._words)

    def _advance(self, pending: list) -> bool:
        progressed = False
        for op in pending:
            after = op.after
            if op.done or (after is not None and not after.done):
                continue
            if type(op) is _Out:
                progressed = self._push(op) or progressed
            elif op.order < 0 or op.order == self._absorbed:
                progressed = self._pull(op) or progressed
        return progressed

    def _ready(self, op) -> bool:
        """Whether ``op`` may move now: not done, not behind an earlier frame on its link, and (for an
        absorbing receive) not behind an earlier absorbing receive."""
        if op.done or (op.after is not None and not op.after.done):
            return False
        return type(op) is _Out or op.order < 0 or op.order == self._absorbed

    def _push(self, out: _Out) -> bool:
        """Post what fits of ``out``; for a rendezvous send, see whether the peer has taken it."""
        peer, words, options = out.peer, self._words, self.options
        taken_at = peer.out_taken
        if out.await_slot:
            out.done = words[taken_at] >= out.await_slot
            return out.done
        progressed = False
        while peer.posted - words[taken_at] < options.slots:
            slot = peer.out_slots + (peer.posted % options.slots) * self._slot
            at = slot >> 3
            if out.posted < 0:
                self._bytes[slot:slot + wire.HEADER_SIZE] = out.header
                out.posted = 0
                if out.nbytes > options.inline_max:
                    route = self._buffer(out) if out.buffered else self._route(out)
                    if route is not None:
                        words[at + _MODE], words[at + _NBYTES], words[at + _OFFSET], words[at + _WHERE] = (
                            route[0], out.nbytes, route[2], route[1])
                        self._post(peer)
                        if out.buffered:
                            peer.staged.append((peer.posted, route[3]))
                            out.done = True
                        else:
                            out.await_slot = peer.posted
                        return True
            n = min(self._chunk, out.nbytes - out.posted)
            words[at + _MODE], words[at + _NBYTES], words[at + _OFFSET] = _INLINE, n, out.posted
            if n:
                self._bytes[slot + _PAYLOAD_AT:slot + _PAYLOAD_AT + n] = out.payload[out.posted:out.posted + n]
            out.posted += n
            self._post(peer)
            progressed = True
            if out.posted >= out.nbytes:
                out.done = True
                break
        return progressed

    def _post(self, peer: _Peer) -> None:
        peer.posted += 1
        self._words[peer.out_sent] = peer.posted
        peer.wake()

    def _buffer(self, out: _Out):
        """Copy a point-to-point payload into a staging segment the peer can map: its send is done at
        once, as a TCP send that fits the socket buffers is, so ``isend`` + ``irecv`` on both sides
        cannot deadlock. ``(mode, where, offset, segment)``, or ``None`` to send it inline."""
        peer = out.peer
        taken = self._words[peer.out_taken]
        while peer.staged and peer.staged[0][0] <= taken:  # the peer is done with these
            self._spare.append(peer.staged.popleft()[1])
        fits = [segment for segment in self._spare if segment.size >= out.nbytes]
        if fits:
            segment = min(fits, key=lambda seg: seg.size)
            self._spare.remove(segment)
        else:
            segment = shmseg.create(max(1 << 20, 1 << (out.nbytes - 1).bit_length()), "staging")
            while len(self._spare) > 3:  # keep a few for reuse
                self._drop(self._spare.pop(0))
        if not peer.share(segment):
            self._spare.append(segment)
            return None
        with memoryview(segment.map) as view:
            view[:out.nbytes] = out.payload
        return _REGISTERED, segment.gen, 0, segment

    def _drop(self, segment: shmseg.Segment) -> None:
        """Close a staging segment and have the peers that mapped it unmap it."""
        for peer in self._peers.values():
            peer.unshare([segment.gen], self._words)
        segment.close()

    def _route(self, out: _Out):
        """``(mode, where, offset)`` for a rendezvous send of ``out``, or ``None`` to send it inline."""
        address = shmseg.address_of(out.payload)
        found = shmseg.find(address, out.nbytes)
        peer = out.peer
        if found is not None and peer.share(found[0]):
            segment, offset = found
            return _REGISTERED, segment.gen, offset
        if peer.reader is not None:
            return _CROSS, address, 0
        return None

    def _pull(self, inn: _In) -> bool:
        """Take every slot the peer has posted for ``inn``."""
        peer, options = inn.peer, self.options
        theirs = peer.words
        sent_at = peer.in_sent
        progressed = False
        while peer.consumed < theirs[sent_at]:
            slot = peer.in_slots + (peer.consumed % options.slots) * self._slot
            at = slot >> 3
            if not inn.started:
                if peer.bytes[slot:slot + wire.HEADER_SIZE] != inn.header:
                    raise self._mismatch(peer, slot, inn)
                inn.started = True
            mode, n, offset = theirs[at + _MODE], theirs[at + _NBYTES], theirs[at + _OFFSET]
            if mode == _INLINE and 0 <= offset and offset + n <= inn.nbytes:
                self._land(inn, peer.bytes[slot + _PAYLOAD_AT:slot + _PAYLOAD_AT + n], offset)
                inn.got = offset + n
            elif mode == _REGISTERED and n == inn.nbytes:
                segment = peer.registered(theirs[at + _WHERE], self._deadline)
                if offset < 0 or offset + n > segment.size:
                    raise _with_peer(ProtocolError(f"rank {peer.rank} named bytes outside its segment"), peer.rank)
                with memoryview(segment.map) as whole:
                    self._land(inn, whole[offset:offset + n], 0)
                inn.got = n
            elif mode == _CROSS and n == inn.nbytes and peer.reader is not None:
                self._read_across(inn, theirs[at + _WHERE])
                inn.got = n
            else:
                raise _with_peer(ProtocolError(f"rank {peer.rank} posted a malformed slot (mode {mode}, "
                                               f"{n} bytes at {offset} of {inn.nbytes})"), peer.rank)
            peer.consumed += 1
            theirs[peer.in_taken] = peer.consumed
            peer.wake()
            progressed = True
            if inn.got >= inn.nbytes:
                inn.done = True
                if inn.order >= 0:
                    self._absorbed += 1
                break
        return progressed

    @staticmethod
    def _land(inn: _In, view: memoryview, offset: int) -> None:
        """Hand bytes ``[offset, offset + len(view))`` of the payload to the receive."""
        spec = inn.spec
        if spec.absorb is not None:
            spec.absorb(view, offset)
            return
        spec.dest[offset:offset + view.nbytes] = view
        if spec.progress is not None:
            spec.progress(offset + view.nbytes)

    def _read_across(self, inn: _In, address: int) -> None:
        """Read the payload out of the peer's memory piece by piece: a receive that absorbs gets each
        piece from a small bounce buffer that stays in cache; any other lands in ``dest``."""
        spec, peer, piece = inn.spec, inn.peer, self.options.cma_piece
        absorb = spec.absorb
        if absorb is not None:
            if self._bounce is None:
                self._bounce = memoryview(bytearray(piece))
            dest, step = shmseg.address_of(self._bounce), 0
        else:
            dest, step = shmseg.address_of(spec.dest), 1
        for at in range(0, inn.nbytes, piece):
            n = min(piece, inn.nbytes - at)
            try:
                peer.reader.read(dest + at * step, address + at, n)
            except ProcessLookupError as exc:
                raise _with_peer(PeerLost(f"rank {peer.rank} exited or crashed (pid {peer.pid})"), peer.rank) from exc
            except OSError as exc:
                raise _with_peer(ProtocolError(f"cannot read rank {peer.rank}'s memory: {exc.strerror}"),
                                 peer.rank) from exc
            if absorb is not None:
                absorb(self._bounce[:n], at)
            elif spec.progress is not None:
                spec.progress(at + n)

    def _mismatch(self, peer: _Peer, slot: int, inn: _In) -> AllreduceError:
        try:
            wire.check(wire.decode(bytes(inn.header)), wire.decode(bytes(peer.bytes[slot:slot + wire.HEADER_SIZE])))
            exc: AllreduceError = ProtocolError("frame header changed while it was read")
        except AllreduceError as error:
            exc = error
        return _with_peer(type(exc)(f"rank {peer.rank}: {exc}"), peer.rank)

    # ---- waiting ---------------------------------------------------------------------------------

    def _pause(self, pending: list, wait: "_Wait", deadline: float, idle, idle_every: float) -> None:
        """Nothing moved: spin, yield or sleep, and check the deadline, the idle hook and the peers."""
        now = time.monotonic()
        if now >= deadline:
            raise self._timeout(pending)
        if idle is not None and now - wait.quiet >= idle_every:
            idle()
            wait.quiet = now
        elapsed = now - wait.start
        if now - self._busy_checked >= 1.0:
            self._busy_checked = now
            self._busy = os.getloadavg()[0] > self._cores
        if elapsed < self.options.spin_s and not (self._crowded or self._busy):
            return
        if now - wait.checked >= self.options.check_s:
            wait.checked = now
            self._check_peers(pending)
        if elapsed < self.options.yield_s and not self._busy:
            os.sched_yield()
            return
        if not wait.armed:  # raise the flag, then look once more before sleeping: no lost wake-up
            self._words[_SLEEPING] = 1
            wait.armed = True
            return
        ms = max(0, min(self.options.sleep_ms, int((deadline - now) * 1000) + 1, int(idle_every * 1000) + 1))
        events = self._poller.poll(ms)
        self._words[_SLEEPING] = 0
        wait.armed = False
        for fd, _ in events:
            peer = self._polled.get(fd)
            if peer is None:  # forgotten by a peer check a moment ago
                continue
            if fd == peer.pidfd:
                peer.exited = True
            else:
                peer.drain()
            if peer.exited or peer.hung_up:
                self._check_peers(pending)

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
                self._forget(peer)
        self._advance(pending)  # what it posted before it went is still ours to take
        for op in pending:
            if op.peer.rank in lost and self._ready(op):  # (ops still waiting their turn may find it later)
                raise _with_peer(PeerLost(lost[op.peer.rank]), op.peer.rank)

    def _forget(self, peer: _Peer) -> None:
        """Stop polling a gone peer's descriptors (they would stay readable forever)."""
        for fd in (peer.sock.fileno(), peer.pidfd):
            if self._polled.pop(fd, None) is not None:
                self._poller.unregister(fd)

    def _timeout(self, pending: list) -> CommTimeout:
        waiting = [op for op in pending if not op.done]
        ins = [op for op in waiting if type(op) is _In]
        op = (ins or waiting)[0]
        what = "waiting for" if ins else "waiting to send to"
        return _with_peer(CommTimeout(f"{what} rank {op.peer.rank}"), op.peer.rank)

    # ---- teardown --------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        if self._closed:
            return
        data = reason.encode("utf-8", "replace")[:wire.MAX_ABORT_REASON]
        self._bytes[_REASON_AT:_REASON_AT + len(data)] = data
        self._words[_REASON_LEN] = len(data)
        self._words[_STATE] = _ABORTED
        for peer in self._peers.values():
            try:
                peer.sock.send(_WAKE, socket.MSG_DONTWAIT)
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._words[_STATE] == _OPEN:
            self._words[_STATE] = _CLOSED
        for peer in self._peers.values():
            peer.close()
            for _, segment in peer.staged:
                segment.close()
        for segment in self._spare:
            segment.close()
        self._peers, self._spare = {}, []
        self._words.release()
        self._bytes.release()
        self._segment.close()


@dataclass
class _Wait:
    """One stretch of waiting without progress."""

    start: float
    quiet: float = 0.0
    checked: float = 0.0
    armed: bool = False

    def __post_init__(self):
        self.quiet = self.checked = self.start


# ---- set-up helpers ----------------------------------------------------------------------------

def _dial(store, rank: int, peer: int, digest: bytes, layout: tuple[int, int], fd: int, deadline: float):
    """Connect to lower rank ``peer``, trade hellos and control segments; ``(socket, its fd, its pid)``."""
    name = store.get(f"shm/{peer}", timeout=max(0.0, deadline - time.monotonic())).decode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.connect("\0" + name)
        if not _same_user(sock):
            raise ValueError(f"a process of another user listens at rank {peer}'s address")
        socket.send_fds(sock, [_HELLO.pack(_HELLO_MAGIC, rank, peer, digest, *layout)], [fd])
        sender, theirs, their_layout = _hello(sock, rank, digest)
        if sender != peer:
            os.close(theirs)
            raise ValueError(f"rank {sender} answered instead")
    except (OSError, ValueError, struct.error) as exc:
        sock.close()
        raise RendezvousError(f"rank {rank} could not link with rank {peer} over shared memory: {exc}") from exc
    return _agreed(sock, theirs, rank, peer, layout, their_layout)


def _answer(listener: socket.socket, rank: int, members: list[int], digest: bytes, layout: tuple[int, int],
            fd: int, deadline: float):
    """Accept one higher rank and trade control segments; ``(None, None)`` for a stranger (dropped)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RendezvousError(f"rank {rank} timed out waiting for ranks {members} to link over shared memory")
    listener.settimeout(left)
    try:
        sock, _ = listener.accept()
    except TimeoutError:
        raise RendezvousError(f"rank {rank} timed out waiting for ranks {members} to link over shared memory") from None
    try:
        if not _same_user(sock):
            raise ValueError("another user")
        sock.settimeout(min(5.0, max(0.1, deadline - time.monotonic())))
        sender, theirs, their_layout = _hello(sock, rank, digest)
        if sender not in members or sender <= rank:
            os.close(theirs)
            raise ValueError("not a higher member of this group")
        socket.send_fds(sock, [_HELLO.pack(_HELLO_MAGIC, rank, sender, digest, *layout)], [fd])
    except (OSError, ValueError, struct.error):
        sock.close()
        return None, None
    return sender, _agreed(sock, theirs, rank, sender, layout, their_layout)


def _hello(sock: socket.socket, rank: int, digest: bytes) -> tuple[int, int, tuple[int, int]]:
    """Read a hello addressed to ``rank``: ``(sender, its control segment fd, its (chunk, slots))``;
    ``ValueError`` unless it is one."""
    data, fds, _, _ = socket.recv_fds(sock, _HELLO.size, 2)
    if len(data) != _HELLO.size or len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise ValueError("no hello")
    magic, sender, receiver, their_digest, chunk, slots = _HELLO.unpack(data)
    if magic != _HELLO_MAGIC or receiver != rank or their_digest != digest:
        os.close(fds[0])
        raise ValueError("a hello for another group")
    return sender, fds[0], (chunk, slots)


def _agreed(sock: socket.socket, fd: int, rank: int, peer: int, layout: tuple[int, int], theirs: tuple[int, int]):
    """``(socket, fd, pid)`` of a peer whose channels are laid out as ours; ``RendezvousError`` if not."""
    if theirs != layout:
        sock.close()
        os.close(fd)
        raise RendezvousError(f"ranks {rank} and {peer} lay out shared-memory channels differently ((chunk, "
                              f"slots) {layout} and {theirs}): give every rank the same ALLREDUCE_SHM_* settings")
    return sock, fd, _peer_pid(sock)


def _same_user(sock: socket.socket) -> bool:
    """Whether the other end of a Unix socket runs as this user. Abstract sockets have no permissions,
    so this is what keeps other users out; a process of the same user could read our memory anyway."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid == os.getuid()


def _peer_pid(sock: socket.socket) -> int:
    """The pid at the other end of a Unix socket, as the kernel saw it connect (0 if unknown here)."""
    pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid


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
