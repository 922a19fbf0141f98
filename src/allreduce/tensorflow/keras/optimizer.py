"""Horovod's Keras ``DistributedOptimizer`` for Keras 3.

Keras 3 optimizers have no ``get_gradients``/``_aggregate_gradients`` for Horovod to override; every
update goes through ``apply(grads, trainable_variables)`` (``apply_gradients`` calls it, and so does
the trainer, inside its ``tf.function``). The distributed optimizer is the wrapped optimizer's class,
subclassed with an ``apply`` that first reduces the gradients across ranks (one fused call per dtype:
:func:`..tape.reduce_gradients`), and rebuilt from the optimizer's config, as Horovod does.
"""

from __future__ import annotations

from ..basics import Average, world
from ..compression import Compression
from ..tape import reduce_gradients


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """``optimizer`` (a Keras 3 optimizer) whose gradients are reduced across ranks (default: averaged).

    Example (every rank)::

        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        model.compile(optimizer=opt, loss="mse", jit_compile=False)

    Raises:
        NotImplementedError: ``backward_passes_per_step`` other than 1.
    """
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 is not supported by allreduce.tensorflow.keras")
    world(process_set)
    options = dict(op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor,
                   sparse_as_dense=sparse_as_dense)
    base = optimizer.__class__

    def apply(self, grads, trainable_variables=None):
        return base.apply(self, reduce_gradients(list(grads), **options), trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__,
                                        "__doc__": f"{base.__name__} with gradients reduced across ranks."})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)
