"""mpi4py's buffer arguments turned into flat numpy views of their elements.

A buffer argument is any buffer-protocol object, DLPack array or ``__array_interface__`` in host
memory, or a list in mpi4py's forms: ``[data, MPI.DOUBLE]``, ``[data, count, MPI.DOUBLE]``,
``[data, (count, displ), MPI.DOUBLE]``, ``[data, count, displ, MPI.DOUBLE]``; the vector collectives
also take ``[data, counts]``, ``[data, (counts, displs)]``, ``[data, counts, displs, MPI.DOUBLE]``.
Counts and displacements are in units of the datatype, which reinterprets the data's bytes, as in
MPI; without one, the array's own dtype decides. ``None`` (or ``BOTTOM``) as the data is a buffer of
no elements.

A derived datatype whose elements do not lie back to back (a vector, a struct, a subarray...) gives
its buffer's elements packed (:mod:`.derived`): a copy of its basic dtype, the elements in order. A
receive buffer packed so is a :class:`Scattered` array; the call that fills it calls :func:`written`
once done, which writes the elements back where the datatype lays them.
"""

from __future__ import annotations

import ctypes
import operator

import numpy as np

from ..dtypes import code_of
from ..uneven import displacements
from .arrays import array_of
from .constants import BOTTOM
from .datatypes import Datatype
from .typecodes import datatype_of


class Scattered(np.ndarray):
    """Packed elements of a receive buffer laid out by a derived datatype (views of it share its home:
    the user's bytes and the layout that :meth:`unpack` writes them back through)."""

    def __array_finalize__(self, obj) -> None:
        self.home = getattr(obj, "home", None)

    def unpack(self) -> None:
        packed, raw, layout, count = self.home
        layout.unpack(packed, raw, count)


def written(*targets) -> None:
    """Write each packed receive buffer back into its user's memory (plain buffers are already there)."""
    for target in targets:
        if isinstance(target, Scattered):
            target.unpack()


def unpacking(*targets):
    """A request's ``finish`` that writes the packed ``targets`` back, or ``None`` if none is packed."""
    if not any(isinstance(t, Scattered) for t in targets):
        return None
    return lambda: written(*targets)


def simple(spec, what: str, writable: bool) -> np.ndarray:
    """The elements a buffer argument names, as a flat view of its basic dtype (``None``: no elements).

    Raises:
        ValueError: a count or displacement beyond the data, or a malformed argument.
        TypeError: data that is not a contiguous buffer of a dtype collectives carry.
    """
    if spec is None or spec is BOTTOM:
        return np.empty(0, np.uint8)
    elements, per, count, displ, available = _located(spec, what, writable)
    count = available - displ if count is None else operator.index(count)
    if displ < 0 or count < 0 or displ + count > available:
        raise ValueError(f"{what}: {count} elements from {displ} do not fit in its {available} elements")
    return elements[displ * per:(displ + count) * per]


def _located(spec, what: str, writable: bool) -> tuple[np.ndarray, int, int | None, int, int]:
    """A buffer argument's elements (flat, basic dtype), the elements per item of its datatype, its
    count (``None``: not given), its displacement and how many items the data holds."""
    data, count, datatype = _parts(spec, what)
    displ = 0
    if isinstance(count, (tuple, list)):
        count, displ = count
    displ = 0 if displ is None else operator.index(displ)
    elements, per = _elements(data, datatype, what, writable, exact=count is None)
    return elements, per, count, displ, elements.size // max(per, 1)


