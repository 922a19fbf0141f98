"""Horovod's ``Compression`` for TensorFlow: the dtype a floating tensor travels in.

``Compression.fp16``/``bf16`` send float32/float64 values as 16-bit floats; sums of 16-bit wires are
formed in float32 (:func:`.reductions.reduce_flat`), so they round once rather than at every addition.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import bfloat16


class Compressor:
    """Sends floating values wider than ``wire`` as ``wire`` (``None``: as they are)."""

    def __init__(self, wire):
        self.wire = wire

    def wire_dtype_for(self, dtype: np.dtype) -> np.dtype:
        if self.wire is None or dtype.kind != "f" or dtype.itemsize <= 2:
            return dtype
        return self.wire


class Compression:
    """The compressors: ``none``, ``fp16``, ``bf16`` (``bf16`` needs ml_dtypes, as TensorFlow does)."""

    none = Compressor(None)
    fp16 = Compressor(np.dtype(np.float16))
    bf16 = Compressor(bfloat16)
