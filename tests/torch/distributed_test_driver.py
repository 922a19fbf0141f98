"""torch's own distributed test base, ``DistributedTest._DistTestBase``, on the "allreduce" backend.

Driven the way upstream ``test/distributed/test_distributed_spawn.py`` and the UCC plugin's driver
drive it: every test starts ``WORLD_SIZE`` ranks that join on a ``file://`` store. torch gates most
CPU tests on the literal name "gloo", both when the module is imported (skip decorators) and while
the tests run (``if BACKEND == "gloo"`` picks the CPU model, the expected values). So the tests run
as for ``BACKEND=gloo`` and the backend under test is swapped in where the ranks' process group is
made: ``init_process_group(backend="gloo")`` forms an "allreduce" group, and so does every subgroup
that inherits its backend. A test that asks for ``new_group(backend="gloo")`` itself still gets Gloo.
The backend's features are declared in ``DistTestCases`` as torch's plugin drivers declare theirs.

Run it with pytest (``make torch-conformance`` runs all of it)::

    BACKEND_UNDER_TEST=allreduce WORLD_SIZE=2 python -m pytest tests/torch/distributed_test_driver.py
    BACKEND_UNDER_TEST=gloo WORLD_SIZE=2 python -m pytest tests/torch/distributed_test_driver.py

Ranks are spawned, as upstream does; each then imports torch's test modules again (about ten seconds a
test on two cores). ``CONFORMANCE_START=fork`` forks them from the loaded driver instead (a second),
which is what the CI share and the make target use: these are CPU-only runs, where forking is safe.

:data:`CI_SELECTION` is the share ``tests/torch/test_torch_conformance.py`` runs in CI, and
:data:`SKIPPED` the tests skipped on purpose, each with its reason.
"""

from __future__ import annotations

import os
import unittest

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it (the dev extra installs it)

BACKEND = os.environ.setdefault("BACKEND_UNDER_TEST", "allreduce")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ["BACKEND"] = "gloo"  # how torch's decorators gate, at import (see the module docstring)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

if BACKEND != "gloo":
    import allreduce.torch  # noqa: F401  (registers the backend; torch's autoload does too)

    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add(BACKEND)
    _init_process_group = dist.init_process_group

    def _swapped(*args, backend=None, **kwargs):
        """torch's init_process_group, with the backend under test where a test asks for Gloo."""
        return _init_process_group(*args, backend=BACKEND if backend == "gloo" else backend, **kwargs)

    dist.init_process_group = _swapped

# Skipped on purpose when testing "allreduce", and why. (Tests torch skips itself are not listed.)
SKIPPED = {
    "test_monitored_barrier_gloo": "torch's dist.monitored_barrier accepts Gloo alone by name; "
    "ours is group.monitored_barrier (tests/torch/test_torch_c10d.py)",
    "test_monitored_barrier_gloo_subgroup": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_allreduce_hang": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_allreduce_hang_wait_all_ranks": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_failure_order": "as test_monitored_barrier_gloo",
    "test_monitored_barrier_wait_all_ranks": "as test_monitored_barrier_gloo",
}

# The share CI runs (a few minutes): one test of each kind of call torch makes of a backend.
CI_SELECTION = [
    "test_all_reduce_sum", "test_sparse_all_reduce_sum", "test_all_reduce_coalesced_max", "test_broadcast",
    "test_all_gather_coalesced_simple", "test_gather", "test_scatter", "test_batch_isend_irecv_gloo", "test_get_future",
    "test_barrier_timeout_full_group", "test_destroy_group",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_monitored_barrier_gloo_rank_0_timeout",
]


class TestDistBackendWithSpawn(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("CONFORMANCE_START") == "fork":  # ranks start in a second, not ten (CPU only)
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if BACKEND != "gloo":
    for _name, _why in SKIPPED.items():
        if hasattr(TestDistBackendWithSpawn, _name):
            setattr(TestDistBackendWithSpawn, _name, unittest.skip(_why)(getattr(TestDistBackendWithSpawn, _name)))
