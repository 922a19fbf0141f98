"""Every collective against the numpy reference, on real processes over TCP, world sizes 1 to 8.

Each world size is one group of forked ranks that runs its whole matrix (dtype x op x count x
algorithm x root) and returns the cases that went wrong, so process start-up is paid once per size.
"""

from __future__ import annotations

import pytest

from support import engines
from support.harness import run_ranks
from support.matrices import all_reduce_matrix, block_matrix, rooted_matrix

WORLD_SIZES = range(1, 9)


# Ranks of one host use shared memory by default; TCP gets the same matrices, on both engines, on the
# sizes that break naive code most (prime, not a power of two, largest).
CASES = [(size, "auto") for size in WORLD_SIZES]
TCP_SIZES = (2, 3, 5, 8)


@pytest.mark.parametrize("size,transport", CASES)
def test_all_reduce_every_dtype_op_count_algorithm(size, transport):
    wrong = run_ranks(all_reduce_matrix, size, deadline=240, env={"ALLREDUCE_TRANSPORT": transport})
    assert wrong == [[]] * size


@pytest.mark.parametrize("size,transport", CASES)
def test_rooted_collectives(size, transport):
    wrong = run_ranks(rooted_matrix, size, deadline=240, env={"ALLREDUCE_TRANSPORT": transport})
    assert wrong == [[]] * size


@pytest.mark.parametrize("size,transport", CASES)
def test_block_collectives(size, transport):
    wrong = run_ranks(block_matrix, size, deadline=240, env={"ALLREDUCE_TRANSPORT": transport})
    assert wrong == [[]] * size


def _every_matrix(rank, size):
    return all_reduce_matrix(rank, size) + rooted_matrix(rank, size) + block_matrix(rank, size)


@engines.BOTH
@pytest.mark.parametrize("size", TCP_SIZES)
def test_every_collective_over_tcp(size):
    wrong = run_ranks(_every_matrix, size, deadline=400, env={"ALLREDUCE_TRANSPORT": "tcp"})
    assert wrong == [[]] * size
