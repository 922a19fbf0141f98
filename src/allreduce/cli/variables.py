"""Every environment variable allreduce reads, in one table: for ``allreduce info`` and the docs.

The library's settings come from :data:`allreduce.settings.VARIABLES`, the shared-memory transport's
from the fields of :class:`~allreduce.transport.shm.ShmOptions` (``ALLREDUCE_SHM_<FIELD>``, each
explained by the comment beside its field); the launcher's and the rendezvous' variables are listed
here. A test checks that every ``ALLREDUCE_*`` name in the source is in the table.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from .. import settings
from ..transport.shm import ShmOptions
from ..transport.shm.options import PREFIX as SHM_PREFIX

LAUNCH = (  # (variable, meaning): what `allreduce run` reads and what it sets for each worker
    ("ALLREDUCE_NPROC", "workers per node for `allreduce run` (its `-n`)"),
    ("ALLREDUCE_NNODES", "nodes in the job for `allreduce run` (its `--nnodes`)"),
    ("ALLREDUCE_NODE_RANK", "this node's index for `allreduce run` (its `--node-rank`)"),
    ("ALLREDUCE_MIN_NP", "workers that go on after one fails, for `allreduce run` (its `--min-np`)"),
    ("ALLREDUCE_MAX_NP", "live workers below which `allreduce run` starts replacements (its `--max-np`)"),
    ("ALLREDUCE_JOB_ID", "set by `allreduce run` for its workers: which job they belong to"),
    ("ALLREDUCE_LOBBY", "set by `allreduce run --max-np` for its workers: host:port of the store where "
                        "replacements wait to join"),
    ("ALLREDUCE_REPLACEMENT", "set to 1 by `allreduce run --max-np` in a replacement worker, which joins the "
                              "running job (`join_group`, `hvd.init`) instead of starting one"),
)
RENDEZVOUS = (  # (variable, meaning): the launcher environments env:// reads
    ("RANK", "this process's rank (set by `allreduce run`, torchrun)"),
    ("WORLD_SIZE", "processes in the job"),
    ("LOCAL_RANK", "rank among the processes of this host"),
    ("LOCAL_WORLD_SIZE", "processes on this host"),
    ("GROUP_RANK", "this node's index (torchrun, `allreduce run`)"),
    ("MASTER_ADDR", "host of rank 0, which hosts the rendezvous store"),
    ("MASTER_PORT", "port of the rendezvous store"),
    ("TORCHELASTIC_RESTART_COUNT", "torchrun's restart count: which attempt of the job this is"),
    ("OMPI_COMM_WORLD_RANK", "Open MPI's rank (`mpirun`); also `OMPI_COMM_WORLD_SIZE`, `..._LOCAL_RANK`, and "
                             "`PMIX_NAMESPACE`, from which a missing `MASTER_PORT` is derived"),
    ("PMI_RANK", "MPICH/Hydra's rank; also `PMI_SIZE`"),
    ("SLURM_PROCID", "Slurm's rank (`srun`); also `SLURM_NTASKS`, `SLURM_LOCALID`; a missing `MASTER_ADDR` is the "
                     "first node of `SLURM_STEP_NODELIST`, a missing `MASTER_PORT` derived from `SLURM_JOB_ID` and "
                     "`SLURM_STEP_ID`"),
)
LAUNCHER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "GROUP_RANK", "MASTER_", "TORCHELASTIC_", "OMPI_COMM_WORLD_",
                     "PMI_", "SLURM_")  # what `allreduce info` reports as launcher variables


def library() -> list[tuple[str, str]]:
    """``(variable, meaning)`` of every variable the library reads, its settings first."""
    rows = [(name, meaning) for name, _, meaning in settings.VARIABLES]
    comments = field_comments(ShmOptions)
    for field in dataclasses.fields(ShmOptions):
        rows.append((SHM_PREFIX + field.name.upper(),
                     f"shared-memory transport: {comments.get(field.name, field.name)} (default {field.default!r})"))
    return rows + list(LAUNCH)


def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` from the ``name: type = default  # comment`` lines of a dataclass's source."""
    found = re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(cls), re.MULTILINE)
    return {name: comment.strip() for name, comment in found}


def markdown() -> str:
    """The tables of the docs' environment page: allreduce's variables, then the launchers'."""
    lines = ["| variable | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in library()]
    lines += ["", "Read by `env://` (the default `init_method`) to find rank, world size and the store:", "",
              "| variable | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in RENDEZVOUS]
    return "\n".join(lines) + "\n"
