"""Horovod's ``DistributedGradientTape``: a ``tf.GradientTape`` whose gradients are averaged across ranks.

``tape.gradient`` computes this rank's gradients, then reduces them all in one fused call per dtype
(one op in a ``tf.function``, so every rank issues the same collectives in the same order).
``gradient_predivide_factor`` ``f`` splits the average as Horovod does: ``1/f`` before the sum, ``f/size``
after it.
"""

from __future__ import annotations

import tensorflow as tf

from .basics import Average, Sum, world
from .compression import Compression
from .mpi_ops import grouped_allreduce


def reduce_gradients(grads, op=Average, compression=Compression.none, gradient_predivide_factor=1.0,
                     sparse_as_dense=False) -> list:
    """``grads`` (``None`` entries kept) reduced across ranks, one fused call per dtype."""
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    prescale, postscale = 1.0, 1.0
    if gradient_predivide_factor != 1.0 and op is Average:
        op, prescale, postscale = Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / world().size
    out = list(grads)
    by_dtype: dict = {}
    for i, g in enumerate(grads):
        if g is not None:
            by_dtype.setdefault((g.dtype, isinstance(g, tf.IndexedSlices)), []).append(i)
    for indices in by_dtype.values():
        reduced = grouped_allreduce([grads[i] for i in indices], op=op, compression=compression,
                                    prescale_factor=prescale, postscale_factor=postscale)
        for i, r in zip(indices, reduced):
            out[i] = r
    return out


class DistributedGradientTape:
    """Wraps ``gradtape``; ``gradient`` returns the gradients reduced across ranks (default: averaged).

    Example (every rank)::

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
    """

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=Compression.none,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=None):
        world(process_set)
        self._tape = gradtape
        self._options = dict(op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor,
                             sparse_as_dense=sparse_as_dense)

        self._local: set = set()  # refs of the variables whose gradients stay local

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        listed, kind = isinstance(grads, (list, tuple)), type(grads)
        grads, sources = (list(grads), list(sources)) if listed else ([grads], [sources])
        shared = [i for i, v in enumerate(sources) if not (hasattr(v, "ref") and v.ref() in self._local)]
        for i, g in zip(shared, reduce_gradients([grads[i] for i in shared], **self._options)):
            grads[i] = g
        return kind(grads) if listed else grads[0]

    def register_local_source(self, source) -> None:
        """Keep the gradient of the variable ``source`` local (not reduced)."""
        self._local.add(source.ref())

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None):
    """A :class:`DistributedGradientTape` that leaves the gradients of ``local_layers``' trainable
    variables local (each rank keeps its own, as for a rank-local head)."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set)
    for layer in local_layers or []:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
