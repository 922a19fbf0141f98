"""Is the job wired right? Every rank sums vectors of awkward sizes and checks them against numpy.

Start it under any launcher, with no settings of its own: ``allreduce run``, ``torchrun``, ``srun``,
``sbatch`` (examples/slurm_job.sbatch), ``mpirun``, or a Kubernetes PyTorchJob. Each rank prints one
JSON line: its rank, the world size, which launcher's variables it read, the ranks of each host, the
transport inside its host, the all-reduce algorithm chosen for 4 MiB, and whether every sum was
right. The exit status is 0 only if it was.
"""

import json
import os
import sys

import numpy as np

import allreduce as dist
from allreduce.rendezvous import from_environment

COUNTS = (1, 7, 1000, 300_001, 1 << 20)  # one element, fewer than the ranks, uneven splits, 4 MiB of f32

dist.init_process_group(timeout=120)
rank, size = dist.get_rank(), dist.get_world_size()
wrong = []
for count in COUNTS:
    x = np.arange(count, dtype=np.float32) % 1000 * (rank + 1)
    dist.all_reduce(x)
    if not np.array_equal(x, np.arange(count, dtype=np.float32) % 1000 * (size * (size + 1) // 2)):
        wrong.append(count)
group = dist.default_group()
report = json.dumps({
    "rank": rank, "size": size, "source": from_environment().source, "hosts": dist.get_topology().hosts,
    "intra": group.intra, "algorithm": group.algorithm_for("all_reduce", None, 4 << 20, np.dtype(np.float32)),
    "ok": not wrong, "wrong_counts": wrong,
})
os.write(sys.stdout.fileno(), f"{report}\n".encode())  # one write: ranks sharing a pipe never split a line
dist.destroy_process_group()
sys.exit(1 if wrong else 0)
