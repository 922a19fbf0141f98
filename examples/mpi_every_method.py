"""Every method of allreduce.MPI on small exact inputs, summed up in one digest that real mpi4py must match.

    mpirun -n 3 python examples/mpi_every_method.py mpi4py        # real MPI
    allreduce run -n 3 -- python examples/mpi_every_method.py     # allreduce.MPI, no MPI installed
    mpirun -n 3 python examples/mpi_every_method.py               # allreduce.MPI under mpirun

Rank 0 prints one line per method (its name and a hash of every rank's results) and the digest of
them all. Inputs are small integers, so results are exact whatever order a reduction combines in;
sizes are uneven and some blocks empty, as real programs have them.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

if sys.argv[1:] == ["mpi4py"]:
    from mpi4py import MPI
else:
    from allreduce import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
results: dict[str, object] = {}


def record(name: str, value) -> None:
    results[name] = value.tolist() if isinstance(value, np.ndarray) else value


def ints(count: int, salt: int = 0, dtype=np.float64) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` small integers."""
    return ((np.arange(count) * 7 + rank * 3 + salt) % 11 - 3).astype(dtype)


# ---- identity ------------------------------------------------------------------------------------
record("Get_rank/Get_size", (rank, size, comm.rank, comm.size))
record("Get_processor_name", isinstance(MPI.Get_processor_name(), str))
record("Wtime", MPI.Wtime() <= MPI.Wtime())

# ---- buffer collectives --------------------------------------------------------------------------
for op_name in ("SUM", "PROD", "MIN", "MAX"):
    out = np.zeros(7)
    comm.Allreduce(ints(7), out, op=getattr(MPI, op_name))
    record(f"Allreduce {op_name}", out)
for op_name in ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"):
    out = np.zeros(7, np.int32)
    comm.Allreduce(ints(7, dtype=np.int32) % 3, [out, MPI.INT], op=getattr(MPI, op_name))
    record(f"Allreduce {op_name}", out)
inplace = ints(5)
comm.Allreduce(MPI.IN_PLACE, inplace, op=MPI.SUM)
record("Allreduce IN_PLACE", inplace)
out = np.zeros(4)
request = comm.Iallreduce(ints(4), out, op=MPI.MAX)
request.Wait()
record("Iallreduce", (out.tolist(), request.Test()))

out = np.zeros(6) if rank == size - 1 else None
comm.Reduce(ints(6), out, op=MPI.SUM, root=size - 1)
record("Reduce", out)
out = ints(6)
comm.Reduce(MPI.IN_PLACE if rank == 0 else ints(6), out, op=MPI.MIN, root=0)
record("Reduce IN_PLACE", out if rank == 0 else None)

buf = ints(9) if rank == 0 else np.zeros(9)
comm.Bcast([buf, MPI.DOUBLE], root=0)
record("Bcast", buf)
buf = ints(9, salt=2)
comm.Bcast([buf, (3, 2), MPI.DOUBLE], root=size - 1)  # 3 elements from the third
record("Bcast count/displ", buf)

out = np.zeros(3 * size) if rank == 0 else None
comm.Gather(ints(3), out, root=0)
record("Gather", out)
out = np.zeros(3 * size)
out[3 * rank:3 * rank + 3] = ints(3, salt=4)
comm.Gather(MPI.IN_PLACE if rank == 0 else ints(3, salt=4), out if rank == 0 else None, root=0)
record("Gather IN_PLACE", out if rank == 0 else None)
counts = [(r * 2) % 3 for r in range(size)]  # 0, 2, 1, 0, ...: empty blocks too
out = np.zeros(sum(counts), np.int64) if rank == 0 else None
comm.Gatherv(ints(counts[rank], dtype=np.int64), [out, counts, MPI.LONG] if rank == 0 else None, root=0)
record("Gatherv", out)

out = np.zeros(2)
comm.Scatter(np.arange(2 * size, dtype=np.float64) if rank == 0 else None, out, root=0)
record("Scatter", out)
counts = [r + 1 for r in range(size)]
out = np.zeros(rank + 1)
send = [np.arange(sum(counts), dtype=np.float64), (counts, None), MPI.DOUBLE] if rank == 0 else None
comm.Scatterv(send, out, root=0)
record("Scatterv", out)

out = np.zeros(2 * size)
comm.Allgather(ints(2), out)
record("Allgather", out)
out = np.zeros(2 * size)
out[2 * rank:2 * rank + 2] = ints(2, salt=1)
comm.Allgather(MPI.IN_PLACE, out)
record("Allgather IN_PLACE", out)
pair = MPI.DOUBLE.Create_contiguous(2).Commit()
out = np.zeros(4 * size)
comm.Allgather([ints(4, salt=5), 2, pair], [out, pair])
record("Allgather contiguous type", out)
pair.Free()
counts = [(r + 2) % 3 for r in range(size)]
out = np.zeros(sum(counts))
comm.Allgatherv(ints(counts[rank]), [out, counts])
record("Allgatherv", out)

out = np.zeros(2 * size)
comm.Alltoall(ints(2 * size), out)
record("Alltoall", out)
send_counts = [(rank + j) % 3 for j in range(size)]
recv_counts = [(j + rank) % 3 for j in range(size)]
out = np.zeros(sum(recv_counts))
comm.Alltoallv([ints(sum(send_counts)), send_counts], [out, recv_counts])
record("Alltoallv", out)
displs = [3 * j for j in range(size)]  # blocks with gaps between them
out = np.full(3 * size, -1.0)
comm.Alltoallv([ints(3 * size), (send_counts, displs), MPI.DOUBLE], [out, (recv_counts, displs), MPI.DOUBLE])
record("Alltoallv displs", out)

