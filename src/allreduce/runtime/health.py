"""A group's health: the heartbeat that says which call this rank has reached, and the reports of failure.

A small heartbeat thread publishes which collective this rank has reached (``progress/{rank}`` in the
store), so that a rank stuck in a call can spot a peer that called something else (:meth:`Health.inspect`)
and a rank that times out can say which ranks never arrived (the stall report). A rank that refuses
its own arguments before a call begins publishes the refusal in the same record, under the number
the call would have had (:meth:`Health.refused`): a peer stuck in that call raises at its next
inspection instead of waiting to the deadline, and no extra round is paid by calls that go well. Every error a call
raises is worded here: the stall report after a timeout, the peer's own reason (``failed/{rank}``)
after it gave up. Store calls on these paths are bounded: a frozen store host must hold neither a
collective nor teardown.
"""

from __future__ import annotations

import threading

from .. import collectives, wire
from ..engines import Call
from ..engines.callstate import CallStateLike
from ..errors import AllreduceError, CommTimeout, Mismatch, PeerLost, Revoked
from ..rendezvous.store import Store

STORE_GRACE = 1.0  # seconds a store call may take off a collective's path (heartbeat, error report)
_REFUSED = "refused "  # how a progress record that tells a refusal begins


def describe(call: Call) -> str:
    """A collective as every rank must agree on it, e.g. ``all_reduce(count=10, float32, SUM, ring)``."""
    facts = collectives.get(call.collective)
    op = f", {call.op.name}" if facts.reduces else ""
    root = f", root={call.root}" if facts.rooted else ""
    return f"{call.collective}(count={call.count}, {call.dtype}{op}{root}, {wire.algorithm_label(call.digest)})"