def blocked(spec, size: int, what: str, writable: bool) -> np.ndarray:
    """The elements of a buffer argument that holds one block per rank: an explicit count is the
    count of one block (as in MPI, where ``recvcount`` of a gather is per rank); without one the
    data splits into ``size`` equal blocks.

    Raises:
        ValueError: data that does not split into ``size`` equal blocks, or blocks beyond the data.
    """
    if spec is None or spec is BOTTOM:
        return np.empty(0, np.uint8)
    elements, per, count, displ, available = _located(spec, what, writable)
    if count is None:
        if (available - displ) % size:
            raise ValueError(f"{what}: {available - displ} elements do not split into {size} equal blocks")
        count = (available - displ) // size
    count = operator.index(count)
    if displ < 0 or count < 0 or displ + count * size > available:
        raise ValueError(f"{what}: {size} blocks of {count} elements from {displ} do not fit in its {available} "
                         "elements")
    return elements[displ * per:(displ + count * size) * per]


def vector(spec, size: int, what: str, writable: bool) -> tuple[np.ndarray, list[int], list[int]]:
    """``(elements, counts, displs)`` of a vector buffer argument, counts and displs in basic elements.

    Without counts the data splits into ``size`` equal blocks; without displs blocks lie back to back.
    """
    data, counts, displs, datatype = _vector_parts(spec, what)
    elements, per = _elements(data, datatype, what, writable, exact=counts is None)
    counts = [elements.size // per // size] * size if counts is None else _integers(counts, size, 0)
    displs = displacements(counts) if displs is None else _integers(displs, size, 1)
    if len(counts) != size or len(displs) != size:
        raise ValueError(f"{what}: needs one count and displacement per rank ({size}), "
                         f"got {len(counts)} and {len(displs)}")
    if any(c < 0 or d < 0 or (d + c) * per > elements.size for c, d in zip(counts, displs)):
        raise ValueError(f"{what}: blocks (counts {counts}, displs {displs}) do not fit in its "
                         f"{elements.size // per} elements")
    return elements, [c * per for c in counts], [d * per for d in displs]


def _integers(given, size: int, stride: int) -> list[int]:
    """Counts or displacements, one per rank: a list of integers, or one integer (the same count for
    every rank, or with ``stride`` one step: block r starts at r times it).

    Raises:
        TypeError: a number that is not an integer (a float, say).
    """
    try:
        one = operator.index(given)
    except TypeError:
        return [operator.index(x) for x in given]
    return [one * r for r in range(size)] if stride else [one] * size


def datatype_argument(spec, dtype) -> Datatype:
    """The datatype a buffer argument names, else the one of ``dtype``."""
    if isinstance(spec, (list, tuple)) and spec and _is_datatype(spec[-1]):
        return _datatype(spec[-1])
    return datatype_of(dtype)


def _parts(spec, what: str) -> tuple:
    """``(data, count, datatype)`` of a buffer argument; ``count`` may be ``(count, displ)`` or ``None``.

    The forms are mpi4py's: ``[data]``, ``[data, datatype]``, ``[data, count]``, ``[data, (count,
    displ)]``, ``[data, count or (count, displ), datatype]``, ``[data, count, displ, datatype]``;
    ``None`` stands for what is not given.
    """
    if not isinstance(spec, (list, tuple)):
        return spec, None, None
    data, *rest = spec
    if len(rest) == 1 and _is_datatype(rest[0]):
        return data, None, rest[0]
    if len(rest) <= 1:
        return data, (rest[0] if rest else None), None
    if len(rest) == 2 and (rest[1] is None or _is_datatype(rest[1])):
        return data, rest[0], rest[1]
    if len(rest) == 3 and (rest[2] is None or _is_datatype(rest[2])):
        return data, (rest[0], rest[1]), rest[2]
    raise ValueError(f"{what}: a buffer argument is [data, count, displ, datatype] or shorter, got {len(spec)} "
                     f"items")


def _vector_parts(spec, what: str) -> tuple:
    """``(data, counts, displs, datatype)`` of a vector buffer argument, ``None`` where not given.

    As in mpi4py, a tuple where the counts go is ``(counts, displs)``; a list is the counts.
    """
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    data, *rest = spec
    datatype = None
    if rest and (_is_datatype(rest[-1]) or (rest[-1] is None and len(rest) in (2, 3))):
        datatype = rest.pop()
    if len(rest) == 1 and isinstance(rest[0], tuple):
        if len(rest[0]) != 2:
            raise ValueError(f"{what}: (counts, displs) must be a pair, got {rest[0]!r}")
        rest = list(rest[0])  # [data, (counts, displs), ...]
    if len(rest) > 2:
        raise ValueError(f"{what}: a vector buffer argument is [data, counts, displs, datatype] or shorter, "
                         f"got {len(spec)} items")
    counts, displs = (rest + [None, None])[:2]
    return data, counts, displs, datatype


def _datatype(named) -> Datatype:
    """The datatype a buffer argument names (a typecode is looked up as mpi4py looks it up).

    Raises:
        KeyError: a typecode of no datatype.
        ValueError: ``DATATYPE_NULL``.
    """
    if isinstance(named, str):
        try:
            named = Datatype.fromcode(named)
        except ValueError:
            raise KeyError(f"typecode {named!r} names no datatype") from None
    if not named:
        raise ValueError("a buffer argument's datatype is DATATYPE_NULL")
    if named.extent < 0:
        raise ValueError(f"a buffer argument's datatype has a negative extent ({named.extent})")
    return named


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, str))


