"""What a user sees: ``--version`` and ``info``, the debug log, condensed tracebacks, progress, argument
checks made before work starts, the algorithm ``bench`` ran, and a soak stopped by Ctrl-C."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from support.harness import free_port
from support.paths import SRC

import allreduce as dist
from allreduce import algorithms, cli, logs
from allreduce.cli import bench, checks, info, measuring
from allreduce.cli.progress import Progress
from allreduce.cli.tracebacks import Condenser
from allreduce.rendezvous import join
from allreduce.settings import Settings


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLREDUCE_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {**env, "PYTHONPATH": str(SRC), **extra}


def test_version_from_the_script_and_from_python_m(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"allreduce {dist.__version__}\n"
    done = subprocess.run([sys.executable, "-m", "allreduce", "--version"], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"allreduce {dist.__version__}\n")


def test_info_reports_versions_transports_profile_variables_and_launcher(tmp_path):
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "ALLREDUCE_SECRET": "hunter2",
           "ALLREDUCE_ALGO": "ring", "ALLREDUCE_PROFILE": str(tmp_path / "none.json"), "HOME": "/nowhere"}
    text = "\n".join(info.report(env))
    assert text.startswith(f"allreduce {dist.__version__}\npython {sys.version.split()[0]}")
    assert f"numpy {np.__version__}" in text and "ml_dtypes " in text and "torch " in text
    for transport in ("tcp", "shm", "memfd", "cma"):
        assert f"\n  {transport} " in text
    assert "ALLREDUCE_PROFILE names a missing file" in text
    assert "launcher environment: openmpi: rank 1 of 4" in text
    assert "ALLREDUCE_SECRET=(set, hidden)" in text and "hunter2" not in text
    assert "ALLREDUCE_ALGO=ring" in text and "OMPI_COMM_WORLD_SIZE=4" in text
    alone = "\n".join(info.report({}))
    assert "launcher environment: none" in alone and "variables set: none" in alone
    assert "built-in defaults" in "\n".join(info.report({"XDG_CACHE_HOME": str(tmp_path)}))


def test_the_info_command_runs():
    done = subprocess.run([sys.executable, "-m", "allreduce", "info"], env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"allreduce {dist.__version__}") and "transports here:" in done.stdout


def test_debug_levels_are_checked_where_the_environment_is_read():
    assert Settings.from_env({"ALLREDUCE_DEBUG": "detail"}).debug == "detail"
    with pytest.raises(ValueError, match="ALLREDUCE_DEBUG='LOUD' is not one of WARN, INFO, DETAIL"):
        Settings.from_env({"ALLREDUCE_DEBUG": "LOUD"})


def test_the_library_is_silent_unless_asked():
    logger = logging.getLogger("allreduce")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logs.DETAIL is False


DETAIL_SCRIPT = """
import numpy as np, allreduce as dist
dist.init_process_group()
x = np.arange(6, dtype=np.float32)
dist.all_reduce(x, algorithm="ring")
assert x.tolist() == [2.0 * i for i in range(6)]
dist.all_reduce(x)  # a small call left to the library: the shared-memory lines, logged as well
assert x.tolist() == [4.0 * i for i in range(6)]
dist.all_reduce(x)  # the shape again: its shortcut (compiled where the lines are), logged as well
assert x.tolist() == [8.0 * i for i in range(6)]
from allreduce.runtime import Shape
known = dist.default_group().shortcuts.get(Shape.all_reduce(x.dtype, 6, dist.ReduceOp.SUM))
assert known is not None and (known.retire is not None) == dist.default_group().compiled
dist.destroy_process_group()
"""


def test_detail_logs_rendezvous_transports_algorithms_and_each_collective_per_rank():
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "2", "--", sys.executable, "-c",
                           DETAIL_SCRIPT], env=_env(ALLREDUCE_DEBUG="DETAIL"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        mine = [line for line in done.stderr.splitlines() if line.startswith(f"[{rank}] ")]
        assert any(f"allreduce[{rank}] rank {rank}/2: rendezvous at TCPStore(127.0.0.1:" in line for line in mine), mine
        assert any(f"rank {rank}/2: all 2 ranks joined" in line for line in mine), mine
        assert any(f"rank {rank}/2 reaches ranks [{1 - rank}] by" in line for line in mine), mine
        assert any("all_reduce of 24 bytes (float32) runs ring" in line for line in mine), mine
        first = f"rank {rank}: all_reduce #1 ring count=6 float32 SUM root=0 digest="
        assert any(first in line and line.endswith(" us")
                   for line in mine), mine
        for seq in (2, 3):
            assert any(f"rank {rank}: all_reduce #{seq} lines count=6 float32 SUM root=0 digest=" in line
                       and line.endswith(" us") for line in mine), mine
    assert "hosted by this rank" in done.stderr


def test_a_rendezvous_missing_a_rank_says_so_while_it_waits(monkeypatch, caplog):
    monkeypatch.setattr(join, "REPORT_S", 0.3)
    caplog.set_level(logging.WARNING, logger="allreduce")
    with pytest.raises(dist.CommTimeout, match="1 of 2 ranks joined"):
        join.rendezvous(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=2, timeout=1.5)
    waits = [r.getMessage() for r in caplog.records if r.name == "allreduce.rendezvous"]
    assert len(waits) >= 2 and all("rank 0/2: waiting for ranks 1 to join" in w for w in waits), waits


CHAINED = b"""Traceback (most recent call last):
  File "/lib/allreduce/executor.py", line 103, in run
    self.transport.exchange(send_specs, recv_specs)
