"""Horovod's ``horovod.tensorflow.keras`` API for Keras 3 (``import allreduce.tensorflow.keras as hvd``):
everything of :mod:`allreduce.tensorflow`, the Keras ``DistributedOptimizer`` and ``hvd.callbacks``.

Example (every rank, under ``allreduce run -n 2 -- python train.py``)::

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())),
                  loss="mse", jit_compile=False)
    model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()])
"""

from .. import *  # noqa: F403 (horovod.tensorflow.keras has the names of horovod.tensorflow)
from .. import __all__ as _tensorflow_names
from . import callbacks
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "callbacks", *_tensorflow_names]
