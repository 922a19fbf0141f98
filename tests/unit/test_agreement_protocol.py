"""The agreement protocol on an in-process network of lifelines, where a member can die after any message.

Each member contributes every bit set but its own, so the decided value says exactly who contributed;
every survivor must return the same decision, with every survivor's bit cleared, whoever dies when:
the coordinator before its asks, after telling some members the decision and not others, the next
coordinator too. A death is seen, as on a real lifeline, after every message the dead member sent.
"""

from __future__ import annotations

import queue
import random
import socket
import threading
import time

import pytest

from allreduce.resilience.agreement import Agreements
from allreduce.resilience.lifeline import Decoder, Lifeline, encode

ALL = (1 << 16) - 1


class FakeLine(Lifeline):
    """A lifeline end whose messages go through ``net``; it dies once it has sent ``budget`` more."""

    def __init__(self, net: Net, me: int):  # no sockets, no reader thread: the net delivers
        self.me, self.net = me, net
        self.cv = threading.Condition()
        self.dead: set[int] = set()
        self.handlers = []
        self.budget: int | None = None
        self.killed = False

    def send(self, peer: int, message: dict) -> bool:
        if self.killed or peer in self.dead:
            return False
        if self.budget is not None:
            if self.budget == 0:
                self.net.kill(self.me)
                return False
            self.budget -= 1
        self.net.inboxes[peer].put((self.me, Decoder().feed(encode(message))[0]))  # through the framing
        return True


class Net:
    def __init__(self, size: int):
        self.lines = [FakeLine(self, i) for i in range(size)]
        self.inboxes = [queue.Queue() for _ in range(size)]
        for i in range(size):
            threading.Thread(target=self._deliver, args=(i,), daemon=True).start()

    def kill(self, who: int) -> None:
        self.lines[who].killed = True
        for i, inbox in enumerate(self.inboxes):
            if i != who:
                inbox.put((who, None))  # the end of its lifeline, after whatever it sent

    def _deliver(self, me: int) -> None:
        line = self.lines[me]
        while True:
            sender, message = self.inboxes[me].get()
            if line.killed:
                continue
            with line.cv:
                if message is None:
                    line.dead.add(sender)
                else:
                    for handle in line.handlers:
                        handle(sender, message)
                line.cv.notify_all()


def _run(size: int, budgets: dict[int, int], seed: int, rounds: int = 1):
    net = Net(size)
    agreements = [Agreements(line) for line in net.lines]
    for who, budget in budgets.items():
        net.lines[who].budget = budget
    results: dict[int, list] = {}
    rng = random.Random(seed)
    delays = [rng.uniform(0, 0.003) for _ in range(size)]

    def member(i: int) -> None:
        time.sleep(delays[i])
        got = []
        try:
            for k in range(1, rounds + 1):
                d = agreements[i].agree("g", k, list(range(size)), ALL & ~(1 << i), time.monotonic() + 10, f"rank {i}",
                                         {m: m for m in range(size)})
                got.append((d.value, d.failed))
        except Exception as exc:  # a killed member's call may time out: it is not a survivor
            got.append(exc)
        results[i] = got

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(size)]
    for t in threads:
        t.start()
    end = time.monotonic() + 30
    while any(t.is_alive() and not net.lines[i].killed for i, t in enumerate(threads)) and time.monotonic() < end:
        time.sleep(0.005)
    hung = [i for i, t in enumerate(threads) if t.is_alive() and not net.lines[i].killed]
    assert not hung, f"members {hung} hung"
    survivors = [i for i in range(size) if not net.lines[i].killed]
    return {i: results[i] for i in survivors}


def _check(outcome: dict[int, list]) -> None:
    decisions = {tuple(v) for v in outcome.values()}
    assert len(decisions) == 1, outcome
    for value, failed in next(iter(decisions)):
        for i in outcome:
            assert not value & (1 << i), (i, bin(value))  # every survivor contributed
            assert i not in failed


def test_every_member_alive_gets_the_and():
    outcome = _run(5, {}, 0, rounds=3)
    assert all(v == [(ALL & ~0b11111, ())] * 3 for v in outcome.values()), outcome


@pytest.mark.parametrize("told", range(5))
def test_the_coordinator_dies_having_told_some(told):
    # Member 0 coordinates: 4 asks, then the decision to `told` members, then it dies.
    _check(_run(5, {0: 4 + told}, told))


@pytest.mark.parametrize("seed", range(60))
def test_members_die_after_any_message(seed):
    rng = random.Random(seed)
    size = rng.randint(2, 6)
    victims = rng.sample(range(size), rng.randint(1, size - 1))
    outcome = _run(size, {v: rng.randint(0, 2 * size) for v in victims}, seed, rounds=3)
    _check(outcome)


def test_the_decoder_takes_bytes_in_any_pieces():
    data = encode({"t": "ask", "k": 1}) + encode({"t": "decided", "value": -1, "failed": [2]})
    decoder, got = Decoder(), []
    for i in range(len(data)):
        got += decoder.feed(data[i:i + 1])
    assert got == [{"t": "ask", "k": 1}, {"t": "decided", "value": -1, "failed": [2]}]
    with pytest.raises(ValueError):
        Decoder().feed(encode([1, 2]))
    with pytest.raises(ValueError):
        Decoder().feed((1 << 30).to_bytes(4, "little"))


def test_a_message_a_handler_cannot_take_leaves_the_failure_detector_running():
    mine, theirs = socket.socketpair()
    line = Lifeline(0, {1: mine})
    taken = []

    def handle(sender, message):
        if "value" not in message:
            raise KeyError("value")
        taken.append(message["value"])
    line.handlers.append(handle)
    line.start()
    try:
        theirs.sendall(encode({"t": "contrib"}) + encode({"t": "contrib", "value": 7}))
        theirs.close()  # the peer dies after both
        with line.cv:
            assert line.cv.wait_for(lambda: 1 in line.dead, timeout=10), "the peer's death was never read"
        assert taken == [7]
    finally:
        line.close()
