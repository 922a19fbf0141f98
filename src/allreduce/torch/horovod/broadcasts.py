"""Horovod's broadcasts and synchronization points: ``broadcast`` (new tensor or in place, sync or
async), ``broadcast_object``, ``barrier`` and ``join``.

``root_rank`` is a *world* rank even on a process set, as in Horovod. ``broadcast`` is differentiable
as in Horovod: the root's gradient is the average of every rank's output gradient, the others' zero.
"""

from __future__ import annotations

import torch

from ... import api
from ...objects import broadcast_object_list

from ..common.tensors import host_copy
from . import joining
from .basics import Average, rank
from .handles import Pending, register
from .reductions import allreduce
from .process_sets import global_process_set, group_of, root_in


def start_broadcast(tensor: torch.Tensor, output: torch.Tensor, root_rank: int, process_set) -> Pending:
    """Begin copying world rank ``root_rank``'s ``tensor`` into ``output`` on every rank of the set.

    Raises:
        ValueError: ``root_rank`` is not in the set, or this rank is not.
    """
    group = group_of(process_set)
    src = root_in(process_set, root_rank)
    host = host_copy([tensor])
    work = api.broadcast(host, src, group=group, async_op=True)

    def done() -> torch.Tensor:
        with torch.no_grad():
            output.copy_(host.view(output.shape))
        return output

    return Pending([work], done)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return start_broadcast(tensor, torch.empty_like(tensor), root_rank, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        return (reduced if rank() == ctx.root_rank else torch.zeros_like(reduced)), None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """World rank ``root_rank``'s ``tensor``, as a new tensor on every rank of ``process_set``.

    Example (two ranks)::

        hvd.broadcast(torch.tensor([rank + 1.0]), root_rank=1)   # both: tensor([2.])
    """
    return _Broadcast.apply(tensor, root_rank, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with world rank ``root_rank``'s and return it (not differentiable)."""
    return start_broadcast(tensor, tensor, root_rank, process_set).wait()


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start :func:`broadcast`; ``synchronize(handle)`` returns the new tensor."""
    return register(start_broadcast(tensor, torch.empty_like(tensor), root_rank, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start :func:`broadcast_`; ``synchronize(handle)`` returns ``tensor``."""
    return register(start_broadcast(tensor, tensor, root_rank, process_set))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """World rank ``root_rank``'s picklable ``obj``, returned on every rank of ``process_set``.

    Example (two ranks)::

        hvd.broadcast_object({"epoch": 3} if rank == 0 else None)   # both: {'epoch': 3}
    """
    objects = [obj]
    broadcast_object_list(objects, src=root_in(process_set, root_rank), group=group_of(process_set))
    return objects[0]


def barrier(process_set=global_process_set) -> None:
    """Return once every rank of ``process_set`` has called it."""
    api.barrier(group_of(process_set))


def join(device: int = -1) -> int:
    """Declare that this rank has no more data: until every rank has joined, take part in the other
    ranks' reductions with zeros (see :mod:`.joining`). Returns the rank that joined last.

    Example (two ranks; rank 1 has one batch more)::

        for batch in my_batches: train(batch)     # rank 1's last allreduce is answered by rank 0's join
        hvd.join()                                # both: 1
    """
    return joining.join()
