"""The communicator: mpi4py's ``Comm`` on a process group, and the world's and this process's own.

``COMM_WORLD`` joins the default group the first time it is used, from the launcher's environment
(``allreduce run``, ``torchrun``, Open MPI's ``mpirun``, MPICH's, ``srun``; a process started alone
is a world of one), as ``MPI_Init`` would, and leaves it at exit. If the program has called
``allreduce.init_process_group`` itself, ``COMM_WORLD`` uses that group and leaves it alone.
``COMM_SELF`` is a group of this process alone, formed on its first use without any peer.
``Split``, ``Split_type``, ``Dup`` and ``Create`` form new groups of their own
(:func:`allreduce.split_group`), which ``Free`` closes.

A ``Comm`` object is a handle, as in mpi4py: ``Comm(comm)`` is another handle of the same
communicator (equal to it), ``Comm()`` is ``COMM_NULL``, and pickling the predefined ones gives
them back.
"""

from __future__ import annotations

import atexit
import os
import sys

from .. import api, rendezvous
from ..errors import AllreduceError
from ..p2p import TAG_UB as _TAG_UB
from . import environment, errorcodes
from .collectives import BufferCollectives
from .errorcodes import ERR_ARG, ERR_COMM, ERR_KEYVAL, error
from .groups import CONGRUENT, IDENT, SIMILAR, UNEQUAL, Group
from .handles import Handle, constant
from .info import ERRORS_RETURN, INFO_NULL, Errhandler, Info
from .messages import PointToPoint
from .pickled import ObjectCollectives
from .reducing import Reductions
from .requests import Request
from .status import UNDEFINED
from .ulfm import FailureMitigation


_UNSUPPORTED = {  # Comm methods of MPI features this library does not offer, and the feature's name
    **dict.fromkeys(["Create_cart", "Create_graph", "Create_dist_graph", "Create_dist_graph_adjacent",
                     "Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall", "Neighbor_alltoallv",
                     "Neighbor_alltoallw", "neighbor_allgather", "neighbor_alltoall"], "process topologies"),
    **dict.fromkeys(["Spawn", "Spawn_multiple", "Accept", "Connect", "Join"], "dynamic process management"),
    **dict.fromkeys(["Create_intercomm", "Merge"], "inter-communicators"),
    **dict.fromkeys(["Allreduce_init", "Bcast_init", "Reduce_init", "Allgather_init", "Alltoall_init", "Gather_init",
                     "Scatter_init", "Barrier_init", "Reduce_scatter_init", "Reduce_scatter_block_init", "Scan_init",
                     "Exscan_init", "Gatherv_init", "Scatterv_init", "Allgatherv_init", "Alltoallv_init",
                     "Alltoallw_init", "Psend_init", "Precv_init", "Create_from_group", "Attach_buffer",
                     "Detach_buffer", "Flush_buffer", "Iflush_buffer"], "MPI-4 features (persistent collectives, "
                                                                         "partitioned messages, sessions)"),
}


class _Handle:
    """What every handle of one communicator shares."""

    def __init__(self, group=None, kind: str | None = None, name: str = ""):
        self.group, self.kind, self.name = group, kind, name  # kind: "world", "self" or None
        self.attrs: dict[int, object] = {}
        self.info = Info.Create()
        self.errhandler = ERRORS_RETURN

    @property
    def null(self) -> bool:
        return self.kind is None and self.group is None


