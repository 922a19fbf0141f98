"""Horovod's negotiation: the ranks of a process set agree on an operation, by name, before any data moves.

Horovod pairs operations by *name*, not by issue order, and checks that every rank asked for the same
thing before it runs: a rank may have several operations in flight, ranks may issue them in different
orders, and a mismatch (another dtype, shape, op or root) is refused on every rank while the set stays
usable. This module does the same on the caller's thread:

- A call builds an :class:`Operation`: its kind, its name (``<kind>.<name>``, or ``<kind>.noname.<n>``
  when the caller gave none, counted per kind from the last ``join``, so unnamed calls pair up in
  issue order), the fields every rank must agree on, and ``start``, which runs its collectives.
  ``submit`` *queues* it and returns a :class:`Ticket` (the handle's object). A second request with
  the name of one not yet started is a ``ValueError`` at once, as in Horovod.
- A rank that must wait for a ticket (``synchronize``, a blocking call, ``join``) holds a *round*: one
  all-gather, over the set, of the requests each rank queued since its last round and the name it waits
  for. Every rank files what it receives into the same table, in the same order, so every rank takes the
  same decisions: a request that every rank (but those in ``join``) has announced is *ready*; a ready
  request whose fields agree starts, in table order, on every rank; one whose fields differ is refused
  on every rank with a :class:`~allreduce.Mismatch` naming the field, two ranks and their values.
- A round in which nothing new was announced, nothing was ready, and every rank was waiting can never
  be followed by progress: each rank's awaited request is refused, naming what every rank waits for.
- A rank in ``join`` announces a ``join`` request and keeps holding rounds: reductions ready among the
  others run with this rank contributing the op's identity (:func:`.joining.contribute`); any other
  kind is refused while a rank is joined (as Horovod does); ``join`` returns, on every rank, once every
  rank has announced it, with the rank that announced it last.

Queued requests are announced in the next round *this* rank holds, so an ``*_async`` call starts its
collectives at the next blocking Horovod call of its rank, or at its second ``poll`` (the first says
``False`` at once), after which they complete in the background.

A round first compares *digests*: each rank's announcement is a JSON text, and the ranks all-reduce
(bitwise AND) its 16-byte BLAKE2b digest beside the digest's complement, 32 bytes of a fixed shape,
so that after the first round the group's compiled shortcut takes it in one call. A bit set in
neither half of the result is one where the ranks' digests differ (texts that differ share a digest
with odds of 2**-128: those of guessing a 128-bit key). Where every rank announced the
same text (the common case: the ranks issue the same operations in the same order), each rank knows
every rank's announcement already and files its own text once per rank: the round settles exactly
as if the texts had been gathered. Only where the digests differ are the texts gathered: one
all-gather of a 512-byte slot per rank (a second when a text is longer). This plays the part of
Horovod's response cache, which announces a request negotiated before by one bit: here a request
needs no earlier round, and nothing is cached, so no cache has to stay alike on every rank across
``join``, a refusal, a removed process set or an elastic reset. A rank's text names what it waits
for only when it announces nothing (the names serve only to refuse the awaited requests of a round
in which nothing was announced), so ranks that announce the same requests and wait for different
ones still agree. While a rank is joined, texts differ by construction, and rounds
gather at once. The common case, one blocking call at a time, costs one round of one 32-byte
all-reduce per call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from ... import api, uneven
from ...errors import Mismatch
from ...ops import ReduceOp

from . import joining, timeline
from .handles import Pending

JOIN = "join"
SLOT = 512  # bytes per rank of a round's all-gather: most rounds' texts fit (else a second, exact one)


@dataclass
class Operation:
    """One Horovod operation, as the ranks negotiate it."""

    kind: str  # Horovod's op: "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", ...
    name: str | None  # the caller's name=, or None for an automatic one
    agreed: dict = field(default_factory=dict)  # field -> JSON-able value every rank must give alike
    start: Callable[[], Pending] | None = None  # runs the collectives once agreed (None: nothing to run)
    serves: joining.Reduction | None = None  # what a joined rank contributes (None: refused while one is joined)


class Ticket:
    """A submitted :class:`Operation`: ``done()`` once its collectives are done, ``wait()`` its result."""

    def __init__(self, negotiator: Negotiator, request: Operation):
        self.negotiator, self.request = negotiator, request
        self.pending: Pending | None = None
        self.error: Exception | None = None
        self.polled = False  # whether poll() was asked about it already

    def done(self) -> bool:
        return self.error is not None or (self.pending is not None and self.pending.done())

    def poll(self) -> bool:
        """:meth:`done`; asked again about a request not yet started, it holds a round first, so that a
        loop on ``poll`` makes progress (each such round waits for every rank of the set to hold one)."""
        if self.pending is None and self.error is None:
            if self.polled:
                self.negotiator.round(self)
            self.polled = True
        return self.done()

    def wait(self):
        """Hold rounds until the request has started (or was refused), then wait for its result.

        Raises:
            Mismatch: the ranks asked for different things, or wait for operations that never pair up.
        """
        while self.pending is None and self.error is None:
            self.negotiator.round(self)
        if self.error is not None:
            raise self.error
        try:
            return self.pending.wait()
        finally:
            if (trace := timeline.active()) is not None:
                trace.end(self.request.name)


class Negotiator:
    """The negotiation of one process set's group (see the module docstring)."""

    def __init__(self, group):
        self.group = group
        self.queued: list[Ticket] = []  # this rank's tickets not yet announced
        self.mine: dict[str, Ticket] = {}  # this rank's tickets not yet started or refused, by name
        self.table: dict[str, dict[int, list]] = {}  # name -> {rank: [kind, agreed, serves]}, alike on all ranks
        self.joined: list[int] = []  # ranks inside join(), in the order they announced it
        self.counters: Counter = Counter()
        self.rounds = itertools.count(1)

    def submit(self, request: Operation) -> Ticket:
        """Queue ``request``; it is announced at this rank's next round.

        Raises:
            ValueError: a request of this name is in flight on this rank.
        """
        if request.name is None:
            self.counters[request.kind] += 1
            request.name = f"{request.kind}.noname.{self.counters[request.kind]}"
        else:
            request.name = f"{request.kind}.{request.name}"  # as Horovod: an allreduce and a broadcast may share one
        if request.name in self.mine:
            raise ValueError(f"rank {self.group.rank}: a Horovod {self.mine[request.name].request.kind} named "
                             f"{request.name!r} is already in flight; operations in flight need distinct names")
        ticket = Ticket(self, request)
        self.mine[request.name] = ticket
        self.queued.append(ticket)
        if (trace := timeline.active()) is not None:
            trace.begin(request.name, f"NEGOTIATE_{request.kind.upper()}")
        return ticket

    def round(self, waiting: Ticket) -> None:
        """One round: announce what this rank queued, file every rank's announcements, settle what can be."""
        g, number = self.group, next(self.rounds)
        if (trace := timeline.active()) is not None:
            trace.cycle()
        announced = [[t.request.name, t.request.kind, t.request.agreed,
                      None if t.request.serves is None else joining.describe(t.request.serves)]
                     for t in self.queued]
        self.queued.clear()
        said = [announced, None if announced else waiting.request.name]
        text = json.dumps(said).encode()
        if g.size == 1 or (not self.joined and _alike(g, text)):
            messages = [said] * g.size
        else:
            messages = [json.loads(m) for m in _exchange(g, text)]
        fresh = False
        for r, (entries, _) in enumerate(messages):
            for name, kind, agreed, serves in entries:
                self.table.setdefault(name, {})[r] = [kind, agreed, serves]
                fresh = True
                if kind == JOIN:
                    self.joined.append(r)
        settled = self._settle()
        if not (fresh or settled):
            self._refuse_stuck([w for _, w in messages], number)

    def _settle(self) -> bool:
        """Start or refuse every ready request, in table order; whether any was."""
        n, settled = self.group.size, False
        for name, entry in list(self.table.items()):
            kind = next(iter(entry.values()))[0]
            if kind == JOIN:
                if len(entry) == n:
                    last = self.joined[-1]
                    self.joined.clear()
                    self.counters.clear()  # every rank is here: automatic names start again alike
                    self._finish(name, result=last)
                    settled = True
                continue
            joined = set(self.joined) - set(entry)
            if len(entry) + len(joined) < n:
                continue
            settled = True
            if joined and any(serves is None for _, _, serves in entry.values()):
                self._finish(name, error=Mismatch(
                    f"rank {self.group.rank}/{n}: Horovod {kind} {name!r} cannot run while rank(s) "
                    f"{sorted(joined)} have joined; only allreduce serves joined ranks"))
            elif (error := self._disagreement(name, kind, entry)) is not None:
                self._finish(name, error=error)
            else:
                self._run(name, entry, joined)
        return settled

    def _disagreement(self, name: str, kind: str, entry: dict) -> Mismatch | None:
        """The Mismatch of a ready request whose ranks differ in kind or in an agreed field, if they do."""
        ranks = sorted(entry)
        first = entry[ranks[0]]
        for r in ranks[1:]:
            other = entry[r]
            fields = ["kind"] if other[0] != first[0] else [f for f in first[1] if first[1][f] != other[1].get(f)]
            if fields:
                what = fields[0]
                mine, theirs = (first[0], other[0]) if what == "kind" else (first[1][what], other[1].get(what))
                return Mismatch(f"rank {self.group.rank}/{self.group.size}: Horovod {kind} {name!r}: mismatched "
                                f"{what}: rank {ranks[0]} gave {mine}, rank {r} gave {theirs}")
        return None

    def _run(self, name: str, entry: dict, joined: set) -> None:
        """Start an agreed request: this rank's own, or a joined rank's identity contribution."""
        del self.table[name]
        ticket = self.mine.pop(name, None)
        if ticket is None:  # this rank is joined: serve the reduction
            serves = next(s for _, _, s in entry.values())
            joining.contribute(joining.parse(serves), self.group)
            return
        if (trace := timeline.active()) is not None:
            trace.end(name)
            trace.begin(name, ticket.request.kind.upper())
        start = ticket.request.start
        ticket.pending = start() if start is not None else Pending([], lambda: None)

    def _finish(self, name: str, error: Exception | None = None, result=None) -> None:
        """Settle ``name`` without running it: refused with ``error``, or (``join``) with ``result``."""
        del self.table[name]
        ticket = self.mine.pop(name, None)
        if ticket is None:
            return
        if error is not None:
            ticket.error = error
        else:
            ticket.pending = Pending([], lambda: result)

    def _refuse_stuck(self, waits: list[str], number: int) -> None:
        """Every rank waits and nothing can move: refuse each awaited request (``join`` excepted)."""
        waited = ", ".join(f"rank {r} for {w!r}" for r, w in enumerate(waits))
        for r, name in enumerate(waits):
            if name in self.table and self.table[name].get(r, [JOIN])[0] != JOIN:
                self._finish(name, error=Mismatch(
                    f"rank {self.group.rank}/{self.group.size}: Horovod negotiation round {number}: no operation "
                    f"can run: {waited}, and no request is ready on every rank (names or order differ)"))

    def forget(self) -> None:
        """Drop every queued and announced request (``hvd.shutdown``)."""
        self.queued.clear()
        self.mine.clear()
        self.table.clear()
        self.joined.clear()


