"""allreduce: collective communication for Python processes on one host or many.

The API mirrors torch.distributed on numpy arrays (and torch CPU tensors)::

    import numpy as np, allreduce as dist
    dist.init_process_group()                 # env://, e.g. under `allreduce run -n 4 -- python script.py`
    x = np.full(1000, dist.get_rank() + 1, dtype=np.float32)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)  # in place: every rank holds the sum
    dist.destroy_process_group()
"""

from types import ModuleType

from . import algorithms, errors
from .api import (
    SHRINK_ABORT, SHRINK_DEFAULT, Agreement, agree, failed_ranks, grow_group, is_replacement, join_group,
    joiners_waiting, shrink_group, NonMember, all_gather, all_gather_into_tensor, all_reduce, all_reduce_scalar,
    all_to_all_single,
    are_deterministic_algorithms_enabled, barrier, broadcast, default_group, destroy_process_group, gather,
    get_backend, get_local_rank, get_local_size, get_rank, get_topology, get_world_size, init_process_group, irecv,
    is_available, is_initialized, isend, new_group, recv, reduce, reduce_scatter, reduce_scatter_tensor, scatter,
    send, split_group, use_deterministic_algorithms,
)
from .errors import (
    AllreduceError, CommTimeout, GroupBroken, Mismatch, PeerLost, ProtocolError, RendezvousError, Revoked,
)
from .runtime import ProcessGroup
from .objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .ops import ReduceOp
from .topology import Topology
from .transport.shmseg import empty
from .version import __version__ as __version__
from .work import Work

__all__ = [
    "SHRINK_ABORT", "SHRINK_DEFAULT", "Agreement", "Revoked", "agree", "failed_ranks", "grow_group",
    "is_replacement", "join_group", "joiners_waiting", "shrink_group",
    "AllreduceError", "CommTimeout", "GroupBroken", "Mismatch", "NonMember", "PeerLost", "ProcessGroup",
    "ProtocolError", "ReduceOp", "RendezvousError", "Topology", "Work", "algorithms", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_reduce_scalar", "all_to_all_single",
    "are_deterministic_algorithms_enabled", "barrier",
    "broadcast", "broadcast_object_list", "default_group", "destroy_process_group", "empty", "errors", "gather",
    "gather_object", "get_backend", "get_local_rank", "get_local_size", "get_rank", "get_topology", "get_world_size",
    "init_process_group", "irecv", "is_available", "is_initialized", "isend", "new_group", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "split_group",
    "use_deterministic_algorithms",
]


def __getattr__(name: str) -> ModuleType:
    """``from allreduce import MPI`` (mpi4py's API), loaded only when asked for."""
    if name == "MPI":
        from . import mpi

        return mpi
    raise AttributeError(f"module 'allreduce' has no attribute {name!r}")
