"""mpi4py's upper-case reductions on buffers (``Allreduce``, ``Reduce``, ``Reduce_scatter(_block)``,
``Scan``, ``Exscan``), blocking and not.

A predefined op runs the library's reduction: ``Allreduce`` in the caller's thread,
``Iallreduce``/``Reduce``/``Reduce_scatter_block`` with ``async_op=True`` (the request completes in the
group's progress); ``Reduce_scatter``
with uneven counts pads every block to the largest; ``Scan`` and ``Exscan``, which the library
lacks, all-gather the inputs and combine them in rank order on each rank. A user op
(``Op.Create``), ``REPLACE`` or ``NO_OP`` all-gathers the inputs too and folds them in rank order,
so a non-commutative op sees its operands in order. Those run at once; their nonblocking forms
return a completed request. ``MPI.IN_PLACE`` (or ``None``): the receive buffer holds this rank's
input (at the root, or the whole input of a reduce-scatter).
"""

from __future__ import annotations

import numpy as np

from .. import api, uneven
from ..ops import check_op, kernel
from . import parsed
from .bufferargs import datatype_argument
from .collectives import done, refusals
from .parsed import in_place
from .reductions import SUM, Op
from .requests import Request


@refusals(_allreduce="Allreduce", Ireduce="Reduce", Ireduce_scatter_block="Reduce_scatter_block",
          Ireduce_scatter="Reduce_scatter", Iscan="Scan", Iexscan="Exscan")
