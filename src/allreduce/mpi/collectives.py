"""mpi4py's upper-case collectives on buffers that move data without combining it, blocking and not.

Each collective ``X`` is ``IX(...).Wait()``. The even ones (``Bcast``, ``Gather``, ``Scatter``,
``Allgather``, ``Alltoall``, ``Barrier``) start the library's collective with ``async_op=True``: the
request completes in the group's progress, in order with the group's other collectives. The
v- and w-variants pad their blocks (:mod:`allreduce.uneven`), which starts with an all-reduce of
the block sizes: their nonblocking forms run at once and return a completed request. Before
that, one small all-reduce tells every rank whether any rank refused its arguments (counts that
do not fit, a malformed buffer), so such an error raises on every rank and none is left waiting.

Each method parses its buffer arguments once (:mod:`.parsed`: the root, ``MPI.IN_PLACE``, the
blocks) and starts the collective on the record. A root out of range raises
``MPI.Exception(ERR_ROOT)`` on every rank, before anything is sent.

The even collectives pay no such round: a rank that refuses its arguments tells its peers through
the group's heartbeat record (:func:`refusals`, ``ProcessGroup.refused``), and a peer waiting in
that collective raises ``Mismatch`` naming the rank, the call and the reason within a heartbeat
interval. Where every rank refuses alike nobody waits, and the communicator stays usable.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import api, refusal, uneven
from ..ops import ReduceOp
from . import parsed
from .bufferargs import written
from .errorcodes import Exception as MPIException
from .requests import Request

REFUSALS = (ValueError, TypeError, BufferError, KeyError, IndexError, MPIException)  # a rank's own arguments


def refusals(**collectives: str):
    """A class decorator: each method named (``method="Collective"``) that raises one of
    :data:`REFUSALS` before its collective was issued tells the group's peers that this rank refused
    it (:func:`~allreduce.refusal.refusing`), then raises as before."""
    def decorate(cls):
        for method, collective in collectives.items():
            setattr(cls, method, refusal.refusing(getattr(cls, method), collective, _group_of, REFUSALS))
        return cls
    return decorate


def _group_of(comm, *args, **kwargs):
    """The group of the communicator a method is called on (``None`` for none)."""
    try:
        return comm.process_group()
    except MPIException:  # no group (COMM_NULL): the method raises so, and nobody waits
        return None


def done() -> Request:
    """The request of an operation that has completed already."""
    return Request(active=True)


def agreed(g, what: str, prepare):
    """``prepare()``'s value once every rank of ``g`` checked its arguments (:func:`~allreduce.refusal.agreed`)."""
    return refusal.agreed(what, prepare, g.rank, functools.partial(_highest, g))


def _highest(g, vote: int) -> int:
    """The highest of the votes of the ranks of ``g``: one small all-reduce."""
    votes = np.array([vote], np.int64)
    api.all_reduce(votes, ReduceOp.MAX, g)
    return int(votes[0])


