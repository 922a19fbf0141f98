"""mpi4py's buffer arguments turned into flat numpy views of their elements.

A buffer argument is any buffer-protocol object, DLPack array or ``__array_interface__`` in host
memory, or a list in mpi4py's forms: ``[data, MPI.DOUBLE]``, ``[data, count, MPI.DOUBLE]``,
``[data, (count, displ), MPI.DOUBLE]``, ``[data, count, displ, MPI.DOUBLE]``; the vector collectives
also take ``[data, counts]``, ``[data, (counts, displs)]``, ``[data, counts, displs, MPI.DOUBLE]``.
Counts and displacements are in units of the datatype, which reinterprets the data's bytes, as in
MPI; without one, the array's own dtype decides. ``None`` (or ``BOTTOM``) as the data is a buffer of
no elements.
"""

from __future__ import annotations

import numpy as np

from ..buffers import as_array, flat
from ..uneven import displacements
from . import dlpack
from .datatypes import Datatype, datatype_of


class _InPlace:
    """``MPI.IN_PLACE``: the receive buffer also holds this rank's input."""

    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE = _InPlace()


class _Bottom:
    """``MPI.BOTTOM``: address zero, the base of absolute addresses (here: a buffer of no elements)."""

    def __repr__(self) -> str:
        return "BOTTOM"


BOTTOM = _Bottom()


def simple(spec, what: str, writable: bool) -> np.ndarray:
    """The elements a buffer argument names, as a flat view of its basic dtype (``None``: no elements).

    Raises:
        ValueError: a count or displacement beyond the data, or a malformed argument.
        TypeError: data that is not a contiguous buffer of a dtype collectives carry.
    """
    if spec is None or spec is BOTTOM:
        return np.empty(0, np.uint8)
    data, count, datatype = _parts(spec, what)
    displ = 0
    if isinstance(count, (tuple, list)):
        count, displ = count
    displ = 0 if displ is None else int(displ)
    elements, per = _elements(data, datatype, what, writable)
    available = elements.size // per
    count = available - displ if count is None else int(count)
    if displ < 0 or count < 0 or displ + count > available:
        raise ValueError(f"{what}: {count} elements from {displ} do not fit in its {available} elements")
    return elements[displ * per:(displ + count) * per]


def blocked(spec, size: int, what: str, writable: bool) -> np.ndarray:
    """The elements of a buffer argument that holds one block per rank: an explicit count is the
    count of one block (as in MPI, where ``recvcount`` of a gather is per rank); without one the
    data splits into ``size`` equal blocks.

    Raises:
        ValueError: data that does not split into ``size`` equal blocks, or blocks beyond the data.
    """
    if spec is None or spec is BOTTOM:
        return np.empty(0, np.uint8)
    data, count, datatype = _parts(spec, what)
    displ = 0
    if isinstance(count, (tuple, list)):
        count, displ = count
    displ = 0 if displ is None else int(displ)
    elements, per = _elements(data, datatype, what, writable)
    available = elements.size // per
    if count is None:
        if (available - displ) % size:
            raise ValueError(f"{what}: {available - displ} elements do not split into {size} equal blocks")
        count = (available - displ) // size
    count = int(count)
    if displ < 0 or count < 0 or displ + count * size > available:
        raise ValueError(f"{what}: {size} blocks of {count} elements from {displ} do not fit in its {available} "
                         "elements")
    return elements[displ * per:(displ + count * size) * per]


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
    if displs is None:
        displs = displacements(counts)
    elif isinstance(displs, (int, np.integer)):
        displs = [int(displs) * r for r in range(size)]  # one stride: block r starts at r * displs
    displs = [int(d) for d in displs]
    if len(counts) != size or len(displs) != size:
        raise ValueError(f"{what}: needs one count and displacement per rank ({size}), got {len(counts)} and {len(displs)}")
    if any(c < 0 or d < 0 or (d + c) * per > elements.size for c, d in zip(counts, displs)):
        raise ValueError(f"{what}: blocks (counts {counts}, displs {displs}) do not fit in its {elements.size // per} elements")
    return elements, [c * per for c in counts], [d * per for d in displs]


def datatype_argument(spec, dtype) -> "Datatype":
    """The datatype a buffer argument names, else the one of ``dtype``."""
    if isinstance(spec, (list, tuple)) and spec and _is_datatype(spec[-1]):
        return spec[-1] if isinstance(spec[-1], Datatype) else Datatype.fromcode(spec[-1])
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
        raise ValueError(f"{what}: a vector buffer argument is [data, counts, displs, datatype] or shorter, got {len(spec)} items")
    counts, displs = (rest + [None, None])[:2]
    return data, counts, displs, datatype


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, str))


def array_of(data, what: str, writable: bool) -> np.ndarray:
    """A numpy view of any buffer mpi4py takes: the buffer protocol, DLPack, ``__array_interface__``,
    or ``__cuda_array_interface__`` over host memory (what an MPI without device support reads)."""
    if isinstance(data, np.ndarray) or type(data).__module__.startswith("torch"):
        return as_array(data, what, writable)
    if hasattr(data, "mpi_view"):  # MPI.buffer, Alloc_mem's memory
        data = data.mpi_view()
    elif hasattr(data, "__dlpack__"):
        data = dlpack.view(data)
    elif hasattr(data, "__cuda_array_interface__") and not hasattr(data, "__array_interface__"):
        if type(data).__module__.split(".")[0] in _DEVICE_LIBRARIES:
            raise TypeError(f"{what} is in GPU memory ({type(data).__module__}); pass a host array")
        data = np.asarray(_HostInterface(data.__cuda_array_interface__))
    elif hasattr(data, "__array_interface__"):
        data = np.asarray(data)
    return as_array(data, what, writable)


_DEVICE_LIBRARIES = ("cupy", "numba", "torch", "jax", "pycuda")  # their CUDA interface points at device memory


class _HostInterface:
    """A CUDA array interface whose pointer is host memory, shown to numpy as an array interface."""

    def __init__(self, interface: dict):
        self.__array_interface__ = {"version": 3, "shape": tuple(interface["shape"]), "typestr": interface["typestr"],
                                    "data": tuple(interface["data"]), "strides": interface.get("strides")}


def _elements(data, datatype, what: str, writable: bool) -> tuple[np.ndarray, int]:
    """The data as a flat array of the datatype's basic dtype, and how many make one element
    (``None`` or ``BOTTOM`` as the data: no elements)."""
    arr = np.empty(0, np.uint8) if data is None or data is BOTTOM else flat(array_of(data, what, writable))
    if datatype is None:
        return arr, 1
    if isinstance(datatype, str):
        datatype = Datatype.fromcode(datatype)
    basic = datatype._basic()
    if arr.dtype != basic:
        if arr.nbytes % basic.itemsize:
            raise ValueError(f"{what}: {arr.nbytes} bytes are not a whole number of {datatype.name}")
        arr = arr.view(np.uint8).view(basic)
    return arr, datatype.count