allreduce.errors.PeerLost: rank 1 exited or crashed (pid 4635)

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/home/me/train.py", line 6, in <module>
    dist.all_reduce(x)
  File "%s/api.py", line 203, in all_reduce
    return g.collective("all_reduce")
allreduce.errors.PeerLost: rank 0/3: all_reduce #2 (ring, step 2/4): rank 1 exited or crashed (pid 4635)
after the error
""" % os.path.dirname(dist.__file__).encode()


def _condensed(text: bytes) -> bytes:
    condenser = Condenser()
    out = [piece for line in text.splitlines(keepends=True) for piece in condenser.feed(line)]
    return b"".join(out + condenser.end())


def test_an_allreduce_error_becomes_one_line_with_the_users_frame():
    assert _condensed(b"before\n" + CHAINED) == (
        b"before\nPeerLost: rank 0/3: all_reduce #2 (ring, step 2/4): rank 1 exited or crashed (pid 4635) "
        b"(at /home/me/train.py:6, in <module>)\nafter the error\n")
    assert _condensed(CHAINED.rsplit(b"after", 1)[0]).count(b"\n") == 1  # ended by the end of the stream
    cut = CHAINED.split(b"  File", 1)[0]  # a worker stopped while it printed its traceback
    assert _condensed(b"before\n" + cut) == b"before\n(stopped while printing a traceback)\n"


def test_the_launcher_shows_a_mismatch_as_one_line_per_rank():
    script = "import numpy as np, allreduce as d; d.init_process_group(); d.all_reduce(np.ones(3 + d.get_rank()))"
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "2", "--", sys.executable, "-c", script],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(("[0] ", "[1] "))
             and not line.endswith("(stopped while printing a traceback)")]  # the rank stopped on the first's exit
    assert lines, done.stderr  # the rank that failed first printed before it exited (the other may be stopped)
    for line in lines:
        rank = int(line[1])
        assert line.startswith(f"[{rank}] Mismatch: rank {rank}/2: all_reduce #1 ("), done.stderr
        assert f"count {4 - rank} (expected {3 + rank})" in line and line.endswith("(at <string>:1, in <module>)")


def test_other_tracebacks_pass_through_whole():
    user_bug = b'Traceback (most recent call last):\n  File "t.py", line 4, in <module>\n    {}["k"]\nKeyError: \'k\'\n'
    assert _condensed(user_bug + b"next\n") == user_bug + b"next\n"
    interrupted = (b'Traceback (most recent call last):\n  File "t.py", line 9, in <module>\n'
                   b'    f()\nKeyboardInterrupt\n')
    assert _condensed(interrupted) == b"KeyboardInterrupt (at t.py:9, in <module>)\n"


def test_progress_prints_a_line_now_and_then_when_not_on_a_terminal(capsys):
    with Progress(10, "job", every_s=0.0) as progress:
        progress.print("row")
        progress.advance(4, "0 wrong")
    out, err = capsys.readouterr()
    assert out == "row\n" and err == "job: 4/10, 0 wrong\n"


def test_a_simulated_sweep_reports_each_result_as_it_goes():
    from allreduce.planner import costmodel
    from allreduce.sim.sweep import sweep

    seen = []
    table = sweep("all_reduce", ["ring", "tree"], [64, 4096], 4, costmodel.DEFAULT.network(), on_result=seen.append)
    assert len(seen) == 4 and seen == table["ring"] + table["tree"]


def test_output_paths_and_optional_packages_are_checked_before_work(tmp_path, capsys, monkeypatch):
    assert checks.output_file(str(tmp_path / "rows.json")) == str(tmp_path / "rows.json")
    with pytest.raises(argparse.ArgumentTypeError, match="there is no folder"):
        checks.output_file(str(tmp_path / "missing" / "rows.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="bfloat16 needs ml_dtypes: pip install ml_dtypes"):
        checks.dtype_name(["float32"])("bfloat16")
    monkeypatch.setattr(checks.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(argparse.ArgumentTypeError, match="plots need matplotlib"):
        checks.plot_file(str(tmp_path / "a.png"))
    monkeypatch.undo()
    plotting = importlib.util.find_spec("matplotlib") is not None  # without it, that is what --plot says first
    for argv, why in ((["bench", "-n", "2", "--json", str(tmp_path / "no" / "x.json")], "there is no folder"),
                      (["simulate", "-n", "8", "--sweep", "--plot", str(tmp_path / "no" / "x.png")],
                       "there is no folder" if plotting else "plots need matplotlib")):
        started = time.monotonic()
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2 and why in capsys.readouterr().err
        assert time.monotonic() - started < 5


def test_bench_names_the_algorithm_auto_ran():
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30)
    try:
        options = measuring.BenchOptions(iters=1, warmup=0)
        row = measuring.measure(dist, "all_reduce", 4096, "auto", options)
        fixed = measuring.measure(dist, "all_reduce", 4096, "ring", options)
    finally:
        dist.destroy_process_group()
    assert row.algorithm == "auto" and row.ran in algorithms.names("all_reduce")
    assert f"auto:{row.ran}" in bench.format_row(row)
    assert fixed.ran == "" and " ring " in bench.format_row(fixed)


def test_ctrl_c_in_soak_prints_the_tally_so_far_and_no_traceback():
    soak = subprocess.Popen([sys.executable, "-m", "allreduce", "soak", "-n", "2", "--ops", "1000000", "--seed", "3",
                             "--max-count", "256"], env=_env(ALLREDUCE_DEBUG="INFO"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        deadline = time.monotonic() + 60
        while sum("ranks joined" in line for line in seen) < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([soak.stderr], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                seen.append(soak.stderr.readline())
        time.sleep(1.0)  # both ranks are soaking
        soak.send_signal(signal.SIGINT)
        out, err = soak.communicate(timeout=60)
    finally:
        soak.kill()
    err = "".join(seen) + err
    assert soak.returncode == 130, err
    assert "got SIGINT" in err and "Traceback" not in err, err
    assert "allreduce soak: interrupted after " in err and "--seed 3 replays the same calls" in err
