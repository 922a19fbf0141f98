"""The element types collectives move, and a small stable code for each one on the wire.

bfloat16 comes from ``ml_dtypes`` when it is installed; everything else is plain numpy. Codes never
change: a new dtype takes the next free one, and bfloat16 keeps its code where it is missing. C's
``long double`` (numpy's ``longdouble`` and ``clongdouble``, MPI's ``LONG_DOUBLE``) is carried where
it is a type of its own; the compiled kernels have no loop for it, so its folds are numpy's.
"""

from __future__ import annotations

import numpy as np

try:  # optional: bfloat16 arrays as numpy dtypes
    import ml_dtypes

    bfloat16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    bfloat16 = None

_NAMES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]
_BY_CODE: dict[int, np.dtype] = {i + 1: np.dtype(n) for i, n in enumerate(_NAMES)}
if bfloat16 is not None:
    _BY_CODE[15] = bfloat16
if np.dtype(np.longdouble) != np.dtype(np.float64):  # where long double is double, "float64" stands for it
    _BY_CODE.update({16: np.dtype(np.longdouble), 17: np.dtype(np.clongdouble)})
_CODES = {dt: code for code, dt in _BY_CODE.items()}

SUPPORTED: tuple[np.dtype, ...] = tuple(_BY_CODE.values())


def code_of(dtype) -> int:
    """The wire code of ``dtype``; ``TypeError`` for a dtype collectives cannot carry."""
    dt = np.dtype(dtype)
    if dt in _CODES and dt.isnative:
        return _CODES[dt]
    names = ", ".join(str(d) for d in SUPPORTED)
    raise TypeError(f"dtype {dt} is not supported by collectives (native byte order only); use one of {names}")


def dtype_of(code: int) -> np.dtype:
    """The dtype a wire code stands for (``0`` is 'no dtype', used by byte-only collectives)."""
    return _BY_CODE.get(code, np.dtype(np.uint8))
