"""The compiled lines engine: its layout is the Python engine's, ranks on different engines share one
group (the protocol is the same, word for word), every rank's result is the numpy reference with
the left fold's bits, pairs the kernels lack fall back to Python within the same group, and
``ALLREDUCE_ENGINE`` decides (``native`` without the build is an error naming why)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.harness import free_port, run_ranks
from support.reference import all_gather_misses, make_input, reduction_misses, same

import allreduce as dist
from allreduce import native
from allreduce.ops import ReduceOp
from allreduce.runtime import choice
from allreduce.settings import Settings
from allreduce.transport import shm
from allreduce.transport.shm import layout

_line_plans = pytest.importorskip("allreduce.native._line_plans", reason="the compiled engine is not built")
pytestmark = pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")


def test_the_layout_is_the_python_engines():
    for name, value in _line_plans.LAYOUT.items():
        assert getattr(layout, name) == value, name
    from allreduce import wire
    assert _line_plans.HEADER_SIZE == wire.HEADER_SIZE


def _mixed(rank: int, size: int) -> list[str]:
    """Rank 1 on the Python engine, the others in C; every collective the lines serve, both paths
    (one round, chunks), a complex PRODUCT (the Python plan inside the compiled engine), then a barrier."""
    os.environ["ALLREDUCE_ENGINE"] = "python" if rank == 1 else "native"
    os.environ["ALLREDUCE_SHM_LINE_MAX"] = os.environ["ALLREDUCE_SHM_LINE_CHUNK"] = "256"  # lines of 256 bytes:
    # one round up to 256 bytes a rank, many chunks above
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{_mixed.port}", rank=rank, world_size=size, timeout=30)
    wrong = []
    for dtype, op in [(np.float32, ReduceOp.SUM), (np.float16, ReduceOp.MAX), (np.int64, ReduceOp.PRODUCT),
                      (np.complex64, ReduceOp.PRODUCT), (np.float64, ReduceOp.AVG), (np.bool_, ReduceOp.MIN)]:
        dtype = np.dtype(dtype)
        for count in (0, 1, size - 1, 7, 61, 1031, 70_001):
            wrong += reduction_misses(rank, size, dtype, op, count)
        for count in (0, 3, 1000):
            x = make_input(dtype, count, rank)
            dist.broadcast(x, src=count % size)
            if not same(x, make_input(dtype, count, count % size)):
                wrong.append(f"broadcast {dtype} {count}")
            wrong += all_gather_misses(rank, size, dtype, count)
    dist.barrier()
    dist.destroy_process_group()
    return wrong


@pytest.mark.parametrize("size", [2, 3, 4])
def test_ranks_on_either_engine_share_a_group(size):
    _mixed.port = free_port()
    assert run_ranks(_mixed, size, init=False, deadline=240) == [[]] * size


def _engine_of(rank: int, size: int) -> str:
    from allreduce import roster

    group = roster.default_group()
    return group.algorithm_of("all_reduce", 4, np.float32), group.engine


def test_auto_runs_the_compiled_lines_and_python_when_asked(monkeypatch):
    monkeypatch.setenv("ALLREDUCE_ENGINE", "auto")
    assert run_ranks(_engine_of, 2) == [("lines", "native (compiled)")] * 2
    monkeypatch.setenv("ALLREDUCE_ENGINE", "python")
    assert run_ranks(_engine_of, 2) == [("lines", "python (ALLREDUCE_ENGINE=python)")] * 2
    for algorithm, engine in run_ranks(_engine_of, 2, env={"ALLREDUCE_TRANSPORT": "tcp"}):
        assert algorithm != "lines" and engine == "none (no shared-memory lines in this group)"


def test_native_without_the_build_is_an_error_naming_why(monkeypatch):
    monkeypatch.setattr(native, "load", lambda name: (None, "not built (No module named '_line_plans')"))
    with pytest.raises(ImportError, match="ALLREDUCE_ENGINE=native.*not built"):
        choice.lines_engine(None, Settings(engine="native"))
    assert choice.lines_engine(None, Settings(engine="auto"))[0] is None


def test_info_says_which_engine_runs_and_why(monkeypatch):
    from allreduce.cli import info

    assert info.engine({}).startswith("native for the shared-memory lines (compiled; ALLREDUCE_ENGINE=auto)")
    assert info.engine({"ALLREDUCE_ENGINE": "python"}) == "python (ALLREDUCE_ENGINE=python)"
    monkeypatch.setattr(native, "load", lambda name: (None, "not built (no compiler)"))
    assert info.engine({}) == "python (not built (no compiler))"
    assert info.engine({"ALLREDUCE_ENGINE": "native"}).startswith("none: ALLREDUCE_ENGINE=native, but the compiled")
