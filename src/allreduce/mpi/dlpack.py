"""Reading a DLPack array as mpi4py does: take the capsule, view its memory, release it at once.

``numpy.from_dlpack`` would keep the capsule's tensor until the view dies and only then call its
deleter; mpi4py instead reads the tensor's description, calls the deleter straight away, and
relies on the exporting object (which the caller holds) to keep the memory. Producers written for
mpi4py free the tensor with the capsule, so only mpi4py's order is safe with all of them.
"""

from __future__ import annotations

import ctypes

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_CPU, _CUDA_HOST = 1, 3
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # DLPack type codes: numpy kinds
_READ_ONLY = 1
_USED = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}  # kept alive: a
# capsule keeps the pointer to its name, not a copy
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


def view(obj) -> np.ndarray:
    """A numpy view of the DLPack array ``obj`` (which must outlive it), its tensor released already.

    Raises:
        TypeError: not in host memory, strided, or of a type numpy does not hold.
    """
    device = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else _CPU
    if device not in (_CPU, _CUDA_HOST):
        raise TypeError(f"DLPack array on device type {device}; pass one in host memory")
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__()
    versioned = bool(_api.PyCapsule_IsValid(capsule, b"dltensor_versioned"))
    name = b"dltensor_versioned" if versioned else b"dltensor"
    if not versioned and not _api.PyCapsule_IsValid(capsule, name):
        raise TypeError("__dlpack__ returned no DLPack capsule (or one already used)")
    address = _api.PyCapsule_GetPointer(capsule, name)
    managed = (_ManagedVersioned if versioned else _Managed).from_address(address)
    tensor = managed.dl_tensor
    try:
        readonly = versioned and bool(managed.flags & _READ_ONLY)
        array = _described(tensor, readonly)
    finally:
        _api.PyCapsule_SetName(capsule, _USED[name])
        if managed.deleter:
            _Deleter(managed.deleter)(address)
    return array


def _described(tensor: _Tensor, readonly: bool) -> np.ndarray:
    """The array the tensor describes, over its memory."""
    if tensor.device.device_type not in (_CPU, _CUDA_HOST):
        raise TypeError(f"DLPack array on device type {tensor.device.device_type}; pass one in host memory")
    kind = _KINDS.get(tensor.dtype.code)
    if kind is None or tensor.dtype.lanes != 1:
        raise TypeError(f"DLPack type code {tensor.dtype.code} x{tensor.dtype.lanes} is not one numpy holds")
    dtype = np.dtype("?" if kind == "b" else f"{kind}{tensor.dtype.bits // 8}")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if tensor.strides and count > 1:
        expected, step = [], 1
        for extent in reversed(shape):
            expected.insert(0, step)
            step *= extent
        actual = [tensor.strides[i] for i in range(tensor.ndim)]
        if any(a != e for a, e, n in zip(actual, expected, shape) if n > 1):
            raise TypeError(f"DLPack array with strides {actual} is not contiguous")
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    raw = (ctypes.c_char * nbytes).from_address(tensor.data + tensor.byte_offset)
    array = np.frombuffer(raw, dtype).reshape(shape)
    if readonly:
        array.flags.writeable = False
    return array
