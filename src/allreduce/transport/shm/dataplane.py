"""Moving frames through the channels: posting sends into slots, taking receives out of them.

Its own file because this is the hot path, and the only code that touches slots; how a rank waits
when nothing moves is :mod:`.waiting`, who the peers are is :mod:`.link`. A message goes inline
(copied through slots a chunk at a time), registered (the slot names a shared segment and offset),
staged (copied once into a staging segment, then read as a registered one) or cross-memory (the slot
names an address the receiver reads with ``process_vm_readv``); point-to-point sends are staged too,
so they never wait for their receiver.
"""

from __future__ import annotations

from ... import collectives, wire
from ...errors import AllreduceError, PeerLost, ProtocolError, with_peer
from .. import shmseg
from ..base import RecvSpec, SendSpec
from .layout import CROSS, INLINE, MODE, NBYTES, OFFSET, PAYLOAD_AT, REGISTERED, WHERE, slot_size
from .options import ShmOptions
from .link import ShmLink

POINT_TO_POINT = collectives.get("send").code  # frames of send/recv, whose receiver may come much later


class Out:
    """A send in progress: bytes posted so far, or the slot a rendezvous send waits to see taken."""

    __slots__ = ("peer", "header", "payload", "nbytes", "posted", "await_slot", "done", "after", "buffered")

    def __init__(self, peer: ShmLink, spec: SendSpec, after: Out | None, buffered_max: int):
        self.peer = peer
        self.header = wire.encode(spec.header)
        self.payload = spec.payload
        self.nbytes = spec.payload.nbytes
        self.buffered = spec.header.collective == POINT_TO_POINT and self.nbytes <= buffered_max
        self.posted = -1  # payload bytes posted; -1 before the first slot
        self.await_slot = 0  # rendezvous: done once the peer has taken this many slots
        self.done = False
        self.after = after  # the previous send to the same peer, which goes first


class In:
    """A receive in progress: bytes landed so far."""

    __slots__ = ("peer", "header", "spec", "nbytes", "got", "started", "order", "done", "after")

    def __init__(self, peer: ShmLink, spec: RecvSpec, order: int, after: In | None):
        self.peer = peer
        self.header = wire.encode(spec.header)
        self.spec = spec
        self.nbytes = spec.dest.nbytes
        self.got = 0
        self.started = False
        self.order = order  # position among the receives that absorb (they complete in list order)
        self.done = False
        self.after = after  # the previous receive from the same peer, which goes first


