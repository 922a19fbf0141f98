"""What each rank does in the Keras tests (module-level functions, for spawned ranks)."""

from __future__ import annotations

import keras
import numpy as np

import allreduce.tensorflow.keras as hvd

BATCH, STEPS, EPOCHS = 12, 2, 3  # the global batch (12: shares for 2 and 3 ranks), batches per epoch, epochs


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BATCH * STEPS, 5)).astype(np.float32)
    return x, (x @ rng.normal(size=(5, 2))).astype(np.float32)


def model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])


def trained(m: keras.Model, optimizer, x, y, batch: int, callbacks=()) -> list[np.ndarray]:
    m.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    m.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=list(callbacks))
    return [w.numpy() for w in m.weights]


def fit(rank, size):
    """This rank's share of every global batch, trained from another seed than rank 0's (the broadcast
    callback must make them alike), and the same model trained alone on the full batches."""
    x, y = data()
    share = BATCH // size
    rows = np.concatenate([np.arange(b * BATCH + rank * share, b * BATCH + (rank + 1) * share) for b in range(STEPS)])
    history = keras.callbacks.History()
    distributed = trained(model(rank), hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), x[rows], y[rows], share,
                          [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                           history])
    alone = trained(model(0), keras.optimizers.SGD(0.1), x, y, BATCH)
    return {"distributed": distributed, "alone": alone, "loss": history.history["loss"]}


def warmup(rank, size):
    """The learning rate at each batch of a warmup over 2 epochs of 2 batches, then half of it."""
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_batch_begin=lambda batch, logs: seen.append(float(m.optimizer.learning_rate.numpy())))
    m = model(0)
    x, y = data()
    trained(m, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), x[:8], y[:8], 4,
            [hvd.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2),
             hvd.callbacks.LearningRateScheduleCallback(0.4, 0.5, start_epoch=2), record])
    return seen