out = np.zeros(3)
comm.Reduce_scatter_block(ints(3 * size), out, op=MPI.SUM)
record("Reduce_scatter_block", out)
out = ints(3 * size, salt=6)
comm.Reduce_scatter_block(MPI.IN_PLACE, out, op=MPI.MIN)
record("Reduce_scatter_block IN_PLACE", out[:3])
counts = [r % 3 + 1 for r in range(size)]
out = np.zeros(counts[rank])
comm.Reduce_scatter(ints(sum(counts)), out, recvcounts=counts, op=MPI.MAX)
record("Reduce_scatter", out)

out = np.zeros(4)
comm.Scan(ints(4), out, op=MPI.SUM)
record("Scan", out)
out = np.zeros(6, np.int32)
comm.Scan(ints(6, dtype=np.int32) % 3, out, op=MPI.LAND)
record("Scan LAND", out)
out = np.zeros(4)
comm.Exscan(ints(4), out, op=MPI.PROD)
record("Exscan", out if rank > 0 else None)  # rank 0's result is undefined in MPI
comm.Barrier()
record("Barrier", True)

# ---- buffer point to point -----------------------------------------------------------------------
right, left = (rank + 1) % size, (rank - 1) % size
out = np.zeros(3)
comm.Sendrecv(ints(3), dest=right, sendtag=5, recvbuf=out, source=left, recvtag=5)
record("Sendrecv", out)
out = np.zeros(4, np.int32)
requests = [comm.Irecv([out, MPI.INT], source=left, tag=9), comm.Isend(ints(4, dtype=np.int32), dest=right, tag=9)]
MPI.Request.Waitall(requests)
record("Isend/Irecv/Waitall", out)
if rank == 0:
    for peer in range(1, size):
        comm.Send(ints(peer), dest=peer, tag=peer)
elif rank > 0:
    status = MPI.Status()
    comm.Probe(source=0, tag=MPI.ANY_TAG, status=status)
    out = np.zeros(status.Get_count(MPI.DOUBLE))
    comm.Recv(out, source=MPI.ANY_SOURCE, tag=rank, status=status)
    record("Send/Probe/Recv", (out.tolist(), status.Get_source(), status.Get_tag()))

# ---- object collectives --------------------------------------------------------------------------
record("allreduce SUM", comm.allreduce(rank + 1, op=MPI.SUM))
record("allreduce list SUM", comm.allreduce([rank], op=MPI.SUM))  # concatenation: order matters
record("allreduce MAXLOC", comm.allreduce((rank % 2, rank), op=MPI.MAXLOC))
record("allreduce LXOR", comm.allreduce(rank % 2, op=MPI.LXOR))
record("reduce", comm.reduce(rank * 2, op=MPI.MAX, root=size - 1))
record("bcast", comm.bcast({"from": rank, "data": list(range(rank + 3))}, root=size - 1))
record("gather", comm.gather(("r", rank), root=0))
record("scatter", comm.scatter([{"to": r} for r in range(size)] if rank == 0 else None, root=0))
record("allgather", comm.allgather("x" * rank))
record("alltoall", comm.alltoall([(rank, j) for j in range(size)]))
record("scan", comm.scan(rank + 1, op=MPI.PROD))
record("exscan", comm.exscan(rank + 1, op=MPI.SUM))
comm.barrier()

# ---- object point to point -----------------------------------------------------------------------
comm.send({"hello": rank}, dest=right, tag=rank)
status = MPI.Status()
got = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
record("send/recv ANY", (got, status.Get_source(), status.Get_tag()))
request = comm.irecv(source=left, tag=3)
comm.isend([rank] * 3, dest=right, tag=3).wait()
record("isend/irecv", request.wait())
record("sendrecv", comm.sendrecv(("sr", rank), dest=right, source=left))
if rank > 0:
    comm.send(rank * 10, dest=0, tag=1)
if rank == 0:
    record("recv ANY_SOURCE", sorted(comm.recv(source=MPI.ANY_SOURCE, tag=1) for _ in range(size - 1)))

# ---- new communicators ---------------------------------------------------------------------------
sub = comm.Split(color=rank % 2, key=-rank)  # reversed order inside each color
record("Split", (sub.Get_rank(), sub.Get_size(), sub.allgather(rank), sub.allreduce(rank)))
dup = sub.Dup()
out = np.zeros(2)
dup.Allreduce(ints(2), out)
record("Dup", (dup.rank, out.tolist()))
dup.Free()
sub.Free()
none = comm.Split(color=MPI.UNDEFINED if rank == 0 else 1, key=0)
record("Split UNDEFINED", none == MPI.COMM_NULL)
if none != MPI.COMM_NULL:
    none.Free()

# ---- the digest ----------------------------------------------------------------------------------
everyone = comm.gather(results, root=0)
if rank == 0:
    lines = []
    for name in dict.fromkeys(name for r in everyone for name in r):  # in order, from every rank
        hashed = hashlib.sha256(repr([r.get(name) for r in everyone]).encode()).hexdigest()[:16]
        lines.append(f"{name:24} {hashed}")
    print("\n".join(lines))
    print("digest", hashlib.sha256("\n".join(lines).encode()).hexdigest())
