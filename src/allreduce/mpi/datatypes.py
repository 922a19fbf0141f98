"""MPI datatypes as numpy dtypes, and mpi4py's buffer arguments turned into flat numpy views.

A buffer argument is an array (any buffer-protocol object), or a list in mpi4py's forms:
``[data, MPI.DOUBLE]``, ``[data, count, MPI.DOUBLE]``, ``[data, (count, displ), MPI.DOUBLE]``; the
vector collectives also take ``[data, counts]``, ``[data, (counts, displs)]``,
``[data, counts, displs, MPI.DOUBLE]``. Counts and displacements are in units of the datatype. The
datatype reinterprets the data's bytes, as in MPI; without one, the array's own dtype decides.
Derived datatypes other than contiguous ones would need gathers of strided memory, which the flat
views of this library cannot express: they raise ``NotImplementedError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..buffers import as_array, flat
from ..uneven import displacements

_DERIVED = ("Create_vector", "Create_hvector", "Create_indexed", "Create_hindexed", "Create_indexed_block",
            "Create_hindexed_block", "Create_struct", "Create_subarray", "Create_darray", "Create_resized")


class _InPlace:
    """``MPI.IN_PLACE``: the receive buffer also holds this rank's input."""

    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE = _InPlace()


@dataclass(frozen=True, eq=False)
class Datatype:
    """An element type: a numpy dtype, repeated ``count`` times for a contiguous derived type."""

    dtype: np.dtype  # the basic element
    name: str  # MPI's name, e.g. MPI_DOUBLE
    count: int = 1  # basic elements in one element of this type

    @property
    def size(self) -> int:
        return self.dtype.itemsize * self.count

    extent = size

    def Get_size(self) -> int:
        return self.size

    def Get_extent(self) -> tuple[int, int]:
        return 0, self.size

    def Get_name(self) -> str:
        return self.name

    def Create_contiguous(self, count: int) -> "Datatype":
        """``count`` elements of this type back to back, as one element."""
        return Datatype(self.dtype, f"CONTIGUOUS({count}, {self.name})", self.count * int(count))

    def Commit(self) -> "Datatype":
        return self

    def Free(self) -> None:
        """Nothing to release: a datatype here is a plain value."""

    def __getattr__(self, name: str):
        if name in _DERIVED:
            raise NotImplementedError(f"derived datatypes other than contiguous ({name}) are not supported by "
                                      "allreduce.MPI; copy the data into a contiguous array")
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<Datatype {self.name}>"


def _predefined(name: str, dtype) -> Datatype:
    return Datatype(np.dtype(dtype), f"MPI_{name}")


BYTE = _predefined("BYTE", np.uint8)
CHAR = _predefined("CHAR", np.int8)
SIGNED_CHAR = _predefined("SIGNED_CHAR", np.int8)
UNSIGNED_CHAR = _predefined("UNSIGNED_CHAR", np.uint8)
SHORT = _predefined("SHORT", np.short)
UNSIGNED_SHORT = _predefined("UNSIGNED_SHORT", np.ushort)
INT = _predefined("INT", np.intc)
UNSIGNED = _predefined("UNSIGNED", np.uintc)
LONG = _predefined("LONG", np.int_)
UNSIGNED_LONG = _predefined("UNSIGNED_LONG", np.uint)
LONG_LONG = _predefined("LONG_LONG", np.longlong)
UNSIGNED_LONG_LONG = _predefined("UNSIGNED_LONG_LONG", np.ulonglong)
INT8_T = _predefined("INT8_T", np.int8)
INT16_T = _predefined("INT16_T", np.int16)
INT32_T = _predefined("INT32_T", np.int32)
INT64_T = _predefined("INT64_T", np.int64)
UINT8_T = _predefined("UINT8_T", np.uint8)
UINT16_T = _predefined("UINT16_T", np.uint16)
UINT32_T = _predefined("UINT32_T", np.uint32)
UINT64_T = _predefined("UINT64_T", np.uint64)
FLOAT = _predefined("FLOAT", np.float32)
DOUBLE = _predefined("DOUBLE", np.float64)
C_BOOL = _predefined("C_BOOL", np.bool_)
BOOL = _predefined("BOOL", np.bool_)
C_FLOAT_COMPLEX = _predefined("C_FLOAT_COMPLEX", np.complex64)
C_DOUBLE_COMPLEX = _predefined("C_DOUBLE_COMPLEX", np.complex128)
COMPLEX = _predefined("COMPLEX", np.complex64)
DOUBLE_COMPLEX = _predefined("DOUBLE_COMPLEX", np.complex128)

