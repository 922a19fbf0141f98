"""Any buffer mpi4py takes, as a flat numpy view of its memory: what every buffer argument (and
``Pack``/``Unpack``, ``Get_address``) starts from, before a count or a datatype says which elements."""

from __future__ import annotations

import numpy as np

from ..buffers import as_array
from . import cudaiface, dlpack
from .constants import BOTTOM
from .memregion import HOST_DEVICES, Region


def raw_bytes(data, what: str, writable: bool) -> np.ndarray:
    """The bytes of a plain buffer (no count, no datatype), as a flat uint8 view."""
    if data is None or data is BOTTOM:
        return np.empty(0, np.uint8)
    return array_of(data, what, writable).view(np.uint8)


def array_of(data, what: str, writable: bool) -> np.ndarray:
    """A flat numpy view of any buffer mpi4py takes, its elements in memory order: the buffer
    protocol, DLPack, ``__array_interface__``, or ``__cuda_array_interface__`` over memory the host
    reads (what an MPI without device support reads); C or Fortran order alike.

    Raises:
        TypeError: ``data`` offers no memory, or is an array library's device memory.
        BufferError: memory that is read-only where ``writable``, or not contiguous.
    """
    if type(data).__module__.startswith("torch"):
        return as_array(data, what, writable)  # CPU tensors (bfloat16 too); device ones refused
    if isinstance(data, np.ndarray):
        arr = data
    elif hasattr(data, "mpi_view"):  # MPI.buffer, Alloc_mem's memory
        arr = data.mpi_view()
    elif hasattr(data, "__dlpack__"):
        arr = _host_region(dlpack.region(data), data, what)
    elif hasattr(data, "__cuda_array_interface__") and not hasattr(data, "__array_interface__"):
        arr = _host_region(cudaiface.region(data), data, what)
    elif hasattr(data, "__array_interface__"):
        arr = np.asarray(data)
    else:
        try:
            arr = np.asarray(memoryview(data))
        except TypeError:
            raise TypeError(f"{what} must be a buffer, a DLPack array or an array interface, got "
                            f"{type(data).__name__}") from None
    if writable and not arr.flags.writeable:
        raise BufferError(f"{what} is read-only; a receive buffer must be writable")
    if arr.flags.c_contiguous:
        arr = arr.reshape(-1)
    elif arr.flags.f_contiguous:
        arr = arr.reshape(-1, order="F")
    else:
        raise BufferError(f"{what} is not contiguous (strides {arr.strides}); pass a contiguous copy")
    return arr.view(np.uint8) if arr.dtype.kind == "V" else arr  # records: their bytes, which a datatype lays out


_DEVICE_LIBRARIES = ("cupy", "numba", "torch", "jax", "pycuda")  # their device pointers are not host memory


def _host_region(region: Region, data, what: str) -> np.ndarray:
    if region.device not in HOST_DEVICES and type(data).__module__.split(".")[0] in _DEVICE_LIBRARIES:
        raise TypeError(f"{what} is in GPU memory ({type(data).__module__}); pass a host array")
    return region.array()
