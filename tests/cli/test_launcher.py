"""``allreduce run``: the environment each worker gets, tagged output, and stopping a job as a whole.

The workers are tiny ``python -c`` scripts (no collective API needed); the launcher runs as a real
``python -m allreduce run`` process, so signals and exit codes are the ones a user sees. Workers that
must be stopped write their pid to a file first, so the test can check they are really gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.paths import SRC
from allreduce import cli
from allreduce.cli.launcher import LaunchConfig, launch, worker_env

PRINT_ENV = (
    "import json, os; keys = 'RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT "
    "ALLREDUCE_JOB_ID PYTHONUNBUFFERED'.split(); print(json.dumps({k: os.environ.get(k) for k in keys}))"
)
# Publish our pid as DIR/RANK.pid, wait until every rank has, then exit with the code given for our
# rank (arguments RANK=CODE) or sleep for a minute.
WORKER = """
import os, signal, sys, time
{setup}
rank, directory = os.environ["RANK"], sys.argv[1]
with open(os.path.join(directory, rank + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(directory, rank + ".tmp"), os.path.join(directory, rank + ".pid"))
while len([name for name in os.listdir(directory) if name.endswith(".pid")]) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.02)
codes = dict(arg.split("=") for arg in sys.argv[2:])
sys.exit(int(codes[rank])) if rank in codes else time.sleep(60)
"""


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("ALLREDUCE_")}
    return {**env, "PYTHONPATH": str(SRC), **extra}


def _run(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allreduce", "run", *args], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allreduce", "run", *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _envs(stdout: str) -> dict[int, dict]:
    """The environments the PRINT_ENV workers reported, by the rank in their output tag."""
    out = {}
    for line in stdout.splitlines():
        tag, _, payload = line.partition(" ")
        out[int(tag.strip("[]"))] = json.loads(payload)
    return out


def _pids(directory: Path, count: int, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(files := sorted(directory.glob("*.pid"))) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(files)} of {count} workers started")
        time.sleep(0.05)
    return [int(f.read_text()) for f in files]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited; a zombie counts (an orphan's waits for a container's init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped just now, or no /proc (not Linux: kill's answer stands)
        return Path("/proc/self").exists()


def test_single_node_environment():
    proc = _run("-n", "3", "--", sys.executable, "-c", PRINT_ENV)
    assert proc.returncode == 0, proc.stderr
    envs = _envs(proc.stdout)
    assert sorted(envs) == [0, 1, 2]
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("3", "3", "0")
        assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
        assert env["PYTHONUNBUFFERED"] == "1"
    assert len({(e["MASTER_PORT"], e["ALLREDUCE_JOB_ID"]) for e in envs.values()}) == 1, "one job, one port"
    assert len(envs[0]["ALLREDUCE_JOB_ID"]) == 16 and int(envs[0]["ALLREDUCE_JOB_ID"], 16) >= 0


@pytest.mark.parametrize("how", ["flags", "environment"])
def test_multi_node_environment(how):
    if how == "flags":
        proc = _run("-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port",
                    "29511", "--", sys.executable, "-c", PRINT_ENV)
    else:
        env = _env(ALLREDUCE_NPROC="2", ALLREDUCE_NNODES="2", ALLREDUCE_NODE_RANK="1", MASTER_ADDR="10.1.2.3",
                   MASTER_PORT="29511")
        proc = _run("--", sys.executable, "-c", PRINT_ENV, env=env)
    assert proc.returncode == 0, proc.stderr
    envs = _envs(proc.stdout)
    assert sorted(envs) == [2, 3]
    for rank, env in envs.items():
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank - 2))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("4", "2", "1")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.1.2.3", "29511")


def test_output_lines_are_tagged():
    script = ("import sys, os; r = os.environ['RANK']; print('out', r); print('two'); "
              "print('err', r, file=sys.stderr); sys.stdout.write('tail')")
    proc = _run("-n", "2", "--", sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert [line for line in proc.stdout.splitlines() if line.startswith(f"[{rank}] ")] == [
            f"[{rank}] out {rank}", f"[{rank}] two", f"[{rank}] tail"]
        assert f"[{rank}] err {rank}" in proc.stderr.splitlines()
    untagged = _run("-n", "2", "--no-tag-output", "--", sys.executable, "-c", script)
    assert untagged.returncode == 0 and "[" not in untagged.stdout + untagged.stderr
    # untagged workers share our stdout, so their writes may interleave anyhow: compare the characters
    assert sorted(untagged.stdout.replace("\n", "")) == sorted("out 0twotail" "out 1twotail")


def test_failing_worker_stops_the_job(tmp_path):
    start = time.monotonic()
    proc = _run("-n", "3", "--", sys.executable, "-c", WORKER.format(setup=""), str(tmp_path), "1=3")
    assert time.monotonic() - start < 10, "the sleeping workers were not stopped"
    assert proc.returncode == 3
    assert "rank 1 exited with code 3" in proc.stderr
    assert all(_gone(pid) for pid in _pids(tmp_path, 3))


def test_worker_killed_by_a_signal():
    proc = _run("-n", "2", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == 128 + signal.SIGKILL
    assert "was killed by SIGKILL (exit code 137)" in proc.stderr


def test_worker_that_ignores_sigterm_is_killed(tmp_path):
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    start = time.monotonic()
    proc = _run("-n", "2", "--", sys.executable, "-c", WORKER.format(setup=ignore), str(tmp_path), "0=4")
    assert proc.returncode == 4
    assert time.monotonic() - start < 12
    assert all(_gone(pid) for pid in _pids(tmp_path, 2))


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_stops_everything(tmp_path, signum, code):
    launcher = _start("-n", "2", "--", sys.executable, "-c", WORKER.format(setup=""), str(tmp_path))
    try:
        pids = _pids(tmp_path, 2)
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=10)
    finally:
        launcher.kill()
    assert launcher.returncode == code, err
    assert f"got {signal.Signals(signum).name}" in err
    assert all(_gone(pid) for pid in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("signum, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGHUP, 129),
                                          (signal.SIGQUIT, 131)])
def test_workers_die_with_the_launcher(tmp_path, signum, code):
    """A closed terminal (SIGHUP) and Ctrl-\\ (SIGQUIT) stop the job like SIGTERM; a launcher killed
    outright (SIGKILL: the OOM killer) takes its workers along too. Either way within 2 s."""
    no_core = "import resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0))"  # SIGQUIT's default dumps one
    launcher = _start("-n", "2", "--", sys.executable, "-c", WORKER.format(setup=no_core), str(tmp_path))
    try:
        pids = _pids(tmp_path, 2)
        launcher.send_signal(signum)
        sent = time.monotonic()
        while not all(_gone(pid) for pid in pids) and time.monotonic() < sent + 2.0:
            time.sleep(0.02)
        alive = [pid for pid in pids if not _gone(pid)]
        _, err = launcher.communicate(timeout=10)
    finally:
        launcher.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert alive == [], f"workers {alive} outlived the launcher by 2 s"
    assert launcher.returncode == code, err
    if signum != signal.SIGKILL:
        assert f"got {signal.Signals(signum).name}" in err


@pytest.mark.parametrize("argv, message", [
    (["-n", "0", "--", "true"], "must be at least 1, got 0"),
    (["-n", "x", "--", "true"], "expected an integer, got 'x'"),
    (["--nnodes", "2", "--", "true"], "needs --master-addr and --master-port"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1", "--", "true"], "outside [0, 2)"),
    (["--master-port", "70000", "--", "true"], "65535"),
    (["-n", "2"], "no command to run"),
    (["-n", "2", "--"], "no command to run"),
])
def test_bad_arguments(monkeypatch, capsys, argv, message):
    for var in ("MASTER_ADDR", "MASTER_PORT", "ALLREDUCE_NPROC", "ALLREDUCE_NNODES", "ALLREDUCE_NODE_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_command_that_cannot_start():
    proc = _run("-n", "2", "--", "/nonexistent/worker")
    assert proc.returncode == 127 and "cannot start '/nonexistent/worker'" in proc.stderr


def test_launch_as_a_library(capfd, tmp_path):
    # rank 1 fails only once rank 0 has printed, or the launcher may stop rank 0 first
    script = ("import os, sys, time\nrank = int(os.environ['RANK'])\nprint('hi', flush=True)\n"
              "if rank == 0: open(sys.argv[1], 'w').close()\n"
              "while rank and not os.path.exists(sys.argv[1]): time.sleep(0.01)\nsys.exit(rank * 5)")
    code = launch(LaunchConfig(nproc=2), [sys.executable, "-c", script, str(tmp_path / "printed")])
    assert code == 5
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == ["[0] hi", "[1] hi"] and "rank 1 exited with code 5" in err
    with pytest.raises(ValueError, match="no command"):
        launch(LaunchConfig(), [])


def test_worker_env_and_config_checks():
    config = LaunchConfig(nproc=4, nnodes=3, node_rank=2, master_addr="h", master_port=5)
    env = worker_env(config, 1, "h", 5, "ab")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["GROUP_RANK"]) == ("9", "12", "1", "2")
    horovod = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
               "HOROVOD_CROSS_SIZE")
    assert [env[name] for name in horovod] == ["9", "12", "1", "4", "2", "3"]
    with pytest.raises(ValueError, match="at least 1"):
        LaunchConfig(nproc=0)
    with pytest.raises(ValueError, match="needs --master-addr"):
        LaunchConfig(nnodes=2, master_port=5)


@pytest.mark.parametrize("flags", [dict(max_np=4), dict(min_np=2, max_np=5), dict(min_np=3, max_np=2),
                                   dict(min_np=2, max_np=4, nnodes=2, master_addr="h", master_port=5)])
def test_max_np_needs_min_np_one_node_and_room(flags):
    with pytest.raises(ValueError, match="--max-np must come with --min-np"):
        LaunchConfig(nproc=4, **flags)
    assert LaunchConfig(nproc=4, min_np=2, max_np=4).max_np == 4