def _alike(group, text: bytes) -> bool:
    """Whether every rank of ``group`` holds the same ``text``: one bitwise-AND all-reduce of its 16-byte
    digest and the digest's complement; where the ranks' bits agree, one of the two ANDs keeps the bit."""
    digest = np.frombuffer(hashlib.blake2b(text, digest_size=16).digest(), np.uint64)
    words = np.concatenate((digest, ~digest))
    api.all_reduce(words, ReduceOp.BAND, group)
    return not (~(words[:2] | words[2:])).any()


def _exchange(group, text: bytes) -> list[bytes]:
    """Every rank's ``text``, in rank order: one all-gather of :data:`SLOT`-byte slots (a length, then
    the text), and a second, of the whole texts, only when one did not fit its slot."""
    slot = np.zeros(SLOT, np.uint8)
    slot[:8] = np.frombuffer(len(text).to_bytes(8, "little"), np.uint8)
    if len(text) <= SLOT - 8:
        slot[8:8 + len(text)] = np.frombuffer(text, np.uint8)
    slots = np.empty((group.size, SLOT), np.uint8)
    api.all_gather_into_tensor(slots, slot, group=group)
    lengths = slots[:, :8].copy().view("<i8")[:, 0].tolist()
    if max(lengths) <= SLOT - 8:
        return [row[8:8 + n].tobytes() for row, n in zip(slots, lengths)]
    texts: list[bytes] = []
    uneven.all_gather(group, np.frombuffer(text, np.uint8), lambda blocks: texts.extend(bytes(b) for b in blocks))
    return texts


_NEGOTIATORS: dict[int, Negotiator] = {}


def negotiator_of(group) -> Negotiator:
    """The negotiator of ``group`` (created at first use)."""
    found = _NEGOTIATORS.get(id(group))
    if found is None or found.group is not group:
        found = _NEGOTIATORS[id(group)] = Negotiator(group)
    return found


def submit(group, request: Operation) -> Ticket:
    """Queue ``request`` on ``group``'s negotiator (see :meth:`Negotiator.submit`)."""
    return negotiator_of(group).submit(request)


def run(group, request: Operation):
    """Submit ``request`` and wait for its result (a blocking Horovod call)."""
    return submit(group, request).wait()


def forget(group) -> None:
    """Drop the negotiator of ``group`` (its process set is removed)."""
    negotiator = _NEGOTIATORS.pop(id(group), None)
    if negotiator is not None:
        negotiator.forget()


def clear() -> None:
    """Forget every negotiator (``hvd.shutdown``)."""
    for negotiator in _NEGOTIATORS.values():
        negotiator.forget()
    _NEGOTIATORS.clear()
