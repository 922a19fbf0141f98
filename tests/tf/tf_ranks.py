"""What each rank does in the TensorFlow tests (module-level functions, for spawned ranks); every
result is numpy, compared with numpy references by the tests."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import tensorflow as tf

import allreduce.tensorflow as hvd


def values(rank: int) -> np.ndarray:
    """This rank's 2x3 float32 input."""
    return np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1) + rank


def basics(rank, size):
    return [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
            hvd.is_initialized()]


def reductions(rank, size):
    x = tf.constant(values(rank))
    out = {op: hvd.allreduce(x, op=getattr(hvd, op)).numpy() for op in ("Average", "Sum", "Min", "Max", "Product")}
    out["int_average"] = hvd.allreduce(tf.constant([rank + 1, -rank - 1])).numpy()
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0).numpy()
    out["fp16"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16).numpy()
    out["bf16"] = hvd.allreduce(x, compression=hvd.Compression.bf16).numpy()
    out["grouped"] = [t.numpy() for t in hvd.grouped_allreduce([x, x[0] * 2], op=hvd.Sum)]
    return out


def in_function(rank, size):
    @tf.function
    def step(x):
        a = hvd.allreduce(x, op=hvd.Sum)
        b = hvd.allreduce(x * 2, op=hvd.Max)  # independent of a: ordered by program order all the same
        c = hvd.allgather(x)
        return a, b, c, hvd.broadcast(x, root_rank=1)

    return [t.numpy() for t in step(tf.constant(values(rank)))]


def gathers(rank, size):
    rows = tf.fill([rank + 1, 2], float(rank))
    out, received = hvd.alltoall(tf.range(3 * size) + 10 * rank, splits=[1 + r for r in range(size - 1)] +
                                 [3 * size - sum(1 + r for r in range(size - 1))])
    return {"allgather": hvd.allgather(rows).numpy(), "broadcast": hvd.broadcast(tf.constant([rank]), 1).numpy(),
            "alltoall": out.numpy(), "received": received.numpy(),
            "reducescatter": hvd.reducescatter(tf.constant(values(rank)), op=hvd.Sum).numpy(),
            "reducescatter_uneven": hvd.reducescatter(tf.ones([3, 2]) * (rank + 1)).numpy(),
            "grouped_allgather": [t.numpy() for t in hvd.grouped_allgather([rows, rows[:1] * 2])],
            "grouped_reducescatter": [t.numpy() for t in hvd.grouped_reducescatter([tf.ones([2, 1]) * rank], hvd.Sum)],
            "object": hvd.broadcast_object({"rank": rank}, root_rank=1), "objects": hvd.allgather_object(rank)}


def variables(rank, size):
    v = [tf.Variable(values(rank)), tf.Variable([rank], dtype=tf.int64), tf.Variable(float(rank))]
    hvd.broadcast_variables(v, root_rank=1)
    return [x.numpy() for x in v]


def gradients(rank, size):
    x = tf.Variable(values(rank))

    @tf.function
    def grads():
        with tf.GradientTape(persistent=True) as tape:
            s = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * values(0))
            g = tf.reduce_sum(hvd.allgather(x) ** 2)
            b = tf.reduce_sum(hvd.broadcast(x, root_rank=0) * 3.0)
            r = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum))
        return [tape.gradient(loss, x) for loss in (s, g, b, r)]

    return [t.numpy() for t in grads()]


def sparse(rank, size):
    table = tf.Variable(tf.ones([5, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [rank, 4]) * (rank + 1.0))
    grad = hvd.allreduce(tape.gradient(loss, table), op=hvd.Sum)
    return [grad.values.numpy(), grad.indices.numpy()]


def xla(rank, size):
    @tf.function(jit_compile=True)
    def step(x):
        return hvd.allreduce(x)

    try:
        step(tf.constant([1.0]))
    except ValueError as exc:
        return str(exc)
    return None


def tape_training(rank, size):
    """Linear regression in a tf.function on this rank's half of a batch: the weights after 5 steps."""
    data = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    target = data @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    w = tf.Variable(tf.zeros([3, 1]))
    share = slice(rank * 8 // size, (rank + 1) * 8 // size)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.1 * grad)

    for _ in range(5):
        step(data[share], target[share])
    return w.numpy()


def partial_tape(rank, size):
    """The gradients of a shared and a rank-local variable through PartialDistributedGradientTape."""
    shared, local = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared * (rank + 1.0)) + tf.reduce_sum(local * (rank + 1.0))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[SimpleNamespace(trainable_weights=[local])])
    return [g.numpy() for g in tape.gradient(loss, [shared, local])]
