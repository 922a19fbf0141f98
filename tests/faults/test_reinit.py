"""Re-initialization: init -> all_reduce -> destroy, again and again, on the same MASTER_PORT.

Rank 0 keeps the store until every rank has left; a rank that is quicker to init again must not
join that old store, but wait for the new one (torch.distributed allows this too).
"""

from __future__ import annotations

import numpy as np
import pytest

import allreduce as dist
from support.harness import free_port, run_ranks

CYCLES = 5


def _cycles(barrier: bool):
    def body(rank, size):
        sums = []
        for cycle in range(CYCLES):
            dist.init_process_group(init_method="env://", rank=rank, world_size=size, timeout=30)
            x = np.full(4, rank + cycle, np.float32)
            dist.all_reduce(x)
            if barrier:
                dist.barrier()
            dist.destroy_process_group()
            sums.append(float(x[0]))
        return sums
    return body


@pytest.mark.parametrize("barrier", [False, True], ids=["no-barrier", "barrier"])
def test_init_destroy_cycles_on_one_port(barrier):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    results = run_ranks(_cycles(barrier), 3, init=False, deadline=60, env=env)
    expected = [float(3 + 3 * cycle) for cycle in range(CYCLES)]  # 0+1+2 plus 3 * cycle
    assert results == [expected] * 3
