"""Gradient compression: what a tensor looks like on the wire, and how it comes back.

A compressor is two functions, ``compress(tensor) -> (wire, ctx)`` and ``decompress(wire, ctx) ->
tensor``. The ones here are *element-wise*: the wire tensor has the input's shape, element i decodes
on its own, and ``ctx`` (the original dtype) is the same on every rank. That is what lets
:func:`~allreduce.torch.common.reduction.reduce_flat` split a wire tensor into chunks, sum each chunk in
float32 on the rank that owns it, and send the result back in the wire dtype: the wire carries
float16/bfloat16 but no sum is ever formed in it, so adding many large values cannot overflow.

:class:`ErrorFeedback` wraps a lossy compressor and keeps, for each buffer it compresses, what the
rounding lost; the next compression of that buffer adds it back first, so small gradient components
are delayed rather than lost (error-feedback SGD).

Example::

    opt = DistributedOptimizer(opt, compression=Compression.fp16)
    opt = DistributedOptimizer(opt, compression=Compression.error_feedback(Compression.bf16))
"""

from __future__ import annotations

import torch


class Compressor:
    """The identity compressor, and the interface every compressor follows."""

    wire_dtype: torch.dtype | None = None  # the dtype floating tensors travel in; None: unchanged

    def compress(self, tensor: torch.Tensor):
        """Return ``(wire_tensor, ctx)``; ``ctx`` is whatever :meth:`decompress` needs."""
        return tensor, None

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        """Turn a wire tensor (or a slice of one) back into the dtype it was compressed from."""
        return tensor

    def wire_dtype_for(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor of ``dtype`` travels in (only floating tensors are cast)."""
        if self.wire_dtype is None or not dtype.is_floating_point:
            return dtype
        return self.wire_dtype

    def __repr__(self) -> str:
        return f"Compression.{_NAMES.get(self.wire_dtype, type(self).__name__)}"


class Cast(Compressor):
    """Cast floating tensors to ``dtype`` on the wire and back to their own dtype afterwards."""

    def __init__(self, dtype: torch.dtype):
        if not dtype.is_floating_point:
            raise TypeError(f"a cast compressor needs a floating dtype, got {dtype}")
        self.wire_dtype = dtype

    def compress(self, tensor: torch.Tensor):
        if self.wire_dtype_for(tensor.dtype) == tensor.dtype:
            return tensor, None
        return tensor.to(self.wire_dtype), tensor.dtype

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class ErrorFeedback(Compressor):
    """``inner`` plus a per-buffer residual: what rounding lost last time is added before compressing.

    Residuals are keyed by the memory the tensor lives in, so compress the same buffer every step
    (as :func:`~allreduce.torch.DistributedOptimizer` does with its fusion buckets). One instance
    belongs to one optimizer.
    """

    def __init__(self, inner: Compressor):
        if isinstance(inner, ErrorFeedback) or not isinstance(inner, Compressor):
            raise TypeError(f"error feedback wraps a plain compressor, got {inner!r}")
        self.inner = inner
        self.wire_dtype = inner.wire_dtype
        self._residuals: dict[tuple, torch.Tensor] = {}

    def compress(self, tensor: torch.Tensor):
        key = (tensor.device, tensor.data_ptr(), tensor.numel(), tensor.dtype)
        residual = self._residuals.get(key)
        corrected = tensor if residual is None else tensor + residual
        wire, ctx = self.inner.compress(corrected)
        self._residuals[key] = corrected - self.inner.decompress(wire, ctx)
        return wire, ctx

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        return self.inner.decompress(tensor, ctx)

    def residual(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """What the last compression of ``tensor``'s buffer lost (``None`` before the first)."""
        return self._residuals.get((tensor.device, tensor.data_ptr(), tensor.numel(), tensor.dtype))

    def __repr__(self) -> str:
        return f"Compression.error_feedback({self.inner!r})"


class Compression:
    """The compressors on offer (Horovod's names): ``none``, ``fp16``, ``bf16``, ``error_feedback(c)``."""

    none = Compressor()
    fp16 = Cast(torch.float16)
    bf16 = Cast(torch.bfloat16)

    @staticmethod
    def error_feedback(inner: Compressor) -> ErrorFeedback:
        """A new error-feedback compressor around ``inner`` (one per optimizer: it holds state)."""
        return ErrorFeedback(inner)


_NAMES = {None: "none", torch.float16: "fp16", torch.bfloat16: "bf16"}