class Reductions:
    """The reductions of :class:`~allreduce.mpi.comm.Comm`, which provides ``process_group()``."""

    def Allreduce(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """All-reduce in the caller's thread: a blocking call of a shape already run costs what the numpy
        API's costs (no request, no hand-off to the progress thread). Plain 1-D arrays of one dtype and a
        predefined arithmetic op go to it straight: the input copied into ``recvbuf``, reduced in place."""
        if type(recvbuf) is np.ndarray and recvbuf.ndim == 1 and op.native is not None and not op.logical \
                and recvbuf.flags.c_contiguous and recvbuf.flags.writeable:
            if in_place(sendbuf):
                api.all_reduce(recvbuf, op.native, self.process_group())
                return
            if type(sendbuf) is np.ndarray and sendbuf.dtype == recvbuf.dtype and sendbuf.shape == recvbuf.shape:
                recvbuf[...] = sendbuf
                api.all_reduce(recvbuf, op.native, self.process_group())
                return
        self._allreduce(sendbuf, recvbuf, op, async_op=False)

    def Iallreduce(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Start an all-reduce; the result is in ``recvbuf`` once the request completes."""
        return self._allreduce(sendbuf, recvbuf, op, async_op=True)

    def _allreduce(self, sendbuf, recvbuf, op: Op, async_op: bool) -> Request:
        g = self.process_group()
        m = parsed.allreduce(sendbuf, recvbuf)
        if op.native is None:
            np.copyto(m.recv, _folded(g, op, m.send, recvbuf)[-1], casting="unsafe")
            m.written()
            return done()
        work, write_back = _staged(op, m.send, m.recv, g.size)
        started = api.all_reduce(work, op.for_buffers(), g, async_op=async_op)
        if async_op:
            return Request(started, write_back).then(m.written)
        if write_back is not None:
            write_back()
        m.written()
        return done()

    def Reduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> None:
        self.Ireduce(sendbuf, recvbuf, op, root).Wait()

    def Ireduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> Request:
        g = self.process_group()
        m = parsed.reduce(sendbuf, recvbuf, root, g.rank, g.size)
        if op.native is None:
            rows = _folded(g, op, m.send, recvbuf if m.recv is not None else sendbuf)
            if m.recv is not None:
                np.copyto(m.recv, rows[-1], casting="unsafe")
                m.written()
            return done()
        work, write_back = _staged(op, m.send, m.recv, g.size)
        return Request(api.reduce(work, m.root, op.for_buffers(), g, async_op=True), write_back).then(m.written)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        self.Ireduce_scatter_block(sendbuf, recvbuf, op).Wait()

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        """Reduce ``size`` blocks across ranks; rank r receives block r (in place: ``recvbuf`` holds
        every block and block r of the result lands at its start)."""
        g = self.process_group()
        m = parsed.reduce_scatter_block(sendbuf, recvbuf, g.size)
        send, recv = m.send, m.recv
        if op.native is None:
            np.copyto(recv, parsed.split(_folded(g, op, send, recvbuf)[-1], g.size)[g.rank], casting="unsafe")
            m.written()
            return done()
        operand = _operand(op, send, g.size)
        out = recv if recv.dtype == operand.dtype else np.empty(recv.size, operand.dtype)
        started = api.reduce_scatter_tensor(out, operand if operand is not send else send.copy(), op.for_buffers(),
                                            g, async_op=True)
        return Request(started, None if out is recv else (lambda: np.copyto(recv, out, casting="unsafe"))).then(
            m.written)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op: Op = SUM) -> None:
        self.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op).Wait()

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op: Op = SUM) -> Request:
        """Reduce ``sendbuf`` across ranks; rank r keeps ``recvcounts[r]`` elements of the result (from
        the start of ``recvbuf``). Without ``recvcounts`` each rank keeps as many as its ``recvbuf``
        holds (the counts are all-gathered); in place, ``recvbuf`` holds the whole input."""
        g = self.process_group()
        m = parsed.reduce_scatter(sendbuf, recvbuf)
        send, recv = m.send, m.recv
        counts = _recvcounts(g, recvcounts, None if in_place(sendbuf) else recv.size, send.size)
        start = uneven.displacements(counts)[g.rank]
        if op.native is None:
            total = _folded(g, op, send, recvbuf)[-1]
            np.copyto(recv[:counts[g.rank]], total[start:start + counts[g.rank]], casting="unsafe")
            m.written()
            return done()
        block = max(counts, default=0)
        operand = _operand(op, send, g.size)
        padded = np.zeros(g.size * block, operand.dtype)
        for r, (count, begin) in enumerate(zip(counts, uneven.displacements(counts))):
            padded[r * block:r * block + count] = operand[begin:begin + count]
        result = np.empty(block, padded.dtype)
        api.reduce_scatter_tensor(result, padded, op.for_buffers(), g)
        np.copyto(recv[:counts[g.rank]], result[:counts[g.rank]], casting="unsafe")
        m.written()
        return done()

    def Scan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        self.Iscan(sendbuf, recvbuf, op).Wait()

    def Iscan(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        self._prefix(sendbuf, recvbuf, op, inclusive=True)
        return done()

    def Exscan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Like ``Scan`` without this rank's own input; ``recvbuf`` of rank 0 is left as it was."""
        self.Iexscan(sendbuf, recvbuf, op).Wait()

    def Iexscan(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        self._prefix(sendbuf, recvbuf, op, inclusive=False)
        return done()

    def _prefix(self, sendbuf, recvbuf, op: Op, inclusive: bool) -> None:
        g = self.process_group()
        m = parsed.scan(sendbuf, recvbuf)
        mine, recv = m.send, m.recv
        everyone = _gathered(g, mine)[:g.rank + inclusive]
        if len(everyone) == 0:
            return
        if op.native is None:
            total = op.fold(list(everyone), datatype_argument(recvbuf, recv.dtype))
        else:
            dtype = _operand(op, mine, 2).dtype
            combine = kernel(check_op(op.for_buffers(), dtype), dtype)
            total = everyone[0]
            for row in everyone[1:]:
                total = combine(_operand(op, total, 2), _operand(op, row, 2))
        np.copyto(recv, total, casting="unsafe")
        m.written()


def _recvcounts(g, recvcounts, own: int | None, total: int) -> list[int]:
    """A reduce-scatter's count per rank: ``recvcounts``, else every rank's ``own`` (its receive
    buffer's size; ``None`` in place, where it holds the whole input), all-gathered.

    Raises:
        ValueError: counts that are not one per rank summing to ``total``, or in place without them.
    """
    if recvcounts is None:
        everyone = np.empty(g.size, np.int64)
        api.all_gather_into_tensor(everyone, np.array([-1 if own is None else own], np.int64), g)
        counts = [int(c) for c in everyone]
        if min(counts) < 0:
            raise ValueError("Reduce_scatter with MPI.IN_PLACE needs recvcounts (recvbuf holds the whole input)")
    else:
        counts = [int(c) for c in recvcounts]
    if len(counts) != g.size or total != sum(counts):
        raise ValueError(f"sendbuf has {total} elements; recvcounts {counts} need one count per rank "
                         f"({g.size}) summing to it")
    return counts


def _gathered(g, mine: np.ndarray) -> np.ndarray:
    """Every rank's ``mine``, one row per rank in rank order."""
    everyone = np.empty(g.size * mine.size, mine.dtype)
    api.all_gather_into_tensor(everyone, np.ascontiguousarray(mine), g)
    return everyone.reshape(g.size, mine.size)


def _folded(g, op: Op, send: np.ndarray, spec) -> list[np.ndarray]:
    """``[result]``: every rank's ``send`` folded in rank order by a user op (or REPLACE, NO_OP)."""
    rows = _gathered(g, send)
    return [op.fold(list(rows), datatype_argument(spec, send.dtype))]


def _operand(op: Op, values: np.ndarray, operands: int) -> np.ndarray:
    """What a reduction of ``operands`` inputs combines: ``values``, or for the logical ops whether each
    is nonzero. A single input passes through unchanged, as in MPI, where nothing combines it."""
    return values != 0 if op.logical and operands > 1 else values


def _staged(op: Op, send: np.ndarray, recv: np.ndarray | None, size: int):
    """``(work, write_back)``: an array holding ``send`` for ``op`` to reduce in place over ``size``
    ranks, and what copies the result into ``recv`` afterwards (``None`` when ``work`` is ``recv`` or
    there is no ``recv``).

    Raises:
        ValueError: ``send`` and ``recv`` hold different counts (as mpi4py, before anything is sent:
            a copy would broadcast one element over the receive buffer).
    """
    if recv is not None:
        parsed.matched(send, recv, same_count=True)
    operand = _operand(op, send, size)
    if recv is not None and recv.dtype == operand.dtype:
        if operand is not recv:
            np.copyto(recv, operand)
        return recv, None
    work = operand.copy() if operand is send or operand is recv else operand
    return work, (None if recv is None else lambda: np.copyto(recv, work, casting="unsafe"))
