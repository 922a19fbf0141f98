"""Point-to-point matching without processes or sockets: MPI's rules on the pure matcher."""

from __future__ import annotations

import random

from allreduce.p2p.matching import Envelope, Matcher, Receive


def test_a_message_goes_to_the_earliest_posted_receive_that_accepts_it():
    m = Matcher()
    wild, exact, any_tag = Receive(None, None), Receive(1, 5), Receive(1, None)
    for r in (exact, wild, any_tag):
        assert m.post(r) is None
    assert m.arrive(Envelope(1, 5)) is exact
    assert m.arrive(Envelope(1, 5)) is wild
    assert m.arrive(Envelope(1, 6)) is any_tag
    assert m.arrive(Envelope(2, 6)) is None  # nobody left for it: unexpected
    assert m.unexpected_count() == 1


def test_a_receive_takes_the_earliest_message_it_accepts():
    m = Matcher()
    first, second, third = Envelope(2, 7), Envelope(1, 7), Envelope(2, 8)
    for e in (first, second, third):
        assert m.arrive(e) is None
    assert m.peek(None, 8) is third  # left in place
    assert m.post(Receive(None, 7)) is first
    assert m.post(Receive(2, None)) is third
    assert m.post(Receive(None, None)) is second
    assert m.post(Receive(None, None)) is None and m.unexpected_count() == 0


class Numbered(Envelope):
    __slots__ = ("number",)

    def __init__(self, source: int, tag: int, number: int):
        super().__init__(source, tag)
        self.number = number


def test_messages_with_one_source_and_tag_never_overtake_each_other():
    rng = random.Random(5)
    m = Matcher()
    sent = {(s, t): [] for s in range(3) for t in range(3)}
    got = {key: [] for key in sent}
    number = 0
    for _ in range(2000):
        if rng.random() < 0.5:
            s, t = rng.randrange(3), rng.randrange(3)
            number += 1
            message = Numbered(s, t, number)
            sent[(s, t)].append(number)
            receive = m.arrive(message)
            if receive is not None:
                got[(s, t)].append(number)
        else:
            receive = Receive(rng.choice([None, 0, 1, 2]), rng.choice([None, 0, 1, 2]))
            message = m.post(receive)
            if message is not None:
                got[(message.source, message.tag)].append(message.number)
    for key in sent:
        assert got[key] == sent[key][:len(got[key])], key  # in order, a prefix of what was sent


def test_a_failed_receive_can_be_withdrawn():
    m = Matcher()
    r = Receive(0, 1)
    m.post(r)
    m.withdraw(r)
    assert m.posted() == [] and m.arrive(Envelope(0, 1)) is None
