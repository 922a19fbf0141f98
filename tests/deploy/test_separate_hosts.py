"""A job across network namespaces, each a host with its own ``allreduce run --nnodes N --node-rank R``
(or torchrun's ``--nnodes N --node-rank R``).

No pretend hosts (ALLREDUCE_HOST_ID is cleared): the ranks tell the namespaces apart by themselves,
talk through shared memory inside each and TCP across, and hierarchical all-reduce is chosen.
"""

from __future__ import annotations

import importlib.util
import secrets
import subprocess
import sys

import pytest
from deployment import CHECK, DEADLINE_S, assert_job, clean_env
from support import netns

from allreduce.transport import shm

pytestmark = pytest.mark.skipif(not (shm.available() and netns.available()),
                                reason="needs root, ip and tc (network namespaces) and shared memory")

PORT = "29531"  # inside the namespaces every port is free


def allreduce_run(hosts: int, per_host: int, host: int, master: str) -> list[str]:
    return [sys.executable, "-m", "allreduce", "run", "-n", str(per_host), "--nnodes", str(hosts),
            "--node-rank", str(host), "--master-addr", master, "--master-port", PORT, "--"]


def torchrun(hosts: int, per_host: int, host: int, master: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--nproc-per-node", str(per_host),
            "--node-rank", str(host), "--master-addr", master, "--master-port", PORT, "--no-python"]


def run_on_hosts(hosts: int, per_host: int, launcher, command: list[str]) -> list[str]:
    """Start one launcher per namespace; return each launcher's output once all have exited 0."""
    env = clean_env(ALLREDUCE_SECRET=secrets.token_hex(16), ALLREDUCE_HOST_ID="")
    with netns.Testbed(hosts) as bed:
        launchers = [bed.popen(host, [*launcher(hosts, per_host, host, bed.addresses[0]), *command], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for host in range(hosts)]
        outputs = [proc.communicate(timeout=DEADLINE_S)[0] for proc in launchers]
    for host, (proc, output) in enumerate(zip(launchers, outputs)):
        assert proc.returncode == 0, f"host {host}:\n{output}"
    return outputs


@pytest.mark.parametrize("hosts,per_host,launcher", [
    (2, 2, allreduce_run),
    pytest.param(4, 2, allreduce_run, marks=pytest.mark.slow),
    pytest.param(2, 2, torchrun, marks=[pytest.mark.slow, pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torchrun comes with torch")]),
])
def test_launcher_per_namespace_runs_hierarchical(hosts, per_host, launcher):
    outputs = run_on_hosts(hosts, per_host, launcher, [sys.executable, CHECK])
    layout = [list(range(h * per_host, (h + 1) * per_host)) for h in range(hosts)]
    for r in assert_job("\n".join(outputs), hosts * per_host, "env", layout):
        assert (r["intra"], r["algorithm"]) == ("shm", "hierarchical"), r
