"""mpi4py's lower-case collectives on picklable objects, as compositions of the object collectives.

Each holds its communicator's lock of its name (``comm_lock(comm, "bcast")``...) while it runs, as
mpi4py's do. Reductions follow mpi4py: every rank's object is gathered and the op is applied in rank order
(``op(op(x0, x1), x2)``), so a non-commutative op sees its operands in order; ``exscan`` gives
``None`` on rank 0.
"""

from __future__ import annotations

import functools

from .. import objects, uneven
from .parsed import check_root
from .locks import comm_lock
from .reductions import SUM


class ObjectCollectives:
    """The object collectives of :class:`~allreduce.mpi.comm.Comm`, which provides ``process_group()``."""

    def barrier(self) -> None:
        self.Barrier()

    def bcast(self, obj, root: int = 0):
        root = check_root(root, self.process_group().size)
        box = [obj]
        with comm_lock(self, "bcast"):
            objects.broadcast_object_list(box, root, self.process_group())
        return box[0]

    def gather(self, sendobj, root: int = 0) -> list | None:
        """Every rank's object, in rank order, on ``root``; ``None`` elsewhere."""
        g = self.process_group()
        root = check_root(root, g.size)
        out = [None] * g.size if g.rank == root else None
        with comm_lock(self, "gather"):
            objects.gather_object(sendobj, out, root, g)
        return out

    def scatter(self, sendobj, root: int = 0):
        """Item r of ``root``'s list ``sendobj`` (ignored elsewhere) on rank r; ``None`` sends ``None``."""
        g = self.process_group()
        root = check_root(root, g.size)
        box = [None]
        with comm_lock(self, "scatter"):
            objects.scatter_object_list(box, _per_rank(sendobj, g.size) if g.rank == root else None, root, g)
        return box[0]

    def allgather(self, sendobj) -> list:
        out = [None] * self.process_group().size
        with comm_lock(self, "allgather"):
            objects.all_gather_object(out, sendobj, self.process_group())
        return out

    def alltoall(self, sendobj) -> list:
        """Item j of every rank's list to rank j, which gets the list of what each rank sent it (``None``
        sends ``None`` to every rank)."""
        g = self.process_group()
        objects.check_trusted(g, "alltoall")
        items = _per_rank(sendobj, g.size)
        if len(items) != g.size:
            raise ValueError(f"alltoall takes one item per rank ({g.size}), got {len(items)}")
        out: list = []
        with comm_lock(self, "alltoall"):
            uneven.all_to_all(g, [objects.dumps(item) for item in items],
                              lambda got: out.extend(objects.loads(block) for block in got))
        return out

    def reduce(self, sendobj, op=SUM, root: int = 0):
        gathered = self.gather(sendobj, root)
        return None if gathered is None else functools.reduce(op, gathered)

    def allreduce(self, sendobj, op=SUM):
        return functools.reduce(op, self.allgather(sendobj))

    def scan(self, sendobj, op=SUM):
        return functools.reduce(op, self.allgather(sendobj)[:self.process_group().rank + 1])

    def exscan(self, sendobj, op=SUM):
        before = self.allgather(sendobj)[:self.process_group().rank]
        return functools.reduce(op, before) if before else None


def _per_rank(sendobj, size: int) -> list:
    """The items of a scatter's or an all-to-all's ``sendobj``: ``None`` is one ``None`` per rank."""
    return [None] * size if sendobj is None else list(sendobj)
