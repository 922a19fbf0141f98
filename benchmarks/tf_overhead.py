"""What the TensorFlow face adds to a small all-reduce: ``hvd.allreduce`` against the numpy call, same group.

Run under the launcher (every rank times; rank 0 prints), with TensorFlow installed::

    allreduce run -n 2 -- python benchmarks/tf_overhead.py
    allreduce run -n 2 -- python benchmarks/tf_overhead.py --bytes 8 4096 --calls 2000

Per size, batches of each kind of call alternate; the table shows rank 0's median microseconds per
call over the batches, and the 90th percentile of the batches' means:

- ``numpy``: ``allreduce.all_reduce(array)`` (Sum) on a float32 numpy array;
- ``eager``: ``hvd.allreduce(tensor, op=hvd.Sum)`` in eager mode;
- ``tf.function``: a ``tf.function`` that makes ``CALLS_PER_STEP`` ``hvd.allreduce(tensor, op=hvd.Sum)``
  (one ``tf.numpy_function`` op each, chained in program order), timed per all-reduce.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

BATCH = 50  # calls per timed batch
CALLS_PER_STEP = 10  # all-reduces per tf.function call: its own dispatch is shared by these


def _batches(call, calls: int, per_call: int = 1) -> list[float]:
    """Microseconds per all-reduce of each batch of ``BATCH`` calls (``per_call`` all-reduces each)."""
    out = []
    for _ in range(max(1, calls // (BATCH * per_call))):
        start = time.perf_counter()
        for _ in range(BATCH):
            call()
        out.append((time.perf_counter() - start) / (BATCH * per_call) * 1e6)
    return out


def _kinds(nbytes: int, tf, hvd, allreduce) -> dict:
    """The calls to time for ``nbytes``: name -> (call, all-reduces per call)."""
    array = np.ones(nbytes // 4, np.float32)
    tensor = tf.constant(array)

    @tf.function
    def step(x):
        for _ in range(CALLS_PER_STEP):
            x = hvd.allreduce(x, op=hvd.Sum) * 0.5
        return x

    return {"numpy": (lambda: allreduce.all_reduce(array), 1),
            "eager": (lambda: hvd.allreduce(tensor, op=hvd.Sum), 1),
            "tf.function": (lambda: step(tensor), CALLS_PER_STEP)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", default=[8])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import tensorflow as tf

    import allreduce
    import allreduce.tensorflow as hvd

    hvd.init()
    for nbytes in args.bytes:
        kinds = _kinds(nbytes, tf, hvd, allreduce)
        for call, _ in kinds.values():  # warm up: trace the function, plan the shape
            for _ in range(20):
                call()
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind, (call, per_call) in kinds.items():
                times[kind] += _batches(call, args.calls // args.rounds, per_call)
        if hvd.rank() == 0:
            print(f"{nbytes} bytes, {hvd.size()} ranks: microseconds per all-reduce (median, 90th percentile of "
                  "batch means)")
            for kind, got in times.items():
                print(f"  {kind:12s} {statistics.median(got):9.1f} {statistics.quantiles(got, n=10)[-1]:9.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
