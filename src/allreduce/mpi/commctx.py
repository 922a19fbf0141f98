"""A communicator's private duplicate with fresh tags: mpi4py's ``_commctx_intra``/``_commctx_inter``.

mpi4py.util.pkl5 builds its object collectives of point-to-point messages on a duplicate of the
user's communicator, whose messages never meet the user's, and gives each call its own tag, so
that successive collectives never take each other's messages. The duplicate is made on first use
(a collective call, as ``Dup`` is), kept as an attribute of the communicator (shared by every handle
of it) and freed with it.
"""

from __future__ import annotations

from ..p2p import TAG_UB
from .comm import Comm
from .locks import attribute, guard


class _Context:
    """A communicator's private duplicate and the next tag to give out."""

    def __init__(self, comm: Comm):
        self.duplicate = Comm.Dup(comm)  # an Intracomm whatever the class of comm, as mpi4py's
        self.tag = 0

    def next_tag(self) -> int:
        with guard:
            if self.tag >= TAG_UB:
                self.tag = 0
            tag, self.tag = self.tag, self.tag + 1
            return tag


def _free_context(comm: Comm, keyval: int, context: _Context) -> None:
    context.duplicate.Free()


def commctx_intra(comm: Comm) -> tuple[Comm, int]:
    """A handle of the communicator's private duplicate and a tag no earlier call got.

    The first call on a communicator makes the duplicate: every rank of it calls this together, as
    the collectives built on it do.
    """
    context = attribute(comm, "context", lambda: _Context(comm), _free_context)
    return Comm(context.duplicate), context.next_tag()


def commctx_inter(comm: Comm):
    """Inter-communicators are not supported: ``NotImplementedError`` (``ERR_COMM`` for a null one)."""
    comm.process_group()
    raise NotImplementedError("inter-communicators (MPI.Intercomm) are not supported by allreduce.MPI")
