"""The small- and medium-message path: each rank writes a line per round, every peer reads it where it lies.

A collective of a few bytes costs what its bookkeeping costs, so this path keeps almost none: no
frames, no slots to hand back, no sockets. Every rank owns two *lines* in its control segment
(:mod:`.layout`); round number ``k`` (counted over the rounds of the calls that take the lines: one
for a small call, two per chunk of a medium one) uses line ``k % 2``. A rank writes its payload, the
call's group sequence number, its fingerprint and frame header, and the number ``k`` last (x86-64
keeps one process's stores in order, so a peer that reads ``k`` reads the rest complete). Then it
waits until every peer's line shows ``k``, checks their fingerprints against its own (a difference
raises ``Mismatch`` naming each field that differs) and reads their payloads in place.

A line is reused without acknowledgements: a rank writes line ``k % 2`` again at round ``k + 2``,
which it reaches only after seeing every peer's round ``k + 1``, which each peer posts only once it
has finished round ``k``, reading included.

Waiting matches who is expected: spin while every rank has a core; yield the processor until
``yield_s`` when ranks outnumber cores (to each other) or while other work does not keep the cores
busy; then sleep on a futex on the awaited peer's line number, having raised this rank's sleeping
flag; a rank that posts wakes sleepers it sees flagged with one futex call. A wake-up lost to the
flag's race costs at most ``sleep_ms``. Every wait keeps its deadline, calls ``idle`` every
``idle_every`` seconds and looks for a gone peer every ``check_s``.

The time before sleeping follows the peers. It starts at ``spin_s``; when a wait ended soon after it,
it widens to twice that wait (at most ``spin_max_s``; yielding past ``spin_s``, so that a peer
sharing the core can run), so that a steady stream of calls from a slower caller (a torch loop,
say) finds its peer awake instead of paying a wake-up per call; after each wait longer than
``spin_max_s`` it halves back towards ``spin_s``, so that an idle rank soon sleeps at once again.
This applies where waiting would otherwise sleep after ``spin_s``: the load average above the cores
(the group's own spinning ranks count in it) but not above the cores plus the group's ranks. With
idle cores the yield until ``yield_s`` already keeps peers awake; with ranks outnumbering cores, or
other work keeping the cores busy, a longer spin would only delay the peer it waits for.
"""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from collections.abc import Callable

import numpy as np

from ... import wire
from ...errors import AllreduceError, CommTimeout, PeerLost, ProtocolError, with_peer
from .. import shmseg
from .layout import (LINE_CALL, LINE_HEADER_AT, LINE_NUMBER, LINE_PAYLOAD_AT, LINE_PRINT, LINE_SLEEPING,
                     LINES_FIRST, line_size)
from .options import ShmOptions
from .link import ShmLink
from .waiting import Waiting

_SYS_FUTEX = 202  # x86-64's number; the transport runs nowhere else
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not private): the word lies in memory of several processes
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long
except (OSError, TypeError, AttributeError):  # not a Unix libc: the transport is not available here anyway
    _syscall = None
