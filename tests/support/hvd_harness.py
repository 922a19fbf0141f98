"""Ranks for the Horovod API tests: forked by :func:`torch_harness.run_ranks`, each inside ``hvd.init()``
and ``hvd.shutdown()``, returning torch tensors.

A tensor put on a multiprocessing queue travels as a shared-memory handle that dies with its rank, so
each rank's result is pickled to bytes first (tensors included, by value).
"""

from __future__ import annotations

import pickle

from support.torch_harness import run_ranks

import allreduce.torch as hvd


def run_hvd(fn, size: int, **kwargs) -> list:
    """``fn(rank, size)`` on ``size`` ranks between ``hvd.init()`` and ``hvd.shutdown()``; the results."""

    def inside(rank, world):
        hvd.init()
        try:
            return pickle.dumps(fn(rank, world))
        finally:
            hvd.shutdown()

    return [pickle.loads(result) for result in run_ranks(inside, size, **kwargs)]
