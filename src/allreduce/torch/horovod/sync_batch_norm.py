"""Horovod's ``SyncBatchNorm``: batch normalization whose statistics cover the batch of every rank.

In training, each channel's mean and variance are those of the samples of all the ranks of the process
set together: one Sum all-reduce of every channel's sum and the sample count gives the mean, a second
one of the squared deviations from it gives the (biased) variance, so ranks may hold batches of
different sizes (even empty ones). Both reductions are differentiable (:func:`.reductions.allreduce`),
so autograd gives every rank the gradient of the sum of all ranks' losses, as torch's
``nn.SyncBatchNorm`` does; ``weight`` and ``bias`` get this rank's share, which the
``DistributedOptimizer`` then averages. Running statistics are updated alike on every rank (the
unbiased variance of the whole batch). In eval mode, or on a set of one rank, it is plain batch norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .basics import Sum
from .process_sets import global_process_set
from .reductions import allreduce


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of all the ranks of ``process_set`` (see the module).

    The arguments are ``torch.nn.BatchNorm*d``'s; the input is ``(N, C, ...)``.

    Example (every rank)::

        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8))

    Raises:
        ValueError: an input of fewer than two dimensions.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of at least 2 dimensions (N, C, ...), got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = self._average_factor()
        if not self.training or len(self.process_set.ranks) == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                                factor, self.eps)
        result_dtype = input.dtype
        if input.dtype in (torch.float16, torch.bfloat16):  # statistics in float32
            input = input.float()
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() // max(channels, 1)], dtype=input.dtype)
        totals = allreduce(torch.cat([input.sum(dims), count]), op=Sum, process_set=self.process_set)
        mean, samples = totals[:channels] / totals[channels], totals[channels]
        centered = input - mean.view(shape)
        var = allreduce(centered.pow(2).sum(dims), op=Sum, process_set=self.process_set) / samples
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape).to(out.dtype) + self.bias.view(shape).to(out.dtype)
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * samples / (samples - 1).clamp(min=1)
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.detach(), alpha=factor)
        return out.to(result_dtype)

    def _average_factor(self) -> float:
        """The running statistics' update factor: ``momentum``, or a cumulative average when it is None
        (counting this batch, as torch's batch norm does)."""
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                return 1.0 / float(self.num_batches_tracked)
        return 0.0 if self.momentum is None else self.momentum
