"""A stretch of memory that an array interface describes (DLPack, the CUDA array interface).

The readers (:mod:`.dlpack`, :mod:`.cudaiface`) check a description as mpi4py checks it and give a
:class:`Region`; buffer arguments and ``MPI.buffer`` view its bytes from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CPU, CUDA = 1, 2  # DLPack device types
HOST_DEVICES = (CPU, 3, 13)  # kDLCPU, kDLCUDAHost (pinned), kDLCUDAManaged: memory the host reads directly


@dataclass(frozen=True)
class Region:
    """Where the memory is, how long, how to read its elements, and what keeps it alive."""

    address: int
    nbytes: int
    dtype: np.dtype  # uint8 where the elements are of a type numpy does not hold
    readonly: bool
    device: int  # a DLPack device type
    owner: object

    def array(self) -> np.ndarray:
        """A flat numpy view of the region (which reads nothing until it is indexed).

        Raises:
            BufferError: a NULL address for some bytes.
        """
        count = self.nbytes // self.dtype.itemsize
        if not self.address and count:
            raise BufferError(f"a NULL data pointer for {self.nbytes} bytes")
        return np.asarray(_Interface(self.address, count, self.dtype, self.readonly, self.owner))


class _Interface:
    """An ``__array_interface__`` over raw memory that keeps its owner alive with the view."""

    def __init__(self, address: int, count: int, dtype: np.dtype, readonly: bool, owner: object):
        self.owner = owner
        self.__array_interface__ = {"version": 3, "shape": (count,), "typestr": dtype.str,
                                    "data": (address or _EMPTY_ADDRESS, readonly)}


_EMPTY = np.empty(1, np.uint8)
_EMPTY_ADDRESS = _EMPTY.ctypes.data  # numpy takes no NULL pointer, not even for no elements


def dtype_of(kind: str, itemsize: int) -> np.dtype:
    """The native numpy dtype of a kind (``i u f c b``) and size; bytes (uint8) for any other."""
    if kind == "b" and itemsize == 1:
        return np.dtype(np.bool_)
    if kind and kind in "iufc" and itemsize in (1, 2, 4, 8, 16, 32):  # f16, c32: long double and its complex
        try:
            return np.dtype(f"{kind}{itemsize}")
        except TypeError:
            pass
    return np.dtype(np.uint8)


def check_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int, what: str) -> None:
    """Refuse byte strides that are neither C's nor Fortran's over the axes longer than 1.

    Raises:
        BufferError: the elements do not lie back to back.
    """
    if strides is None or int(np.prod(shape, dtype=np.int64)) <= 1:
        return
    for order in (range(len(shape) - 1, -1, -1), range(len(shape))):
        step = itemsize
        for axis in order:
            if shape[axis] > 1 and strides[axis] != step:
                break
            step *= shape[axis]
        else:
            return
    raise BufferError(f"{what} of shape {list(shape)} and strides {list(strides)} is not contiguous")


def check_shape(shape: tuple[int, ...], what: str) -> None:
    if any(n < 0 for n in shape):
        raise BufferError(f"{what} of negative extent: shape {list(shape)}")