class DataPlane:
    """Posts and takes slots for one rank: its own control segment's channels and its peers'."""

    def __init__(self, data: memoryview, words: memoryview, peers: dict[int, ShmLink], options: ShmOptions,
                 chunk: int):
        self.options = options
        self.peers = peers
        self._bytes = data  # our control segment
        self._words = words
        self._chunk = chunk
        self._slot = slot_size(chunk)
        self._bounce: memoryview | None = None  # where cross-memory pieces land for a receive that absorbs
        self._spare: list[shmseg.Segment] = []  # staging segments no peer is reading
        self.absorbed = 0  # absorbing receives completed in the current exchange
        self.deadline = 0.0  # of the current exchange

    def advance(self, pending: list) -> bool:
        """Move every op that may move now; whether any did."""
        progressed = False
        for op in pending:
            if self.ready(op):
                progressed = (self._push(op) if type(op) is Out else self._pull(op)) or progressed
        return progressed

    def ready(self, op) -> bool:
        """Whether ``op`` may move now: not done, not behind an earlier frame on its link, and (for an
        absorbing receive) not behind an earlier absorbing receive."""
        if op.done or (op.after is not None and not op.after.done):
            return False
        return type(op) is Out or op.order < 0 or op.order == self.absorbed

    def close(self) -> None:
        """Free the staging segments no peer holds."""
        for segment in self._spare:
            segment.close()
        self._spare = []

    # ---- sending ---------------------------------------------------------------------------------

    def _push(self, out: Out) -> bool:
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
                        words[at + MODE], words[at + NBYTES], words[at + OFFSET], words[at + WHERE] = (
                            route[0], out.nbytes, route[2], route[1])
                        self._post(peer)
                        if out.buffered:
                            peer.staged.append((peer.posted, route[3]))
                            out.done = True
                        else:
                            out.await_slot = peer.posted
                        return True
            n = min(self._chunk, out.nbytes - out.posted)
            words[at + MODE], words[at + NBYTES], words[at + OFFSET] = INLINE, n, out.posted
            if n:
                self._bytes[slot + PAYLOAD_AT:slot + PAYLOAD_AT + n] = out.payload[out.posted:out.posted + n]
            out.posted += n
            self._post(peer)
            progressed = True
            if out.posted >= out.nbytes:
                out.done = True
                break
        return progressed

    def _post(self, peer: ShmLink) -> None:
        peer.posted += 1
        self._words[peer.out_sent] = peer.posted
        peer.wake()

    def _buffer(self, out: Out):
        """Copy a payload into a staging segment the peer can map: its send is done at once. For a
        point-to-point send this is as a TCP send that fits the socket buffers is, so ``isend`` +
        ``irecv`` on both sides cannot deadlock; for a collective's it is the staged route of
        :meth:`_route`. ``(mode, where, offset, segment)``, or ``None`` to send it inline."""
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
        return REGISTERED, segment.gen, 0, segment

    def _drop(self, segment: shmseg.Segment) -> None:
        """Close a staging segment and have the peers that mapped it unmap it."""
        for peer in self.peers.values():
            peer.unshare([segment.gen], self._words)
        segment.close()

    def _route(self, out: Out):
        """How a large send of ``out`` travels: ``(mode, where, offset)`` for a rendezvous send (its
        payload read where it lies), the staging route of :meth:`_buffer`, or ``None`` to send it inline.

        A registered payload is read in place. Below ``staged_max`` the payload is copied once into a
        staging segment the peer maps and reduces straight out of: a memory copy runs at two to three
        times the rate of ``process_vm_readv``, whose every call pins the peer's pages, and the send is
        done at once. Larger payloads are read cross-memory: there that cost is spread thin, one copy
        moves fewer bytes than two, and no staging memory of their size is held.
        """
        address = shmseg.address_of(out.payload)
        found = shmseg.find(address, out.nbytes)
        peer = out.peer
        if found is not None and peer.share(found[0]):
            segment, offset = found
            return REGISTERED, segment.gen, offset
        if out.nbytes <= self.options.staged_max:
            out.buffered = True  # done once copied, as a buffered point-to-point send is
            return self._buffer(out)
        if peer.reader is not None:
            return CROSS, address, 0
        return None

    # ---- receiving -------------------------------------------------------------------------------

    def _pull(self, inn: In) -> bool:
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
                    raise _mismatch(peer, slot, inn)
                inn.started = True
            mode, n, offset = theirs[at + MODE], theirs[at + NBYTES], theirs[at + OFFSET]
            if mode == INLINE and 0 <= offset and offset + n <= inn.nbytes:
                _land(inn, peer.bytes[slot + PAYLOAD_AT:slot + PAYLOAD_AT + n], offset)
                inn.got = offset + n
            elif mode == REGISTERED and n == inn.nbytes:
                segment = peer.registered(theirs[at + WHERE], self.deadline)
                if offset < 0 or offset + n > segment.size:
                    raise with_peer(ProtocolError(f"rank {peer.rank} named bytes outside its segment"), peer.rank)
                with memoryview(segment.map) as whole:
                    _land(inn, whole[offset:offset + n], 0)
                inn.got = n
            elif mode == CROSS and n == inn.nbytes and peer.reader is not None:
                self._read_across(inn, theirs[at + WHERE])
                inn.got = n
            else:
                raise with_peer(ProtocolError(f"rank {peer.rank} posted a malformed slot (mode {mode}, "
                                              f"{n} bytes at {offset} of {inn.nbytes})"), peer.rank)
            peer.consumed += 1
            theirs[peer.in_taken] = peer.consumed
            peer.wake()
            progressed = True
            if inn.got >= inn.nbytes:
                inn.done = True
                if inn.order >= 0:
                    self.absorbed += 1
                break
        return progressed

    def _read_across(self, inn: In, address: int) -> None:
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
                raise with_peer(PeerLost(f"rank {peer.rank} exited or crashed (pid {peer.pid})"), peer.rank) from exc
            except OSError as exc:
                raise with_peer(ProtocolError(f"cannot read rank {peer.rank}'s memory: {exc.strerror}"),
                                peer.rank) from exc
            if absorb is not None:
                absorb(self._bounce[:n], at)
            elif spec.progress is not None:
                spec.progress(at + n)


def _land(inn: In, view: memoryview, offset: int) -> None:
    """Hand bytes ``[offset, offset + len(view))`` of the payload to the receive."""
    spec = inn.spec
    if spec.absorb is not None:
        spec.absorb(view, offset)
        return
    spec.dest[offset:offset + view.nbytes] = view
    if spec.progress is not None:
        spec.progress(offset + view.nbytes)


def _mismatch(peer: ShmLink, slot: int, inn: In) -> AllreduceError:
    try:
        wire.check(wire.decode(bytes(inn.header)), wire.decode(bytes(peer.bytes[slot:slot + wire.HEADER_SIZE])))
        exc: AllreduceError = ProtocolError("frame header changed while it was read")
    except AllreduceError as error:
        exc = error
    return with_peer(type(exc)(f"rank {peer.rank}: {exc}"), peer.rank)
