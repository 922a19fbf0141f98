"""Recursive-doubling all-reduce: ``log2 p`` rounds of whole-tensor exchange, for small tensors.

Vocabulary (shared with ``fold.py``): a world of ``n`` ranks is *folded* onto ``p``, the largest power
of two ``<= n``: in the *fold step* each odd rank among the first ``2 (n - p)`` hands its tensor to
its even neighbour, which reduces it in; the ``p`` *survivors* (virtual ranks ``v``) then run the
*rounds*; in the *unfold step* the even neighbour hands the result back. In round ``k`` survivor
``v`` sends its whole running sum to ``v ^ 2^k`` and reduces the partner's into it, so after round
``k`` it holds the sum over the ``2^(k+1)`` virtual ranks that agree with it above bit ``k``.

A rank cannot receive into the buffer it is sending in the same step, so the running sum alternates
between ``data`` and ``tmp``, arranged so that the last round lands in ``data`` (when the number of
rounds is odd, round 0 sends a copy in ``tmp``).

Same bits everywhere: both partners of a round combine the same two operands, in opposite order
(each computes ``mine (op) theirs``). Every reduce op is commutative, and element-wise numpy
additions, products and bit operations are commutative bit for bit, so every rank ends with the same
bits. The one exception is MIN/MAX on floats when the operands are ``+0.0`` and ``-0.0`` (or two
NaNs with different payloads): each side keeps its own, so ranks may differ in the sign of a zero.

Cost (``m`` bytes, alpha per message, beta per byte, gamma per byte reduced, ``L = floor(log2 n)``):
``L (alpha + m beta + m gamma)``, plus ``2 alpha + 2 m beta + m gamma`` for the fold when ``n`` is
not a power of two. The fewest rounds of any all-reduce, but every round carries the whole tensor.
"""

from __future__ import annotations

from functools import lru_cache

from .cost import log2_floor
from .fold import fold, folded_partner, framed, real, sitting_out, virtual
from .schedule import Copy, Recv, Region, Schedule, Send, check_call, without_empty


@lru_cache(maxsize=1024)
def all_reduce(rank: int, size: int, count: int, *, root: int = 0) -> Schedule:
    """Recursive-doubling all-reduce of ``count`` elements in place in ``data``.

    ``floor(log2 n)`` steps when ``n`` is a power of two, two more otherwise.

    Args:
        rank, size: this rank and the world size.
        count: elements in the tensor.
        root: ignored (all-reduce has none).

    Returns:
        This rank's :class:`Schedule`; survivors use ``count`` elements of ``tmp``.

    Raises:
        ValueError: for a rank, root or count out of range.

    Example (2 ranks, 4 elements): in the one step rank 0 copies ``data`` to ``tmp``, sends
    ``tmp`` to rank 1 and receives rank 1's tensor, reducing ``data = tmp (op) incoming``.
    """
    check_call(rank, size, count, root)
    rounds = log2_floor(size)
    whole = Region("data", 0, count)
    v = virtual(rank, size)
    if v is None:
        return sitting_out(folded_partner(rank, size), whole, whole, rounds)
    steps, held = [], whole
    for k in range(rounds):
        into = Region("data" if (rounds - 1 - k) % 2 == 0 else "tmp", 0, count)
        ops = []
        if into == held:
            held = Region("tmp", 0, count)
            ops.append(Copy(whole, held))
        peer = real(v ^ (1 << k), size)
        steps.append(ops + [Send(peer, held), Recv(peer, into, reduce=held)])
        held = into
    steps = framed(rank, size, steps, lambda q: [Recv(q, whole, reduce=whole)], lambda q: [Send(q, whole)])
    return Schedule(without_empty(steps), tmp=count if rounds else 0)


def all_reduce_cost(n: int, m: float, alpha: float, beta: float, gamma: float) -> float:
    """Predicted seconds of :func:`all_reduce` on ``n`` ranks for ``m`` bytes (see the module docstring)."""
    p, rem = fold(n)
    folding = 2 * alpha + 2 * m * beta + m * gamma if rem else 0.0
    return log2_floor(p) * (alpha + m * beta + m * gamma) + folding
