"""allreduce.MPI's buffer methods against a numpy reference, on 1 to 4 forked ranks.

Each world size runs one matrix (dtype x count x op x method) in one group and returns what went
wrong. Counts include 0, 1 and primes, and the v-variants give ranks uneven (and empty) blocks.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from support.harness import run_ranks
from support.reference import make_input

COUNTS = (0, 1, 2, 7, 13)
DTYPES = ("float64", "int32")
FLOAT_OPS = ("SUM", "PROD", "MIN", "MAX")
INT_OPS = FLOAT_OPS + ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
          "BOR": np.bitwise_or, "BXOR": np.bitwise_xor, "LAND": np.logical_and, "LOR": np.logical_or,
          "LXOR": np.logical_xor}


def fold(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """MPI's result: ``op`` over the arrays in rank order; a single array passes through unchanged."""
    dtype = arrays[0].dtype
    return functools.reduce(lambda a, b: UFUNCS[op](a, b).astype(dtype), arrays).copy()


def uneven(count: int, size: int, salt: int) -> list[int]:
    """Per-rank block sizes around ``count``: some larger, some smaller, some empty."""
    return [(count * (r + 1) + salt) % (count + 3) for r in range(size)]


def displs(counts) -> list[int]:
    return [int(d) for d in np.concatenate(([0], np.cumsum(counts)[:-1]))] if len(counts) else []


class Checker:
    def __init__(self):
        self.wrong: list[str] = []

    def __call__(self, name: str, got, expected) -> None:
        if got is None and expected is None:
            return
        if got is None or expected is None or got.dtype != expected.dtype or not np.array_equal(got, expected):
            self.wrong.append(f"{name}: got {got}, expected {expected}")


def operands(op_name: str, dtype, count: int, size: int, salt: int) -> list[np.ndarray]:
    """Every rank's input; for the logical ops mostly 0, 1 and 2, so "nonzero" is neither always nor never."""
    ins = [make_input(dtype, count, r, salt=salt) for r in range(size)]
    return [x % 3 for x in ins] if op_name in ("LAND", "LOR", "LXOR") else ins


def reductions(comm, MPI, check, dtype, count, rank, size):
    ops = INT_OPS if np.dtype(dtype).kind == "i" else FLOAT_OPS
    for op_name in ops:
        op = getattr(MPI, op_name)
        ins = operands(op_name, dtype, count, size, 3)
        mine = ins[rank]
        name = f"{dtype} count={count} {op_name}"
        out = np.empty_like(mine)
        comm.Allreduce(mine, out, op=op)
        check(f"Allreduce {name}", out, fold(op_name, ins))
        out = mine.copy()
        comm.Allreduce(MPI.IN_PLACE, out, op=op)
        check(f"Allreduce IN_PLACE {name}", out, fold(op_name, ins))
        out = np.empty_like(mine)
        comm.Iallreduce(mine, out, op=op).Wait()
        check(f"Iallreduce {name}", out, fold(op_name, ins))
        root = size - 1
        out = np.zeros_like(mine) if rank == root else None
        comm.Reduce(mine, out, op=op, root=root)
        check(f"Reduce {name}", out, fold(op_name, ins) if rank == root else None)
        out = mine.copy()
        comm.Reduce(MPI.IN_PLACE if rank == 0 else mine, out, op=op, root=0)
        check(f"Reduce IN_PLACE {name}", out, fold(op_name, ins) if rank == 0 else mine)
        out = np.zeros_like(mine)
        comm.Scan(mine, out, op=op)
        check(f"Scan {name}", out, fold(op_name, ins[:rank + 1]))
        out = np.full_like(mine, 9)
        comm.Exscan(mine, out, op=op)
        check(f"Exscan {name}", out, fold(op_name, ins[:rank]) if rank else np.full_like(mine, 9))
        big = operands(op_name, dtype, count * size, size, 4)
        out = np.zeros(count, dtype)
        comm.Reduce_scatter_block(big[rank], out, op=op)
        check(f"Reduce_scatter_block {name}", out, fold(op_name, [b[rank * count:(rank + 1) * count] for b in big]))
        out = big[rank].copy()
        comm.Reduce_scatter_block(MPI.IN_PLACE, out, op=op)
        check(f"Reduce_scatter_block IN_PLACE {name}", out[:count],
              fold(op_name, [b[rank * count:(rank + 1) * count] for b in big]))
        counts = uneven(count, size, 1)
        parts = operands(op_name, dtype, sum(counts), size, 5)
        out = np.zeros(counts[rank], dtype)
        comm.Reduce_scatter(parts[rank], out, recvcounts=counts, op=op)
        start = displs(counts)[rank]
        check(f"Reduce_scatter {name}", out, fold(op_name, [p[start:start + counts[rank]] for p in parts]))


