"""A twin of a group for a thread of its own: the same ranks, its own links and sequence numbers.

A group serves one thread at a time (:mod:`allreduce.runtime.claims`): collectives from two threads at once
would pair up in different orders on different ranks. Work that communicates from a thread of its own,
such as :func:`~allreduce.torch.DistributedOptimizer` reducing gradients while backward runs, forms
a twin of the caller's group *from that thread*. Every rank of the group forms the same twins in the
same order (data-parallel code does so by construction): the n-th twin of a group is named after it.
"""

from __future__ import annotations

import weakref

from ... import bootstrap
from ...runtime import ProcessGroup

_FORMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # group -> twins formed of it so far


def twin(group: ProcessGroup, purpose: str) -> ProcessGroup:
    """A new group of ``group``'s ranks, owned by the calling thread; every rank of ``group`` calls it.

    Example (every rank, on the thread that will use it)::

        grads = twin(allreduce.default_group(), "grads")   # named "default.grads1"

    Raises:
        RendezvousError: a rank of ``group`` did not form the same twin in time.
    """
    _FORMED[group] = count = _FORMED.get(group, 0) + 1
    name = f"{group.name}.{purpose}{count}"
    formed = bootstrap.form_group(group.store.prefix(name), group.rank, group.size, group.timeout, name, group.ranks,
                                  group.settings, group.shm_options)
    if group.membership is not None:  # its members' deaths break it as they break the group's
        group.membership.survival.enroll(formed, group.membership.ids)
    return formed
