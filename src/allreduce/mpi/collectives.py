"""mpi4py's upper-case collectives on buffers, as compositions of the library's collectives.

Even collectives map one to one (``Allreduce`` is ``all_reduce`` on the receive buffer); the
v-variants and ``Reduce_scatter`` pad their blocks (:mod:`allreduce.uneven`); ``Scan`` and ``Exscan``,
which the library lacks, all-gather the inputs and combine them in rank order on each rank, which
holds ``size`` inputs in memory at once. ``MPI.IN_PLACE`` means what MPI says for each call: the
receive buffer holds this rank's input (at the root, in its own block, or the whole input of a
reduce-scatter).
"""

from __future__ import annotations

import numpy as np

from .. import api, uneven
from ..ops import check_op, kernel
from .datatypes import IN_PLACE, simple, vector
from .reductions import SUM, Op
from .p2p import Request


class BufferCollectives:
    """The buffer collectives of :class:`~allreduce.mpi.comm.Comm`, which provides ``process_group()``."""

    def Barrier(self) -> None:
        api.barrier(self.process_group())

    def Bcast(self, buf, root: int = 0) -> None:
        api.broadcast(simple(buf, "buf", True), root, self.process_group())

    def Allreduce(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """All-reduce in the caller's thread (a blocking call of a shape already run costs what the numpy
        API's costs: no request, no hand-off to the progress thread)."""
        g, work, write_back = self._allreduced(sendbuf, recvbuf, op)
        api.all_reduce(work, op.for_buffers(), g)
        if write_back:
            write_back()

    def Iallreduce(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Start an all-reduce; the result is in ``recvbuf`` once the request completes."""
        g, work, write_back = self._allreduced(sendbuf, recvbuf, op)
        started = api.all_reduce(work, op.for_buffers(), g, async_op=True)
        return Request(started, lambda: write_back and write_back())

    def _allreduced(self, sendbuf, recvbuf, op: Op):
        """The group, the buffer an all-reduce works on in place and what copies it back (or ``None``)."""
        recv = simple(recvbuf, "recvbuf", True)
        g = self.process_group()
        return (g, *_in_place(op, _send(sendbuf, recv, copy=False), recv, g.size))

    def Reduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> None:
        g = self.process_group()
        recv = simple(recvbuf, "recvbuf", True) if g.rank == root else None
        work, write_back = _in_place(op, _send(sendbuf, recv, copy=False), recv, g.size)
        api.reduce(work, root, op.for_buffers(), g)
        if write_back:
            write_back()

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        g = self.process_group()
        if g.rank != root:
            api.gather(simple(sendbuf, "sendbuf", False), None, root, g)
            return
        blocks = _blocks(simple(recvbuf, "recvbuf", True), g.size)
        api.gather(_send(sendbuf, blocks[g.rank]), blocks, root, g)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        g = self.process_group()
        if g.rank != root:
            uneven.gather(g, simple(sendbuf, "sendbuf", False), root, None)
            return
        recv, counts, displs = vector(recvbuf, g.size, "recvbuf", True)
        send = _send(sendbuf, recv[displs[g.rank]:displs[g.rank] + counts[g.rank]])
        uneven.gather(g, send, root, lambda got: uneven.place(got, recv, counts, displs, "recvbuf"), recv.dtype)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        g = self.process_group()
        if g.rank != root:
            api.scatter(simple(recvbuf, "recvbuf", True), None, root, g)
            return
        blocks = _blocks(simple(sendbuf, "sendbuf", False), g.size)
        recv = blocks[g.rank].copy() if recvbuf is IN_PLACE else simple(recvbuf, "recvbuf", True)
        api.scatter(recv, blocks, root, g)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        g = self.process_group()
        blocks, recv = None, None
        if g.rank == root:
            send, counts, displs = vector(sendbuf, g.size, "sendbuf", False)
            blocks = [send[d:d + c] for c, d in zip(counts, displs)]
        if recvbuf is not IN_PLACE or g.rank != root:
            recv = simple(recvbuf, "recvbuf", True)
        got = uneven.scatter(g, blocks, root, None if recv is None else recv.dtype)
        if recv is None:
            return
        if got.nbytes != recv.nbytes:
            raise ValueError(f"root {root} sent {got.nbytes // recv.itemsize} elements; recvbuf holds {recv.size}")
        recv[:] = got.view(recv.dtype)

    def Allgather(self, sendbuf, recvbuf) -> None:
        g = self.process_group()
        recv = simple(recvbuf, "recvbuf", True)
        api.all_gather_into_tensor(recv, _send(sendbuf, _blocks(recv, g.size)[g.rank]), g)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        g = self.process_group()
        recv, counts, displs = vector(recvbuf, g.size, "recvbuf", True)
        send = _send(sendbuf, recv[displs[g.rank]:displs[g.rank] + counts[g.rank]])
        uneven.all_gather(g, send, lambda got: uneven.place(got, recv, counts, displs, "recvbuf"), recv.dtype)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        recv = simple(recvbuf, "recvbuf", True)
        api.all_to_all_single(recv, _send(sendbuf, recv), group=self.process_group())

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        g = self.process_group()
        recv, recv_counts, recv_displs = vector(recvbuf, g.size, "recvbuf", True)
        if sendbuf is IN_PLACE:
            send, send_counts, send_displs = recv.copy(), recv_counts, recv_displs
        else:
            send, send_counts, send_displs = vector(sendbuf, g.size, "sendbuf", False)
        blocks = [send[d:d + c] for c, d in zip(send_counts, send_displs)]
        uneven.all_to_all(g, blocks, lambda got: uneven.place(got, recv, recv_counts, recv_displs, "recvbuf"),
                          into=recv.dtype)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        g = self.process_group()
        recv = simple(recvbuf, "recvbuf", True)
        self.Reduce_scatter(sendbuf, recvbuf, [recv.size // g.size if sendbuf is IN_PLACE else recv.size] * g.size, op)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op: Op = SUM) -> None:
        """Reduce ``sendbuf`` across ranks; rank r keeps ``recvcounts[r]`` elements of the result (from
        the start of ``recvbuf``). Without ``recvcounts`` every rank keeps as many as its ``recvbuf`` holds."""
        g = self.process_group()
        recv = simple(recvbuf, "recvbuf", True)
        counts = [int(c) for c in recvcounts] if recvcounts is not None else [recv.size] * g.size
        send = recv.copy() if sendbuf is IN_PLACE else simple(sendbuf, "sendbuf", False)
        if len(counts) != g.size or send.size != sum(counts):
            raise ValueError(f"sendbuf has {send.size} elements; recvcounts {counts} need one count per rank "
                             f"({g.size}) summing to it")
        block = max(counts, default=0)
        operand = _operand(op, send, g.size)
        padded = np.zeros(g.size * block, operand.dtype)
        for r, (count, start) in enumerate(zip(counts, uneven.displacements(counts))):
            padded[r * block:r * block + count] = operand[start:start + count]
        result = np.empty(block, padded.dtype)
        api.reduce_scatter_tensor(result, padded, op.for_buffers(), g)
        np.copyto(recv[:counts[g.rank]], result[:counts[g.rank]], casting="unsafe")

    def Scan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        self._prefix(sendbuf, recvbuf, op, inclusive=True)

    def Exscan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Like ``Scan`` without this rank's own input; ``recvbuf`` of rank 0 is left as it was."""
        self._prefix(sendbuf, recvbuf, op, inclusive=False)

    def _prefix(self, sendbuf, recvbuf, op: Op, inclusive: bool) -> None:
        g = self.process_group()
        recv = simple(recvbuf, "recvbuf", True)
        mine = _send(sendbuf, recv, copy=False)
        dtype = _operand(op, mine, 2).dtype
        combine = kernel(check_op(op.for_buffers(), dtype), dtype)
        everyone = np.empty(g.size * mine.size, mine.dtype)
        api.all_gather_into_tensor(everyone, mine, g)
        rows = everyone.reshape(g.size, mine.size)[:g.rank + inclusive]
        if len(rows) == 0:
            return
        total = rows[0]
        for row in rows[1:]:
            total = combine(_operand(op, total, 2), _operand(op, row, 2))
        np.copyto(recv, total, casting="unsafe")


def _send(sendbuf, own: np.ndarray | None, copy: bool = True) -> np.ndarray:
    """The send buffer's elements, or with ``IN_PLACE`` ``own``, where the input lies: a copy, unless
    the caller reads it before anything writes the receive buffer."""
    if sendbuf is IN_PLACE:
        if own is None:
            raise ValueError("MPI.IN_PLACE is only valid where this rank also receives (at the root)")
        return own.copy() if copy else own
    return simple(sendbuf, "sendbuf", False)


def _blocks(buffer: np.ndarray, size: int) -> list[np.ndarray]:
    """``buffer`` cut into ``size`` equal blocks."""
    if buffer.size % size:
        raise ValueError(f"a buffer of {buffer.size} elements does not split into {size} equal blocks")
    step = buffer.size // size
    return [buffer[r * step:(r + 1) * step] for r in range(size)]


def _operand(op: Op, values: np.ndarray, operands: int) -> np.ndarray:
    """What a reduction of ``operands`` inputs combines: ``values``, or for the logical ops whether each
    is nonzero. A single input passes through unchanged, as in MPI, where nothing combines it."""
    return values != 0 if op.logical and operands > 1 else values


def _in_place(op: Op, send: np.ndarray, recv: np.ndarray | None, size: int):
    """``(work, write_back)``: an array holding ``send`` for ``op`` to reduce in place over ``size``
    ranks, and what copies the result into ``recv`` afterwards (``None`` when ``work`` is ``recv`` or
    there is no ``recv``).

    Raises:
        ValueError: ``send`` and ``recv`` hold different counts (as mpi4py, before anything is sent:
            a copy would broadcast one element over the receive buffer).
    """
    if recv is not None and send.size != recv.size:
        raise ValueError(f"mismatch in send count {send.size} and receive count {recv.size}")
    operand = _operand(op, send, size)
    if recv is not None and recv.dtype == operand.dtype:
        if operand is not recv:
            np.copyto(recv, operand)
        return recv, None
    work = operand if operand is not send else send.copy()
    return work, (None if recv is None else lambda: np.copyto(recv, work, casting="unsafe"))
