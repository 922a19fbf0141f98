"""Ranks for the TensorFlow tests: *spawned* interpreters (a process forked after TensorFlow has started
its threads may hang), each inside ``hvd.init()``, running module-level functions.

One spawn runs a list of scenarios (``fn(rank, size) -> picklable``) and returns, per rank, a dict of
their results: importing TensorFlow takes seconds, so a test module spawns its ranks once.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback

from support.harness import Hung, RankFailed, free_port


def run_scenarios(scenarios, size: int, deadline: float = 240.0) -> list[dict]:
    """``{fn.__name__: fn(rank, size)}`` for every rank, in rank order (``fn`` module-level)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(scenarios, rank, size, port, results), daemon=True)
             for rank in range(size)]
    for p in procs:
        p.start()
    outcome: dict = {}
    try:
        for _ in range(size):
            rank, ok, value = results.get(timeout=deadline)
            outcome[rank] = (ok, value)
    except queue.Empty:
        raise Hung(f"ranks {sorted(set(range(size)) - set(outcome))} did not finish in {deadline}s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    errors = {r: value for r, (ok, value) in outcome.items() if not ok}
    if errors:
        raise RankFailed(errors)
    return [outcome[r][1] for r in range(size)]


def _rank(scenarios, rank, size, port, results):
    try:
        import tensorflow as tf

        import allreduce
        import allreduce.tensorflow as hvd

        tf.config.threading.set_intra_op_parallelism_threads(1)
        allreduce.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=60)
        hvd.init()
        try:
            results.put((rank, True, {fn.__name__: fn(rank, size) for fn in scenarios}))
        finally:
            hvd.shutdown()
            allreduce.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which raises RankFailed
        results.put((rank, False, (type(exc).__name__, str(exc), traceback.format_exc())))