class Comm(Handle, BufferCollectives, Reductions, PointToPoint, ObjectCollectives, FailureMitigation):
    """An intra-communicator with mpi4py's method names and argument order.

    Example (under ``allreduce run -n 2 -- python script.py``)::

        from allreduce import MPI
        comm = MPI.COMM_WORLD
        comm.allreduce(comm.rank + 1)          # both: 3
    """

    def __new__(cls, comm: Comm | None = None):
        return super().__new__(cls)  # mpi4py's subclasses (mpi4py.util.pkl5) call Comm.__new__(cls, comm)

    def __init__(self, comm: Comm | None = None):
        if comm is None:
            self._handle = _Handle()
        elif isinstance(comm, Comm):
            self._handle = comm._handle
        else:
            raise TypeError(f"{type(self).__name__}() takes a communicator, got {type(comm).__name__}")

    @classmethod
    def _of(cls, group, kind: str | None = None, name: str = "") -> Comm:
        made = cls()
        made._handle = _Handle(group, kind, name)
        return made

    def process_group(self):
        """The library group under this communicator (the world's and this process's own are formed
        on first use).

        Raises:
            MPI.Exception: ``ERR_COMM``, the communicator is ``COMM_NULL`` or was freed.
        """
        handle = self._handle
        if handle.kind == "world":
            handle.group = init_world()  # a new default group, once the old one is gone: nothing carries over
        elif handle.kind == "self":
            world = init_world()
            if handle.group is None or getattr(handle, "world", None) is not world:
                handle.group, handle.world = api.self_group(), world
        if handle.group is None:
            raise error(ERR_COMM, "this communicator is MPI.COMM_NULL (or was freed); it has no ranks")
        return handle.group

    # ---- who is here -----------------------------------------------------------------------------

    def Get_rank(self) -> int:
        return self.process_group().rank

    def Get_size(self) -> int:
        return self.process_group().size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_group(self) -> Group:
        """The communicator's ranks, as a group of world ranks."""
        g = self.process_group()
        return Group.of(g.ranks, g.ranks[g.rank])

    group = property(Get_group)

    def Is_intra(self) -> bool:
        self.process_group()
        return True

    def Is_inter(self) -> bool:
        self.process_group()
        return False

    is_intra = property(Is_intra)
    is_inter = property(Is_inter)

    def Get_topology(self) -> int:
        """``UNDEFINED``: no process topology is attached (they are not supported)."""
        self.process_group()
        return UNDEFINED

    topology = property(Get_topology)

    def Compare(self, comm: Comm) -> int:
        """``IDENT`` (the same communicator), ``CONGRUENT`` (same ranks, same order), ``SIMILAR`` (same
        ranks) or ``UNEQUAL``; callable as ``MPI.Comm.Compare(a, b)`` too."""
        mine, theirs = self.process_group().ranks, comm.process_group().ranks
        if self._handle is comm._handle:
            return IDENT
        if mine == theirs:
            return CONGRUENT
        return SIMILAR if set(mine) == set(theirs) else UNEQUAL

    def __bool__(self) -> bool:
        return not self._handle.null

    def __eq__(self, other) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self._handle is other._handle or (self._handle.null and other._handle.null)

    def _shared(self):
        return None if self._handle.null else self._handle

    def _is_predefined(self) -> bool:
        return self._handle.kind is not None

    def _release(self) -> None:
        self._handle = _Handle()

    def __reduce__(self):
        for name, predefined in (("COMM_NULL", COMM_NULL), ("COMM_WORLD", COMM_WORLD), ("COMM_SELF", COMM_SELF)):
            if self is predefined:
                return _predefined, (name,)
        for predefined in (COMM_WORLD, COMM_SELF):
            if self._handle is predefined._handle:
                return type(self), (predefined,)
        if self._handle.null:
            return type(self), ()
        raise ValueError(f"cannot pickle {self!r}: only the predefined communicators travel")

    def __repr__(self) -> str:
        return f"<allreduce.MPI.Comm {self.Get_name() or hex(id(self._handle))}>"

    # ---- names, attributes, info, error handlers ------------------------------------------------

    def Get_name(self) -> str:
        if self._handle.null:
            return "MPI_COMM_NULL"
        return self._handle.name

    def Set_name(self, name: str) -> None:
        self.process_group()
        self._handle.name = str(name)

    name = property(Get_name, Set_name)

    def Get_attr(self, keyval: int):
        """The value of an attribute: MPI's (``TAG_UB``, ``IO``, ``WTIME_IS_GLOBAL``, ``APPNUM``,
        ``UNIVERSE_SIZE``, ``LASTUSEDCODE``) or one set with ``Set_attr``; ``None`` if unset."""
        g = self.process_group()
        predefined = {environment.TAG_UB: _TAG_UB, environment.IO: g.rank, environment.WTIME_IS_GLOBAL: False,
                      environment.UNIVERSE_SIZE: api.default_group().size,
                      environment.LASTUSEDCODE: errorcodes.LASTUSEDCODE_VALUE}
        if keyval in predefined:
            return predefined[keyval]
        if keyval == environment.APPNUM:
            return None
        if keyval not in _KEYVALS:
            raise error(ERR_KEYVAL, f"{keyval} is not an attribute key (Comm.Create_keyval makes one)")
        return self._handle.attrs.get(keyval)

    def Set_attr(self, keyval: int, attrval) -> None:
        self.process_group()
        if keyval not in _KEYVALS:
            raise error(ERR_KEYVAL, f"{keyval} is not an attribute key (Comm.Create_keyval makes one)")
        self._handle.attrs[keyval] = attrval

    def Delete_attr(self, keyval: int) -> None:
        self.process_group()
        if keyval not in _KEYVALS:
            raise error(ERR_KEYVAL, f"{keyval} is not an attribute key")
        if keyval in self._handle.attrs:
            self._deleted(keyval, self._handle.attrs.pop(keyval))

    def _deleted(self, keyval: int, attrval) -> None:
        """Call the key's ``delete_fn`` on an attribute leaving the communicator, as MPI does."""
        delete_fn = _KEYVALS.get(keyval)
        if delete_fn is not None:
            delete_fn(self, keyval, attrval)

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
        """A new attribute key; ``delete_fn(comm, keyval, attrval)`` is called when an attribute of it
        leaves a communicator (``Delete_attr``, ``Free``); ``copy_fn`` is accepted (``Dup`` copies no
        attribute)."""
        key = max(_KEYVALS, default=100) + 1
        _KEYVALS[key] = delete_fn
        return key

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        _KEYVALS.pop(keyval, None)
        return environment.KEYVAL_INVALID

    def Get_info(self) -> Info:
        self.process_group()
        return self._handle.info.Dup()

    def Set_info(self, info: Info) -> None:
        self.process_group()
        self._handle.info = info.Dup() if info else Info.Create()

    info = property(Get_info, Set_info)

    def Get_errhandler(self) -> Errhandler:
        self.process_group()
        return Errhandler(self._handle.errhandler)

    def Set_errhandler(self, errhandler: Errhandler) -> None:
        self.process_group()
        if not isinstance(errhandler, Errhandler) or not errhandler:
            raise error(ERR_ARG, f"not an error handler: {errhandler!r}")
        self._handle.errhandler = Errhandler(errhandler)

    def Call_errhandler(self, errorcode: int) -> None:
        """Errors raise here: this raises ``MPI.Exception(errorcode)``."""
        raise errorcodes.Exception(errorcode)

    # ---- new communicators -----------------------------------------------------------------------

    def _formed(self, splits: list[list[int]]) -> Comm:
        """The communicator of the split holding this rank (``COMM_NULL`` if none); every rank calls it."""
        if not splits:
            return Comm()
        group = api.split_group(self.process_group(), splits)
        return Comm() if isinstance(group, api.NonMember) else Comm._of(group)

    def Split(self, color: int = 0, key: int = 0) -> Comm:
        """Ranks of equal ``color`` form a new communicator, ordered by ``key`` then by rank here;
        ``color=MPI.UNDEFINED`` gives ``COMM_NULL``. Every rank of this communicator calls it."""
        chosen = self.allgather((int(color), int(key)))
        colors = sorted({c for c, _ in chosen if c != UNDEFINED})
        if any(c < 0 and c != UNDEFINED for c, _ in chosen):
            raise error(ERR_ARG, f"Split colors must be >= 0 or MPI.UNDEFINED, got {[c for c, _ in chosen]}")
        return self._formed([sorted((r for r, (c, _) in enumerate(chosen) if c == color_),
                                    key=lambda r: (chosen[r][1], r)) for color_ in colors])

    def Split_type(self, split_type: int, key: int = 0, info: Info = INFO_NULL) -> Comm:
        """``COMM_TYPE_SHARED``: one communicator per host (ranks that share memory); ``UNDEFINED``
        gives ``COMM_NULL``, and so do the hardware-guided types, whose resources are not known here."""
        g = self.process_group()
        color = g.topology.host if split_type == environment.COMM_TYPE_SHARED else UNDEFINED
        return self.Split(color, key)

    def Dup(self, info: Info | None = None) -> Comm:
        """A communicator of the same ranks, and of this one's class, whose messages and collectives
        never meet this one's. ``info`` hints are accepted and, as MPI allows, ignored."""
        made = type(self)._of(api.split_group(self.process_group()))
        made._handle.info = (info or self._handle.info).Dup() if (info or self._handle.info) else Info.Create()
        return made

    Clone = Dup

    def Dup_with_info(self, info: Info) -> Comm:
        return self.Dup(info)

    def Idup(self, info: Info | None = None) -> tuple[Comm, Request]:
        """``Dup``, which completes at once here, and its completed request."""
        return self.Dup(info), Request(active=True)

    def Idup_with_info(self, info: Info) -> tuple[Comm, Request]:
        return self.Idup(info)

    def Create(self, group: Group) -> Comm:
        """The communicator of ``group``'s ranks (a subgroup of this one's, in its order); ranks outside
        it get ``COMM_NULL``. Every rank of this communicator calls it, with the same group."""
        members = self.Get_group().Translate_ranks(None, None)
        wanted = list(group.Translate_ranks(None, None)) if group else []
        if any(w not in members for w in wanted):
            raise error(errorcodes.ERR_GROUP, f"the group {wanted} holds ranks outside this communicator")
        return self._formed([[members.index(w) for w in wanted]] if wanted else [])

    def Create_group(self, group: Group, tag: int = 0) -> Comm:
        """``Create``, when every rank of this communicator is in ``group`` (forming a communicator of
        only some ranks, with no part taken by the others, is not supported)."""
        if group.Get_size() != self.Get_size():
            raise NotImplementedError("Comm.Create_group of a strict subgroup is not supported by allreduce.MPI; "
                                      "call Create(group) on every rank instead")
        return self.Create(group)

    def Free(self) -> None:
        """Close the communicator's group; this handle becomes ``COMM_NULL``.

        Raises:
            MPI.Exception: ``ERR_COMM`` for ``COMM_NULL``, ``COMM_WORLD`` and ``COMM_SELF``.
        """
        handle = self._handle
        if handle.null or handle.kind is not None:
            raise error(ERR_COMM, f"{self.Get_name() or 'this communicator'} cannot be freed")
        for keyval in list(handle.attrs):
            self._deleted(keyval, handle.attrs.pop(keyval))
        if handle.group is not None:
            api.destroy_process_group(handle.group)
        self._handle = _Handle()

    Disconnect = Free

    def Abort(self, errorcode: int = 0) -> None:
        """End this process at once with ``errorcode``; the launcher then ends the others."""
        print(f"allreduce.MPI: Abort({errorcode}) called on rank {self.rank}", file=sys.stderr, flush=True)
        os._exit(errorcode)

    @classmethod
    def Get_parent(cls) -> Comm:
        """A null inter-communicator (equal to ``COMM_NULL``): no process here was spawned by another."""
        return Intercomm()


