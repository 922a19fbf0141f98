"""The collectives of the torch backend ``"allreduce"``: torch's ``Backend`` methods on an allreduce group.

torch builds the ``ProcessGroup`` (group name, rank, size, dispatch by device type) and registers,
for devices cpu and cuda, the backend that :mod:`.plugin`'s creator returns: a C++ ``c10d::Backend``
(:mod:`.native`) that calls the methods of a :class:`ProcessGroupAllreduce` of the same names, as it
would call ProcessGroupGloo's. So ``dist.*``, DDP's reducer, FSDP2, DTensor and the functional
collectives reach these methods whether they call from Python or from C++.

A call whose caller will wait (torch's ``opts.asyncOp`` false: ``dist.all_reduce(t)`` without
``async_op=True``) runs in the caller's thread, as our own blocking calls do, and returns a finished
:class:`~.work.DoneWork`; the commonest of them (an all-reduce or broadcast of one CPU tensor, a
barrier) come in through the ``*_now`` methods and get their finished work from the shim, which calls
a shape's compiled shortcut itself once the group has one (no Python at all). Every other call
(``async_op=True``, and C++ callers such as DDP's reducer) starts its collective asynchronously on
the allreduce group and returns a :class:`~.work.TorchWork`.
Tensors the core cannot view in place (CUDA, non-contiguous) are staged
(:class:`~allreduce.torch.common.tensors.Staged`)
and copied back before the work completes. ``opts`` may be omitted
wherever torch's callers omit it (``backend.allreduce(tensors)``, communication hooks).
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist

from ... import api, bootstrap
from ...ops import ReduceOp
from ...runtime import Shape

from ..common.tensors import Staged, host_copy, is_direct
from . import monitored, private, sparse
from .work import DoneWork, TorchWork, in_torch_words

NAME = "allreduce"


class ProcessGroupAllreduce:
    """torch's ``Backend`` methods on the allreduce group ``group``; see the module docstring."""

    def __init__(self, group, shrunk: bool = False):
        self.group = group
        self._unsettled = shrunk  # made by shrink_group: torch registered it as Gloo (private.settle_shrunk)
        self._compiled = group.compiled  # whether the shim may get compiled shortcuts (else no need to ask)
        self.sequence = 0  # collectives started, the same count on every rank (torch's sequence number; the shim
        # counts here the calls it runs on a compiled shortcut)
        self._coalesced: list | None = None  # the parts of the works started since _start_coalescing
        self._barriers = 0  # monitored barriers held, which name their store keys
        self._left = False  # shutdown() has left the store
        self._shrinks = 0  # groups shrunk from this one, which name their store keys

    def __repr__(self) -> str:
        return f"<ProcessGroupAllreduce rank {self.group.rank}/{self.group.size} '{self.group.name}'>"

    def _work(self, started, result, *after, source: int | None = -1) -> TorchWork | DoneWork:
        """The torch work of a collective ``started`` (``None``: it ran in this thread and is done)."""
        self.sequence += 1
        if self._unsettled:
            self._unsettled = False
            private.settle_shrunk(self)
        if started is None:
            for step in after:
                step()
            return DoneWork(result)
        parts = started if isinstance(started, list) else [started]
        if self._coalesced is not None:
            self._coalesced.extend(parts)
        return TorchWork(parts, result, *after, source=source)

    # ---- reductions ------------------------------------------------------------------------------

    @in_torch_words
    def allreduce(self, tensors, opts=None):
        if _one(tensors, "allreduce").is_sparse:
            return self.allreduce_sparse(tensors, opts)
        if is_direct(tensors[0]):  # the common case, spared the staging object
            return self._work(api.all_reduce(tensors[0], _op(opts), group=self.group, async_op=_async(opts)), tensors)
        s = Staged(tensors[0])
        started = api.all_reduce(s.host, _op(opts), group=self.group, async_op=_async(opts))
        return self._work(started, tensors, s.copy_back)

    # ---- the shim's short way: blocking calls on one CPU tensor, which it passes as a numpy view
    # (``array``) and whose finished work it makes itself (see ``shim.cpp``). Each returns the group's
    # compiled shortcut of the call's shape (``None``: it has none), which the shim calls itself next
    # time, with no Python in between, and counts in ``sequence``; a shortcut that answers False (stale,
    # or the group busy, broken or destroyed) sends the call here again ---------------------------

    @in_torch_words
    def allreduce_now(self, array: np.ndarray, op: int):
        """``dist.all_reduce(t)``; ``op`` is torch's ``RedOpType`` number."""
        reduce_op = _BY_NUMBER.get(op)
        if reduce_op is None:
            _refuse(dist.ReduceOp.RedOpType(op))
        api.all_reduce(array, reduce_op, group=self.group)
        self.sequence += 1
        if not self._compiled:
            return None
        return self.group.shortcuts.compiled(Shape.all_reduce(array.dtype, array.size, reduce_op))

    @in_torch_words
    def broadcast_now(self, array: np.ndarray, root: int):
        """``dist.broadcast(t, src)``; ``root`` is ``src``'s rank in this group."""
        api.broadcast(array, root, group=self.group)
        self.sequence += 1
        return self.group.shortcuts.compiled(Shape.broadcast(array.dtype, array.size, root)) if self._compiled else None

    @in_torch_words
    def barrier_now(self):
        """``dist.barrier()``."""
        api.barrier(group=self.group)
        self.sequence += 1
        return self.group.shortcuts.compiled(Shape.barrier()) if self._compiled else None

    @in_torch_words
    def now_failed(self, error: BaseException) -> NoReturn:
        """A call the shim ran on a compiled shortcut raised ``error``: raise it in the words the
        ``*_now`` methods would have."""
        raise error

    @in_torch_words
    def allreduce_sparse(self, tensors, opts=None):
        """Sparse COO tensors, as Gloo sums them: gather every rank's indices and values, then coalesce."""
        op = _op(opts)
        if op != ReduceOp.SUM:
            raise ValueError(f"sparse all_reduce supports ReduceOp.SUM only (as Gloo), got ReduceOp.{op.name}")
        sparse.all_reduce(_one(tensors, "allreduce_sparse"), self.group)
        return self._work(None, tensors)

    @in_torch_words
    def allreduce_coalesced(self, tensors, opts=None):
        flat = host_copy(tensors) if tensors else torch.empty(0)
        started = api.all_reduce(flat, _op(opts), group=self.group, async_op=_async(opts))
        return self._work(started, tensors, lambda: _unpack(flat, tensors))

    @in_torch_words
    def reduce(self, tensors, opts=None):
        s = Staged(_one(tensors, "reduce"))
        started = api.reduce(s.host, _root(opts), _op(opts), group=self.group, async_op=_async(opts))
        return self._work(started, tensors, s.copy_back)

    @in_torch_words
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = Staged(_one(output_tensors, "reduce_scatter"), copy_in=False)
        ins = [Staged(t).host for t in _one(input_tensors, "reduce_scatter")]
        started = api.reduce_scatter(out.host, ins, _op(opts), group=self.group, async_op=_async(opts))
        return self._work(started, output_tensors, out.copy_back)

    @in_torch_words
    def _reduce_scatter_base(self, output, input, opts=None):
        out, inp = Staged(output, copy_in=False), Staged(input)
        started = api.reduce_scatter_tensor(out.host, inp.host, _op(opts), group=self.group, async_op=_async(opts))
        return self._work(started, [output], out.copy_back)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._joined([self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    # ---- data movement ---------------------------------------------------------------------------

    @in_torch_words
    def broadcast(self, tensors, opts=None):
        s = Staged(_one(tensors, "broadcast"))
        started = api.broadcast(s.host, _root(opts), group=self.group, async_op=_async(opts))
        return self._work(started, tensors, s.copy_back)

    @in_torch_words
    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = [Staged(t, copy_in=False) for t in _one(output_tensors, "allgather")]
        inp = Staged(_one(input_tensors, "allgather"))
        started = api.all_gather([o.host for o in outs], inp.host, group=self.group, async_op=_async(opts))
        return self._work(started, output_tensors, *[o.copy_back for o in outs])

    @in_torch_words
    def _allgather_base(self, output, input, opts=None):
        out, inp = Staged(output, copy_in=False), Staged(input)
        started = api.all_gather_into_tensor(out.host, inp.host, group=self.group, async_op=_async(opts))
        return self._work(started, [output], out.copy_back)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_tensors[i]`` (Gloo's layout)."""
        works = [self.allgather([[outs[i] for outs in output_lists]], [t], opts) for i, t in enumerate(input_tensors)]
        return self._joined(works, output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._joined([self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    @in_torch_words
    def gather(self, output_tensors, input_tensors, opts=None):
        inp = Staged(_one(input_tensors, "gather"))
        outs = [Staged(t, copy_in=False) for t in output_tensors[0]] if output_tensors else None
        started = api.gather(inp.host, [o.host for o in outs] if outs else None, _root(opts),
                             group=self.group, async_op=_async(opts))
        return self._work(started, output_tensors, *[o.copy_back for o in outs or ()])

    @in_torch_words
    def scatter(self, output_tensors, input_tensors, opts=None):
        out = Staged(_one(output_tensors, "scatter"), copy_in=False)
        ins = [Staged(t).host for t in input_tensors[0]] if input_tensors else None
        started = api.scatter(out.host, ins, _root(opts), group=self.group, async_op=_async(opts))
        return self._work(started, output_tensors, out.copy_back)

    @in_torch_words
    def alltoall_base(self, output, input, output_split_sizes=(), input_split_sizes=(), opts=None):
        out, inp = Staged(output, copy_in=False), Staged(input)
        started = api.all_to_all_single(out.host, inp.host, list(output_split_sizes) or None,
                                        list(input_split_sizes) or None, group=self.group, async_op=_async(opts))
        return self._work(started, [output], out.copy_back)

    @in_torch_words
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """Blocks of any sizes: one flat all-to-all whose split sizes are the blocks' element counts."""
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=input_tensors[0].dtype)
        flat_in = torch.cat([t.detach().reshape(-1).cpu() for t in input_tensors])
        started = api.all_to_all_single(flat_out, flat_in, [t.numel() for t in output_tensors],
                                        [t.numel() for t in input_tensors], group=self.group, async_op=_async(opts))
        return self._work(started, output_tensors, lambda: _unpack(flat_out, output_tensors))

    # ---- synchronization and point-to-point ------------------------------------------------------

    @in_torch_words
    def barrier(self, opts=None):
        return self._work(api.barrier(group=self.group, async_op=_async(opts)), None)

    def monitored_barrier(self, opts=None, wait_all_ranks: bool = False) -> None:
        """Gloo's monitored barrier (rank 0 names the ranks that did not arrive in time), on the store."""
        self._barriers += 1
        seconds = -1.0 if opts is None else opts.timeout.total_seconds()  # torch's "unset" is -1 ms
        monitored.barrier(self.group, self._barriers, seconds if seconds >= 0 else self.group.timeout, wait_all_ranks)

    def send(self, tensors, dst: int, tag: int = 0):
        s = Staged(_one(tensors, "send"))
        return self._work(api.isend(s.host, dst, group=self.group, tag=tag), tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        s = Staged(_one(tensors, "recv"), copy_in=False)
        return self._work(api.irecv(s.host, src, group=self.group, tag=tag), tensors, s.copy_back, source=src)

    def recv_anysource(self, tensors, tag: int = 0):
        """A receive from whichever rank sends first; the work's ``source_rank()`` names it once done."""
        s = Staged(_one(tensors, "recv"), copy_in=False)
        return self._work(api.irecv(s.host, None, group=self.group, tag=tag), tensors, s.copy_back, source=None)

    # ---- coalescing, sequence numbers, lifetime --------------------------------------------------

    def _start_coalescing(self) -> None:
        """Collect the works started until :meth:`_end_coalescing` (torch's ``_coalescing_manager``)."""
        self._coalesced = []

    def _end_coalescing(self) -> TorchWork:
        """One work for all those started since :meth:`_start_coalescing`; they run in issue order."""
        parts, self._coalesced = self._coalesced or [], None
        return TorchWork(parts, None)

    def _get_sequence_number_for_group(self) -> int:
        return self.sequence

    def shutdown(self) -> None:
        """Close the group, release its keys from torch's store, then leave it (rank 0 waits briefly for the
        others to leave); once."""
        if self._left:
            return
        self._left = True
        healthy = self.group.healthy
        self.group.close()
        bootstrap.release(self.group.store, self.group.size)
        bootstrap.leave(self.group.store, self.group.size, wait=healthy)

    def abort(self) -> None:
        self.group.close()

    def shrink(self, ranks_to_exclude: list[int], flags: int = 0) -> ProcessGroupAllreduce:
        """``torch.distributed.shrink_group``'s backend half (torch checked the ranks): the group of the other
        members, renumbered in order, formed on torch's store under keys of its own. With ``SHRINK_ABORT``
        (flag 1) this group is broken first, so that nothing more runs on it. Every member that stays calls
        it, with the same ranks; the store must have survived (under torchrun, its agent hosts it)."""
        if flags & 1:
            self.group.revoke()
        self._shrinks += 1
        members = [r for r in range(self.group.size) if r not in set(ranks_to_exclude)]
        rank = members.index(self.group.rank)
        store = self.group.store.beside(f"shrink{self._shrinks}", is_server=rank == 0)
        name, ranks = f"{self.group.name}.shrink{self._shrinks}", [self.group.ranks[r] for r in members]
        shrunk = bootstrap.form_group(store, rank, len(members), self.group.timeout, name, ranks,
                                      self.group.settings, self.group.shm_options)
        return ProcessGroupAllreduce(shrunk, shrunk=True)

    def _joined(self, works: list, result) -> TorchWork | DoneWork:
        """One work done when all of ``works`` are (a coalesced call made of several collectives)."""
        self.sequence -= len(works) - 1
        parts = [part for w in works for part in w.parts]
        return TorchWork(parts, result) if parts else DoneWork(result)


def _one(tensors: list, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"{what} on the allreduce backend takes one tensor (one device per process), "
                         f"got {len(tensors)}")
    return tensors[0]


def _async(opts) -> bool:
    """Whether torch will return the work to its caller (``async_op=True``, or a C++ caller such as DDP's
    reducer). A blocking call (``opts.asyncOp`` false) runs in the caller's thread, as our own blocking
    calls do, and returns a finished work: no hand-off to the progress thread and back. (A torch whose
    options lack ``asyncOp`` gets the queued path, correct for every caller.)"""
    return opts is None or getattr(opts, "asyncOp", True)


_OPS = {op: ReduceOp[name] for name, op in dist.ReduceOp.RedOpType.__members__.items() if name in ReduceOp.__members__}
_BY_NUMBER = {int(op): ours for op, ours in _OPS.items()}


# torch's ReduceOp hashes to its RedOpType's number; looking that up costs a fraction of reading ``.op``
# (a new enum object per call). Used only where every op checks out, else empty: ``.op`` then decides.
_BY_HASH = {hash(dist.ReduceOp(op)): ours for op, ours in _OPS.items()}
if any(hash(dist.ReduceOp(op)) != int(op) for op in _OPS):
    _BY_HASH = {}


def _op(opts) -> ReduceOp:
    if opts is None:
        return ReduceOp.SUM
    reduce_op = opts.reduceOp
    op = _BY_HASH.get(hash(reduce_op))
    if op is not None:
        return op
    torch_op = reduce_op.op
    op = _OPS.get(torch_op)
    if op is None:
        _refuse(torch_op)
    return op


def _refuse(torch_op) -> NoReturn:
    raise ValueError(f"ReduceOp.{torch_op.name} is not supported by the allreduce backend; use "
                     f"{', '.join(ReduceOp.__members__)}")


def _root(opts) -> int:
    return 0 if opts is None else opts.rootRank


def _unpack(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``tensors``."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

