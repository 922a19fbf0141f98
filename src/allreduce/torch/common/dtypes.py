"""The torch dtypes a collective may announce to other ranks, each as a small integer code.

Headers that ranks exchange before a collective (Horovod's ``join`` agreements, ``allgather``'s shapes)
carry a dtype as its code; 0 stays free to mean "nothing", so a code is the dtype's position plus one.
"""

from __future__ import annotations

import torch

DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex128)


def code_of(dtype: torch.dtype) -> int:
    """``dtype``'s code (``ValueError`` for a dtype not in :data:`DTYPES`)."""
    return DTYPES.index(dtype) + 1


def dtype_of(code: int) -> torch.dtype:
    """The dtype of ``code``, as :func:`code_of` gave it."""
    return DTYPES[code - 1]


def known(code: int) -> bool:
    """Whether ``code`` names a dtype."""
    return 0 < code <= len(DTYPES)