_BY_DTYPE: dict[np.dtype, Datatype] = {}
for _type in (BYTE, SIGNED_CHAR, SHORT, UNSIGNED_SHORT, INT, UNSIGNED, LONG, UNSIGNED_LONG, FLOAT, DOUBLE,
              C_BOOL, C_FLOAT_COMPLEX, C_DOUBLE_COMPLEX):  # the one a bare array of each dtype stands for
    _BY_DTYPE.setdefault(_type.dtype, _type)


def datatype_of(dtype) -> Datatype:
    """The predefined datatype of a numpy dtype (or a typecode such as ``"d"``), else an unnamed one."""
    dtype = np.dtype(dtype)
    return _BY_DTYPE.get(dtype) or Datatype(dtype, str(dtype))


def simple(spec, what: str, writable: bool) -> np.ndarray:
    """The elements a buffer argument names, as a flat view of its basic dtype.

    Raises:
        ValueError: a count or displacement beyond the data, or a malformed argument.
        TypeError: data that is not a contiguous buffer of a dtype collectives carry.
    """
    data, count, datatype = _parts(spec, what)
    displ = 0
    if isinstance(count, (tuple, list)):
        count, displ = count
    elements, per = _elements(data, datatype, what, writable)
    available = elements.size // per
    count = available - displ if count is None else int(count)
    if displ < 0 or count < 0 or displ + count > available:
        raise ValueError(f"{what}: {count} elements from {displ} do not fit in its {available} elements")
    return elements[displ * per:(displ + count) * per]


def vector(spec, size: int, what: str, writable: bool) -> tuple[np.ndarray, list[int], list[int]]:
    """``(elements, counts, displs)`` of a vector buffer argument, counts and displs in basic elements.

    Without counts the data splits into ``size`` equal blocks; without displs blocks lie back to back.
    """
    data, counts, displs, datatype = _vector_parts(spec, what)
    elements, per = _elements(data, datatype, what, writable)
    if counts is None:
        counts = [elements.size // per // size] * size
    elif isinstance(counts, (int, np.integer)):
        counts = [int(counts)] * size
    counts = [int(c) for c in counts]
    displs = displacements(counts) if displs is None else [int(d) for d in displs]
    if len(counts) != size or len(displs) != size:
        raise ValueError(f"{what}: needs one count and displacement per rank ({size}), got {len(counts)} and {len(displs)}")
    if any(c < 0 or d < 0 or (d + c) * per > elements.size for c, d in zip(counts, displs)):
        raise ValueError(f"{what}: blocks (counts {counts}, displs {displs}) do not fit in its {elements.size // per} elements")
    return elements, [c * per for c in counts], [d * per for d in displs]


def _parts(spec, what: str) -> tuple:
    """``(data, count, datatype)`` of a buffer argument; ``count`` may be ``(count, displ)`` or ``None``."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None
    if not 1 <= len(spec) <= 3:
        raise ValueError(f"{what}: a buffer argument is [data], [data, datatype] or [data, count, datatype], "
                         f"got {len(spec)} items")
    data, *rest = spec
    datatype = rest.pop() if rest and _is_datatype(rest[-1]) else None
    return data, (rest[0] if rest else None), datatype


def _vector_parts(spec, what: str) -> tuple:
    """``(data, counts, displs, datatype)`` of a vector buffer argument, ``None`` where not given."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    data, *rest = spec
    datatype = rest.pop() if rest and _is_datatype(rest[-1]) else None
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)) and len(rest[0]) == 2 \
            and not isinstance(rest[0][0], (int, np.integer)):
        rest = list(rest[0])  # [data, (counts, displs), ...]
    if len(rest) > 2:
        raise ValueError(f"{what}: a vector buffer argument is [data, counts, displs, datatype] or shorter, got {len(spec)} items")
    counts, displs = (rest + [None, None])[:2]
    return data, counts, displs, datatype


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, str))


def _elements(data, datatype, what: str, writable: bool) -> tuple[np.ndarray, int]:
    """The data as a flat array of the datatype's basic dtype, and how many make one element."""
    arr = flat(as_array(data, what, writable))
    if datatype is None:
        return arr, 1
    if isinstance(datatype, str):
        datatype = datatype_of(datatype)
    if arr.dtype != datatype.dtype:
        if arr.nbytes % datatype.dtype.itemsize:
            raise ValueError(f"{what}: {arr.nbytes} bytes are not a whole number of {datatype.name}")
        arr = arr.view(np.uint8).view(datatype.dtype)
    return arr, datatype.count
