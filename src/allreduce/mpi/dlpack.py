"""Reading a DLPack array as mpi4py does: a contiguous stretch of bytes, its element type and flags.

The capsule that ``__dlpack__`` returns is neither renamed nor released here: it travels with the
view (as the view's owner) and its own destructor hands the tensor back when the view dies, so the
same capsule may be read again while it lives, and a capsule some consumer already used is refused.
A tensor counts as contiguous when its elements lie back to back in C or in Fortran order (the
stride of an axis of extent 1 does not matter); its bytes are then read in memory order. A type
numpy does not hold (other codes, several lanes) is read as bytes.

Every malformed description raises as mpi4py raises: ``BufferError`` for a tensor this module cannot
take (a used or missing capsule, an unknown version, a negative rank or extent, strides that leave
gaps, a read-only tensor given as a receive buffer); ``TypeError``/``ValueError`` for a
``__dlpack_device__`` that is not a pair of integers.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .memregion import CPU, Region, check_contiguous, check_shape, dtype_of


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # DLPack type codes: numpy kinds
_READ_ONLY = 1
_MAJOR = 1  # the versioned layout read here
_CAPSULE_TYPE = type(np.empty(0).__dlpack__())
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def device_of(obj) -> int:
    """The DLPack device type of ``obj`` (CPU where it names none).

    Raises:
        TypeError: ``__dlpack_device__`` is not callable or does not return integers.
        ValueError: it returns other than two items.
    """
    if not hasattr(obj, "__dlpack_device__"):
        return CPU
    device_type, device_id = obj.__dlpack_device__()
    _integer(device_id, "device id")
    return _integer(device_type, "device type")


def region(obj) -> Region:
    """The memory of the DLPack array ``obj`` (which must outlive every view of it).

    Raises:
        BufferError: no usable capsule, or a tensor whose description this module cannot take.
    """
    device = device_of(obj)
    stream = None if device == CPU else -1  # -1: the producer need not synchronise any stream
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=(_MAJOR, 0))
    except TypeError:
        capsule = obj.__dlpack__(stream=stream)
    if not isinstance(capsule, _CAPSULE_TYPE):
        raise BufferError(f"__dlpack__ of {type(obj).__name__} returned no DLPack capsule")
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = _ManagedVersioned.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        if managed.version.major != _MAJOR:
            raise BufferError(f"DLPack version {managed.version.major}.{managed.version.minor} is not {_MAJOR}.x")
        readonly = bool(managed.flags & _READ_ONLY)
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        managed, readonly = _Managed.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor")), False
    else:
        raise BufferError("the DLPack capsule was already used (or is not a DLPack capsule)")
    tensor = managed.dl_tensor
    shape = _shape(tensor)
    itemsize = (tensor.dtype.bits * tensor.dtype.lanes) // 8
    strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim)) if tensor.strides else None
    check_contiguous(shape, strides, itemsize, "DLPack tensor")
    dtype = dtype_of(_kind(tensor.dtype), itemsize)
    count = int(np.prod(shape, dtype=np.int64))
    return Region(address=(tensor.data or 0) + tensor.byte_offset, nbytes=count * itemsize, dtype=dtype,
                  readonly=readonly, device=tensor.device.device_type, owner=(obj, capsule))


def _kind(dtype: _DataType) -> str:
    """The numpy kind of a DLPack element: its code's, or complex for two lanes of floats (how a
    complex without a DLPack code of its width, long double's, is described); else none (bytes)."""
    if dtype.lanes == 1:
        return _KINDS.get(dtype.code, "")
    return "c" if dtype.lanes == 2 and _KINDS.get(dtype.code) == "f" else ""


def _integer(value, what: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"__dlpack_device__ must give integers, got {what} {value!r}")
    return int(value)


def _shape(tensor: _Tensor) -> tuple[int, ...]:
    if tensor.ndim < 0:
        raise BufferError(f"DLPack tensor of negative rank {tensor.ndim}")
    if tensor.ndim and not tensor.shape:
        raise BufferError(f"DLPack tensor of rank {tensor.ndim} without a shape")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    check_shape(shape, "DLPack tensor")
    return shape
