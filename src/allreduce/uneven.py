"""Collectives whose ranks contribute blocks of different sizes, composed from the even ones.

Every block travels as bytes in a slot of one common size, the *stride*: an 8-byte length, then the
block, then padding. One small all-reduce finds the largest block first, and checks that every rank
moves one dtype (bytes would be read as another without a word); the even
collective (all-gather, gather, scatter, all-to-all, broadcast) then moves the slots, and each
receiver reads every block's true length from its slot. So a receiver needs to know no size in
advance (object collectives), and one that does (MPI's v-variants, torch's split all-to-all) checks
what arrived against it.

The price is the padding: up to ``size x largest`` bytes move where an exact schedule would move
the sum of the blocks, plus one small all-reduce. Uneven calls are rare enough in the programs this
serves that reusing the verified even schedules is worth it.
"""

from __future__ import annotations

import math

import numpy as np

from .buffers import flat
from .dtypes import code_of, dtype_of
from .errors import Mismatch
from .ops import ReduceOp
from .runtime import Request
from .work import Work

HEADER = 8  # bytes of each slot that hold the block's length
BYTE = np.dtype(np.uint8)


NO_DTYPE = 1 << 62  # what a rank that moves no typed data contributes to the dtype check


def largest(g, nbytes: int, what: str, *dtypes: np.dtype | None) -> int:
    """The largest ``nbytes`` any rank of ``g`` passed, in one all-reduce (MAX) that also carries the
    highest and lowest code of the ``dtypes`` (``None``: none) this rank sends and receives.

    Raises:
        Mismatch: on every rank, when the ranks' dtypes differ, naming two of them.
    """
    codes = [code_of(d) for d in dtypes if d is not None]
    value = np.array([nbytes, max(codes, default=0), -min(codes, default=NO_DTYPE)], np.int64)
    g.collective(Request("all_reduce", {"data": value}, 3, value.dtype, ReduceOp.MAX))
    high, low = int(value[1]), -int(value[2])
    if high and high != low:
        raise Mismatch(f"{what}: the ranks disagree on the dtype ({dtype_of(low)} and {dtype_of(high)}); "
                       "uneven blocks travel as bytes, which would be read as another dtype")
    return int(value[0])


def all_gather(g, block: np.ndarray, deliver, into: np.dtype | None = None) -> None:
    """Every rank's ``block``; ``deliver(blocks)`` receives them (uint8, in rank order) on every rank,
    to be read as ``into`` (``None``: as the blocks' dtype)."""
    stride = _stride(largest(g, block.nbytes, "all_gather", block.dtype, into))
    out = np.empty(g.size * stride, BYTE)
    g.collective(Request("all_gather", {"data": _pack([block], stride), "out": out}, stride, BYTE,
                         after=lambda: deliver(_unpack(out, stride))))


def gather(g, block: np.ndarray, root: int, deliver, into: np.dtype | None = None) -> None:
    """Every rank's ``block`` to ``root``, whose ``deliver(blocks)`` receives them in rank order (to be
    read as ``into``)."""
    stride = _stride(largest(g, block.nbytes, "gather", block.dtype, into))
    buffers, after = {"data": _pack([block], stride)}, None
    if g.rank == root:
        out = buffers["out"] = np.empty(g.size * stride, BYTE)

        def after():
            deliver(_unpack(out, stride))
    g.collective(Request("gather", buffers, stride, BYTE, ReduceOp.SUM, root, after=after))


def scatter(g, blocks: list[np.ndarray] | None, root: int, into: np.dtype | None = None) -> np.ndarray:
    """Block r of ``root``'s ``blocks`` (ignored elsewhere), returned as bytes on rank r (to be read as
    ``into``)."""
    mine = g.rank == root
    sent = [b.dtype for b in blocks] if mine else []
    stride = _stride(largest(g, max((b.nbytes for b in blocks), default=0) if mine else 0, "scatter", *sent, into))
    out = np.empty(stride, BYTE)
    buffers = {"out": out, "data": _pack(blocks, stride)} if mine else {"out": out}
    g.collective(Request("scatter", buffers, stride, BYTE, ReduceOp.SUM, root))
    return _unpack(out, stride)[0]


