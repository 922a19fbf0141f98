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
    "ProcessGroup": ["_get_backend", "_register_backend", "_set_group_name", "_start_coalescing",
                     "_end_coalescing", "monitored_barrier"],
    "Work": ["wait", "get_future", "is_completed", "is_success", "exception", "source_rank", "result"],
    "torch": ["_import_device_backends"],
}


def missing() -> list[str]:
    """The hooks of :data:`TORCH_HOOKS` that the installed torch lacks (empty when all are there)."""
    c10d = importlib.import_module("torch._C._distributed_c10d")
    owners = {"torch._C._distributed_c10d": c10d, "_DistributedBackendOptions": c10d._DistributedBackendOptions(),
              "ProcessGroup": dist.ProcessGroup, "Work": dist.Work, "torch": torch}
    return [f"{owner}.{name}" for owner, names in TORCH_HOOKS.items() for name in names
            if not hasattr(owners[owner], name)]


def cpu_backend(group: dist.ProcessGroup):
    """The backend object ``group`` dispatches cpu tensors to (``None`` when it has none)."""
    try:
        return group._get_backend(torch.device("cpu"))
    except RuntimeError:  # "No backend type associated with device type cpu"
        return None