class Health:
    """The heartbeat and failure reports of one rank of a group, through ``store``; the call this rank
    began last is ``calls.started`` (the group's call state, :mod:`..engines.callstate`)."""

    def __init__(self, store: Store, rank: int, size: int, interval: float, stopping: threading.Event, name: str,
                 calls: CallStateLike):
        self.store = store
        self.rank, self.size = rank, size
        self.interval = interval  # heartbeat period, and quiet time before inspecting peers
        self._calls = calls
        self.interrupt: AllreduceError | None = None  # raised by the next inspection: the group was revoked
        # (seq, peers' states) at the last inspection, for the stall report
        self._seen: tuple[int, dict[int, tuple[int, str] | None]] = (0, {})
        self._publishing = threading.Lock()  # one writer of progress/{rank} at a time: the beat or a refusal
        self._published: tuple[int, Call] | None = None  # the started call progress/{rank} says
        self._refused_at = 0  # the call number of this rank's last refusal (0: none)
        self._after_refusal = False  # publish the next call begun at once: the refusal must not stand for it
        self._stopping = stopping
        self.thread = threading.Thread(target=self._beat, name=f"allreduce-{name}-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self._publish()
            except CommTimeout:  # a slow or frozen store host: try again at the next beat
                continue
            except Exception:  # the store may be gone at shutdown; the report is best effort
                return

    def _publish(self) -> None:
        """Say the call begun last in ``progress/{rank}``, if it does not say it yet (bounded: a frozen
        store host must hold neither the heartbeat nor close())."""
        with self._publishing:
            started = self._calls.started
            if started is not None and started is not self._published:
                record = f"{started[0]}|{describe(started[1])}".encode()
                self.store.within(STORE_GRACE).set(f"progress/{self.rank}", record)
                self._published = started

    def begin(self, seq: int, call: Call) -> None:
        """This rank begins call ``seq``; right after a refusal, say so at once (not at the next beat),
        so that no peer reads the refusal as this call's."""
        self._calls.begin(seq, call)
        if self._after_refusal:
            self._after_refusal = False
            try:
                self._publish()
            except Exception:  # no store: the beat tries again
                pass

    def refused(self, seq: int, text: str) -> None:
        """Publish that this rank refused call ``seq`` before it began (``text``: the collective and the
        reason), where a peer waiting in that call looks; within one :data:`STORE_GRACE`, best effort."""
        with self._publishing:
            self._refused_at, self._after_refusal = seq, True
            self._published = self._calls.started  # the beat must not put the record of an older call back
            try:
                self.store.within(STORE_GRACE).set(f"progress/{self.rank}", f"{seq}|{_REFUSED}{text}".encode())
            except Exception:  # no store, no verdict: the peers wait to their deadline
                pass

    def _peer_states(self, store: Store) -> dict[int, tuple[int, str] | None]:
        """(sequence number, description) of the last collective each peer published, read through ``store``."""
        states: dict[int, tuple[int, str] | None] = {}
        for rank in range(self.size):
            if rank == self.rank:
                continue
            key = f"progress/{rank}"
            if not store.check([key]):
                states[rank] = None
                continue
            seq, _, what = store.get(key).decode().partition("|")
            states[rank] = int(seq), what
        return states

    def inspect(self) -> None:
        """While stuck in the collective begun last: raise :class:`Mismatch` if a peer is in a different
        collective #seq, or :attr:`interrupt` once set (the group was revoked). What it saw is kept for the
        stall report, should the store be gone by the deadline."""
        if self.interrupt is not None:
            raise self.interrupt
        started = self._calls.started
        assert started is not None  # inspected only while a call runs
        seq, call = started
        try:
            states = self._peer_states(self.store.within(self.interval))  # late by an interval at most
        except Exception:  # no store, no verdict: the collective still ends at its deadline
            return
        self._seen = (seq, states)
        ours = describe(call)
        refusal = self._refusal(states, seq)
        if refusal is not None:
            raise Mismatch(f"{refusal}, while this rank called {ours} #{seq}")
        for rank, state in states.items():
            if state is not None and state[0] == seq and state[1] != ours:
                raise Mismatch(f"rank {rank} called a different collective or arguments: {state[1]} #{seq}, while "
                               f"this rank called {ours} #{seq}")

    def _refusal(self, states: dict[int, tuple[int, str] | None], seq: int) -> str | None:
        """Which peer refused call ``seq`` and why, in words, if one did (``states``: the peers' records);
        ``None`` also where this rank refused #``seq`` itself: the peers' refusals are of that call."""
        if self._refused_at == seq:
            return None
        for rank, state in states.items():
            if state is not None and state[0] == seq and state[1].startswith(_REFUSED):
                return (f"rank {rank} refused its arguments to {state[1][len(_REFUSED):]} "
                        f"(as its call #{seq}, before it began)")
        return None

    def failed(self, exc: AllreduceError, seq: int, call: Call) -> AllreduceError:
        """The error the user sees for ``exc`` in call ``seq`` (this rank, then what the peers say), once
        told to the peers through the store; both within one :data:`STORE_GRACE`.

        Its kind is the one the peers are told: a peer of a rank that found a mismatch raises
        :class:`Mismatch` too, since it made the mismatched call; one of a revoked group, :class:`Revoked`.
        """
        text = f"rank {self.rank}/{self.size}: {exc}"
        store = self.store.within(STORE_GRACE)  # the whole report, even with the store's host frozen
        refusal = self._peer_refusal(seq, store) if isinstance(exc, (CommTimeout, PeerLost)) else None
        if refusal is not None:  # what the peer did is the cause: it refused, then closed its links or went on
            text += f"; {refusal}"
        elif isinstance(exc, CommTimeout):
            text += self._stall_report(seq, call.collective, store)
        elif isinstance(exc, PeerLost) and " aborted: " not in text:
            text += self._peer_failure(getattr(exc, "peer", None), store)
        kind = Mismatch if refusal is not None else type(exc)
        if isinstance(exc, PeerLost) and ": Mismatch: rank " in text:
            kind = Mismatch
        elif isinstance(exc, PeerLost) and ": Revoked: rank " in text:  # a peer's ABORT passed a revocation on
            kind = Revoked
        error = kind(text)
        error.peer = getattr(exc, "peer", None)
        self.report(f"{kind.__name__}: {text}", store)
        return error

    def report(self, message: str, store: Store | None = None) -> None:
        """Tell the peers through ``store`` (default: the group's, bounded) why this rank gave up (best
        effort: the store may be gone, and the ABORT frames still carry the reason)."""
        try:
            (store or self.store.within(STORE_GRACE)).set(f"failed/{self.rank}", message.encode()[:4096])
        except Exception:
            pass

    def _peer_refusal(self, seq: int, store: Store) -> str | None:
        """A peer's refusal of call ``seq``, in words, read through ``store`` (``None``: none, or no store)."""
        try:
            return self._refusal(self._peer_states(store), seq)
        except Exception:
            return None

    def _peer_failure(self, peer: int | None, store: Store) -> str:
        """Why ``peer`` gave up, if it said so in the store: a closed link alone cannot tell."""
        try:
            if peer is None or not store.check([f"failed/{peer}"]):
                return ""
            reason: bytes = store.get(f"failed/{peer}")
            return f"; rank {peer} had failed: " + reason.decode(errors="replace")
        except Exception:  # no store, no reason
            return ""

    def _stall_report(self, seq: int, collective: str, store: Store) -> str:
        """Which ranks have not reached collective #``seq``, from their heartbeats in ``store``."""
        try:
            states = self._peer_states(store)
        except Exception:  # the store is gone (its host may have failed first): the last inspection's view
            states = self._seen[1] if self._seen[0] == seq else {}
        behind = []
        for rank, state in states.items():
            if state is None:
                behind.append(f"{rank} (no collective yet)")
            elif state[0] < seq:
                behind.append(f"{rank} (last at {state[1]} #{state[0]})")
        if not behind:
            return ""
        return f"; ranks that have not reached {collective} #{seq}: " + ", ".join(behind)
