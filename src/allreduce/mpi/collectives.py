"""mpi4py's upper-case collectives on buffers that move data without combining it, blocking and not.

Each collective ``X`` is ``IX(...).Wait()``. The even ones (``Bcast``, ``Gather``, ``Scatter``,
``Allgather``, ``Alltoall``, ``Barrier``) start the library's collective with ``async_op=True``: the
request completes in the group's progress, in order with the group's other collectives. The
v- and w-variants pad their blocks (:mod:`allreduce.uneven`), which starts with an all-reduce of
the block sizes: their nonblocking forms run at once and return a completed request. Before
that, one small all-reduce tells every rank whether any rank refused its arguments (counts that
do not fit, a malformed buffer), so such an error raises on every rank and none is left waiting.

``MPI.IN_PLACE`` (or ``None`` as the send buffer) means what MPI says for each call: at the root of
a gather its block of the receive buffer already holds its input, at the root of a scatter it keeps
its block where it is, in an all-gather and an all-to-all the receive buffer holds the input.
A root out of range raises ``MPI.Exception(ERR_ROOT)`` on every rank, before anything is sent.

The even collectives pay no such round: a rank that refuses its arguments tells its peers through
the group's heartbeat record (:func:`refusals`, ``ProcessGroup.refused``), and a peer waiting in
that collective raises ``Mismatch`` naming the rank, the call and the reason within a heartbeat
interval. Where every rank refuses alike nobody waits, and the communicator stays usable.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import api, uneven
from ..ops import ReduceOp
from .bufferargs import BOTTOM, IN_PLACE, absolute, array_of, blocked, simple, vector, written
from .errorcodes import ERR_ROOT, Exception as MPIException, error
from .requests import Request

REFUSALS = (ValueError, TypeError, BufferError, KeyError, IndexError, MPIException)  # a rank's own arguments


def refusals(**collectives: str):
    """A class decorator: each method named (``method="Collective"``) that raises one of
    :data:`REFUSALS` before its collective was issued tells the group's peers that this rank refused
    it (``ProcessGroup.refused``), then raises as before."""
    def decorate(cls):
        for method, collective in collectives.items():
            setattr(cls, method, _refusing(getattr(cls, method), collective))
        return cls
    return decorate


def _refusing(method, collective: str):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            g = self.process_group()
        except MPIException:  # no group (COMM_NULL): the method raises so, and nobody waits
            return method(self, *args, **kwargs)
        issued = g.issued
        try:
            return method(self, *args, **kwargs)
        except REFUSALS as exc:
            g.refused(collective, str(exc), issued)
            raise
    return call


def done() -> Request:
    """The request of an operation that has completed already."""
    return Request(active=True)


def in_place(sendbuf) -> bool:
    return sendbuf is IN_PLACE or sendbuf is None


def check_root(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise error(ERR_ROOT, f"root={root!r} is not a rank of this communicator (0..{size - 1})")
    return int(root)


def split(buffer: np.ndarray, size: int) -> list[np.ndarray]:
    """``buffer`` cut into ``size`` equal blocks."""
    if buffer.size % size:
        raise ValueError(f"a buffer of {buffer.size} elements does not split into {size} equal blocks")
    step = buffer.size // size
    return [buffer[r * step:(r + 1) * step] for r in range(size)]


def agreed(g, what: str, prepare):
    """``prepare()``'s value, once every rank of ``g`` has run its own ``prepare`` (its local checks of
    its arguments) without error: one small all-reduce tells each rank whether any failed, so a bad
    argument on one rank raises there and a ``ValueError`` naming it on the others, instead of
    leaving them waiting in a collective that rank never enters."""
    try:
        value, error = prepare(), None
    except (ValueError, TypeError) as exc:
        value, error = None, exc
    flag = np.array([-1 if error is None else g.rank], np.int64)
    api.all_reduce(flag, ReduceOp.MAX, g)
    if error is not None:
        raise error
    if flag[0] >= 0:
        raise ValueError(f"{what}: rank {int(flag[0])} of this communicator refused its arguments; no data moved")
    return value


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
        root = check_root(root, g.size)
        target = simple(buf, "buf", g.rank != root)
        if not target.flags.writeable:  # the root only reads its buffer (bytes, say); what moves is a copy
            target = target.copy()
        return Request(api.broadcast(target, root, g, async_op=True)).then(lambda: written(target))

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igather(sendbuf, recvbuf, root).Wait()

    def Igather(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        root = check_root(root, g.size)
        if g.rank != root:
            return Request(api.gather(simple(sendbuf, "sendbuf", False), None, root, g, async_op=True))
        whole = blocked(recvbuf, g.size, "recvbuf", True)
        blocks = split(whole, g.size)
        send = blocks[g.rank].copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
        return Request(api.gather(send, blocks, root, g, async_op=True)).then(lambda: written(whole))

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatter(sendbuf, recvbuf, root).Wait()

    def Iscatter(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        root = check_root(root, g.size)
        if g.rank != root:
            target = simple(recvbuf, "recvbuf", True)
            return Request(api.scatter(target, None, root, g, async_op=True)).then(lambda: written(target))
        blocks = split(blocked(sendbuf, g.size, "sendbuf", False), g.size)
        recv = blocks[g.rank].copy() if in_place(recvbuf) else simple(recvbuf, "recvbuf", True)
        return Request(api.scatter(recv, blocks, root, g, async_op=True)).then(lambda: written(recv))

    def Allgather(self, sendbuf, recvbuf) -> None:
        self.Iallgather(sendbuf, recvbuf).Wait()

    def Iallgather(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        recv = blocked(recvbuf, g.size, "recvbuf", True)
        send = split(recv, g.size)[g.rank].copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
        return Request(api.all_gather_into_tensor(recv, send, g, async_op=True)).then(lambda: written(recv))

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self.Ialltoall(sendbuf, recvbuf).Wait()

    def Ialltoall(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()
        recv = blocked(recvbuf, g.size, "recvbuf", True)
        send = recv.copy() if in_place(sendbuf) else blocked(sendbuf, g.size, "sendbuf", False)
        return Request(api.all_to_all_single(recv, send, group=g, async_op=True)).then(lambda: written(recv))

    # ---- v- and w-variants (uneven blocks) ----------------------------------------------------

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Igatherv(sendbuf, recvbuf, root).Wait()

    def Igatherv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        root = check_root(root, g.size)
        if g.rank != root:
            uneven.gather(g, agreed(g, "Gatherv", lambda: simple(sendbuf, "sendbuf", False)), root, None)
            return done()

        def prepare():
            recv, counts, displs = vector(recvbuf, g.size, "recvbuf", True)
            own = recv[displs[g.rank]:displs[g.rank] + counts[g.rank]]
            return recv, counts, displs, own.copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
        recv, counts, displs, send = agreed(g, "Gatherv", prepare)
        uneven.gather(g, send, root, lambda got: uneven.place(got, recv, counts, displs, "recvbuf"), recv.dtype)
        written(recv)
        return done()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self.Iscatterv(sendbuf, recvbuf, root).Wait()

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0) -> Request:
        g = self.process_group()
        root = check_root(root, g.size)

        def prepare():
            blocks, recv = None, None
            if g.rank == root:
                send, counts, displs = vector(sendbuf, g.size, "sendbuf", False)
                blocks = [send[d:d + c] for c, d in zip(counts, displs)]
            if not (in_place(recvbuf) and g.rank == root):
                recv = simple(recvbuf, "recvbuf", True)
            return blocks, recv
        blocks, recv = agreed(g, "Scatterv", prepare)
        got = uneven.scatter(g, blocks, root, None if recv is None else recv.dtype)
        if recv is not None:
            if got.nbytes != recv.nbytes:
                raise ValueError(f"root {root} sent {got.nbytes // max(recv.itemsize, 1)} elements; recvbuf holds "
                                 f"{recv.size}")
            recv[:] = got.view(recv.dtype)
            written(recv)
        return done()

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self.Iallgatherv(sendbuf, recvbuf).Wait()

    def Iallgatherv(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()

        def prepare():
            recv, counts, displs = vector(recvbuf, g.size, "recvbuf", True)
            own = recv[displs[g.rank]:displs[g.rank] + counts[g.rank]]
            return recv, counts, displs, own.copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
        recv, counts, displs, send = agreed(g, "Allgatherv", prepare)
        uneven.all_gather(g, send, lambda got: uneven.place(got, recv, counts, displs, "recvbuf"), recv.dtype)
        written(recv)
        return done()

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self.Ialltoallv(sendbuf, recvbuf).Wait()

    def Ialltoallv(self, sendbuf, recvbuf) -> Request:
        g = self.process_group()

        def prepare():
            recv, recv_counts, recv_displs = vector(recvbuf, g.size, "recvbuf", True)
            if in_place(sendbuf):
                send, send_counts, send_displs = recv.copy(), recv_counts, recv_displs
            else:
                send, send_counts, send_displs = vector(sendbuf, g.size, "sendbuf", False)
            return recv, recv_counts, recv_displs, [send[d:d + c] for c, d in zip(send_counts, send_displs)]
        recv, recv_counts, recv_displs, blocks = agreed(g, "Alltoallv", prepare)
        uneven.all_to_all(g, blocks, lambda got: uneven.place(got, recv, recv_counts, recv_displs, "recvbuf"),
                          into=recv.dtype)
        written(recv)
        return done()

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        self.Ialltoallw(sendbuf, recvbuf).Wait()

    def Ialltoallw(self, sendbuf, recvbuf) -> Request:
        """Like ``Alltoallv`` with a datatype per block: ``[data, (counts, displs), types]``, displacements
        in bytes, as MPI's ``Alltoallw`` takes them (``[data, types]``: one element of each type per rank,
        all at the start of ``data``)."""
        g = self.process_group()

        def prepare():
            recv_blocks = _typed_blocks(recvbuf, g.size, "recvbuf", True)
            if in_place(sendbuf):
                return recv_blocks, [b.copy() for b in recv_blocks]
            return recv_blocks, _typed_blocks(sendbuf, g.size, "sendbuf", False)
        recv_blocks, send_blocks = agreed(g, "Alltoallw", prepare)
        sent = [b.view(np.uint8) for b in send_blocks]

        def deliver(got):
            for r, (block, target) in enumerate(zip(got, recv_blocks)):
                if block.nbytes != target.nbytes:
                    raise ValueError(f"Alltoallw: rank {r} sent {block.nbytes} bytes; block {r} of recvbuf holds "
                                     f"{target.nbytes}")
                target.view(np.uint8)[:] = block.view(np.uint8)
            written(*recv_blocks)
        uneven.all_to_all(g, sent, deliver)
        return done()


def _typed_blocks(spec, size: int, what: str, writable: bool) -> list[np.ndarray]:
    """The blocks of an ``Alltoallw`` argument, in mpi4py's forms: ``[data, counts, displs, types]``,
    ``[data, (counts, displs), types]`` (displacements in bytes), or ``[data, types]`` and counts and
    displs both ``None``: then every block is one element of its type at the start of ``data`` (each
    rank's block over the same bytes, as in MPI with counts of one and displacements of zero).

    Raises:
        ValueError: another number of items, only one of counts and displs, ``BOTTOM`` without both.
    """
    if not isinstance(spec, (list, tuple)) or not 2 <= len(spec) <= 4:
        raise ValueError(f"{what}: an Alltoallw buffer is [data, counts, displs, types], [data, (counts, displs), "
                         "types] or [data, types]")
    if len(spec) == 2:
        (data, types), counts, displs = spec, None, None
    elif len(spec) == 3:
        data, (counts, displs), types = spec
    else:
        data, counts, displs, types = spec
    if data is BOTTOM and (counts is None or displs is None):
        raise ValueError(f"{what}: MPI.BOTTOM needs counts and displs (absolute addresses)")
    if counts is None and displs is None:
        counts, displs = [1] * size, [0] * size
    elif counts is None or displs is None:
        raise ValueError(f"{what}: give both counts and displs, or neither")
    if not isinstance(types, (list, tuple)):
        types = [types] * size
    if not len(counts) == len(displs) == len(types) == size:
        raise ValueError(f"{what}: needs one count, displacement and type per rank ({size})")
    if data is BOTTOM:  # every type's displacements are absolute addresses
        return [absolute(t, int(c), int(d), writable) for c, d, t in zip(counts, displs, types)]
    raw = array_of(data, what, writable).reshape(-1).view(np.uint8)
    blocks = []
    for count, displ, datatype in zip(counts, displs, types):
        nbytes = int(count) * datatype.Get_size()
        if displ < 0 or displ + nbytes > raw.size:
            raise ValueError(f"{what}: {count} elements of {datatype.Get_name()} at byte {displ} do not fit in "
                             f"{raw.size} bytes")
        blocks.append(raw[int(displ):int(displ) + nbytes])
    return blocks
