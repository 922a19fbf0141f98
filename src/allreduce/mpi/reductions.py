"""MPI's reduction operations: callable on two Python objects, and mapped to a ReduceOp for buffers.

As in mpi4py, ``MPI.SUM(a, b)`` is ``a + b``: the object methods (``comm.allreduce(x, op=MPI.SUM)``)
combine pickled values by calling the op in rank order. Buffer methods run the library's ReduceOp;
the logical ops (LAND, LOR, LXOR) reduce "is nonzero" flags as booleans (MIN, MAX, BXOR of bools) and
write 0 or 1 back, which is MPI's result. A user op (``Op.Create(function, commute)``) is mpi4py's:
``function(invec, inoutvec, datatype)`` combines two buffers into the second; on buffers every
rank's input is gathered and folded in rank order, so it need not commute. As in mpi4py, at most
32 user ops exist at once.
"""

from __future__ import annotations

import operator

import numpy as np

from ..ops import ReduceOp, kernel
from .bufferargs import datatype_argument, simple, written
from .errorcodes import ERR_OP, error
from .handles import Handle, constant

MAX_USER_OPS = 32
_live_user_ops: set[object] = set()  # a token per user op not yet freed


class Op(Handle):
    """A reduction: ``op(x, y)`` combines two objects; buffers use ``native`` (``None``: folded here).

    ``Op()`` is ``OP_NULL``; ``Op(op)`` is another handle of the same op.
    """

    def __init__(self, op: Op | None = None, *, name: str = "OP_NULL", combine=None, native: ReduceOp | None = None,
                 logical: bool = False, commute: bool = True, function=None):
        if isinstance(op, Op):
            self.__dict__.update(op.__dict__)
            return
        if op is not None:
            raise TypeError(f"Op() takes an Op, got {type(op).__name__}")
        self.name, self.combine, self.native = name, combine, native
        self.logical = logical  # reduce (x != 0) as booleans, write back 0/1
        self.commute = commute
        self.function = function  # a user op's function(invec, inoutvec, datatype)

    @classmethod
    def Create(cls, function, commute: bool = False) -> Op:
        """A user op: ``function(invec, inoutvec, datatype)`` sets ``inoutvec`` to ``invec op inoutvec``.

        Raises:
            RuntimeError: 32 user ops exist already (``Free`` one first).
        """
        if len(_live_user_ops) >= MAX_USER_OPS:
            raise RuntimeError(f"cannot create more than {MAX_USER_OPS} user-defined reduction operations; "
                               "Free() one first")
        made = cls(name=getattr(function, "__name__", "user op"), commute=bool(commute), function=function)
        made._token = object()
        _live_user_ops.add(made._token)
        return made

    def __call__(self, x, y):
        if self.function is not None:
            return self.function(x, y, None)
        if self.combine is None:
            raise ValueError("cannot call MPI.OP_NULL")
        return self.combine(x, y)

    def __bool__(self) -> bool:
        return self.combine is not None or self.function is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        if not self and not other:
            return True
        if self.function is not None or other.function is not None:  # user ops: the same one
            return getattr(self, "_token", None) is getattr(other, "_token", None)
        return self.name == other.name

    def _shared(self):
        if self.function is not None:
            return self._token
        return _PREDEFINED[self.name] if self else None

    def _is_predefined(self) -> bool:
        return self.function is None

    def _release(self) -> None:
        self.__dict__.update(Op().__dict__)

    def __reduce__(self):
        """A predefined op unpickles as itself (another handle of it as a new handle); a user op as a new
        user op of the same function."""
        if self.function is not None:
            return Op.Create, (self.function, self.commute)
        predefined = _PREDEFINED[self.name]
        return (_predefined, (self.name,)) if self is predefined else (type(self), (predefined,))

    @property
    def is_predefined(self) -> bool:
        return self.function is None

    @property
    def is_commutative(self) -> bool:
        return self.commute

    def Is_commutative(self) -> bool:
        return self.commute

    def toint(self) -> int:
        """A number for the op (``-1`` for a user op, which has none that another process reads)."""
        return list(_PREDEFINED).index(self.name) if self.name in _PREDEFINED else -1

    @classmethod
    def fromint(cls, arg: int) -> Op:
        return Op(_PREDEFINED[list(_PREDEFINED)[int(arg)]])

    def Free(self) -> None:
        """Release a user op (predefined ones stay); this handle becomes ``OP_NULL``."""
        if self.function is None:
            raise error(ERR_OP, f"MPI.{self.name} is predefined: it cannot be freed")
        token = getattr(self, "_token", None)
        if token is not None:
            _live_user_ops.discard(token)
        self.__dict__.update(Op().__dict__)

    def for_buffers(self) -> ReduceOp:
        """The ReduceOp that reduces buffers for this op.

        Raises:
            MPI.Exception: ``ERR_OP`` for ``OP_NULL``. NotImplementedError: MAXLOC/MINLOC (pair datatypes).
        """
        if not self:
            raise error(ERR_OP, "MPI.OP_NULL cannot reduce")
        if self.native is None:
            raise NotImplementedError(f"MPI.{self.name} on buffers is not supported by allreduce.MPI (pair datatypes);"
                                      " use the lower-case object method instead")
        return self.native

    def fold(self, inputs: list[np.ndarray], datatype) -> np.ndarray:
        """``inputs[0] op inputs[1] op ...`` of arrays of one dtype, in that order (a user op, REPLACE, NO_OP)."""
        if self.name in ("MAXLOC", "MINLOC"):
            self.for_buffers()
        if self.function is None:
            return self.combine(inputs[0], inputs[-1]) if len(inputs) > 1 else inputs[0]
        result = bytearray(inputs[-1].tobytes())
        for earlier in reversed(inputs[:-1]):
            self.function(bytearray(earlier.tobytes()), result, datatype)
        return np.frombuffer(bytes(result), inputs[0].dtype)

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """Combine ``inbuf`` into ``inoutbuf`` on this process alone: ``inoutbuf = inbuf op inoutbuf``."""
        source, target = simple(inbuf, "inbuf", False), simple(inoutbuf, "inoutbuf", True)
        if source.size != target.size:
            raise ValueError(f"mismatch in inbuf count {source.size} and inoutbuf count {target.size}")
        if source.dtype != target.dtype:
            raise ValueError(f"mismatch in inbuf datatype ({source.dtype}) and inoutbuf datatype ({target.dtype})")
        if self.native is None:
            np.copyto(target, self.fold([source, target], datatype_argument(inoutbuf, target.dtype)), casting="unsafe")
            written(target)
            return
        operands = [source, target] if not self.logical else [source != 0, target != 0]
        np.copyto(target, kernel(self.for_buffers(), operands[0].dtype)(operands[0], operands[1]), casting="unsafe")
        written(target)

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
        return (v, j) if j < i else (u, i)
    return combine


