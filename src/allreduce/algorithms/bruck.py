"""Bruck's all-gather and all-to-all: ``ceil(log2 n)`` steps whatever ``n`` is, for small blocks.

Vocabulary: in *step* ``k`` (*distance* ``d = 2^k``) every rank ``r`` sends to ``r - d`` and receives
from ``r + d`` (mod ``n``). Blocks are ``count`` elements; "block ``i``" is taken mod ``n``.

- All-gather: after step ``k`` rank ``r`` holds the blocks of ranks ``r .. r + 2^(k+1) - 1``, each
  already in its place in ``out``; in step ``k`` it sends its first ``min(d, n - d)`` of them and
  receives as many that follow them. A run of blocks that wraps past rank ``n - 1`` is sent as two
  messages.
- All-to-all: a rank's *position* ``j`` starts with the block it owes rank ``r - j`` (``data`` block
  ``r - j``) and every step moves the blocks of the positions with bit ``k`` set ``d`` ranks down,
  keeping their position. Each block thus travels ``j`` ranks in ``popcount(j)`` hops, and at the end
  position ``j`` holds the block that rank ``r + j`` owes ``r``: ``out`` block ``r + j``, which is
  where a position's block is kept between hops. The blocks of one step are scattered, so they are
  *packed* by copies into ``tmp`` (slots ``S``) to go as one message, received into ``tmp`` (slots
  ``V``), and *unpacked* into ``out`` by copies at the start of the next step. The last step's
  positions ``2^(L-1) .. n - 1`` are one run and are received straight into ``out``.

Cost (alpha per message, beta per byte; ``L = ceil(log2 n)``): all-gather of ``m`` bytes in all,
``L alpha + (n-1)/n m beta``; all-to-all of ``m`` bytes per rank (``n`` blocks), ``L alpha +
P/n m beta`` where ``P`` (about ``L n / 2``) counts the set bits of ``0 .. n-1``: each step sends
about half the buffer, against the pairwise exchange's ``(n - 1) alpha + (n-1)/n m beta``. Local
copies are not counted.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_ceil
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty


def _run(first: int, blocks: int, size: int) -> list[tuple[int, int]]:
    """Blocks ``first .. first + blocks - 1`` (mod ``size``) as one or two ``(start, length)`` runs."""
    first %= size
    head = min(blocks, size - first)
    return [(start, length) for start, length in ((first, head), (0, blocks - head)) if length]


def _blocks(buf: str, start: int, length: int, count: int) -> Region:
    return Region(buf, start * count, (start + length) * count)


@lru_cache(maxsize=1024)
def all_gather(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Bruck all-gather: ``out`` block ``i`` (``count`` elements) = rank ``i``'s ``data`` on every rank.

    Args:
        rank, size: this rank and the world size.
        count: elements per rank's block.
        root: ignored.

    Returns:
        This rank's :class:`Schedule`: ``ceil(log2 n)`` steps (one for a single rank); no scratch.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (3 ranks, count 1, rank 0): step 0 copies ``data[0]`` to ``out[0]``, sends it to rank 2
    and receives ``out[1]`` from rank 1; step 1 sends ``out[0]`` to rank 1 and receives ``out[2]``
    from rank 2.
    """
    check_call(rank, size, count, root)
    steps = []
    for k in range(log2_ceil(size)):
        d = 1 << k
        held = min(d, size - d)
        steps.append([Send((rank - d) % size, _blocks("out", *run, count)) for run in _run(rank, held, size)]
                     + [Recv((rank + d) % size, _blocks("out", *run, count)) for run in _run(rank + d, held, size)])
    steps = steps or [[]]
    steps[0].insert(0, Copy(Region("data", 0, count), _blocks("out", rank, 1, count)))
    return Schedule(without_empty(steps))


@lru_cache(maxsize=1024)
def all_to_all(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Bruck all-to-all: ``out`` block ``j`` on rank ``r`` becomes rank ``j``'s ``data`` block ``r``.

    Args:
        rank, size: this rank and the world size.
        count: elements per block (``data`` and ``out`` hold ``size * count``).
        root: ignored.

    Returns:
        This rank's :class:`Schedule`: ``ceil(log2 n)`` steps (one for a single rank), with
        ``tmp`` for the packed blocks.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, count 1, rank 0): copies ``data[0]`` to ``out[0]`` and ``data[1]`` to
    ``tmp[0]``, sends ``tmp[0]`` to rank 1 and receives rank 1's ``data[0]`` into ``out[1]``.
    """
    check_call(rank, size, count, root)
    rounds = log2_ceil(size)
    moving = [[j for j in range(size) if j >> k & 1] for k in range(rounds)]  # positions sent in step k
    packed = max(map(len, moving), default=0)
    received = max(map(len, moving[:-1]), default=0)

    def slots(first: int, length: int) -> Region:  # S slots from 0, V slots after them
        return _blocks("tmp", first, length, count)

    def kept(j: int, d: int) -> Region:  # where position j's block waits for step d: untouched, or moved
        at = ("data", rank - j) if j % d == 0 else ("out", rank + j)
        return _blocks(at[0], at[1] % size, 1, count)

    steps = []
    for k, js in enumerate(moving):
        d, ops = 1 << k, []
        if k:  # unpack what the previous step received
            ops += _merged([Copy(slots(packed + i, 1), _blocks("out", (rank + j) % size, 1, count))
                            for i, j in enumerate(moving[k - 1])])
        ops += _merged([Copy(kept(j, d), slots(i, 1)) for i, j in enumerate(js)])
        to, frm = (rank - d) % size, (rank + d) % size
        if k < rounds - 1:
            ops += [Send(to, slots(0, len(js))), Recv(frm, slots(packed, len(js)))]
        else:  # positions js[0] .. n - 1, straight into place, cut where the receiver's run wraps
            at = 0
            for _, length in _run(to + js[0], len(js), size):
                ops.append(Send(to, slots(at, length)))
                at += length
            ops += [Recv(frm, _blocks("out", *run, count)) for run in _run(rank + js[0], len(js), size)]
        steps.append(ops)
    steps = steps or [[]]
    steps[0].insert(0, Copy(_blocks("data", rank, 1, count), _blocks("out", rank, 1, count)))
    return Schedule(without_empty(steps), tmp=(packed + received) * count)


def _merged(copies: list[Copy]) -> list[Copy]:
    """``copies`` with each run that continues the previous one in both source and destination joined."""
    out: list[Copy] = []
    for c in copies:
        last = out[-1] if out else None
        if last and (last.src.buf, last.src.stop, last.dst.buf, last.dst.stop) == (
                c.src.buf, c.src.start, c.dst.buf, c.dst.start):
            out[-1] = Copy(Region(c.src.buf, last.src.start, c.src.stop),
                           Region(c.dst.buf, last.dst.start, c.dst.stop))
        else:
            out.append(c)
    return out


def _with_bit(n: int, k: int) -> int:
    """How many of ``0 .. n-1`` have bit ``k`` set."""
    period = 1 << (k + 1)
    return (n // period) * (period // 2) + max(0, n % period - period // 2)


def all_gather_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_gather` on ``n`` ranks, ``m`` bytes gathered in all."""
    return log2_ceil(n) * alpha + (n - 1) / n * m * beta


def all_to_all_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_to_all` on ``n`` ranks, ``m`` bytes in each rank's buffer."""
    rounds = log2_ceil(n)
    return rounds * alpha + sum(_with_bit(n, k) for k in range(rounds)) * m / n * beta
