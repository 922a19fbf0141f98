"""The private parts of torch the backend relies on, in one place (``tests/torch`` checks them).

torch's documented plugin API stops at ``Backend.register_backend``; composing a backend the way torch
composes Gloo needs a few names torch does not promise to keep. Each is listed in :data:`TORCH_HOOKS`
with what uses it, and :func:`missing` says which the installed torch lacks, so an upgrade that
removes one fails a test loudly instead of a job quietly. (The C++ side, ``c10d::Backend``'s virtual
methods, is checked by the compiler when :mod:`.native` builds the shim against the installed headers.)
"""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist

# owner -> names used. The creator reads _DistributedBackendOptions (register_backend's extended API);
# groups.py asks a ProcessGroup for its cpu backend; work.py's TorchWork overrides the Work methods
# torch's PyWork trampoline calls; torch autoloads plugins from the torch.backends entry point group.
TORCH_HOOKS = {
    "torch._C._distributed_c10d": ["_DistributedBackendOptions", "Backend"],
    "_DistributedBackendOptions": ["store", "group_rank", "group_size", "timeout", "group_id",
                                   "global_ranks_in_group"],
    "ProcessGroup": ["_get_backend", "_register_backend", "_set_default_backend", "_set_group_name",
                     "_start_coalescing", "_end_coalescing", "monitored_barrier"],
    "ProcessGroup.BackendType": ["CUSTOM"],
    "torch.distributed.distributed_c10d._world": ["pg_map"],
    "Work": ["wait", "get_future", "is_completed", "is_success", "exception", "source_rank", "result"],
    "torch": ["_import_device_backends"],
}


def missing() -> list[str]:
    """The hooks of :data:`TORCH_HOOKS` that the installed torch lacks (empty when all are there)."""
    c10d = importlib.import_module("torch._C._distributed_c10d")
    owners = {"torch._C._distributed_c10d": c10d, "_DistributedBackendOptions": c10d._DistributedBackendOptions(),
              "ProcessGroup": dist.ProcessGroup, "ProcessGroup.BackendType": dist.ProcessGroup.BackendType,
              "torch.distributed.distributed_c10d._world": dist.distributed_c10d._world, "Work": dist.Work,
              "torch": torch}
    return [f"{owner}.{name}" for owner, names in TORCH_HOOKS.items() for name in names
            if not hasattr(owners[owner], name)]


def cpu_backend(group: dist.ProcessGroup):
    """The backend object ``group`` dispatches cpu tensors to (``None`` when it has none)."""
    try:
        return group._get_backend(torch.device("cpu"))
    except RuntimeError:  # "No backend type associated with device type cpu"
        return None


def settle_shrunk(impl) -> None:
    """Register the backend whose impl is ``impl`` in its torch group as a custom backend, as torch does for
    the groups it creates. torch's ``shrink_group`` registers the shrunk group's cpu backend as Gloo, and
    DDP's logger then reads it as a ``ProcessGroupGloo`` (a crash); called at the group's first collective,
    once the group exists, and before DDP's logger runs."""
    for group in list(dist.distributed_c10d._world.pg_map):
        backend = cpu_backend(group)
        if backend is not None and getattr(backend, "impl", None) is impl:
            custom = dist.ProcessGroup.BackendType.CUSTOM
            group._register_backend(torch.device("cpu"), custom, backend)
            group._set_default_backend(custom)
