"""The communicator: mpi4py's ``Comm`` on a process group, and the world one, formed on first use.

``COMM_WORLD`` joins the default group the first time it is used, from the launcher's environment
(``allreduce run``, ``torchrun``, Open MPI's ``mpirun``, MPICH's, ``srun``; a process started alone
is a world of one), as ``MPI_Init`` would, and leaves it at exit. If the program has called
``allreduce.init_process_group`` itself, ``COMM_WORLD`` uses that group and leaves it alone.
``Split`` and ``Dup`` form new groups of their own (:func:`allreduce.split_group`), which ``Free``
closes.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys

import numpy as np

from .. import api, objects, rendezvous
from .collectives import BufferCollectives
from .datatypes import simple
from . import p2p
from .p2p import ANY_SOURCE, ANY_TAG, Request, Status
from .pickled import ObjectCollectives
from .ulfm import FailureMitigation

UNDEFINED = -32766

_UNSUPPORTED = {  # Comm methods of MPI features this library does not offer, and the feature's name
    **dict.fromkeys(["Create_cart", "Create_graph", "Create_dist_graph", "Create_dist_graph_adjacent"],
                    "process topologies"),
    **dict.fromkeys(["Spawn", "Spawn_multiple", "Get_parent", "Accept", "Connect", "Join"],
                    "dynamic process management"),
    **dict.fromkeys(["Create_intercomm", "Merge"], "inter-communicators"),
    **dict.fromkeys(["Ssend", "Bsend", "Rsend", "Issend", "Ibsend", "Irsend", "Send_init", "Recv_init",
                     "ssend", "bsend", "issend", "ibsend"], "send modes other than standard (Send/Isend)"),
    **dict.fromkeys(["Ibarrier", "Ibcast", "Igather", "Igatherv", "Iscatter", "Iscatterv", "Iallgather",
                     "Iallgatherv", "Ialltoall", "Ialltoallv", "Ireduce", "Ireduce_scatter", "Iscan", "Iexscan"],
                    "nonblocking collectives other than Iallreduce"),
}


class Comm(BufferCollectives, ObjectCollectives, FailureMitigation):
    """An intra-communicator with mpi4py's method names and argument order.

    Example (under ``allreduce run -n 2 -- python script.py``)::

        from allreduce import MPI
        comm = MPI.COMM_WORLD
        comm.allreduce(comm.rank + 1)          # both: 3
    """

    def __init__(self, group=None, world: bool = False):
        self._group = group
        self._world = world  # resolve the default group lazily

    def process_group(self):
        """The library group under this communicator (the world's is formed here on first use).

        Raises:
            ValueError: the communicator is ``COMM_NULL`` or was freed.
        """
        if self._world:
            group = init_world()
            self._group = group  # a new default group, once the old one is gone: nothing carries over
        if self._group is None:
            raise ValueError("this communicator is MPI.COMM_NULL (or was freed); it has no ranks")
        return self._group

    # ---- who is here -----------------------------------------------------------------------------

    def Get_rank(self) -> int:
        return self.process_group().rank

    def Get_size(self) -> int:
        return self.process_group().size

    rank = property(Get_rank)
    size = property(Get_size)

    def Is_intra(self) -> bool:
        return True

    def Is_inter(self) -> bool:
        return False

    def __bool__(self) -> bool:
        return self._world or self._group is not None

    def __repr__(self) -> str:
        if not self:
            return "<allreduce.MPI.Comm COMM_NULL>"
        return f"<allreduce.MPI.Comm {'COMM_WORLD' if self._world else self._group.name}>"

    def __getattr__(self, name: str):
        if name in _UNSUPPORTED:
            raise NotImplementedError(f"Comm.{name}: {_UNSUPPORTED[name]} are not supported by allreduce.MPI")
        raise AttributeError(f"allreduce.MPI.Comm has no attribute {name!r}")

    # ---- new communicators -----------------------------------------------------------------------

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        """Ranks of equal ``color`` form a new communicator, ordered by ``key`` then by rank here;
        ``color=MPI.UNDEFINED`` gives ``COMM_NULL``. Every rank of this communicator calls it."""
        chosen = self.allgather((color, key))
        colors = sorted({c for c, _ in chosen if c != UNDEFINED})
        splits = [sorted((r for r, (c, _) in enumerate(chosen) if c == color_), key=lambda r: (chosen[r][1], r))
                  for color_ in colors]
        if not splits:
            return COMM_NULL
        group = api.split_group(self.process_group(), splits)
        return COMM_NULL if isinstance(group, api.NonMember) else Comm(group)

    def Dup(self, info=None) -> "Comm":
        """A communicator of the same ranks whose messages and collectives never meet this one's.
        ``info`` hints are accepted and, as MPI allows, ignored."""
        return Comm(api.split_group(self.process_group()))

    Clone = Dup

    def Free(self) -> None:
        """Close the communicator's group (not the world's: that one ends with the program)."""
        if self._world:
            raise ValueError("COMM_WORLD cannot be freed; it is released at exit (or by MPI.Finalize)")
        if self._group is not None:
            api.destroy_process_group(self._group)
        self._group = None

    def Abort(self, errorcode: int = 0) -> None:
        """End this process at once with ``errorcode``; the launcher then ends the others."""
        print(f"allreduce.MPI: Abort({errorcode}) called on rank {self.rank}", file=sys.stderr, flush=True)
        os._exit(errorcode)

    # ---- point to point --------------------------------------------------------------------------

    def _p2p(self):
        group = self.process_group()
        return group.p2p, group.size

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Send the buffer; returns once it is on its way (a large one: once its receive is posted)."""
        self.Isend(buf, dest, tag).finish()

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        """Start sending the buffer, which must not change until the request is done."""
        return p2p.send(*self._p2p(), simple(buf, "buf", False), dest, tag)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> None:
        self.Irecv(buf, source, tag).finish(status)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving a message that fits the buffer (a larger one raises ``Mismatch``)."""
        return p2p.receive(*self._p2p(), simple(buf, "buf", True), source, tag, _nothing)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send and receive at once: the receive is posted first, so a ring of them never deadlocks."""
        receiving = self.Irecv(recvbuf, source, recvtag)
        sending = self.Isend(sendbuf, dest, sendtag)
        p2p.exchange(receiving, sending, status)

    def send(self, obj, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).finish()

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        objects.check_trusted(self.process_group(), "send/isend of an object")
        return p2p.send(*self._p2p(), np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8), dest, tag)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None):
        """The next object from ``source`` with ``tag`` (either may be ANY_*); ``buf`` is ignored."""
        return self.irecv(buf, source, tag).finish(status)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        objects.check_trusted(self.process_group(), "recv/irecv of an object")
        return p2p.receive(*self._p2p(), None, source, tag, _unpickled)

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Status | None = None):
        receiving = self.irecv(recvbuf, source, recvtag)
        sending = self.isend(sendobj, dest, sendtag)
        return p2p.exchange(receiving, sending, status)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Wait until a message from ``source`` with ``tag`` can be received; describe it in ``status``."""
        found = p2p.probe(*self._p2p(), source, tag, block=True)
        if status is not None:
            status.fill(*found)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        found = p2p.probe(*self._p2p(), source, tag, block=False)
        if found is not None and status is not None:
            status.fill(*found)
        return found is not None

    probe, iprobe = Probe, Iprobe


def _nothing(payload) -> None:
    return None


def _unpickled(payload):
    return None if payload is None else pickle.loads(payload)


COMM_WORLD = Comm(world=True)
COMM_NULL = Comm()
_finalize_at_exit: list = []  # set once this module has joined the default group itself


def init_world():
    """The default group, joined now from the launcher's environment if it is not yet."""
    if not api.is_initialized():
        if rendezvous.from_environment().source == "none":  # started alone: a world of one, as MPI does
            api.init_process_group(store=rendezvous.HashStore(), rank=0, world_size=1)
        else:
            api.init_process_group()
        if not _finalize_at_exit:
            _finalize_at_exit.append(atexit.register(_at_exit))
    return api.default_group()


def _at_exit() -> None:
    """:func:`finalize`, except in a fork() child, whose default group is its parent's."""
    if api.is_initialized() and not api.default_group().forked:
        finalize()


def finalize() -> None:
    """Leave the default group if this module joined it (``MPI.Finalize``; also run at exit)."""
    if _finalize_at_exit and api.is_initialized():
        api.destroy_process_group()
