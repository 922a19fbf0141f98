"""mpi4py.util.pkl5's way of sending an object, written out on allreduce.MPI between 1 to 3 forked
ranks: a header of 64-bit counts, the pickle stream and its out-of-band buffer as messages of their
own on the communicator's private duplicate, received by a probe of the header and matched probes
of the rest; a root's read-only buffer broadcast; object collectives of ``None``."""

from __future__ import annotations

import struct

import numpy as np
import pytest


def pickled_messages_between_ranks(rank, size):
    """What rank ``rank`` received, as lists, for the test to compare with what was sent."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    dup, tag = MPI._commctx_intra(comm)
    sender = MPI.Pickle(threshold=0)
    right, left = (rank + 1) % size, (rank - 1) % size
    data, bufs = sender.dumps_oob({"from": rank, "array": np.arange(7 * (rank + 1), dtype=np.int64) * rank})
    header = struct.pack(f"{1 + len(bufs)}q", len(data), *(len(b) for b in bufs))
    counts = MPI.Datatype.fromcode("q")
    with MPI._comm_lock(dup, "send"):
        sends = [dup.Isend((header, counts), right, tag), dup.Isend((data, len(data), MPI.BYTE), right, tag)]
        sends += [dup.Isend((buf, len(buf), MPI.BYTE), right, tag) for buf in bufs]
    status = MPI.Status()
    dup.Probe(left, tag, status)
    got_header = bytearray(status.Get_elements(counts) * 8)
    dup.Recv((got_header, counts), left, tag)
    lengths = struct.unpack(f"{len(got_header) // 8}q", got_header)
    memory = [MPI.buffer.allocate(n) for n in lengths]
    messages = [dup.Mprobe(left, tag) for _ in lengths]
    MPI.Request.Waitall([m.Irecv((mem, len(mem), MPI.BYTE)) for m, mem in zip(messages, memory)] + sends)
    got = sender.loads_oob(memory[0], memory[1:])
    root_bytes = bytes(range(5)) if rank == 0 else bytearray(5)
    comm.Bcast((root_bytes, 5, MPI.BYTE), root=0)
    return {"got": [got["from"], got["array"].tolist()], "bcast": list(root_bytes),
            "tags": [tag, MPI._commctx_intra(comm)[1]],
            "none": [comm.scatter(None, root=size - 1), comm.alltoall(None)]}


@pytest.mark.parametrize("size", [1, 2, 3])
def test_pickled_messages_between_ranks_arrive_whole(size):
    from support.harness import run_ranks

    for rank, got in enumerate(run_ranks(pickled_messages_between_ranks, size)):
        left = (rank - 1) % size
        assert got["got"] == [left, (np.arange(7 * (left + 1), dtype=np.int64) * left).tolist()]
        assert got["bcast"] == [0, 1, 2, 3, 4] and got["tags"] == [0, 1]
        assert got["none"] == [None, [None] * size]
