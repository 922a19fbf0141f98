"""The torch.distributed backend ``"allreduce"``: torch's collectives carried by an allreduce group.

:func:`register_backend` (run on ``import allreduce.torch``) registers a creator with
``torch.distributed.Backend.register_backend``. ``init_process_group("allreduce")`` (and
``new_group``) call it with the store, rank and size torch already settled; it forms an allreduce
group on that store (:class:`.torchstore.TorchStore`, so no second rendezvous) and returns a
:class:`ProcessGroupAllreduce`, a Python subclass of ``torch.distributed.ProcessGroup``. torch then
calls its methods by name, from ``dist.*`` and from C++ (DistributedDataParallel's reducer).

Every method starts its collective asynchronously on the allreduce group and returns a
:class:`TorchWork`, a Python subclass of torch's ``Work`` that the group's progress thread completes:
its ``wait()`` raises the collective's error, and its ``get_future()`` yields the output tensors (as
DDP's communication hooks expect) or fails. (torch's ``_create_work_from_future`` is not enough: its
``wait()`` returns normally even when the future failed, so synchronous ``dist.*`` calls would
never see an error.) Tensors the core cannot view in place (CUDA, non-contiguous) are staged
(:class:`.tensors.Staged`) and copied back before the work completes.

What this relies on in torch beyond the documented ``register_backend`` is private and listed in
:data:`TORCH_HOOKS`; ``tests/torch/test_torch_backend.py`` checks that the pinned torch still has it.
"""

from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist

from allreduce import api, bootstrap
from allreduce.ops import ReduceOp
from allreduce.settings import Settings
from allreduce.transport.shm import ShmOptions

from .tensors import Staged
from .torchstore import TorchStore

NAME = "allreduce"
# The private parts of torch this module uses: the creator's options (extended API), the Work methods
# a Python subclass overrides, and the ProcessGroup method names torch's Python and C++ callers use.
TORCH_HOOKS = {
    "torch._C._distributed_c10d": ["_DistributedBackendOptions"],
    "Work": ["wait", "get_future", "is_completed", "is_success", "exception", "result"],
    "_DistributedBackendOptions": ["store", "group_rank", "group_size", "timeout", "group_id",
                                   "global_ranks_in_group"],
    "ProcessGroup": ["allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
                     "all_gather_single", "_allgather_base", "gather", "scatter", "reduce_scatter",
                     "reduce_scatter_single", "_reduce_scatter_base", "all_to_all_single", "alltoall_base",
                     "alltoall", "barrier", "send", "recv", "recv_anysource", "shutdown", "abort"],
}