def _refused(name: str, feature: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(f"Comm.{name}: {feature} are not supported by allreduce.MPI")
    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not supported: {feature} (raises NotImplementedError)."
    return refused


for _name, _feature in _UNSUPPORTED.items():  # mpi4py's names exist, and say what is missing when called
    setattr(Comm, _name, _refused(_name, _feature))

class Intercomm(Comm):
    """Inter-communicators are not supported: ``Intercomm()`` is a null handle (``COMM_NULL``), and
    making a real one (``Create_intercomm``) raises ``NotImplementedError``."""

    def __init__(self, comm: Comm | None = None):
        if comm is not None and not (isinstance(comm, Comm) and comm._handle.null):
            raise NotImplementedError("inter-communicators (MPI.Intercomm) are not supported by allreduce.MPI")
        super().__init__()

    def Is_inter(self) -> bool:
        return True

    def Is_intra(self) -> bool:
        return False

    def _refuse(self, name: str):
        self.process_group()  # COMM_NULL: ERR_COMM, as for any communicator
        raise NotImplementedError(f"Intercomm.{name}: inter-communicators are not supported by allreduce.MPI")

    def Get_remote_group(self) -> Group:
        self._refuse("Get_remote_group")

    def Get_remote_size(self) -> int:
        self._refuse("Get_remote_size")

    def Merge(self, high: bool = False) -> Comm:
        self._refuse("Merge")


_KEYVALS: dict[int, object] = {}  # attribute keys and their delete_fn (None: none)


def _predefined(name: str) -> Comm:
    return {"COMM_NULL": COMM_NULL, "COMM_WORLD": COMM_WORLD, "COMM_SELF": COMM_SELF}[name]


COMM_WORLD = constant(Comm._of(None, "world", "MPI_COMM_WORLD"))
COMM_SELF = constant(Comm._of(None, "self", "MPI_COMM_SELF"))
COMM_NULL = constant(Comm())
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
    """Leave the default group if this module joined it (``MPI.Finalize``; also run at exit). As MPI's
    Finalize it is collective: it returns once every rank has called it, so a rank done early does not
    take the store (which rank 0 hosts) from ranks still at work. A broken group is left at once."""
    if _finalize_at_exit and api.is_initialized():
        try:
            api.barrier()
        except AllreduceError:  # a failed or revoked group: nobody can wait for the others
            pass
        api.destroy_process_group()
        environment.mark_finalized()
