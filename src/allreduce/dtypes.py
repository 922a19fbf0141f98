"""The element types collectives move, and a small stable code for each one on the wire.

bfloat16 comes from ``ml_dtypes`` when it is installed; everything else is plain numpy. Codes never
change: a new dtype takes the next free one, and bfloat16 keeps its code where it is missing. C's
``long double`` (numpy's ``longdouble`` and ``clongdouble``, MPI's ``LONG_DOUBLE``) is carried where
it is a type of its own; the compiled kernels have no loop for it, so its folds are numpy's.

``ml_dtypes`` is imported on first need (:func:`load_bfloat16`): its extension costs most of a second of
CPU, which every rank of a job would pay at ``import allreduce`` though few ever use bfloat16. A
bfloat16 array exists only once ``ml_dtypes`` is loaded, so :func:`code_of` completes the table on its
first miss; the module attributes ``bfloat16`` and ``SUPPORTED`` load it when read, and :func:`resolve` when
the name "bfloat16" is given where a dtype is asked for.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_BFLOAT16 = 15  # bfloat16's code, entered by load_bfloat16
_BYTES = np.dtype(np.uint8)
_NAMES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]
_BY_CODE: dict[int, np.dtype] = {i + 1: np.dtype(n) for i, n in enumerate(_NAMES)}
if np.dtype(np.longdouble) != np.dtype(np.float64):  # where long double is double, "float64" stands for it
    _BY_CODE.update({16: np.dtype(np.longdouble), 17: np.dtype(np.clongdouble)})
_CODES = {dt: code for code, dt in _BY_CODE.items()}


@functools.cache
def load_bfloat16() -> np.dtype | None:
    """numpy's bfloat16 dtype from ``ml_dtypes``, entered in the tables (``None`` without ``ml_dtypes``)."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - exercised only without ml_dtypes
        return None
    bfloat16 = np.dtype(ml_dtypes.bfloat16)
    _BY_CODE[_BFLOAT16] = bfloat16
    _CODES[bfloat16] = _BFLOAT16
    return bfloat16


def __getattr__(name: str) -> Any:
    """``bfloat16`` (``None`` without ``ml_dtypes``) and ``SUPPORTED`` (every dtype, in code order)."""
    if name == "bfloat16":
        return load_bfloat16()
    if name == "SUPPORTED":
        return _supported()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _supported() -> tuple[np.dtype, ...]:
    load_bfloat16()
    return tuple(_BY_CODE[code] for code in sorted(_BY_CODE))


def resolve(dtype) -> np.dtype:
    """``np.dtype(dtype)``; numpy learns the name "bfloat16" from ``ml_dtypes``, so that name loads it first."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        load_bfloat16()
    return np.dtype(dtype)


def code_of(dtype) -> int:
    """The wire code of ``dtype``; ``TypeError`` for a dtype collectives cannot carry."""
    dt = np.dtype(dtype)
    if dt in _CODES and dt.isnative:
        return _CODES[dt]
    if _BFLOAT16 not in _BY_CODE and load_bfloat16() is not None:
        return code_of(dt)  # perhaps the first bfloat16: its code is in the table now
    names = ", ".join(str(d) for d in _supported())
    raise TypeError(f"dtype {dt} is not supported by collectives (native byte order only); use one of {names}")


def dtype_of(code: int) -> np.dtype:
    """The dtype a wire code stands for (``0`` is 'no dtype', used by byte-only collectives)."""
    if code == _BFLOAT16:
        load_bfloat16()
    return _BY_CODE.get(code, _BYTES)
