"""Under real torchrun: our own ``allreduce.init_process_group()`` joins the agent's store (plain,
``--standalone``, ``--master-port``), and a program that never imports allreduce gets
``backend="allreduce"`` from torch's plugin autoload."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from support.harness import free_port

OURS = """
    import numpy as np
    import allreduce

    allreduce.init_process_group()
    x = np.full(3, allreduce.get_rank() + 1.0)
    allreduce.all_reduce(x)
    print(f"rank {allreduce.get_rank()}/{allreduce.get_world_size()}: {x.tolist()}\\n", end="", flush=True)
    allreduce.destroy_process_group()
"""

TORCH_ONLY = """
    import torch
    import torch.distributed as dist

    dist.init_process_group("allreduce")
    t = torch.full((3,), dist.get_rank() + 1.0)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()}: {t.tolist()} {dist.get_backend()}\\n", end="", flush=True)
    dist.destroy_process_group()
"""


def torchrun(tmp_path, program: str, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(program))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *flags, str(script)]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def ranks_said(done: subprocess.CompletedProcess) -> list[str]:
    """The ranks' lines (each printed in one write, so that two ranks' lines never interleave)."""
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))


@pytest.mark.parametrize("flags", [(), ("--standalone",), ("--master-port", "free")],
                         ids=["plain", "standalone", "master-port"])
def test_our_init_process_group_joins_torchruns_store(tmp_path, flags):
    flags = tuple(str(free_port()) if f == "free" else f for f in flags)
    assert ranks_said(torchrun(tmp_path, OURS, *flags)) == ["rank 0/2: [3.0, 3.0, 3.0]", "rank 1/2: [3.0, 3.0, 3.0]"]


def test_a_torch_program_gets_the_backend_without_importing_allreduce(tmp_path):
    assert "import allreduce" not in TORCH_ONLY and "from allreduce" not in TORCH_ONLY
    assert ranks_said(torchrun(tmp_path, TORCH_ONLY)) == ["rank 0/2: [3.0, 3.0, 3.0] allreduce",
                                                          "rank 1/2: [3.0, 3.0, 3.0] allreduce"]


def test_the_autoload_is_what_registers_it(tmp_path):
    done = torchrun(tmp_path, TORCH_ONLY, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert done.returncode != 0 and "allreduce" in done.stderr


def test_without_a_store_client_the_error_says_what_to_install(monkeypatch):
    import importlib.metadata

    from allreduce.errors import RendezvousError
    from allreduce.rendezvous import from_environment, schemes

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    launch = from_environment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                               "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (launch.agent_store, launch.restart) == (True, 2)
    assert not from_environment({"TORCHELASTIC_USE_AGENT_STORE": "False"}).agent_store
    with pytest.raises(RendezvousError, match=r"TORCHELASTIC_USE_AGENT_STORE=True.*pip install 'allreduce\[torch\]'"):
        schemes.agent_store(launch, 1.0)
