"""Torch tensors in the host memory collectives work on: direct views where possible, staging otherwise.

The core collectives take CPU tensors that are contiguous (viewed through numpy, no copy). Everything
else is *staged*: :class:`Staged` copies the tensor into a host buffer the collective can use, and
after the collective :meth:`Staged.copy_back` copies the result into the caller's tensor. Two kinds
of tensor need it:

- non-contiguous CPU tensors (a transposed matrix, a strided slice): staged through a contiguous copy,
  so the result lands in the caller's tensor correctly instead of in a temporary;
- CUDA tensors: staged through page-locked (pinned) host memory, which the GPU copies to and from by
  DMA; the copy in waits for the tensor's stream, so pending kernels that produce it are finished.

A contiguous CPU tensor is its own host buffer: no copy, ``copy_back`` does nothing.
"""

from __future__ import annotations

import torch


class Staged:
    """A host buffer standing in for ``tensor`` during one collective.

    Args:
        tensor: the caller's tensor (any device, any strides).
        copy_in: copy the tensor's values into the buffer (inputs); ``False`` for pure outputs.

    Example::

        staged = Staged(cuda_tensor)
        dist.all_reduce(staged.host)
        staged.copy_back()            # cuda_tensor now holds the sum
    """

    __slots__ = ("tensor", "host")

    def __init__(self, tensor: torch.Tensor, copy_in: bool = True):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor
        if is_direct(tensor):
            self.host = tensor
            return
        self.host = host_buffer(tensor.shape, tensor.dtype, tensor.device)
        if copy_in:
            with torch.no_grad():
                self.host.copy_(tensor)

    @property
    def direct(self) -> bool:
        """Whether the collective works on the caller's own memory (nothing to copy back)."""
        return self.host is self.tensor

    def copy_back(self) -> None:
        """Copy the collective's result into the caller's tensor (a no-op for direct tensors)."""
        if not self.direct:
            with torch.no_grad():
                self.tensor.copy_(self.host)


def is_direct(tensor: torch.Tensor) -> bool:
    """Whether collectives can use ``tensor``'s memory as it is (a contiguous CPU tensor)."""
    return tensor.is_cpu and tensor.is_contiguous()


def host_buffer(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialized contiguous host tensor, pinned when it will exchange data with a GPU."""
    pinned = torch.device(device).type == "cuda"
    return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pinned)


def host_copy(tensors) -> torch.Tensor:
    """A new flat CPU tensor holding ``tensors`` back to back. They must share a dtype, as Gloo and
    Horovod require: a concatenation would convert them silently.

    Raises:
        TypeError: the tensors have different dtypes.
    """
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"tensors of one call must share a dtype, got {sorted(map(str, dtypes))}")
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])
