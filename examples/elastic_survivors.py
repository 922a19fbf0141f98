"""Our own API under torchrun: when a node is lost, the ranks left re-form a smaller group and carry on.

    # on each of two nodes (or as two agents on one machine), the same command:
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        examples/elastic_survivors.py --steps 300

Every step all-reduces a vector of ones, so each rank can check that the sum is the number of ranks
it believes it is working with. When a collective fails because peers went away (``PeerLost``, or a
``CommTimeout`` where a node stopped answering: an ``AllreduceError``), this rank destroys the group (quick: nothing is
waited for) and forms a new one with the other ranks of its node, through the store torchrun's agent
hosts: ``init_process_group(rank=LOCAL_RANK, world_size=LOCAL_WORLD_SIZE)``. The processes go on with
the steps left, without a restart. The store lives in the agent of the node that holds rank 0, so
that node is the one this policy keeps going. Each rank ends by printing one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import allreduce as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pause", type=float, default=0.02, help="seconds of 'compute' per step")
    args = parser.parse_args()

    dist.init_process_group(timeout=30)
    job_rank, sizes = dist.get_rank(), []
    print(f"rank {job_rank}/{dist.get_world_size()} pid {os.getpid()} local {os.environ['LOCAL_RANK']}\n",
          end="", flush=True)
    step = 0
    while step < args.steps:
        x = np.ones(1024, np.float32)
        try:
            dist.all_reduce(x)
        except dist.AllreduceError as exc:  # PeerLost, CommTimeout, GroupBroken: peers went away
            print(f"rank {job_rank}: step {step}: {type(exc).__name__}; re-forming with this node's ranks\n",
                  end="", flush=True)
            dist.destroy_process_group()
            dist.init_process_group(rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
                                    timeout=30)
            continue  # the step again, in the new group
        if not np.all(x == dist.get_world_size()):
            raise SystemExit(f"rank {job_rank}: step {step}: sum {x[0]} in a group of {dist.get_world_size()}")
        sizes.append(dist.get_world_size())
        step += 1
        time.sleep(args.pause)
    runs = [[size, sizes.count(size)] for size in dict.fromkeys(sizes)]  # [group size, steps in it], in order
    print(json.dumps({"job_rank": job_rank, "rank": dist.get_rank(), "steps": len(sizes), "runs": runs}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