def _logical(test):
    return lambda x, y: test(bool(x), bool(y))


def _predefined_op(name: str, combine, native: ReduceOp | None = None, logical: bool = False) -> Op:
    return constant(Op(name=name, combine=combine, native=native, logical=logical))


SUM = _predefined_op("SUM", operator.add, ReduceOp.SUM)
PROD = _predefined_op("PROD", operator.mul, ReduceOp.PRODUCT)
MIN = _predefined_op("MIN", min, ReduceOp.MIN)
MAX = _predefined_op("MAX", max, ReduceOp.MAX)
LAND = _predefined_op("LAND", _logical(operator.and_), ReduceOp.MIN, logical=True)
LOR = _predefined_op("LOR", _logical(operator.or_), ReduceOp.MAX, logical=True)
LXOR = _predefined_op("LXOR", _logical(operator.ne), ReduceOp.BXOR, logical=True)
BAND = _predefined_op("BAND", operator.and_, ReduceOp.BAND)
BOR = _predefined_op("BOR", operator.or_, ReduceOp.BOR)
BXOR = _predefined_op("BXOR", operator.xor, ReduceOp.BXOR)
MAXLOC = _predefined_op("MAXLOC", _loc(operator.gt))
MINLOC = _predefined_op("MINLOC", _loc(operator.lt))
REPLACE = _predefined_op("REPLACE", lambda x, y: y)
NO_OP = _predefined_op("NO_OP", lambda x, y: x)
OP_NULL = constant(Op())
_PREDEFINED = {op.name: op for op in (OP_NULL, MAX, MIN, SUM, PROD, LAND, BAND, LOR, BOR, LXOR, BXOR, MAXLOC,
                                      MINLOC, REPLACE, NO_OP)}


def _predefined(name: str) -> Op:
    return _PREDEFINED[name]
