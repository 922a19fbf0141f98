"""Each collective's buffer arguments parsed once into a :class:`Message`, as mpi4py's ``_p_msg_cco``
does: the root checked, ``MPI.IN_PLACE`` (or ``None`` as the send buffer) resolved and the blocks cut,
so that a ``Comm`` method only starts the library's collective on what it is handed.

``MPI.IN_PLACE`` means what MPI says for each call: at the root of a gather its block of the
receive buffer already holds its input, at the root of a scatter it keeps its block where it is, in
an all-gather and an all-to-all the receive buffer holds the input, in a reduction the receive
buffer holds this rank's input (at the root, or the whole input of a reduce-scatter).

Each parser raises as the method did before anything moves: ``MPI.Exception(ERR_ROOT)`` for a root
out of range, ``ValueError``/``TypeError``/``BufferError`` for a buffer that does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import array_of
from .bufferargs import absolute, blocked, simple, vector, written
from .constants import BOTTOM, IN_PLACE
from .errorcodes import ERR_ROOT, error


@dataclass(slots=True)
class Message:
    """A collective's parsed buffers on this rank: ``send`` its input, ``recv`` where its result lands
    (``None``: nothing here), ``send_blocks``/``recv_blocks`` the input's (scatter, all-to-all) and the
    result's (gather, ``Alltoallw``) block per rank, ``counts``/``displs`` the result's blocks in a
    vector form, in basic elements."""

    root: int = 0
    send: np.ndarray | None = None
    recv: np.ndarray | None = None
    send_blocks: list[np.ndarray] | None = None
    recv_blocks: list[np.ndarray] | None = None
    counts: list[int] | None = None
    displs: list[int] | None = None

    def written(self) -> None:
        """Write the result back into the user's memory where a derived datatype packed it."""
        written(self.recv)


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


def matched(send: np.ndarray, recv: np.ndarray, same_count: bool) -> None:
    """Refuse, as mpi4py does before anything moves, a send and a receive buffer of different
    datatypes (and, where ``same_count``, of different counts).

    Raises:
        ValueError: naming both.
    """
    if send.dtype != recv.dtype:
        raise ValueError(f"mismatch in send and receive datatypes: {send.dtype} and {recv.dtype}")
    if same_count and send.size != recv.size:
        raise ValueError(f"mismatch in send count {send.size} and receive count {recv.size}")


# ---- data-moving collectives ---------------------------------------------------------------------

def bcast(buf, root, rank: int, size: int) -> Message:
    """The root only reads its buffer (bytes, say); what moves is then a copy."""
    root = check_root(root, size)
    target = simple(buf, "buf", rank != root)
    return Message(root, recv=target if target.flags.writeable else target.copy())


def gather(sendbuf, recvbuf, root, rank: int, size: int) -> Message:
    root = check_root(root, size)
    if rank != root:
        return Message(root, send=simple(sendbuf, "sendbuf", False))
    whole = blocked(recvbuf, size, "recvbuf", True)
    blocks = split(whole, size)
    send = blocks[rank].copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
    return Message(root, send, whole, recv_blocks=blocks)


def scatter(sendbuf, recvbuf, root, rank: int, size: int) -> Message:
    root = check_root(root, size)
    if rank != root:
        return Message(root, recv=simple(recvbuf, "recvbuf", True))
    blocks = split(blocked(sendbuf, size, "sendbuf", False), size)
    recv = blocks[rank].copy() if in_place(recvbuf) else simple(recvbuf, "recvbuf", True)
    return Message(root, recv=recv, send_blocks=blocks)


def allgather(sendbuf, recvbuf, rank: int, size: int) -> Message:
    recv = blocked(recvbuf, size, "recvbuf", True)
    send = split(recv, size)[rank].copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
    return Message(send=send, recv=recv)


def alltoall(sendbuf, recvbuf, size: int) -> Message:
    recv = blocked(recvbuf, size, "recvbuf", True)
    send = recv.copy() if in_place(sendbuf) else blocked(sendbuf, size, "sendbuf", False)
    return Message(send=send, recv=recv)


