"""Per-communicator locks: mpi4py's ``_comm_lock`` and ``_comm_lock_table``.

An operation made of several messages (an object collective, mpi4py.util.pkl5's send of a pickle
and its buffers) holds its communicator's lock for its name while it runs, so that another thread's
operation of the same name cannot interleave its messages. The table is an attribute of the
communicator: every handle of it (``Comm(comm)``) shares the same locks, and they go when it is freed.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

guard = threading.Lock()  # held while a communicator's attribute or lock is made
_keyvals: dict[str, int] = {}


def attribute(comm, name: str, make, delete_fn=None):
    """The communicator's attribute ``name`` (one key per name, for every communicator), set to
    ``make()`` the first time; ``delete_fn(comm, keyval, value)`` runs when the communicator is freed."""
    with guard:
        if name not in _keyvals:
            _keyvals[name] = comm.Create_keyval(delete_fn=delete_fn)
        keyval = _keyvals[name]
        value = comm.Get_attr(keyval)
        if value is None:
            value = make()
            comm.Set_attr(keyval, value)
        return value


def comm_lock_table(comm) -> dict[Hashable, threading.Lock]:
    """The communicator's locks by key (made as :func:`comm_lock` asks for them)."""
    return attribute(comm, "locks", dict)


def comm_lock(comm, key: Hashable | None = None) -> threading.Lock:
    """The communicator's lock for ``key``: the same lock for every handle of it, every call."""
    table = comm_lock_table(comm)
    with guard:
        return table.setdefault(key, threading.Lock())
