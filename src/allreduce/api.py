"""The public functions, shaped like torch.distributed: same names, argument order and meaning.

They live by what they touch: :mod:`.world` forms and closes groups, which :mod:`.roster` keeps and
names; :mod:`.resilience` lets the survivors of a death go on, and replacements join; :mod:`.calls`
issues the collectives and point-to-point messages on them; :mod:`.arguments` holds the types they take
and the checks on them. ``allreduce`` re-exports this module's names; the layers above (``objects``,
``torch``, ``mpi``, ``ray``, ``cli``) import it as ``from allreduce import api``.
"""

from __future__ import annotations

from .arguments import Number, Op, Tensor, Timeout
from .calls import (
    all_gather, all_gather_into_tensor, all_reduce, all_reduce_scalar, all_to_all_single, barrier, broadcast, gather,
    irecv, isend, recv, reduce, reduce_scatter, reduce_scatter_tensor, scatter, send,
)
from .resilience import (
    SHRINK_ABORT, SHRINK_DEFAULT, Agreement, agree, failed_ranks, grow_group,
    joiners_waiting, shrink_group,
)
from .roster import Group, NonMember, default_group, resolve_group
from .world import (
    BACKENDS, are_deterministic_algorithms_enabled, destroy_process_group, get_backend, get_local_rank,
    get_local_size, get_rank, get_topology, get_world_size, init_process_group, is_available, is_initialized,
    is_replacement, join_group, new_group, self_group, split_group, use_deterministic_algorithms,
)

__all__ = [
    "BACKENDS", "SHRINK_ABORT", "SHRINK_DEFAULT", "Agreement", "agree", "failed_ranks", "grow_group", "is_replacement",
    "join_group", "joiners_waiting", "shrink_group", "Group", "NonMember", "Number", "Op", "Tensor", "Timeout",
    "all_gather", "all_gather_into_tensor",
    "all_reduce", "all_reduce_scalar", "all_to_all_single", "are_deterministic_algorithms_enabled", "barrier",
    "broadcast", "default_group", "destroy_process_group", "gather", "get_backend", "get_local_rank",
    "get_local_size", "get_rank", "get_topology", "get_world_size", "init_process_group", "irecv", "is_available",
    "is_initialized", "isend", "new_group", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "resolve_group", "scatter", "self_group", "send", "split_group", "use_deterministic_algorithms",
]
