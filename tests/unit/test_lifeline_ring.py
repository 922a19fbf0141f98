"""The lifelines' ring failure detector, in one process: each process links only to its fingers (which
gather every address) when the lifelines form, and a death read by the ring neighbours reaches every
other process by word."""

from __future__ import annotations

import threading

from allreduce.rendezvous.store import HashStore
from allreduce.resilience.lifeline import Lifeline
from allreduce.security import Security


def _form(size: int) -> list[Lifeline]:
    store, lines = HashStore(), [None] * size

    def join(me: int) -> None:
        lines[me] = Lifeline.connect(store, me, size, "127.0.0.1", Security(), 20.0)
    threads = [threading.Thread(target=join, args=(me,)) for me in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(lines), "the lifelines did not form"
    for line in lines:
        line.start()
    return lines


def _links(line: Lifeline) -> set[int]:
    with line._links:
        return set(line._conns)


def _fingers(me: int, size: int) -> set[int]:
    """The ids ``me`` links to as the lifelines form: 1, 2, 4, ... places on and back on the ring."""
    return {(me + sign * (1 << k)) % size for k in range((size - 1).bit_length()) for sign in (1, -1)}


def test_each_process_links_only_to_its_fingers_and_knows_every_address():
    lines = _form(11)
    try:
        for me, line in enumerate(lines):
            assert _links(line) == _fingers(me, 11)
            assert sorted(line._addresses) == [i for i in range(11) if i != me]
    finally:
        for line in lines:
            line.close()


def test_a_death_reaches_every_survivor_and_the_ring_closes_around_it():
    lines = _form(9)
    try:
        lines[4].close()  # leaving is dying, to the others
        for me, line in enumerate(lines):
            if me != 4:
                with line.cv:
                    assert line.cv.wait_for(lambda line=line: 4 in line.dead, timeout=10), f"id {me} never heard"
        with lines[3].cv:
            assert lines[3].cv.wait_for(lambda: 5 in _links(lines[3]), timeout=10), "the ring was not relinked"
        assert all(len(_links(line)) <= 2 * 4 + 1 for line in lines)  # the fingers, one relinked, never all
    finally:
        for me, line in enumerate(lines):
            if me != 4:
                line.close()
