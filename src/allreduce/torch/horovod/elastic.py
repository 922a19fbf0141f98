"""Horovod's elastic mode (``hvd.elastic``): a training function that outlives the death of a worker.

``@hvd.elastic.run`` runs the function with a :class:`State`. A collective that fails because a peer
died raises :class:`HorovodInternalError` (every allreduce error is one); the wrapper then puts the
state back to its last :meth:`State.commit`, forms the group of the survivors
(:func:`allreduce.shrink_group`, which they agree on over their lifelines), makes it the job of
``hvd.rank()``/``hvd.size()`` and of the global process set, copies the state from its rank 0
(:meth:`State.sync`), runs the reset callbacks and calls the function again, in the same processes.
:class:`HostsUpdatedInterrupt`, which ``commit`` raises on every rank alike when replacement workers
wait to join (``allreduce run --max-np``), does the same without going back to the commit, and the
group it forms takes the replacements in (:func:`allreduce.grow_group`); a replacement's ``hvd.init``
waits until then and gets the state by ``sync``.

Other process sets do not survive a reset (register them again in a reset callback), and a
``DistributedOptimizer`` follows the new group when it is a :class:`TorchState`'s optimizer.
"""

from __future__ import annotations

import copy
import functools

import torch

from ... import api
from ...errors import AllreduceError

from . import basics
from .broadcasts import broadcast_async_, broadcast_object
from .handles import synchronize

HorovodInternalError = AllreduceError  # Horovod's name for a collective that failed (e.g. a peer died)


class HostsUpdatedInterrupt(RuntimeError):
    """The workers of the job changed without a failure: reset without restoring the last commit.

    ``skip_sync``: the state need not be copied from rank 0 after the reset (only workers left).
    """

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's workers changed")
        self.skip_sync = skip_sync


class State:
    """What an elastic training function keeps across a reset: :meth:`commit` saves it, :meth:`restore`
    goes back to the save, :meth:`sync` copies rank 0's to every rank. Subclasses say what is kept."""

    def __init__(self, bcast_object=broadcast_object, get_rank=basics.rank):
        self._bcast_object, self._rank = bcast_object, get_rank
        self._reset_callbacks: list = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Call each of ``callbacks`` (no arguments) after every reset, e.g. to scale the learning rate
        by the new ``hvd.size()`` or register process sets again."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (the point a failure goes back to), then raise :class:`HostsUpdatedInterrupt`
        if the job's workers changed. Every rank commits at the same points of the loop."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` if replacement workers wait to join (``allreduce run
        --max-np``): the ranks agree on it, so all raise it at the same commit."""
        if api.joiners_waiting():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        """Keep a copy of the state (in memory)."""

    def restore(self) -> None:
        """Go back to the last :meth:`save`."""

    def sync(self) -> None:
        """Give every rank rank 0's state (a collective: every rank calls it)."""

    def reset(self) -> None:
        """Follow the new group after a reset."""


class ObjectState(State):
    """A :class:`State` of picklable attributes given as keywords: ``ObjectState(epoch=0, batch=0)``
    makes ``state.epoch`` and ``state.batch``, saved, restored and synced as one dict."""

    def __init__(self, bcast_object=broadcast_object, get_rank=basics.rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank=0)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


class TorchState(ObjectState):
    """The state of a torch training loop: ``model`` and ``optimizer`` (their ``state_dict``), plus any
    keyword attributes as :class:`ObjectState`'s.

    Example (every rank)::

        state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
        train(state)       # a function decorated with @hvd.elastic.run
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self._saved_model = self._saved_optimizer = None
        super().__init__(**kwargs)
        self._save_torch()

    def save(self) -> None:
        self._save_torch()
        super().save()

    def restore(self) -> None:
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        super().restore()

    def sync(self) -> None:
        if self.model is not None:  # in place, tensor by tensor: parameters and buffers
            tensors = {k: t for k, t in self.model.state_dict().items() if isinstance(t, torch.Tensor)}
            for handle in [broadcast_async_(t, 0, name=f"elastic.model.{k}") for k, t in tensors.items()]:
                synchronize(handle)
        if self.optimizer is not None:  # its state as one object: its tensors are created by the first step
            self.optimizer.load_state_dict(self._bcast_object(self.optimizer.state_dict(), root_rank=0))
        self._save_torch()  # a rank that restores before its first commit goes back to what it was given
        super().sync()

    def reset(self) -> None:
        regroup = getattr(self.optimizer, "regroup", None)
        if regroup is not None:
            regroup()

    def _save_torch(self) -> None:
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())


def run(func):
    """Decorate a training function ``func(state, ...)`` so that it survives the death of workers.

    The wrapper syncs ``state`` from rank 0 and calls ``func``; on :class:`HorovodInternalError` it
    restores the last commit, resets onto the survivors and calls ``func`` again (an error that cost no
    rank, such as a ``Mismatch``, is raised after the restore: it would only come again); on
    :class:`HostsUpdatedInterrupt` it resets without restoring, letting the waiting replacements in. It
    returns what ``func`` returns.

    Example (every rank, under ``allreduce run -n 4 --min-np 2 -- python train.py``)::

        @hvd.elastic.run
        def train(state):
            for state.epoch in range(state.epoch, epochs):
                for state.batch in range(state.batch, batches):
                    step(state.batch)
                    state.commit()
                state.batch = 0

    Raises:
        AllreduceError: the reset itself failed (e.g. fewer survivors could not agree in time).
    """
    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
                if not reset(shrink=True):  # nobody died (a mismatch, a timeout): it would only fail again
                    raise
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                reset(shrink=False)
            state.on_reset()
    return wrapper


def reset(shrink: bool) -> bool:
    """Re-initialize hvd: forget the old group's operations and process sets; with ``shrink``, form the
    group of the living ranks (agreed among them); let in the replacements that wait; adopt the result.
    Returns whether anyone was lost (the same answer on every rank)."""
    basics.forget()
    size = api.get_world_size()
    if shrink:
        api.shrink_group()
    lost = api.get_world_size() < size
    api.grow_group()
    basics.adopt(api.default_group())
    return lost


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