def broadcast(g, block: np.ndarray | None, root: int, into: np.dtype | None = None) -> np.ndarray:
    """``root``'s ``block`` (ignored elsewhere), returned as bytes on every rank (to be read as ``into``)."""
    mine = g.rank == root
    stride = _stride(largest(g, block.nbytes if mine else 0, "broadcast", block.dtype if mine else None, into))
    data = _pack([block], stride) if mine else np.empty(stride, BYTE)
    g.collective(Request("broadcast", {"data": data}, stride, BYTE, ReduceOp.SUM, root))
    return _unpack(data, stride)[0]


def all_to_all(g, blocks: list[np.ndarray], deliver, async_op: bool = False, algorithm: str | None = None,
               into: np.dtype | None = None):
    """Block j of every rank to rank j; ``deliver(blocks)`` receives what each rank sent here (to be read
    as ``into``)."""
    stride = _stride(largest(g, max((b.nbytes for b in blocks), default=0), "all_to_all",
                             *(b.dtype for b in blocks), into))
    out = np.empty(g.size * stride, BYTE)
    return g.collective(Request("all_to_all", {"data": _pack(blocks, stride), "out": out}, stride, BYTE,
                                algorithm=algorithm, after=lambda: deliver(_unpack(out, stride))), async_op)


def place(received: list[np.ndarray], out: np.ndarray, counts, displs, who: str) -> None:
    """Copy block r of ``received`` (bytes) to ``out[displs[r]:][:counts[r]]``, checking its length.

    Raises:
        ValueError: a block's length is not what ``counts`` says, naming the rank that sent it.
    """
    for r, (block, count, start) in enumerate(zip(received, counts, displs)):
        if block.nbytes != count * out.itemsize:
            raise ValueError(f"rank {r} sent {block.nbytes // out.itemsize} elements of {out.dtype}; "
                             f"{who} expects {count}")
        out[start:start + count] = block.view(out.dtype)


def all_to_all_single(g, output: np.ndarray, input: np.ndarray, output_split_sizes, input_split_sizes,
                      async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """torch's ``all_to_all_single`` with splits: rows of dim 0 per rank (``None``: equal rows), between
    arrays of one dtype.

    Raises:
        ValueError: splits that do not sum to dim 0, or that disagree with what the peers send.
    """
    send_counts, send_displs = _rows(input, input_split_sizes, g.size, "input_split_sizes")
    recv_counts, recv_displs = _rows(output, output_split_sizes, g.size, "output_split_sizes")
    source, dest = flat(input), flat(output)
    blocks = [source[start:start + count] for count, start in zip(send_counts, send_displs)]
    return all_to_all(g, blocks, lambda got: place(got, dest, recv_counts, recv_displs, "output_split_sizes"),
                      async_op, algorithm, dest.dtype)


def displacements(counts) -> list[int]:
    """Where each block starts when the blocks lie back to back."""
    return [0, *np.cumsum(counts[:-1], dtype=np.int64).tolist()] if len(counts) else []


def _rows(arr: np.ndarray, splits, size: int, name: str) -> tuple[list[int], list[int]]:
    """Element counts and offsets of each rank's block of ``arr``, from rows of dim 0."""
    if arr.ndim == 0:
        raise ValueError(f"a tensor split by {name} needs at least one dimension")
    rows = arr.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(f"{name} is None, so dim 0 ({rows}) must divide by the world size {size}")
        splits = [rows // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size or min(splits, default=0) < 0 or sum(splits) != rows:
        raise ValueError(f"{name} must be {size} non-negative row counts summing to dim 0 ({rows}), got {splits}")
    per_row = math.prod(arr.shape[1:])
    counts = [s * per_row for s in splits]
    return counts, displacements(counts)


def _stride(nbytes: int) -> int:
    """The slot size for blocks of up to ``nbytes``: header plus block, rounded up to 8 bytes."""
    return HEADER + -(-nbytes // HEADER) * HEADER


def _pack(blocks: list[np.ndarray], stride: int) -> np.ndarray:
    packed = np.zeros(len(blocks) * stride, BYTE)
    for i, block in enumerate(blocks):
        raw = flat(block).view(np.uint8)
        start = i * stride
        packed[start:start + HEADER].view(np.int64)[0] = raw.size
        packed[start + HEADER:start + HEADER + raw.size] = raw
    return packed


def _unpack(packed: np.ndarray, stride: int) -> list[np.ndarray]:
    blocks = []
    for start in range(0, packed.size, stride):
        length = int(packed[start:start + HEADER].view(np.int64)[0])
        blocks.append(packed[start + HEADER:start + HEADER + length])
    return blocks