def movements(comm, MPI, check, dtype, count, rank, size):
    ins = [make_input(dtype, count, r, salt=6) for r in range(size)]
    mine, name = ins[rank], f"{dtype} count={count}"
    root = size // 2
    buf = mine.copy()
    comm.Bcast(buf, root=root)
    check(f"Bcast {name}", buf, ins[root])
    out = np.zeros(count * size, dtype) if rank == root else None
    comm.Gather(mine, out, root=root)
    check(f"Gather {name}", out, np.concatenate(ins) if rank == root else None)
    out = np.zeros(count * size, dtype)
    out[count * rank:count * (rank + 1)] = mine
    comm.Gather(MPI.IN_PLACE if rank == root else mine, out, root=root)
    check(f"Gather IN_PLACE {name}", out if rank == root else None, np.concatenate(ins) if rank == root else None)
    out = np.zeros(count * size, dtype)
    comm.Allgather(mine, out)
    check(f"Allgather {name}", out, np.concatenate(ins))
    out[:] = 0
    out[count * rank:count * (rank + 1)] = mine
    comm.Allgather(MPI.IN_PLACE, out)
    check(f"Allgather IN_PLACE {name}", out, np.concatenate(ins))
    whole = np.concatenate(ins)
    out = np.zeros(count, dtype)
    comm.Scatter(whole if rank == root else None, out, root=root)
    check(f"Scatter {name}", out, whole[count * rank:count * (rank + 1)])
    out = whole[count * rank:count * (rank + 1)].copy()
    comm.Scatter(whole if rank == root else None, MPI.IN_PLACE if rank == root else out, root=root)
    check(f"Scatter IN_PLACE {name}", out, whole[count * rank:count * (rank + 1)])
    blocks = [make_input(dtype, count * size, r, salt=7) for r in range(size)]
    out = np.zeros(count * size, dtype)
    comm.Alltoall(blocks[rank], out)
    check(f"Alltoall {name}", out, np.concatenate([b[count * rank:count * (rank + 1)] for b in blocks]))
    out = blocks[rank].copy()
    comm.Alltoall(MPI.IN_PLACE, out)
    check(f"Alltoall IN_PLACE {name}", out, np.concatenate([b[count * rank:count * (rank + 1)] for b in blocks]))

    counts = uneven(count, size, 2)
    pieces = [make_input(dtype, c, r, salt=8) for r, c in enumerate(counts)]
    out = np.zeros(sum(counts), dtype) if rank == root else None
    comm.Gatherv(pieces[rank], [out, counts] if rank == root else None, root=root)
    check(f"Gatherv {name}", out, np.concatenate(pieces) if rank == root else None)
    out = np.zeros(sum(counts), dtype)
    comm.Allgatherv(pieces[rank], [out, counts])
    check(f"Allgatherv {name}", out, np.concatenate(pieces))
    out = np.zeros(counts[rank], dtype)
    comm.Scatterv([np.concatenate(pieces), counts] if rank == root else None, out, root=root)
    check(f"Scatterv {name}", out, pieces[rank])
    sends = [[(count + r + j) % 4 for j in range(size)] for r in range(size)]  # sends[r][j]: from r to j
    data = [make_input(dtype, sum(s), r, salt=9) for r, s in enumerate(sends)]
    recv_counts = [sends[j][rank] for j in range(size)]
    out = np.zeros(sum(recv_counts), dtype)
    comm.Alltoallv([data[rank], sends[rank]], [out, recv_counts])
    expected = [data[j][displs(sends[j])[rank]:][:sends[j][rank]] for j in range(size)]
    check(f"Alltoallv {name}", out, np.concatenate(expected))

    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.zeros(count, dtype)
    comm.Sendrecv(mine, dest=right, sendtag=count, recvbuf=out, source=left, recvtag=count)
    check(f"Sendrecv {name}", out, ins[left])
    out = np.zeros(count, dtype)
    requests = [comm.Irecv(out, source=left, tag=1), comm.Isend(mine, dest=right, tag=1)]
    MPI.Request.Waitall(requests)
    check(f"Isend/Irecv {name}", out, ins[left])
    comm.Send([mine, MPI.BYTE], dest=right, tag=2)
    out = np.zeros(count, dtype)
    status = MPI.Status()
    comm.Recv([out, MPI.BYTE], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    check(f"Send/Recv {name}", out, ins[left])
    if (status.Get_source(), status.Get_tag(), status.Get_count()) != (left, 2, mine.nbytes):
        check.wrong.append(f"Recv status {name}: {status.Get_source(), status.Get_tag(), status.Get_count()}")


def buffer_matrix(rank, size):
    from allreduce import MPI

    comm, check = MPI.COMM_WORLD, Checker()
    for dtype in DTYPES:
        for count in COUNTS:
            reductions(comm, MPI, check, dtype, count, rank, size)
            movements(comm, MPI, check, dtype, count, rank, size)
    return check.wrong


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_buffer_method_matches_numpy(size):
    assert run_ranks(buffer_matrix, size, deadline=240) == [[]] * size


def buffer_specs(rank, size):
    """mpi4py's buffer argument forms: datatypes that reinterpret, counts, displacements, contiguous types."""
    from allreduce import MPI

    comm, check = MPI.COMM_WORLD, Checker()
    x = np.arange(6, dtype=np.float64) + rank
    out = np.zeros(6)
    comm.Allreduce([x, MPI.DOUBLE], [out, 6, MPI.DOUBLE])
    check("[data, count, type]", out, sum(np.arange(6.0) + r for r in range(size)))
    out = np.zeros(6)
    comm.Allreduce([x, (2, 3), MPI.DOUBLE], [out, (2, 1), MPI.DOUBLE])  # 2 elements from the 4th, into the 2nd
    expected = np.zeros(6)
    expected[1:3] = sum(np.arange(6.0)[3:5] + r for r in range(size))
    check("[data, (count, displ), type]", out, expected)
    raw = np.zeros(4, np.uint8)
    raw[:] = rank + 1
    out = np.zeros(1, np.int32)
    comm.Allreduce([raw, MPI.INT], out)  # four bytes read as one int, as MPI does
    check("bytes as MPI.INT", out, np.array([sum(int.from_bytes(bytes([r + 1] * 4), "little") for r in range(size))],
                                            np.int32))
    pair = MPI.INT.Create_contiguous(2).Commit()
    out = np.zeros(2 * size, np.int32)
    comm.Allgather([np.array([rank, -rank], np.int32), 1, pair], [out, pair])
    check("contiguous type", out, np.array([v for r in range(size) for v in (r, -r)], np.int32))
    out = np.full(3 * size, -1, np.int32)
    counts, gaps = [1] * size, [3 * r + 1 for r in range(size)]
    comm.Allgatherv(np.array([rank], np.int32), [out, (counts, gaps), MPI.INT])
    check("[data, (counts, displs), type]", out, np.array([v for r in range(size) for v in (-1, r, -1)], np.int32))
    return check.wrong


@pytest.mark.parametrize("size", [1, 3])
def test_buffer_argument_forms(size):
    assert run_ranks(buffer_specs, size) == [[]] * size
