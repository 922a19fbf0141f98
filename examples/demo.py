"""The main demo: four ranks sum a vector, then show the other collectives once.

Run it with ``allreduce run -n 4 -- python examples/demo.py`` (``make demo`` does).
"""

import numpy as np

import allreduce as dist

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()

x = np.full(1000, rank + 1, dtype=np.float32)
dist.all_reduce(x, op=dist.ReduceOp.SUM)
expected = size * (size + 1) / 2
assert np.all(x == expected), x[:4]
print(f"all_reduce: every element is {x[0]:g} (1 + 2 + ... + {size})")

total = dist.all_reduce_scalar(rank + 0.5)
print(f"all_reduce_scalar(rank + 0.5) = {total}")

blocks = np.empty(size * 2, dtype=np.int64)
dist.all_gather_into_tensor(blocks, np.array([rank, rank * 10]))
print(f"all_gather_into_tensor: {blocks.tolist()}")

mine = np.empty(2, dtype=np.int64)
dist.reduce_scatter_tensor(mine, np.arange(size * 2, dtype=np.int64))
print(f"reduce_scatter_tensor: rank {rank} keeps {mine.tolist()}")

token = np.array([42 if rank == 0 else 0])
dist.broadcast(token, src=0)
ones = np.ones(1 << 20, np.float32)
work = dist.all_reduce(ones, async_op=True)  # runs on the progress thread...
norm = float(np.linalg.norm(np.arange(1 << 16, dtype=np.float64)))  # ...while this rank computes
work.wait()
assert np.all(ones == size)
dist.barrier()
print(f"broadcast from rank 0: {token[0]}; async all_reduce of 4 MiB done while computing a norm ({norm:.0f})")
dist.destroy_process_group()
