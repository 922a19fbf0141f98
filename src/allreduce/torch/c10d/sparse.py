"""All-reduce of sparse COO tensors, as Gloo does it: every rank's indices and values, then one coalesce.

The sum of sparse tensors has as many entries as the union of their patterns, which no rank knows in
advance, so this is no reduction schedule: each rank gathers every other rank's coalesced indices and
values (an object all-gather: blocks of any size) and adds them up locally, in rank order, so every
rank ends with the same bits. The result replaces the caller's tensor in place (``copy_``).
"""

from __future__ import annotations

import torch

from ...objects import all_gather_object


def all_reduce(tensor: torch.Tensor, group) -> None:
    """Sum the sparse ``tensor`` of every rank of ``group`` into it (blocking).

    Example (two ranks)::

        t = torch.sparse_coo_tensor([[rank]], [1.0], (2,))   # rank 0: [1, 0], rank 1: [0, 1]
        all_reduce(t, group)                                  # both: [1, 1], sparse
    """
    mine = tensor.detach().coalesce()
    pieces = [None] * group.size
    all_gather_object(pieces, (mine.indices().cpu(), mine.values().cpu()), group=group)
    indices = torch.cat([i for i, _ in pieces], dim=1)
    values = torch.cat([v for _, v in pieces])
    total = torch.sparse_coo_tensor(indices, values, tensor.shape).coalesce()
    with torch.no_grad():
        tensor.copy_(total.to(tensor.device))
