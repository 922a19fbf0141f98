"""Which allreduce group a call of the torch layer communicates on.

The optimizers take ``group=None`` (or ``process_group=None``) like torch does. ``None`` means
allreduce's default group when ``allreduce.init_process_group`` was called, and otherwise torch's
default group when that runs on the ``"allreduce"`` backend, so a script that only called
``torch.distributed.init_process_group("allreduce")`` works too. A torch group on this backend
stands for the allreduce group inside it (its cpu backend's ``impl``).
"""

from __future__ import annotations

import torch.distributed as dist

from ... import api
from ...runtime import ProcessGroup

from .backend import ProcessGroupAllreduce
from .private import cpu_backend


def resolve(group) -> ProcessGroup | None:
    """The allreduce group (``None``: allreduce's default group) that ``group`` stands for.

    Raises:
        RuntimeError: no group is initialized. TypeError: ``group`` runs on another backend.
        ValueError: this rank is not a member of ``group``.
    """
    if group is None:
        if api.is_initialized():
            return None
        if dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        else:
            raise RuntimeError("no process group: call allreduce.init_process_group() or "
                               "torch.distributed.init_process_group('allreduce') first")
    if isinstance(group, dist.ProcessGroup):
        group = getattr(cpu_backend(group), "impl", group)
    if isinstance(group, ProcessGroupAllreduce):
        return group.group
    if isinstance(group, ProcessGroup):
        return group
    if isinstance(group, api.NonMember):
        raise ValueError(f"this rank is not a member of group {group.ranks}")
    raise TypeError(f"group must be an allreduce group or a torch group on the 'allreduce' backend, "
                    f"got {type(group).__name__}; create it with init_process_group('allreduce') or new_group()")
