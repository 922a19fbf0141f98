"""Registering ``"allreduce"`` with torch.distributed, and torch's creator hook that builds the backend.

:func:`register_backend` registers :func:`create` with ``torch.distributed.Backend.register_backend``
for devices cpu and cuda (CUDA tensors are staged through pinned host memory). It runs on
``import allreduce.torch``, and also, through the ``torch.backends`` entry point (:func:`autoload`),
whenever any program imports torch with this package installed: frameworks that call
``init_process_group(backend="allreduce")`` themselves need not import us first.

``init_process_group("allreduce")`` and ``new_group`` call :func:`create` with the store, rank and
size torch already settled. It forms an allreduce group on that store (:class:`.torchstore.TorchStore`,
so no second rendezvous and no second port) and returns the C++ backend (:mod:`.native`) whose
methods are those of a :class:`~.backend.ProcessGroupAllreduce` on that group.
"""

from __future__ import annotations

import os
import warnings

import torch.distributed as dist

from ... import bootstrap
from ...rendezvous import from_environment
from ...settings import Settings
from ...transport.shm import ShmOptions

from . import native
from .backend import NAME, ProcessGroupAllreduce
from .torchstore import TorchStore


def register_backend() -> None:
    """Register ``"allreduce"`` with torch.distributed (once; ``import allreduce.torch`` does it).

    Example::

        import allreduce.torch
        torch.distributed.init_process_group("allreduce")    # under allreduce run or torchrun
    """
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])


def autoload() -> None:
    """The ``torch.backends`` entry point: register, and never fail ``import torch`` for anyone."""
    try:
        register_backend()
    except Exception as exc:  # a broken install must not break every torch program
        warnings.warn(f"could not register the torch.distributed backend 'allreduce': {exc}", stacklevel=2)


def create(options, backend_options=None):
    """torch's creator hook: the backend of one torch group, on an allreduce group formed on its store."""
    backend_class = native.python_backend(os.environ)  # built before joining: a build failure strands nobody
    seconds = options.timeout.total_seconds()
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    # torchrun's agent keeps one store for every attempt of the job: keys of its own for each one, so a
    # restarted rank never reads the address of a rank that died in the attempt before
    attempt = dist.PrefixStore(f"allreduce/attempt_{from_environment().restart}", options.store)
    store = TorchStore(attempt, seconds, is_server=options.group_rank == 0)
    group = bootstrap.form_group(store, options.group_rank, options.group_size, seconds, f"torch-{options.group_id}",
                                 ranks, Settings.from_env(), ShmOptions.from_env())
    return backend_class(options.group_rank, options.group_size, NAME, ProcessGroupAllreduce(group))
