"""Horovod's broadcasts and synchronization points: ``broadcast`` (new tensor or in place, sync or
async), ``broadcast_object``, ``barrier`` and ``join``.

Every call is negotiated first (:mod:`.negotiation`): the ranks pair it up by ``name`` and agree on
the root, dtype and shape, or every rank gets the same ``Mismatch``. ``root_rank`` is a *world* rank
even on a process set, as in Horovod. ``broadcast`` is differentiable
as in Horovod: the root's gradient is the average of every rank's output gradient, the others' zero.
"""

from __future__ import annotations

import torch

from ... import api
from ...objects import broadcast_object_list

from ..common.tensors import host_copy
from . import joining, negotiation
from .basics import Average, rank
from .handles import Pending, register
from .reductions import allreduce
from .process_sets import global_process_set, group_of, root_in


def submit_broadcast(tensor: torch.Tensor, output: torch.Tensor, root_rank: int, process_set,
                     name=None) -> negotiation.Ticket:
    """Negotiate copying world rank ``root_rank``'s ``tensor`` into ``output`` on every rank of the set.

    Raises:
        ValueError: ``root_rank`` is not in the set, or this rank is not.
    """
    group = group_of(process_set)
    src = root_in(process_set, root_rank)
    agreed = {"root_rank": root_rank, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}

    def start() -> Pending:
        host = host_copy([tensor])
        work = api.broadcast(host, src, group=group, async_op=True)

        def done() -> torch.Tensor:
            with torch.no_grad():
                output.copy_(host.view(output.shape))
            return output

        return Pending([work], done)

    return negotiation.submit(group, negotiation.Operation("broadcast", name, agreed, start))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, name):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return submit_broadcast(tensor, torch.empty_like(tensor), root_rank, process_set, name).wait()

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        return (reduced if rank() == ctx.root_rank else torch.zeros_like(reduced)), None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """World rank ``root_rank``'s ``tensor``, as a new tensor on every rank of ``process_set``.

    Example (two ranks)::

        hvd.broadcast(torch.tensor([rank + 1.0]), root_rank=1)   # both: tensor([2.])
    """
    return _Broadcast.apply(tensor, root_rank, process_set, name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with world rank ``root_rank``'s and return it (not differentiable)."""
    return submit_broadcast(tensor, tensor, root_rank, process_set, name).wait()


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start :func:`broadcast`; ``synchronize(handle)`` returns the new tensor."""
    return register(submit_broadcast(tensor, torch.empty_like(tensor), root_rank, process_set, name))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start :func:`broadcast_`; ``synchronize(handle)`` returns ``tensor``."""
    return register(submit_broadcast(tensor, tensor, root_rank, process_set, name))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """World rank ``root_rank``'s picklable ``obj``, returned on every rank of ``process_set``.

    Example (two ranks)::

        hvd.broadcast_object({"epoch": 3} if rank == 0 else None)   # both: {'epoch': 3}
    """
    group, objects = group_of(process_set), [obj]
    src = root_in(process_set, root_rank)

    def start() -> Pending:
        broadcast_object_list(objects, src=src, group=group)
        return Pending([], lambda: objects[0])

    return negotiation.run(group, negotiation.Operation("broadcast_object", name, {"root_rank": root_rank}, start))


def barrier(process_set=global_process_set) -> None:
    """Return once every rank of ``process_set`` has called it."""
    group = group_of(process_set)

    def start() -> Pending:
        return Pending([api.barrier(group, async_op=True)], lambda: None)

    negotiation.run(group, negotiation.Operation("barrier", None, {}, start))


def join(device: int = -1) -> int:
    """Declare that this rank has no more data: until every rank has joined, take part in the other
    ranks' reductions with zeros (see :mod:`.joining`). Returns the rank that joined last.

    Example (two ranks; rank 1 has one batch more)::

        for batch in my_batches: train(batch)     # rank 1's last allreduce is answered by rank 0's join
        hvd.join()                                # both: 1
    """
    world = global_process_set.group
    return joining.join(lambda: negotiation.run(world, negotiation.Operation(negotiation.JOIN, None)))
