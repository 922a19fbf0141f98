"""``allreduce bench``: sizes, bandwidth factors, expected values and the table, without processes.

The sweep runs against a fake API whose ranks are threads and whose collectives are plain numpy over
every rank's input, so the bench's own arithmetic (buffer layout, expected results, verdicts) is tested
on several world sizes before any transport exists. One end-to-end test runs the real command.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from support.paths import SRC
from allreduce import cli, collectives, native
from allreduce.cli import bench, measuring
from allreduce.cli.measuring import BenchOptions, parse_size, sizes
from allreduce.ops import ReduceOp, finish, reduce_into



@pytest.mark.parametrize("text, expected", [
    ("8", 8), ("0", 0), ("64K", 65536), ("64k", 65536), ("64M", 64 * 2**20), ("1G", 2**30),
    ("64KiB", 65536), ("2MiB", 2 * 2**20), ("1GiB", 2**30), ("16MB", 16 * 2**20), ("100B", 100),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "1.5M", "12Q", "-1", "1 T", "KiB8"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_sizes():
    assert sizes(8, 64, 2) == [8, 16, 32, 64]
    assert sizes(8, 100, 4) == [8, 32]
    assert sizes(0, 4, 2) == [0, 1, 2, 4]
    assert sizes(5, 5, 2) == [5]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"collectives": ("gossip",)}, ValueError, "unknown collective"),
    ({"min_bytes": 64, "max_bytes": 8}, ValueError, "sizes"),
    ({"factor": 1}, ValueError, "factor"),
    ({"iters": 0}, ValueError, "iters"),
    ({"algorithms": ()}, ValueError, "algorithm"),
    ({"dtype": "int32", "op": "avg"}, TypeError, "AVG"),
    ({"dtype": "float32", "op": "band"}, TypeError, "BAND"),
    ({"dtype": ">f4"}, TypeError, "not supported"),
])
def test_options_refuse(kwargs, error, match):
    with pytest.raises(error, match=match):
        BenchOptions(**kwargs)


def test_options_normalize_names():
    options = BenchOptions(dtype="float16", op="max", collectives=("broadcast",))
    assert options.dtype == np.float16 and options.op is ReduceOp.MAX
    # an op that makes no sense for the dtype is fine when nothing reduces
    assert BenchOptions(dtype="int8", op="avg", collectives=("broadcast",)).op is ReduceOp.AVG


def _parse(argv):
    return cli.build_parser().parse_args(["bench", *argv])


@pytest.mark.parametrize("options", [
    BenchOptions(),
    BenchOptions(collectives=measuring.COLLECTIVES, min_bytes=0, max_bytes=2**30, factor=4, iters=3, warmup=0,
                 dtype="bfloat16", op="max", algorithms=("ring", "tree"), check=False),
    BenchOptions(collectives=("broadcast", "all_gather"), dtype="int8", op="bxor", algorithms=("all",)),
])
def test_to_argv_round_trips(options):
    assert bench.options_from_args(_parse(bench.to_argv(options))) == options


def test_command_line_defaults_and_errors(capsys):
    options = bench.options_from_args(_parse(["-e", "64KiB", "--algorithm", "ring, tree"]))
    assert (options.min_bytes, options.max_bytes, options.algorithms) == (8, 65536, ("ring", "tree"))
    assert options.collectives == ("all_reduce",) and options.iters == 20 and options.warmup == 5
    assert bench.options_from_args(_parse(["--collective", "all"])).collectives == measuring.COLLECTIVES
    bad = ((["-b", "1Q"], "not a size"), (["-f", "1"], "at least 2"), (["--dtype", "float8"], "unknown dtype 'float8'"))
    for argv, match in bad:
        with pytest.raises(SystemExit) as exit_info:
            _parse(argv)
        assert exit_info.value.code == 2 and match in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--dtype", "int32", "--op", "avg"])
    assert "AVG is not defined for dtype int32" in capsys.readouterr().err


def test_table_lines_align():
    row = measuring.Row("all_reduce", 1024, 256, "float32", "sum", "ring", 12.345, 0.083, 0.124, True)
    header, line = bench.format_header(), bench.format_row(row)
    assert header.startswith("#") and len(header) == len(line)
    assert line.split() == ["1024", "256", "float32", "sum", "ring", "12.35", "0.083", "0.124", "ok"]
    assert bench.format_row(measuring.Row(**{**row.__dict__, "correct": False})).endswith("WRONG")
    assert bench.format_row(measuring.Row(**{**row.__dict__, "correct": None})).endswith("-")
    assert bench.format_summary([row])[0].startswith("# avg busbw: 0.124 GB/s")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float16", "bfloat16", "float32", "complex64", "bool"])
@pytest.mark.parametrize("world", [1, 2, 7, 40])
def test_expected_values_are_exact(dtype, world):
    """The reduction of the patterns in the dtype equals the exact reduction of the integers."""
    dt = np.dtype(dtype)
    ops = [op for op in ReduceOp if _defined(op, dt)]
    for op in ops:
        pattern = measuring._pattern(op, world, dt)
        ints = [pattern.values(r, 0, pattern.period).real.astype(np.int64) for r in range(world)]
        exact = ints[0].copy()
        for x in ints[1:]:
            reduce_into(ReduceOp.SUM if op is ReduceOp.AVG else op, exact, x)
        assert np.array_equal(exact.astype(dt).real.astype(np.int64), exact), f"{op.name} overflows {dt}"
        want = exact.astype(dt)
        finish(op, want, world)
        assert np.array_equal(pattern.reduced(op, world, 0, pattern.period), want), op


def _defined(op, dtype):
    from allreduce.ops import allowed_ops

    return op in allowed_ops(dtype)


class FakeWorld:
    """``size`` ranks as threads: each collective swaps every rank's input at a barrier, then uses numpy."""

    def __init__(self, size: int, wrong_rank: int | None = None):
        self.size = size
        self.wrong_rank = wrong_rank  # this rank's all_reduce result is off by one
        self.barrier = threading.Barrier(size, timeout=20)
        self.slots = [None] * size
        self.calls: list[tuple] = []

    def rank(self, rank: int) -> FakeRank:
        return FakeRank(self, rank)

    def exchange(self, rank, value):
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values


