"""The table of facts about collectives agrees with everything that reads it."""

from __future__ import annotations

import pytest

from allreduce import algorithms, collectives, wire
from allreduce.errors import Mismatch, ProtocolError


def test_bus_factor_is_nccl_tests():
    def bus(name, n):
        return collectives.get(name).bus_factor(n)
    assert bus("all_reduce", 4) == 1.5
    assert bus("all_reduce", 1) == 0.0
    for name in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        assert bus(name, 4) == 0.75
    assert bus("reduce", 8) == bus("broadcast", 8) == 1.0


def test_unknown_collective_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown collective 'gossip'; known: all_reduce"):
        collectives.get("gossip")


def test_codes_are_unique_and_every_registry_collective_has_facts():
    assert len({c.code for c in collectives.BY_NAME.values()}) == len(collectives.NAMES)
    assert set(algorithms.COLLECTIVES) | {"send"} == set(collectives.NAMES)


@pytest.mark.parametrize("name", collectives.NAMES)
def test_a_header_carries_the_collective_by_its_code(name):
    code = collectives.get(name).code
    header = wire.Header(wire.DATA, code, 0, 0, 0, 0, 1, 2, 3)
    assert wire.decode(wire.encode(header)).collective == code


@pytest.mark.parametrize("name,nbytes,size,count", [
    ("all_reduce", 40, 4, 10), ("reduce_scatter", 40, 4, 2), ("all_gather", 4, 8, 1),
    ("barrier", 64, 2, 0), ("broadcast", 7, 3, 1),
])
def test_count_for_is_elements_per_block_for_split_collectives(name, nbytes, size, count):
    assert collectives.get(name).count_for(nbytes, size, 4) == count


def test_the_wire_knows_collectives_only_by_the_table():
    unknown = max(collectives.BY_CODE) + 1
    with pytest.raises(ProtocolError, match=f"unknown collective code {unknown}"):
        wire.decode(wire.encode(wire.Header(wire.DATA, unknown, 0, 0, 0, 0, 1, 2, 3)))
    expected = wire.Header(wire.DATA, collectives.get("broadcast").code, 0, 0, 0, 0, 1, 2, 3)
    with pytest.raises(Mismatch, match=r"collective scatter \(expected broadcast\)"):
        wire.check(expected, expected._replace(collective=collectives.get("scatter").code))
