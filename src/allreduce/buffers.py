"""Turning what the caller passed into flat numpy views of the same memory, or a clear error.

Collectives work in place, so a copy here would silently drop the result: anything that cannot be
viewed without copying is refused. numpy arrays, torch CPU tensors (bfloat16 included, through
``ml_dtypes``) and buffer-protocol objects are viewed directly.
"""

from __future__ import annotations

import numpy as np

from .dtypes import code_of, load_bfloat16


def as_array(x, what: str = "tensor", writable: bool = True) -> np.ndarray:
    """A numpy view of ``x`` sharing its memory.

    Raises:
        TypeError: ``x`` is not array-like, or its dtype cannot be carried.
        ValueError: ``x`` is not C-contiguous, or is read-only where ``writable``.
    """
    if isinstance(x, np.ndarray):
        arr = x
    elif type(x).__module__.startswith("torch"):
        arr = _torch_view(x, what)
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            raise TypeError(f"{what} must be a numpy array, a torch CPU tensor or a buffer, "
                            f"got {type(x).__name__}") from None
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (strides {arr.strides}); "
                         "pass a contiguous copy and copy the result back")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only; the collective writes its result in place")
    code_of(arr.dtype)
    return arr


def flat(arr: np.ndarray) -> np.ndarray:
    """The 1-D view of a C-contiguous array (never a copy)."""
    return arr.reshape(-1)


def _torch_view(t, what: str) -> np.ndarray:
    """The numpy view of a contiguous CPU tensor; the common case (no grad, not bfloat16) asks torch only
    what it must, since this runs on every small call (``t`` is a torch object: torch is loaded)."""
    import torch

    if not t.is_cpu:
        raise TypeError(f"{what} is on {t.device}; pass a CPU tensor (or use allreduce.torch, which stages it)")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous; call .contiguous() and copy the result back")
    if t.requires_grad:
        t = t.detach()
    if t.dtype is torch.bfloat16:
        bfloat16 = load_bfloat16()
        if bfloat16 is None:
            raise TypeError("bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)")
        return t.view(torch.int16).numpy().view(bfloat16)
    return t.numpy()
