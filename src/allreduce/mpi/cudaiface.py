"""Reading ``__cuda_array_interface__`` as mpi4py does, into a :class:`~.memregion.Region`.

The interface is a dict: ``data`` a pair (pointer, read-only), ``typestr`` in numpy's notation
(``<i4``), ``shape``, and optionally ``strides`` (bytes; ``None``: C order), ``descr`` (a list) and
``mask`` (only ``None``). A missing key raises ``KeyError``, a value of the wrong type ``TypeError``,
a pair or item size of the wrong form ``ValueError``, and a description this module cannot take
(a mask, another byte order, a negative extent, gaps between elements) ``BufferError``. A record
type (``|V24``) is read as its bytes, with a ``RuntimeWarning`` that its fields are not interpreted.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from .memregion import CUDA, Region, check_contiguous, check_shape, dtype_of

_NATIVE = "<" if sys.byteorder == "little" else ">"


def region(obj) -> Region:
    """The memory the CUDA array interface of ``obj`` describes."""
    interface = obj.__cuda_array_interface__
    address, readonly = interface["data"]
    if not isinstance(address, (int, np.integer)) or isinstance(address, bool):
        raise TypeError(f"__cuda_array_interface__ data pointer must be an integer, got {address!r}")
    if interface.get("mask") is not None:
        raise BufferError("__cuda_array_interface__ with a mask is not supported")
    typestr = interface["typestr"]
    if not isinstance(typestr, str):
        raise TypeError(f"__cuda_array_interface__ typestr must be a string, got {typestr!r}")
    if typestr[:1] not in ("|", "=", _NATIVE):
        raise BufferError(f"__cuda_array_interface__ typestr {typestr!r} is not in native byte order")
    kind, itemsize = typestr[1:2], int(typestr[2:])
    shape = tuple(interface["shape"])
    if not all(isinstance(n, (int, np.integer)) for n in shape):
        raise TypeError(f"__cuda_array_interface__ shape must hold integers, got {shape!r}")
    check_shape(shape, "__cuda_array_interface__")
    strides = interface.get("strides")
    strides = None if strides is None else tuple(strides)
    check_contiguous(shape, strides, itemsize, "__cuda_array_interface__")
    descr = interface.get("descr")
    if descr is not None and not isinstance(descr, list):
        raise TypeError(f"__cuda_array_interface__ descr must be a list, got {descr!r}")
    if kind == "V":
        warnings.warn(f"__cuda_array_interface__ typestr {typestr!r}: the record's bytes are moved as they "
                      "lie, its fields are not interpreted", RuntimeWarning, stacklevel=4)
    count = int(np.prod(shape, dtype=np.int64))
    return Region(address=int(address), nbytes=count * itemsize, dtype=dtype_of(kind, itemsize),
                  readonly=bool(readonly), device=CUDA, owner=obj)
