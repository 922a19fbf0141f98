"""MPI's reduction operations: callable on two Python objects, and mapped to a ReduceOp for buffers.

As in mpi4py, ``MPI.SUM(a, b)`` is ``a + b``: the object methods (``comm.allreduce(x, op=MPI.SUM)``)
combine pickled values by calling the op in rank order. Buffer methods run the library's ReduceOp;
the logical ops (LAND, LOR, LXOR) reduce "is nonzero" flags as booleans (MIN, MAX, BXOR of bools) and
write 0 or 1 back, which is MPI's result.
"""

from __future__ import annotations

import operator

from ..ops import ReduceOp


class Op:
    """A reduction: ``op(x, y)`` combines two objects; buffers use ``native`` (``None``: objects only)."""

    def __init__(self, name: str, combine, native: ReduceOp | None = None, logical: bool = False,
                 commute: bool = True):
        self.name = name
        self.combine = combine
        self.native = native  # the ReduceOp that reduces buffers
        self.logical = logical  # reduce (x != 0) as booleans, write back 0/1
        self.commute = commute

    @classmethod
    def Create(cls, function, commute: bool = False) -> "Op":
        """A user op for the object methods: ``function(x, y)`` (buffer methods refuse it)."""
        return cls(getattr(function, "__name__", "user op"), function, commute=commute)

    def __call__(self, x, y):
        return self.combine(x, y)

    def Is_commutative(self) -> bool:
        return self.commute

    def Free(self) -> None:
        """Nothing to release: an op here is a plain value."""

    def for_buffers(self) -> ReduceOp:
        """The ReduceOp that reduces buffers for this op.

        Raises:
            NotImplementedError: MAXLOC/MINLOC (they need pair datatypes) or a user-defined op.
        """
        if self.native is None:
            raise NotImplementedError(f"MPI.{self.name} on buffers is not supported by allreduce.MPI (pair datatypes "
                                      "and user-defined buffer ops); use the lower-case object method instead")
        return self.native

    def __repr__(self) -> str:
        return f"<Op MPI.{self.name}>"


def _loc(better):
    """MAXLOC/MINLOC on ``(value, index)`` pairs: the better value, the lower index on a tie."""
    def combine(x, y):
        (u, i), (v, j) = x, y
        if better(u, v):
            return u, i
        if better(v, u):
            return v, j
        return u, min(i, j)
    return combine


SUM = Op("SUM", operator.add, ReduceOp.SUM)
PROD = Op("PROD", operator.mul, ReduceOp.PRODUCT)
MIN = Op("MIN", min, ReduceOp.MIN)
MAX = Op("MAX", max, ReduceOp.MAX)
LAND = Op("LAND", lambda x, y: bool(x) and bool(y), ReduceOp.MIN, logical=True)
LOR = Op("LOR", lambda x, y: bool(x) or bool(y), ReduceOp.MAX, logical=True)
LXOR = Op("LXOR", lambda x, y: bool(x) != bool(y), ReduceOp.BXOR, logical=True)
BAND = Op("BAND", operator.and_, ReduceOp.BAND)
BOR = Op("BOR", operator.or_, ReduceOp.BOR)
BXOR = Op("BXOR", operator.xor, ReduceOp.BXOR)
MAXLOC = Op("MAXLOC", _loc(operator.gt))
MINLOC = Op("MINLOC", _loc(operator.lt))