def _elements(data, datatype, what: str, writable: bool, exact: bool) -> tuple[np.ndarray, int]:
    """The data as a flat array of the datatype's basic dtype, and how many make one element
    (``None`` or ``BOTTOM`` as the data: no elements). Bytes after the last whole element are left
    out, unless ``exact`` (no count given: the data's size is the message's), where they raise."""
    arr = np.empty(0, np.uint8) if data is None or data is BOTTOM else array_of(data, what, writable)
    if datatype is None:
        if not arr.dtype.isnative:
            raise BufferError(f"{what} is of dtype {arr.dtype.str}, not in native byte order; name a datatype "
                              "to move its bytes")
        code_of(arr.dtype)
        return arr, 1
    datatype = _datatype(datatype)
    basic = datatype._basic()
    if not datatype.dense:
        return _packed(arr.view(np.uint8), datatype.typemap, writable), datatype.count
    if arr.dtype != basic:
        left = arr.nbytes % basic.itemsize
        if left and exact:
            raise ValueError(f"{what}: {arr.nbytes} bytes are not a whole number of {datatype.name}")
        arr = arr.view(np.uint8)[:arr.nbytes - left].view(basic)
    return arr, datatype.count


def absolute(datatype: Datatype, count: int, displ: int, writable: bool) -> np.ndarray:
    """The elements of ``count`` items of ``datatype`` at ``MPI.BOTTOM + displ``: its offsets are
    absolute addresses (``MPI.Get_address``), read (and written back, if ``writable``) in place."""
    if count <= 0 or datatype.size == 0:
        return np.empty(0, datatype._basic())
    layout = datatype.typemap
    low = int(displ) + layout.true_bounds[0]
    nbytes = (count - 1) * layout.extent + layout.true_bounds[1] - layout.true_bounds[0]
    if low <= 0:
        raise ValueError(f"MPI.BOTTOM with {datatype.Get_name() or 'a datatype'} whose data starts at address "
                         f"{low}: its displacements must be absolute addresses (MPI.Get_address)")
    raw = np.frombuffer((ctypes.c_char * nbytes).from_address(low), np.uint8)
    return _packed(raw, layout.shifted(low - int(displ)), writable)[:count * datatype.count]


def _packed(raw: np.ndarray, layout, writable: bool) -> np.ndarray:
    """Every whole element of the bytes ``raw`` laid out by ``layout``, packed into an array of its
    basic dtype (a :class:`Scattered` one if ``writable``)."""
    count = layout.available(raw.size)
    packed = layout.pack(raw, count).view(layout.basic)
    if not writable:
        return packed
    scattered = packed.view(Scattered)
    scattered.home = (scattered.view(np.ndarray), raw, layout, count)
    return scattered