class ProcessGroupAllreduce(dist.ProcessGroup):
    """torch's ProcessGroup interface on an allreduce group (``.group``); see the module docstring."""

    def __init__(self, group):
        super().__init__(group.rank, group.size)
        self.group = group

    def getBackendName(self) -> str:
        return NAME

    def __repr__(self) -> str:
        return f"<ProcessGroupAllreduce rank {self.group.rank}/{self.group.size} '{self.group.name}'>"

    # ---- reductions ------------------------------------------------------------------------------

    def allreduce(self, tensors, opts):
        s = Staged(_one(tensors, "allreduce"))
        started = api.all_reduce(s.host, _op(opts), group=self.group, async_op=True)
        return TorchWork(started, tensors, s.copy_back)

    def allreduce_coalesced(self, tensors, opts):
        flat = torch.cat([t.detach().reshape(-1).cpu() for t in tensors]) if tensors else torch.empty(0)
        started = api.all_reduce(flat, _op(opts), group=self.group, async_op=True)

        def unpack():
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return TorchWork(started, tensors, unpack)

    def reduce(self, tensors, opts):
        s = Staged(_one(tensors, "reduce"))
        started = api.reduce(s.host, opts.rootRank, _op(opts), group=self.group, async_op=True)
        return TorchWork(started, tensors, s.copy_back)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        out = Staged(_one(output_tensors, "reduce_scatter"), copy_in=False)
        ins = [Staged(t).host for t in _one(input_tensors, "reduce_scatter")]
        started = api.reduce_scatter(out.host, ins, _op(opts), group=self.group, async_op=True)
        return TorchWork(started, output_tensors, out.copy_back)

    def reduce_scatter_single(self, output, input, opts):
        out, inp = Staged(output, copy_in=False), Staged(input)
        started = api.reduce_scatter_tensor(out.host, inp.host, _op(opts), group=self.group, async_op=True)
        return TorchWork(started, [output], out.copy_back)

    _reduce_scatter_base = reduce_scatter_single

    # ---- data movement ---------------------------------------------------------------------------

    def broadcast(self, tensors, opts):
        s = Staged(_one(tensors, "broadcast"))
        started = api.broadcast(s.host, opts.rootRank, group=self.group, async_op=True)
        return TorchWork(started, tensors, s.copy_back)

    def allgather(self, output_tensors, input_tensors, opts):
        outs = [Staged(t, copy_in=False) for t in _one(output_tensors, "allgather")]
        inp = Staged(_one(input_tensors, "allgather"))
        started = api.all_gather([o.host for o in outs], inp.host, group=self.group, async_op=True)
        return TorchWork(started, output_tensors, *[o.copy_back for o in outs])

    def all_gather_single(self, output, input, opts):
        out, inp = Staged(output, copy_in=False), Staged(input)
        started = api.all_gather_into_tensor(out.host, inp.host, group=self.group, async_op=True)
        return TorchWork(started, [output], out.copy_back)

    _allgather_base = all_gather_single

    def gather(self, output_tensors, input_tensors, opts):
        inp = Staged(_one(input_tensors, "gather"))
        outs = [Staged(t, copy_in=False) for t in output_tensors[0]] if output_tensors else None
        started = api.gather(inp.host, [o.host for o in outs] if outs else None, opts.rootRank,
                             group=self.group, async_op=True)
        return TorchWork(started, output_tensors, *[o.copy_back for o in outs or ()])

    def scatter(self, output_tensors, input_tensors, opts):
        out = Staged(_one(output_tensors, "scatter"), copy_in=False)
        ins = [Staged(t).host for t in input_tensors[0]] if input_tensors else None
        started = api.scatter(out.host, ins, opts.rootRank, group=self.group, async_op=True)
        return TorchWork(started, output_tensors, out.copy_back)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        if not output_split_sizes and not input_split_sizes:
            out, inp = Staged(output, copy_in=False), Staged(input)
            started = api.all_to_all_single(out.host, inp.host, group=self.group, async_op=True)
            return TorchWork(started, [output], out.copy_back)
        return self._all_to_all_blocks(_split(output, output_split_sizes, self.size()),
                                       _split(input, input_split_sizes, self.size()), [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts):
        return self._all_to_all_blocks(list(output_tensors), list(input_tensors), output_tensors)

    def barrier(self, opts):
        return TorchWork(api.barrier(group=self.group, async_op=True), None)

    def send(self, tensors, dst, tag=0):
        s = Staged(_one(tensors, "send"))
        return TorchWork(api.isend(s.host, dst, group=self.group, tag=tag), tensors)

    def recv(self, tensors, src, tag=0):
        s = Staged(_one(tensors, "recv"), copy_in=False)
        return TorchWork(api.irecv(s.host, src, group=self.group, tag=tag), tensors, s.copy_back)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("the allreduce backend cannot receive from any source; pass src to recv")

    def shutdown(self) -> None:
        """Close the group, then leave the store (rank 0 waits briefly for the others to leave)."""
        self.group.close()
        bootstrap.leave(self.group.store, self.group.size)

    def abort(self) -> None:
        self.group.close()

    def _all_to_all_blocks(self, outs: list[torch.Tensor], ins: list[torch.Tensor], result):
        """All-to-all of blocks of any sizes: pad every block to the largest in the group, then unpad."""
        size = self.size()
        if len(outs) != size or len(ins) != size:
            raise ValueError(f"all-to-all needs one block per rank ({size}), got {len(ins)} in and {len(outs)} out")
        largest = torch.tensor([max(t.numel() for t in outs + ins)], dtype=torch.int64)
        api.all_reduce(largest, ReduceOp.MAX, group=self.group)
        block = int(largest)
        sending = torch.zeros(size * block, dtype=ins[0].dtype)
        with torch.no_grad():
            for j, t in enumerate(ins):
                sending[j * block:j * block + t.numel()] = t.reshape(-1).cpu()
        receiving = torch.empty_like(sending)
        started = api.all_to_all_single(receiving, sending, group=self.group, async_op=True)

        def unpad():
            with torch.no_grad():
                for j, t in enumerate(outs):
                    t.copy_(receiving[j * block:j * block + t.numel()].view_as(t))

        return TorchWork(started, result, unpad)


def register_backend() -> None:
    """Register ``"allreduce"`` with torch.distributed (once; ``import allreduce.torch`` does it).

    Example::

        import allreduce.torch
        torch.distributed.init_process_group("allreduce")    # under allreduce run or torchrun
    """
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])