@refusals(Ibcast="Bcast", Igather="Gather", Iscatter="Scatter", Iallgather="Allgather", Ialltoall="Alltoall")
class BufferCollectives:
    """The data-moving buffer collectives of :class:`~allreduce.mpi.comm.Comm` (``process_group()``)."""

    def Barrier(self) -> None:
        self.Ibarrier().Wait()

    def Ibarrier(self) -> Request:
        return Request(api.barrier(self.process_group(), async_op=True))

    def Bcast(self, buf, root: int = 0) -> None:
        self.Ibcast(buf, root).Wait()

    def Ibcast(self, buf, root: int = 0) -> Request:
        g = self.process_group()
        m = parsed.bcast(buf, root, g.rank, g.size)
        return Request(api.broadcast(m.recv, m.root, g, async_op=True)).then(m.written)

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igather(sendbuf, recvbuf, root).Wait()

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        m = parsed.gather(sendbuf, recvbuf, root, g.rank, g.size)
        return _started(api.gather(m.send, m.recv_blocks, m.root, g, async_op=True), m)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatter(sendbuf, recvbuf, root).Wait()

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        m = parsed.scatter(sendbuf, recvbuf, root, g.rank, g.size)
        return Request(api.scatter(m.recv, m.send_blocks, m.root, g, async_op=True)).then(m.written)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self.Iallgather(sendbuf, recvbuf).Wait()

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        m = parsed.allgather(sendbuf, recvbuf, g.rank, g.size)
        return Request(api.all_gather_into_tensor(m.recv, m.send, g, async_op=True)).then(m.written)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self.Ialltoall(sendbuf, recvbuf).Wait()

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        m = parsed.alltoall(sendbuf, recvbuf, g.size)
        return Request(api.all_to_all_single(m.recv, m.send, group=g, async_op=True)).then(m.written)

    # ---- v- and w-variants (uneven blocks) ----------------------------------------------------

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igatherv(sendbuf, recvbuf, root).Wait()

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        m = agreed(g, "Gatherv", lambda: parsed.gatherv(sendbuf, recvbuf, root, g.rank, g.size))
        if m.recv is None:
            uneven.gather(g, m.send, m.root, None)
            return done()
        uneven.gather(g, m.send, m.root, _placing(m), m.recv.dtype)
        m.written()
        return done()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatterv(sendbuf, recvbuf, root).Wait()

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        m = agreed(g, "Scatterv", lambda: parsed.scatterv(sendbuf, recvbuf, root, g.rank, g.size))
        got = uneven.scatter(g, m.send_blocks, m.root, None if m.recv is None else m.recv.dtype)
        if m.recv is not None:
            if got.nbytes != m.recv.nbytes:
                raise ValueError(f"root {m.root} sent {got.nbytes // max(m.recv.itemsize, 1)} elements; recvbuf "
                                 f"holds {m.recv.size}")
            m.recv[:] = got.view(m.recv.dtype)
            m.written()
        return done()

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self.Iallgatherv(sendbuf, recvbuf).Wait()

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        m = agreed(g, "Allgatherv", lambda: parsed.gatherv(sendbuf, recvbuf, g.rank, g.rank, g.size))
        uneven.all_gather(g, m.send, _placing(m), m.recv.dtype)
        m.written()
        return done()

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self.Ialltoallv(sendbuf, recvbuf).Wait()

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        m = agreed(g, "Alltoallv", lambda: parsed.alltoallv(sendbuf, recvbuf, g.size))
        uneven.all_to_all(g, m.send_blocks, _placing(m), into=m.recv.dtype)
        m.written()
        return done()

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        self.Ialltoallw(sendbuf, recvbuf).Wait()

    def Ialltoallw(self, sendbuf, recvbuf) -> Request:
        """Like ``Alltoallv`` with a datatype per block (:func:`.parsed.alltoallw`)."""
        g = self.process_group()
        m = agreed(g, "Alltoallw", lambda: parsed.alltoallw(sendbuf, recvbuf, g.size))
        uneven.all_to_all(g, [b.view(np.uint8) for b in m.send_blocks], functools.partial(_delivered, m.recv_blocks))
        return done()


def _started(work, m: parsed.Message) -> Request:
    """The request of a collective started on ``m``, which writes its result back once done."""
    return Request(work) if m.recv is None else Request(work).then(m.written)


def _placing(m: parsed.Message):
    """What puts the blocks a v-collective received into ``m``'s receive buffer."""
    return lambda got: uneven.place(got, m.recv, m.counts, m.displs, "recvbuf")


def _delivered(recv_blocks: list[np.ndarray], got: list[np.ndarray]) -> None:
    """``Alltoallw``'s received blocks copied into the blocks of its receive buffer."""
    for r, (block, target) in enumerate(zip(got, recv_blocks)):
        if block.nbytes != target.nbytes:
            raise ValueError(f"Alltoallw: rank {r} sent {block.nbytes} bytes; block {r} of recvbuf holds "
                             f"{target.nbytes}")
        target.view(np.uint8)[:] = block.view(np.uint8)
    written(*recv_blocks)