_LOW = 0xFFFFFFFF  # a futex compares the word's low 32 bits (little-endian: its first four bytes)


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class Lines:
    """This rank's two lines and its peers', for the group's small collectives (see the module docstring).

    ``size`` ranks ``0..size-1`` (every member is on this host); ``peers`` by rank; the lines area lies
    at byte ``at`` of every rank's control segment.
    """

    def __init__(self, rank: int, segment: shmseg.Segment, words: memoryview, peers: dict[int, ShmLink], at: int,
                 options: ShmOptions, waiting: Waiting):
        self.rank = rank
        self.size = len(peers) + 1
        self.at = at  # the lines area's byte offset in every rank's control segment
        self.capacity = options.line_capacity  # payload bytes a line holds
        self.at_once = options.line_max  # bytes per rank a call may have to take the lines in one round
        self.chunked_max = options.chunked_max  # bytes an all-reduce may have to take them in chunks
        self.options = options
        self._words = words
        self._waiting = waiting
        self.crowded = waiting.crowded  # the group's ranks outnumber the cores
        self._sleeping = (at >> 3) + LINE_SLEEPING
        self._peers = [peers[r] for r in range(self.size) if r != rank]
        starts = [at + LINES_FIRST + parity * line_size(self.capacity) for parity in (0, 1)]
        self._starts = starts  # byte offsets of the two lines in every rank's segment
        self._maps = [peers[r].segment.map if r != rank else segment.map for r in range(self.size)]
        self._addresses = [peers[r].segment.address if r != rank else segment.address for r in range(self.size)]
        self._heads = [start >> 3 for start in starts]  # our lines' first words
        self._wakes = [segment.address + start for start in starts]  # our line numbers' addresses
        self._shapes: dict[tuple, list[list[np.ndarray]]] = {}  # views by (dtype, count), see views()
        self._kept: weakref.WeakSet[_Kept] = weakref.WeakSet()  # lists of views made from those, see keep()
        self._theirs = [[(peer, peer.words, start >> 3, peer.segment.address + start) for peer in self._peers]
                        for start in starts]
        self.spin = options.spin_s  # the spin window now, which follows the peers (see the module docstring)
        self._closing: list[Callable[[], None]] = []  # see on_close()

    def areas(self) -> tuple[int, ...]:
        """The address in this process of every rank's lines area, in rank order (for the compiled engine)."""
        return tuple(address + self.at for address in self._addresses)

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` when the lines close, before the segments are unmapped (the compiled engine
        stops touching them there)."""
        self._closing.append(hook)

    def gone(self, rank: int) -> str | None:
        """Why peer ``rank`` can no longer take part, or ``None`` (see :meth:`.link.ShmLink.gone`)."""
        return self._peer(rank).gone()

    def _peer(self, rank: int) -> ShmLink:
        return self._peers[rank if rank < self.rank else rank - 1]

    def views(self, dtype: np.dtype, count: int) -> list[list[np.ndarray]]:
        """Every rank's line payloads as ``count`` items of ``dtype``, ``[parity][rank]``: made once per
        shape, and emptied in place by :meth:`close`, so that no view keeps a segment mapped."""
        shape = self._shapes.get((dtype, count))
        if shape is None:
            if count * dtype.itemsize > self.capacity:
                raise ValueError(f"{count} items of {dtype} do not fit a line of {self.capacity} bytes")
            shape = self._shapes[(dtype, count)] = [
                [np.frombuffer(mapped, dtype, count, start + LINE_PAYLOAD_AT) for mapped in self._maps]
                for start in self._starts]
        return shape

    def keep(self, views: list) -> list:
        """``views`` (a list of anything made from :meth:`views`) as a list that :meth:`close` empties in
        place while its holder lives."""
        kept = _Kept(views)
        self._kept.add(kept)
        return kept

    def close(self) -> None:
        """Drop every view on the lines (before the segments are unmapped)."""
        for hook in self._closing:
            hook()
        self._closing = []
        for shape in self._shapes.values():
            for per_rank in shape:
                per_rank.clear()
        for kept in list(self._kept):
            kept.clear()
        self._shapes = {}

    def post(self, number: int, call: int, fingerprint: int, header: bytes) -> None:
        """Publish round ``number`` (its payload already written): group sequence number ``call``, the
        fingerprint peers compare and the ``header`` (sequence number 0) a mismatch is described by."""
        parity = number & 1
        words, head = self._words, self._heads[parity]
        if words[head + LINE_PRINT] != fingerprint:  # the header is rewritten only when the call's shape changes
            start = self._starts[parity] + LINE_HEADER_AT
            self._maps[self.rank][start:start + wire.HEADER_SIZE] = header
            words[head + LINE_PRINT] = fingerprint
        words[head + LINE_CALL] = call
        words[head + LINE_NUMBER] = number
        for peer in self._peers:
            if peer.words[self._sleeping]:
                _wake(self._wakes[parity])
                return

    def wait(self, number: int, call: int, fingerprint: int, deadline: float,
             idle: Callable[[], None] | None = None, idle_every: float = 1.0) -> None:
        """Return once every peer has posted round ``number``, with the same ``call`` and ``fingerprint``.

        Raises:
            Mismatch: a peer posted a different call (naming each field that differs).
            CommTimeout: at ``deadline``. PeerLost: an awaited peer exited, closed or aborted.
        """
        for peer, words, head, address in self._theirs[number & 1]:
            if words[head + LINE_NUMBER] != number:
                self._await(peer, words, head, address, number, deadline, idle, idle_every)
            if words[head + LINE_CALL] != call or words[head + LINE_PRINT] != fingerprint:
                raise self.mismatch(peer.rank, number & 1)

    def _await(self, peer: ShmLink, words: memoryview, head: int, address: int, number: int, deadline: float,
               idle, idle_every: float) -> None:
        options, monotonic = self.options, time.monotonic
        start = quiet = checked = monotonic()
        # Spin while every rank has a core. Yield when ranks outnumber cores (to each other), or while no other
        # work keeps the cores busy; a yield to other work takes a whole time slice. Where that leaves only
        # spin_s before sleeping (the load above the cores), the window follows the peers (see the module
        # docstring) unless work beyond this group's own ranks keeps the cores busy; past spin_s it yields.
        crowded, busy = self._waiting.crowded, self._waiting.busy(start)
        spin, relent = not crowded, crowded or not busy
        follow = spin and busy and not self._waiting.busy(start, self.size)
        window = self.spin if follow else 0.0
        while words[head] != number:
            now = monotonic()
            elapsed = now - start
            if spin and elapsed < options.spin_s:
                continue
            if now >= deadline:
                raise with_peer(CommTimeout(f"waiting for rank {peer.rank}"), peer.rank)
            if now - checked >= options.check_s:
                checked = now
                reason = peer.gone()
                if reason is not None and words[head] != number:
                    raise with_peer(PeerLost(reason), peer.rank)
            if idle is not None and now - quiet >= idle_every:
                idle()
                quiet = now
            if elapsed < window or (relent and elapsed < options.yield_s):
                os.sched_yield()
                continue
            seen = words[head]
            self._words[self._sleeping] = 1  # then look once more: a peer that posts after this wakes us
            if words[head] == seen:
                _wait(address, seen, min(options.sleep_ms / 1000, max(0.0, deadline - now)))
            self._words[self._sleeping] = 0
        if follow:
            self._follow(monotonic() - start)

    def _follow(self, waited: float) -> None:
        """Fit the spin window to a wait of ``waited`` seconds: widen it to twice a wait that outlasted it
        but not ``spin_max_s``; halve it (not below ``spin_s``) after a longer wait."""
        low = self.options.spin_s
        high = max(low, self.options.spin_max_s)
        if waited > high:
            self.spin = max(low, self.spin / 2)
        elif waited > self.spin:
            self.spin = min(high, 2 * waited)

    def mismatch(self, rank: int, parity: int) -> AllreduceError:
        """The error for peer ``rank`` whose line ``parity`` differs from ours: each field that differs, named."""
        peer = self._peer(rank)
        start, head = self._starts[parity], self._heads[parity]
        theirs = peer.words[head + LINE_CALL]
        try:
            ours = wire.decode(bytes(self._maps[self.rank][start + LINE_HEADER_AT:][:wire.HEADER_SIZE]))
            got = wire.decode(bytes(self._maps[peer.rank][start + LINE_HEADER_AT:][:wire.HEADER_SIZE]))
            wire.check(ours._replace(seq=self._words[head + LINE_CALL] % wire.SEQ_MODULUS),
                       got._replace(seq=theirs % wire.SEQ_MODULUS))
            exc: AllreduceError = ProtocolError("a line changed while it was read")
        except AllreduceError as error:
            exc = error
        return with_peer(type(exc)(f"rank {peer.rank}: {exc}"), peer.rank)


class _Kept(list):
    """A list that a weak set can hold, by identity (see :meth:`Lines.keep`)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _wait(address: int, seen: int, seconds: float) -> None:
    """Sleep until the word at ``address`` no longer holds ``seen`` (low 32 bits), a wake-up or ``seconds``."""
    timeout = _Timespec(int(seconds), int(seconds % 1 * 1e9))
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint(seen & _LOW), ctypes.byref(timeout),
             None, 0)


def _wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 1 << 30, None, None, 0)