def gatherv(sendbuf, recvbuf, root, rank: int, size: int) -> Message:
    """Also all-gather's (``root`` its rank): ``recv`` with the result's counts and displs."""
    root = check_root(root, size)
    if rank != root:
        return Message(root, send=simple(sendbuf, "sendbuf", False))
    recv, counts, displs = vector(recvbuf, size, "recvbuf", True)
    own = recv[displs[rank]:displs[rank] + counts[rank]]
    send = own.copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
    return Message(root, send, recv, counts=counts, displs=displs)


def scatterv(sendbuf, recvbuf, root, rank: int, size: int) -> Message:
    root = check_root(root, size)
    blocks, recv = None, None
    if rank == root:
        send, counts, displs = vector(sendbuf, size, "sendbuf", False)
        blocks = [send[d:d + c] for c, d in zip(counts, displs)]
    if not (in_place(recvbuf) and rank == root):
        recv = simple(recvbuf, "recvbuf", True)
    return Message(root, recv=recv, send_blocks=blocks)


def alltoallv(sendbuf, recvbuf, size: int) -> Message:
    recv, recv_counts, recv_displs = vector(recvbuf, size, "recvbuf", True)
    if in_place(sendbuf):
        send, send_counts, send_displs = recv.copy(), recv_counts, recv_displs
    else:
        send, send_counts, send_displs = vector(sendbuf, size, "sendbuf", False)
    blocks = [send[d:d + c] for c, d in zip(send_counts, send_displs)]
    return Message(recv=recv, send_blocks=blocks, counts=recv_counts, displs=recv_displs)


def alltoallw(sendbuf, recvbuf, size: int) -> Message:
    """Blocks of a datatype each: ``[data, (counts, displs), types]``, displacements in bytes, as MPI's
    ``Alltoallw`` takes them (``[data, types]``: one element of each type per rank, all at the start of
    ``data``)."""
    recv_blocks = _typed_blocks(recvbuf, size, "recvbuf", True)
    if in_place(sendbuf):
        return Message(send_blocks=[b.copy() for b in recv_blocks], recv_blocks=recv_blocks)
    return Message(send_blocks=_typed_blocks(sendbuf, size, "sendbuf", False), recv_blocks=recv_blocks)


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


# ---- reductions ----------------------------------------------------------------------------------

def allreduce(sendbuf, recvbuf) -> Message:
    recv = simple(recvbuf, "recvbuf", True)
    return Message(send=recv if in_place(sendbuf) else simple(sendbuf, "sendbuf", False), recv=recv)


def reduce(sendbuf, recvbuf, root, rank: int, size: int) -> Message:
    root = check_root(root, size)
    recv = simple(recvbuf, "recvbuf", True) if rank == root else None
    if in_place(sendbuf) and recv is None:
        raise ValueError("MPI.IN_PLACE is only valid at the root of a Reduce")
    return Message(root, recv if in_place(sendbuf) else simple(sendbuf, "sendbuf", False), recv)


def reduce_scatter_block(sendbuf, recvbuf, size: int) -> Message:
    """In place, ``recvbuf`` holds every block and block r of the result lands at its start."""
    if in_place(sendbuf):
        whole = blocked(recvbuf, size, "recvbuf", True)
        send, recv = whole.copy(), split(whole, size)[0]
    else:
        recv = simple(recvbuf, "recvbuf", True)
        send = blocked(sendbuf, size, "sendbuf", False)
        matched(send, recv, same_count=False)
    if send.size != recv.size * size:
        raise ValueError(f"sendbuf has {send.size} elements; {size} blocks of recvbuf's {recv.size} need "
                         f"{recv.size * size}")
    return Message(send=send, recv=recv)


def reduce_scatter(sendbuf, recvbuf) -> Message:
    """In place, ``recvbuf`` holds the whole input."""
    recv = simple(recvbuf, "recvbuf", True)
    send = recv.copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
    matched(send, recv, same_count=False)
    return Message(send=send, recv=recv)


def scan(sendbuf, recvbuf) -> Message:
    """Also exscan's."""
    recv = simple(recvbuf, "recvbuf", True)
    send = recv.copy() if in_place(sendbuf) else simple(sendbuf, "sendbuf", False)
    matched(send, recv, same_count=True)
    return Message(send=send, recv=recv)
