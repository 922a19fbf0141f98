"""Recursive-halving reduce-scatter: ``log2 p`` rounds, each halving what a rank still works on.

Vocabulary (shared with ``fold.py``): a world of ``n`` ranks is *folded* onto ``p``, the largest power
of two ``<= n``: in the *fold step* each odd rank among the first ``2 (n - p)`` hands its whole input
to its even neighbour, which reduces it with its own into ``tmp``; the ``p`` *survivors* (virtual
ranks ``v``) run the *rounds*; in the *unfold step* the even neighbour hands the odd one its block.
Virtual rank ``v`` speaks for the caller's *blocks* of the real ranks it stands for (two blocks for
a folded pair, one otherwise), so a window of virtual ranks is a contiguous run of blocks.

In round ``k`` survivor ``v`` pairs with ``v ^ (p / 2^(k+1))`` (largest distance first): of the
*window* both still work on, it keeps the half that holds its own blocks, sends the other half, and
reduces the partner's copy of its half with its own into ``tmp``. After the last round the window is
its own blocks, the last receive lands in ``out``, and ``data`` is never written.

Cost (``m`` bytes of input on each rank, ``n`` blocks; alpha per message, beta per byte, gamma per
byte reduced; ``L = log2 p``): ``L alpha + (p-1)/p m (beta + gamma)`` when ``n`` is a power of two.
Otherwise the fold adds ``2 alpha + (1 + 1/n) m beta + m gamma``, and the rounds move a little more
than ``(p-1)/p m`` because the folded pairs' windows are two blocks wide. Ring's volume in
``log2 p`` rounds instead of ``n - 1``.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_floor
from .fold import fold, folded_partner, framed, halving, real, sitting_out, virtual
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty


@lru_cache(maxsize=1024)
def reduce_scatter(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Recursive-halving reduce-scatter: ``out`` on rank ``r`` = reduction of every rank's ``data`` block ``r``.

    Args:
        rank, size: this rank and the world size.
        count: elements per rank's output block (``data`` holds ``size * count``).
        root: ignored.

    Returns:
        This rank's :class:`Schedule`; with more than one round or a folding partner it uses
        ``size * count`` elements of ``tmp``, laid out like ``data``.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, count 1): rank 0 sends ``data[1]`` to rank 1 and receives rank 1's
    ``data[0]``, reducing it with its own ``data[0]`` into ``out[0]``.
    """
    check_call(rank, size, count, root)
    whole, own = Region("data", 0, size * count), Region("out", 0, count)
    if size == 1:
        return Schedule(without_empty([[Copy(whole, own)]]))
    p, _ = fold(size)
    v, partner = virtual(rank, size), folded_partner(rank, size)
    if v is None:
        return sitting_out(partner, whole, own, log2_floor(p))

    def blocks(buf: str, window: tuple[int, int]) -> Region:
        return Region(buf, real(window[0], size) * count, real(window[1], size) * count)

    rounds = halving(v, p, largest_first=True)
    acc, steps = "data" if partner is None else "tmp", []
    for i, (peer, keep, give) in enumerate(rounds):
        into = own if i == len(rounds) - 1 and partner is None else blocks("tmp", keep)
        peer = real(peer, size)
        steps.append([Send(peer, blocks(acc, give)), Recv(peer, into, reduce=blocks(acc, keep))])
        acc = "tmp"

    def block(i: int) -> Region:
        return Region("tmp", i * count, (i + 1) * count)

    steps = framed(rank, size, steps, lambda q: [Recv(q, Region("tmp", 0, size * count), reduce=whole)],
                   lambda q: [Copy(block(rank), own), Send(q, block(q))])
    return Schedule(without_empty(steps), tmp=size * count if len(rounds) > 1 or partner is not None else 0)


def reduce_scatter_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`reduce_scatter` on ``n`` ranks, ``m`` bytes of input on each.

    Prices each round at its busiest rank: a window half of ``w`` virtual ranks spans up to
    ``w + min(w, n - p)`` blocks.
    """
    p, rem = fold(n)
    block = m / n
    halves = [p >> (k + 1) for k in range(log2_floor(p))]
    rounds = sum(alpha + (w + min(w, rem)) * block * (beta + gamma) for w in halves)
    folding = 2 * alpha + (m + block) * beta + m * gamma if rem else 0.0
    return rounds + folding
