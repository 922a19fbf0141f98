"""Who am I? This process's rank, the world size and the store's address, read from its launcher.

Each launcher announces a process's place in the job in environment variables of its own names.
:func:`from_environment` reads the first family that is present (its rank or its size is set), in
this order::

    source   launcher                rank / world size             local rank / local size
    env      torchrun, allreduce run RANK / WORLD_SIZE             LOCAL_RANK / LOCAL_WORLD_SIZE
    openmpi  Open MPI's mpirun       OMPI_COMM_WORLD_RANK / _SIZE  OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE
    pmi      MPICH, Intel MPI        PMI_RANK / PMI_SIZE           MPI_LOCALRANKID / MPI_LOCALNRANKS
    slurm    srun                    SLURM_PROCID / SLURM_NTASKS   SLURM_LOCALID / SLURM_NTASKS_PER_NODE

The store's address is MASTER_ADDR and MASTER_PORT whatever the launcher (torchrun sets them),
defaulting to 127.0.0.1:29500. Under Slurm nothing needs exporting: a missing MASTER_ADDR is the
first node of the step's node list (where srun's block distribution puts rank 0), else the launch
node's address, and a missing MASTER_PORT is derived from the job and step ids, so two steps of one
job, or two jobs sharing a node, meet at different ports. Under mpirun a missing MASTER_PORT is
derived from the job's PMIx namespace the same way; a job of several hosts exports MASTER_ADDR.
A variable that is absent leaves its field ``None`` for the caller to decide; one that is present but
wrong is an error, because guessing would hang the job.

torchrun's agent already hosts a store at MASTER_ADDR:MASTER_PORT and says so to its workers
(``TORCHELASTIC_USE_AGENT_STORE=True``, with the restart count ``TORCHELASTIC_RESTART_COUNT``):
then every rank is that store's client and none may host one there.

A job that may grow (``allreduce run --max-np``) names its lobby in ``ALLREDUCE_LOBBY`` and starts a
replacement worker with ``ALLREDUCE_REPLACEMENT=1``: :func:`lobby_address` and :func:`is_replacement`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
# A port derived from a launcher's job (and step): JOB_PORT_BASE + (job * JOB_STEPS + step) mod
# JOB_PORTS, below Linux's ephemeral range (32768 up), so no outgoing connection holds it.
JOB_PORT_BASE, JOB_PORTS, JOB_STEPS = 17000, 15000, 16

LOBBY = "ALLREDUCE_LOBBY"  # host:port of the job's lobby store
REPLACEMENT = "ALLREDUCE_REPLACEMENT"  # "1" in a process started to take a dead worker's place

# source -> (rank, world size, local rank, local world size) variable names
_FAMILIES = {
    "env": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
}


@dataclass(frozen=True)
class LaunchInfo:
    """What the launcher told this process; ``None`` where it said nothing."""

    rank: int | None  # this process's rank in the job
    world_size: int | None  # processes in the job
    local_rank: int | None  # rank among the processes on this host
    local_world_size: int | None  # processes on this host
    master_addr: str  # host of the rank-0 store
    master_port: int  # port of the rank-0 store
    source: str  # the variables read: "env", "openmpi", "pmi", "slurm", or "none"
    agent_store: bool = False  # torchrun's agent hosts the store at master_addr:master_port
    restart: int = 0  # torchrun's restart count: which attempt of the job this is


def from_environment(env: Mapping[str, str] = os.environ) -> LaunchInfo:
    """Read rank, world size, local rank and size, and the store address from ``env``.

    Example: under ``torchrun --nproc-per-node 2``, the second process gets
    ``LaunchInfo(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1",
    master_port=29500, source="env")``.

    Raises:
        ValueError: a variable is not an integer or out of range (e.g. RANK >= WORLD_SIZE); the
            message names it.
    """
    source = next((name for name, names in _FAMILIES.items() if names[0] in env or names[1] in env), "none")
    rank_var, size_var, local_rank_var, local_size_var = _FAMILIES.get(source, (None,) * 4)
    rank = _integer(env, rank_var, 0)
    world_size = _integer(env, size_var, 1)
    local_rank = _integer(env, local_rank_var, 0)
    local_world_size = _integer(env, local_size_var, 1)
    _below(rank_var, rank, size_var, world_size)
    _below(local_rank_var, local_rank, local_size_var, local_world_size)
    job_addr, job_port = _job_store(source, env)
    master_addr = env.get("MASTER_ADDR") or job_addr or DEFAULT_MASTER_ADDR
    master_port = _integer(env, "MASTER_PORT", 1)
    if master_port is not None and master_port > 65535:
        raise ValueError(f"MASTER_PORT={master_port} is not a port (1-65535)")
    master_port = master_port or job_port
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torch's own test of it
    restart = _integer(env, "TORCHELASTIC_RESTART_COUNT", 0) or 0
    return LaunchInfo(rank, world_size, local_rank, local_world_size, master_addr,
                      DEFAULT_MASTER_PORT if master_port is None else master_port, source, agent_store, restart)


def lobby_address(env: Mapping[str, str]) -> str | None:
    """``host:port`` of the job's lobby, where replacement workers wait to join (``None``: it cannot grow)."""
    return env.get(LOBBY) or None


def is_replacement(env: Mapping[str, str]) -> bool:
    """Whether the launcher started this process to take a dead worker's place."""
    return env.get(REPLACEMENT) == "1"


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list, expanded from its compressed form.

    Example: ``first_host("gpu[07-12,20],login1")`` is ``"gpu07"``; ``first_host("r[2-3]n[5-6]")`` is ``"r2n5"``.

    Raises:
        ValueError: the list is empty or its brackets do not pair up.
    """
    head, depth = "", 0
    for char in nodelist.strip():
        if char == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"node list {nodelist!r} has unpaired brackets")
        head += char
    if depth:
        raise ValueError(f"node list {nodelist!r} has unpaired brackets")
    if not head:
        raise ValueError(f"node list {nodelist!r} names no host")
    pieces = head.replace("]", "[").split("[")  # outside, inside, outside, ... the brackets
    return "".join(piece if i % 2 == 0 else piece.split(",")[0].split("-")[0] for i, piece in enumerate(pieces))


def job_port(job: int, step: int = 0) -> int:
    """The store's port for step ``step`` of launcher job ``job`` (see :data:`JOB_PORT_BASE`)."""
    return JOB_PORT_BASE + (job * JOB_STEPS + step % JOB_STEPS) % JOB_PORTS


def _job_store(source: str, env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """Where rank 0 hosts the store by what the launcher says of its job; ``None`` where it says nothing.

    srun: the step's first node, at a port of the job id and step id. mpirun: a port of the job's PMIx
    namespace (its host is 127.0.0.1 unless MASTER_ADDR says otherwise).
    """
    if source == "slurm":
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        addr = first_host(nodelist) if nodelist else env.get("SLURM_LAUNCH_NODE_IPADDR")
        job = _integer(env, "SLURM_JOB_ID", 0)
        return addr, None if job is None else job_port(job, _integer(env, "SLURM_STEP_ID", 0) or 0)
    namespace = env.get("PMIX_NAMESPACE")
    if source == "openmpi" and namespace:
        return None, job_port(zlib.crc32(namespace.encode()))
    return None, None


def _integer(env: Mapping[str, str], name: str | None, minimum: int) -> int | None:
    raw = env.get(name) if name else None
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")
    return value


def _below(name: str | None, value: int | None, limit_name: str | None, limit: int | None) -> None:
    if value is not None and limit is not None and value >= limit:
        raise ValueError(f"{name}={value} must be below {limit_name}={limit}")
