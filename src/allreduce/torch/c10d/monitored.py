"""torch's monitored barrier (Gloo's semantics and wording), held on the group's store.

Rank 0 waits for every other rank to check in, in rank order, with one deadline for all of them (or,
with ``wait_all_ranks``, a whole timeout for each); a rank that does not arrive in time is named, so a
hung job says *which* rank is stuck, as Gloo's does::

    [Rank 0]: Rank 2 failed to pass monitoredBarrier in 30000 ms
    [Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 30000 ms    (wait_all_ranks=True)
    Rank 0 timed out in monitoredBarrier after 30000 ms.                  (no time left for the next rank)

Once all have arrived, rank 0 releases them. The store carries it, not the group's links, so a
barrier that names a stuck rank neither waits behind queued collectives nor breaks the group.
"""

from __future__ import annotations

import time

from ...errors import CommTimeout


def barrier(group, number: int, timeout: float, wait_all_ranks: bool = False) -> None:
    """Monitored barrier number ``number`` of ``group`` (counted alike on every rank), within ``timeout`` s.

    Raises:
        CommTimeout: on rank 0, naming the first rank (or, with ``wait_all_ranks``, every rank) that
            did not arrive in time; on the others, when rank 0 did not release them in time.
    """
    store = group.store.prefix(f"monitored_barrier/{number}")
    ms = round(timeout * 1000)
    if group.rank != 0:
        store.set(f"arrived/{group.rank}", b"1")
        try:
            store.wait(["released"], timeout)
        except CommTimeout as exc:
            raise CommTimeout(f"Rank {group.rank} successfully reached monitoredBarrier, but received errors "
                              "while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                              f"rank. ({exc})") from exc
        return
    start, arrived = time.monotonic(), []
    for rank in range(1, group.size):
        # Gloo's budget: one timeout for all the ranks, or (wait_all_ranks) a whole one for each
        left = timeout if wait_all_ranks else timeout - (time.monotonic() - start)
        if left <= 0 and not wait_all_ranks:
            done = f"Successfully processed ranks: {', '.join(map(str, arrived))}" if arrived else \
                "No ranks successfully processed in monitoredBarrier."
            raise CommTimeout(f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n{done}")
        try:
            store.wait([f"arrived/{rank}"], left)
            arrived.append(rank)
        except CommTimeout:
            if not wait_all_ranks:
                raise CommTimeout(f"[Rank 0]: Rank {rank} failed to pass monitoredBarrier in {ms} ms") from None
    missing = [rank for rank in range(1, group.size) if rank not in arrived]
    if missing:
        raise CommTimeout(f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms")
    store.set("released", b"1")
