"""Destroying a group releases what it wrote to the store: a job that forms and destroys groups in a loop
stays within the store's limits.

(Before, every group left its keys, some 530 bytes per rank, in rank 0's store until every set was
refused.)
"""

from __future__ import annotations

import numpy as np
from support.harness import free_port, run_ranks

import allreduce as dist
from allreduce.rendezvous import StoreLimits, TCPStore

CYCLES = 300
LIMIT = 64 << 10  # bytes: what the world's own keys take, with room for a few groups, not for 300


def _cycles(port: int):
    def body(rank, size):
        store = TCPStore("127.0.0.1", port, is_server=rank == 0, timeout=30, world_size=size,
                         limits=StoreLimits(max_bytes=LIMIT))
        dist.init_process_group(store=store, rank=rank, world_size=size, timeout=30)
        for _ in range(CYCLES):
            group = dist.new_group()
            dist.destroy_process_group(group)
        x = np.ones(4, np.float32)
        group = dist.new_group()
        dist.all_reduce(x, group=group)  # the store still takes a group's keys
        dist.destroy_process_group(group)
        dist.barrier()
        left = [key for n in (1, CYCLES) for r in range(size) for key in (f"group{n}/host/{r}", f"group{n}/p2p/{r}")
                if store.check([key])]
        dist.destroy_process_group()
        return float(x[0]), left
    return body


def test_destroyed_groups_leave_no_keys_in_the_store():
    results = run_ranks(_cycles(free_port()), 2, timeout=30, deadline=240, init=False)
    assert results == [(2.0, []), (2.0, [])]