class FakeRank:
    algorithms = SimpleNamespace(names=lambda c: ("ring", "tree") if c in ("all_reduce", "reduce") else ("ring",))

    def __init__(self, world: FakeWorld, rank: int):
        self.world, self.rank = world, rank

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world.size

    def barrier(self):
        self.world.exchange(self.rank, None)

    def _reduced(self, x, op):
        values = self.world.exchange(self.rank, x.copy())
        acc = values[0].copy()
        for v in values[1:]:
            reduce_into(op, acc, v)
        finish(op, acc, self.world.size)
        return acc

    def all_reduce(self, x, op=ReduceOp.SUM, algorithm="auto"):
        self.world.calls.append(("all_reduce", algorithm))
        x[...] = self._reduced(x, op)
        if self.rank == self.world.wrong_rank and x.dtype != np.float64:  # spare the timing all-reduce
            x[-1] += 1

    def reduce(self, x, dst, op=ReduceOp.SUM, algorithm="auto"):
        result = self._reduced(x, op)
        if self.rank == dst:
            x[...] = result
        else:
            x[...] = 0  # a non-root's buffer is scratch

    def broadcast(self, x, src, algorithm="auto"):
        x[...] = self.world.exchange(self.rank, x.copy())[src]

    def all_gather_into_tensor(self, out, x, algorithm="auto"):
        out[...] = np.concatenate(self.world.exchange(self.rank, x.copy()))

    def reduce_scatter_tensor(self, out, x, op=ReduceOp.SUM, algorithm="auto"):
        n = len(out)
        out[...] = self._reduced(x, op)[self.rank * n:(self.rank + 1) * n]

    def all_to_all_single(self, out, x, algorithm="auto"):
        n = len(x) // self.world.size
        values = self.world.exchange(self.rank, x.copy())
        out[...] = np.concatenate([v[self.rank * n:(self.rank + 1) * n] for v in values])


def _sweep_all(world: FakeWorld, options: BenchOptions) -> list[list[measuring.Row]]:
    results, errors = [None] * world.size, []

    def rank_main(rank):
        try:
            results[rank] = measuring.sweep(world.rank(rank), options)
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("world_size", [1, 3, 4])
@pytest.mark.parametrize("dtype, op", [("float32", "sum"), ("int8", "max"), ("bfloat16", "avg"),
                                       ("complex64", "product"), ("bool", "bxor"), ("uint16", "min")])
