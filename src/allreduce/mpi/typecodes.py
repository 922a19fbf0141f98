"""What a numpy dtype or a typecode stands for among the predefined datatypes: the datatype a bare
array's dtype is sent as, and the typecode and alignment ``mpi4py.util`` builds numpy dtypes from
(``MPI._typecode``, ``MPI._typealign``)."""

from __future__ import annotations

import numpy as np

from .datatypes import (
    BYTE, C_BOOL, C_DOUBLE_COMPLEX, C_FLOAT_COMPLEX, C_LONG_DOUBLE_COMPLEX, DOUBLE, FLOAT, INT, LONG, LONG_DOUBLE,
    SHORT, SIGNED_CHAR, UNSIGNED, UNSIGNED_LONG, UNSIGNED_SHORT, Datatype, pair_value,
)

_BY_DTYPE: dict[np.dtype, Datatype] = {}  # the datatype a bare array of each dtype stands for
for _type in (BYTE, SIGNED_CHAR, SHORT, UNSIGNED_SHORT, INT, UNSIGNED, LONG, UNSIGNED_LONG, FLOAT, DOUBLE,
              C_BOOL, C_FLOAT_COMPLEX, C_DOUBLE_COMPLEX, LONG_DOUBLE, C_LONG_DOUBLE_COMPLEX):
    _BY_DTYPE.setdefault(_type.dtype, _type)


def datatype_of(dtype) -> Datatype:
    """The predefined datatype of a numpy dtype (or a typecode such as ``"d"``), else an unnamed one."""
    dtype = np.dtype(dtype)
    return _BY_DTYPE.get(dtype) or Datatype(dtype, str(dtype))


def typecode_of(datatype: Datatype) -> str | None:
    """The numpy typecode of a predefined (or f90) datatype, ``None`` for others and for the pairs:
    what mpi4py's ``MPI._typecode`` answers, which ``mpi4py.util.dtlib`` builds numpy dtypes from."""
    if datatype.dtype is None or not datatype.is_predefined or datatype._is_pair:
        return None
    return datatype.tocode()


def typealign_of(datatype: Datatype) -> int | None:
    """The alignment in bytes of a predefined datatype (mpi4py's ``MPI._typealign``; a pair's is its
    stricter member's), else ``None``."""
    if datatype.dtype is None or not datatype.is_predefined:
        return None
    value = pair_value(datatype)
    if value is not None:
        return max(value.dtype.alignment, INT.dtype.alignment)
    return datatype.dtype.alignment
