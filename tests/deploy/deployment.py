"""What the deployment tests share: the job every engine runs, and how to read what its ranks print."""

from __future__ import annotations

import json
import os
import subprocess

from support.paths import EXAMPLES

CHECK = str(EXAMPLES / "cluster_check.py")  # every rank sums awkward sizes and prints one JSON line
DEADLINE_S = 150  # for any one job; a loaded 2-core machine runs the 8-rank ones in well under a minute
# What a test's own environment may carry that a launcher must set afresh, or that would change the job.
FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
           "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_", "ALLREDUCE_")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's or allreduce's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    return {**env, **extra}


def reports(output: str) -> list[dict]:
    """The JSON line of every rank in ``output`` (lines may carry a ``[rank] `` tag), by rank."""
    found, decoder = [], json.JSONDecoder()
    for line in output.splitlines():
        start = line.find('{"rank"')
        if start >= 0:
            found.append(decoder.raw_decode(line[start:])[0])
    return sorted(found, key=lambda r: r["rank"])


def assert_job(output: str, size: int, source: str, hosts: list[list[int]] | None = None) -> list[dict]:
    """Every one of ``size`` ranks reported correct sums, read ``source``'s variables, saw ``hosts``."""
    found = reports(output)
    assert [r["rank"] for r in found] == list(range(size)), output
    for r in found:
        assert (r["size"], r["source"], r["ok"]) == (size, source, True), r
        if hosts is not None:
            assert r["hosts"] == hosts, r
    return found


def run_all(commands: list[list[str]], envs: list[dict[str, str]]) -> list[str]:
    """Start every command at once, each with its environment; return their outputs once all exited 0."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in zip(commands, envs)]
    try:
        outputs = [proc.communicate(timeout=DEADLINE_S)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output
    return outputs
