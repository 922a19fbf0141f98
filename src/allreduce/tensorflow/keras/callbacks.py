"""Horovod's Keras callbacks: start every rank alike, average the metrics, warm the learning rate up.

- :class:`BroadcastGlobalVariablesCallback` broadcasts the model's variables from ``root_rank`` when
  training begins, and the model's and optimizer's after the first batch (when the optimizer's
  variables exist), as Horovod does.
- :class:`MetricAverageCallback` replaces each epoch's logged metrics with their average over the
  ranks (one all-reduce), so later callbacks (checkpoints, early stopping) decide alike.
- :class:`LearningRateScheduleCallback` sets the learning rate by epoch, and
  :class:`LearningRateWarmupCallback` ramps it from ``initial_lr / size`` to ``initial_lr`` over
  ``warmup_epochs``, batch by batch (Goyal et al., as Horovod).
"""

from __future__ import annotations

import keras
import numpy as np

from ... import api
from ...ops import ReduceOp

from ..basics import size, world
from ..gathers import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Every rank starts from ``root_rank``'s variables."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs=None):
        broadcast_variables(self.model.variables, self.root_rank)

    def on_batch_end(self, batch, logs=None):
        if not self.done:
            broadcast_variables(list(self.model.variables) + list(self.model.optimizer.variables), self.root_rank)
            self.done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Each epoch's metrics, averaged over the ranks (in ``logs``, for the callbacks after this one)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        averaged = np.array([float(logs[k]) for k in names], np.float64)
        api.all_reduce(averaged, ReduceOp.AVG, world())
        logs.update(zip(names, averaged.tolist()))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """The learning rate at ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until ``end_epoch``
    (``None``: to the end); ``multiplier`` a number or a function of the epoch, set at each epoch's
    start (``staircase``) or at each batch, the epoch counted in fractions (``steps_per_epoch``:
    Keras' own count when ``None``). Outside the range the learning rate is left alone, so schedules
    of consecutive ranges compose, as in Horovod.

    ``momentum_correction`` is accepted and not applied (Keras 3 optimizers keep momentum in their own
    variables, which Horovod's correction does not know).
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.staircase, self.steps_per_epoch, self.verbose = staircase, steps_per_epoch, verbose
        self.epoch = 0

    def _adjust(self, epoch: float) -> None:
        if self.start_epoch <= epoch and (self.end_epoch is None or epoch < self.end_epoch):
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.staircase:
            self._adjust(epoch)

    def on_batch_begin(self, batch, logs=None):
        if not self.staircase:
            self._adjust(self.epoch + batch / (self.steps_per_epoch or self.params.get("steps") or 1))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """The learning rate at ``initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)``, batch by
    batch, until ``warmup_epochs``, where it is set to ``initial_lr``."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, lambda epoch: (epoch * (size() - 1) / warmup_epochs + 1) / size(), 0,
                         warmup_epochs, False, momentum_correction, steps_per_epoch, verbose)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if epoch == self.end_epoch:
            self.model.optimizer.learning_rate = self.initial_lr
