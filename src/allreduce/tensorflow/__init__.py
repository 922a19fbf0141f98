"""Horovod's ``horovod.tensorflow`` API on allreduce, for TensorFlow 2 (``import allreduce.tensorflow as hvd``).

``hvd.init()``, ``rank``/``size``/``local_*``/``cross_*``, ``allreduce`` (Average, Sum, Min, Max,
Product; factors; ``Compression.fp16``/``bf16``; ``tf.IndexedSlices``), ``grouped_allreduce``,
``allgather``, ``broadcast``, ``broadcast_variables``, ``alltoall``, ``reducescatter``,
``broadcast_object``, ``allgather_object`` and ``DistributedGradientTape``, eagerly or inside a
``tf.function`` (each collective one stateful op, run in program order: :mod:`.bridge`);
``allreduce.tensorflow.keras`` has the Keras 3 optimizer and callbacks. docs/tensorflow.md says what
differs from Horovod.

This package needs TensorFlow (``pip install allreduce[tensorflow]``); ``import allreduce`` does not.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:
    raise ImportError("allreduce.tensorflow needs TensorFlow: pip install 'allreduce[tensorflow]'") from exc

from .basics import (
    Average, HorovodInternalError, Max, Min, Product, Sum, cross_rank, cross_size, cuda_built, gloo_built,
    gloo_enabled, global_process_set, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
)
from .compression import Compression
from . import mpi_ops
from .mpi_ops import *  # noqa: F403 (Horovod's operations: the names of mpi_ops.__all__)
from .tape import DistributedGradientTape, PartialDistributedGradientTape

__all__ = [
    "Average", "Compression", "DistributedGradientTape", "HorovodInternalError", "Max", "Min",
    "PartialDistributedGradientTape", "Product", "Sum",
    "cross_rank", "cross_size", "cuda_built", "gloo_built", "gloo_enabled", "global_process_set", "init",
    "is_initialized", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "rank", "rocm_built", "shutdown", "size",
] + mpi_ops.__all__