def create(options, backend_options=None) -> ProcessGroupAllreduce:
    """torch's creator hook: form an allreduce group on the store torch passes in."""
    seconds = options.timeout.total_seconds()
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    store = TorchStore(options.store, seconds, is_server=options.group_rank == 0)
    group = bootstrap.form_group(store, options.group_rank, options.group_size, seconds, f"torch-{options.group_id}",
                                 ranks, Settings.from_env(), ShmOptions.from_env())
    return ProcessGroupAllreduce(group)


class TorchWork(dist.Work):
    """A torch ``Work`` that completes, with value ``result``, once ``started`` (an allreduce
    :class:`~allreduce.Work`) and the ``after`` callbacks (copy-backs of staged tensors) are done.

    ``wait()`` raises the collective's own error (a :class:`~allreduce.Mismatch`, a
    :class:`~allreduce.CommTimeout`...). ``get_future()`` is completed with the output tensors, or
    failed with that error, which is what DDP and its communication hooks consume from C++.
    """

    def __init__(self, started, result, *after):
        super().__init__()
        self._result = result
        self._error: BaseException | None = None
        self._done = threading.Event()
        settled = torch.futures.Future()  # its value: the outputs, or the error, as an object
        self._future = settled.then(_unwrap)  # an error there fails this one in C++ too

        def finish(done):
            try:
                done.result()
                for step in after:
                    step()
            except BaseException as exc:  # delivered to whoever waits on the work
                self._error = exc
            self._done.set()
            settled.set_result(self._error if self._error is not None else result)

        started.get_future().add_done_callback(finish)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until done (at most ``timeout``, zero meaning no limit); raise the collective's error."""
        seconds = timeout.total_seconds() or None
        if not self._done.wait(seconds):
            raise TimeoutError(f"collective did not complete within {seconds}s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> list:
        self.wait()
        return self._result


def _unwrap(settled: torch.futures.Future):
    value = settled.value()
    if isinstance(value, BaseException):
        raise value
    return value


def _one(tensors: list, what: str):
    if len(tensors) != 1:
        raise ValueError(f"{what} on the allreduce backend takes one tensor (one device per process), got {len(tensors)}")
    return tensors[0]


def _op(opts) -> ReduceOp:
    name = opts.reduceOp.op.name
    if name not in ReduceOp.__members__:
        raise ValueError(f"ReduceOp.{name} is not supported by the allreduce backend; use "
                         f"{', '.join(ReduceOp.__members__)}")
    return ReduceOp[name]


def _split(t: torch.Tensor, sizes: list[int], size: int) -> list[torch.Tensor]:
    """``t`` cut along dim 0 into ``sizes`` rows (equal parts when ``sizes`` is empty)."""
    if not sizes:
        if t.shape[0] % size:
            raise ValueError(f"all_to_all_single without split sizes needs dim 0 ({t.shape[0]}) divisible by {size}")
        sizes = [t.shape[0] // size] * size
    if sum(sizes) != t.shape[0]:
        raise ValueError(f"split sizes {list(sizes)} do not add up to dim 0 ({t.shape[0]})")
    return list(torch.split(t, list(sizes)))