def test_sweep_every_collective_is_right(world_size, dtype, op):
    options = BenchOptions(collectives=measuring.COLLECTIVES, min_bytes=1, max_bytes=3000, factor=7, iters=2, warmup=1,
                           dtype=dtype, op=op)
    per_rank = _sweep_all(FakeWorld(world_size), options)
    rows = per_rank[0]
    assert all(r == rows for r in per_rank), "every rank returns the same rows"
    assert [r.collective for r in rows] == [c for c in measuring.COLLECTIVES for _ in sizes(1, 3000, 7)]
    assert all(r.correct for r in rows), [r for r in rows if not r.correct]
    itemsize = np.dtype(dtype).itemsize
    for row in rows:
        assert row.size == row.count * itemsize and row.count >= 1 and row.time_us > 0
        if row.collective in ("reduce_scatter", "all_gather", "all_to_all"):
            assert row.count % world_size == 0
        assert row.busbw == pytest.approx(row.algbw * collectives.get(row.collective).bus_factor(world_size))
        assert row.op == (op if row.collective in ("all_reduce", "reduce", "reduce_scatter") else "none")


def test_sweep_marks_a_wrong_rank_on_every_rank():
    options = BenchOptions(min_bytes=64, max_bytes=256, iters=2, warmup=0, dtype="int32")
    per_rank = _sweep_all(FakeWorld(3, wrong_rank=2), options)
    assert all(row.correct is False for rows in per_rank for row in rows)


def test_sweep_without_check():
    options = BenchOptions(min_bytes=64, max_bytes=64, iters=1, warmup=0, check=False)
    assert _sweep_all(FakeWorld(2, wrong_rank=1), options)[0][0].correct is None


def test_plan_algorithms():
    api = FakeWorld(1).rank(0)
    options = BenchOptions(collectives=("all_reduce", "all_gather"), min_bytes=8, max_bytes=16,
                           algorithms=("auto", "tree"))
    assert measuring.plan(api, options) == [("all_reduce", 8, "auto"), ("all_reduce", 8, "tree"),
                                        ("all_reduce", 16, "auto"), ("all_reduce", 16, "tree"),
                                        ("all_gather", 8, "auto"), ("all_gather", 16, "auto")]
    every = measuring.plan(api, BenchOptions(min_bytes=8, max_bytes=8, algorithms=("all",)))
    assert [a for _, _, a in every] == ["ring", "tree"]
    with pytest.raises(ValueError, match="'?warp'? is not registered .*registered: ring, tree"):
        measuring.plan(api, BenchOptions(algorithms=("ring", "warp")))


def test_sweep_passes_the_algorithm():
    world = FakeWorld(1)
    options = BenchOptions(min_bytes=8, max_bytes=8, iters=1, warmup=0, algorithms=("auto", "ring"))
    measuring.sweep(world.rank(0), options)
    assert ("all_reduce", "ring") in world.calls and ("all_reduce", "auto") in world.calls


def _api_missing() -> bool:
    try:
        importlib.import_module("allreduce.api")
    except ImportError:
        return True
    return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(_api_missing(), reason="allreduce.api cannot be imported: bench needs the collective API")
def test_bench_end_to_end(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "-m", "allreduce", "bench", "-n", "2", "-b", "8", "-e", "64K", "--iters", "3", "--warmup", "1",
         "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == len(sizes(8, 65536, 2)) and all(line.split()[-1] == "ok" for line in lines), proc.stdout
    assert "busbw(GB/s)" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(lines) and all(r["correct"] for r in rows)


@pytest.mark.timeout(120)
@pytest.mark.skipif(_api_missing(), reason="allreduce.api cannot be imported: bench needs the collective API")
@pytest.mark.parametrize("env, engines", [
    ({"ALLREDUCE_ENGINE": "python"},
     "lines python (ALLREDUCE_ENGINE=python), schedules python (ALLREDUCE_ENGINE=python)"),
    ({"ALLREDUCE_ENGINE": "native"}, "lines native (compiled), schedules python (the links are not all plain TCP)"),
    ({"ALLREDUCE_ENGINE": "native", "ALLREDUCE_TRANSPORT": "tcp"},
     "lines none (no shared-memory lines in this group), schedules native (compiled; every link plain TCP)"),
])
def test_bench_says_which_engines_ran(env, engines):
    if env["ALLREDUCE_ENGINE"] == "native" and native.load("line_plans")[0] is None:
        pytest.skip("the compiled engine is not built here")
    proc = subprocess.run([sys.executable, "-m", "allreduce", "bench", "-n", "2", "-b", "8", "-e", "8", "--iters", "1"],
                          env={**os.environ, "PYTHONPATH": str(SRC), **env}, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"# engine: {engines}\n" in proc.stdout
