"""Run a collective's numpy function on TensorFlow tensors, eagerly or inside a ``tf.function``.

Eagerly, the function runs at once on the tensors' numpy values. Inside a ``tf.function`` it becomes
one ``tf.numpy_function`` op, marked stateful: TensorFlow's automatic control dependencies then run
the stateful ops of a function in the order the program created them, so every rank issues its
collectives in program order although independent ops may otherwise run in any order. A collective's
gradient is registered with ``tf.custom_gradient`` where a tape may record (:func:`differentiable`). Under
``jit_compile=True`` XLA cannot call back into Python, so that is refused when the function is traced.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util


def call(fn, inputs, dtypes, shapes, name: str):
    """``fn(*numpy values)`` (a list of arrays of ``dtypes``) as tensors of ``shapes`` (``None``: unknown).

    Raises:
        ValueError: traced under ``jit_compile=True``.
    """
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(out) for out in fn(*(t.numpy() for t in inputs))]
    if control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()):
        raise ValueError(f"hvd.{name} cannot run under tf.function(jit_compile=True): XLA cannot call out to the "
                         "collective engine; use jit_compile=False (Keras: model.compile(jit_compile=False))")
    outs = tf.numpy_function(fn, list(inputs), list(dtypes), stateful=True, name=f"Horovod{name.title()}")
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return outs


def differentiable(forward, grad, inputs):
    """``forward(*inputs)``, whose gradient is ``grad(outputs, *output gradients)``; eagerly with no
    gradient tape that could record, ``forward`` alone (``tf.custom_gradient`` costs more than a
    small collective)."""
    if tf.executing_eagerly() and not record.could_possibly_record():
        return forward(*inputs)

    @tf.custom_gradient
    def recorded(*xs):
        outs = forward(*xs)
        return outs, lambda *dys: grad(outs, *dys)

    return recorded(*inputs)
