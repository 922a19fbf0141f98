"""Folding any world size onto a power of two, and the halving rounds of a power-of-two world.

Vocabulary: ``p`` is the largest power of two ``<= n`` and ``rem = n - p``. Among the first
``2 rem`` ranks each odd rank *folds* into its even neighbour: it hands over its data in a first
*fold step*, sits out the rounds, and gets the result back in a last *unfold step*. The ``p``
*survivors* are renumbered as *virtual ranks* ``v``: rank ``2v`` for ``v < rem``, rank ``v + rem``
after. Survivor ``v < rem`` thus speaks for two real ranks, ``2v`` and ``2v + 1``.

Rounds: in the round with *mask* ``b`` (a power of two below ``p``) virtual rank ``v`` pairs with
``v ^ b``. For halving, a *window* of virtual blocks ``[lo, hi)`` (all ``p`` at first) is cut in two
each round: the rank whose ``v & b`` is 0 *keeps* the lower half, its partner the upper, and each
*gives* the other half away. After all rounds the window is one block, and its order of masks fixes
which one: largest mask first leaves ``v`` with block ``v``.

Cost: folding an all-reduce of ``m`` bytes adds ``2 alpha + 2 m beta + m gamma`` (alpha per
message, beta per byte, gamma per byte reduced) to the power-of-two algorithm when ``n`` is not one.
"""

from __future__ import annotations

from .schedule import Recv, Region, Schedule, Send, without_empty


def fold(size: int) -> tuple[int, int]:
    """``(p, rem)``: the largest power of two ``p <= size`` and the ranks beyond it."""
    p = 1 << (size.bit_length() - 1)
    return p, size - p


def virtual(rank: int, size: int) -> int | None:
    """The virtual rank of ``rank``, or ``None`` if it folds into ``rank - 1``."""
    _, rem = fold(size)
    if rank < 2 * rem:
        return None if rank % 2 else rank // 2
    return rank - rem


def real(v: int, size: int) -> int:
    """The rank that virtual rank ``v`` runs on; ``real(p, size)`` is ``size``, so window ends map too."""
    _, rem = fold(size)
    return 2 * v if v < rem else v + rem


def folded_partner(rank: int, size: int) -> int | None:
    """The rank that ``rank`` folds with (its odd or even neighbour), or ``None`` if it folds with none."""
    _, rem = fold(size)
    if rank >= 2 * rem:
        return None
    return rank - 1 if rank % 2 else rank + 1


def masks(p: int, largest_first: bool) -> list[int]:
    """The round masks of a world of ``p`` (a power of two) ranks, in the order the rounds run."""
    ordered = [1 << k for k in range(p.bit_length() - 1)]
    return ordered[::-1] if largest_first else ordered


def halving(v: int, p: int, largest_first: bool) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """Per halving round: (virtual partner, kept window, given window), windows as ``(lo, hi)`` blocks."""
    lo, hi = 0, p
    rounds = []
    for b in masks(p, largest_first):
        mid = (lo + hi) // 2
        lower, upper = (lo, mid), (mid, hi)
        keep, give = (upper, lower) if v & b else (lower, upper)
        rounds.append((v ^ b, keep, give))
        lo, hi = keep
    return rounds


def sitting_out(partner: int, handed: Region, returned: Region, rounds: int) -> Schedule:
    """The schedule of a rank that folds: hand ``handed`` to ``partner``, wait out ``rounds`` steps,
    then receive the result into ``returned``."""
    steps = [[Send(partner, handed)]] + [[] for _ in range(rounds)] + [[Recv(partner, returned)]]
    return Schedule(without_empty(steps))


def framed(rank: int, size: int, rounds: list, take, give_back) -> list:
    """A survivor's steps: ``rounds``, between the fold and unfold steps when ``size`` is not a power of two.

    ``take(partner)`` and ``give_back(partner)`` are this rank's ops in those two steps if it has a
    folding partner; they stay empty (but present, so steps line up) if not.
    """
    if fold(size)[1] == 0:
        return rounds
    partner = folded_partner(rank, size)
    if partner is None:
        return [[]] + rounds + [[]]
    return [take(partner)] + rounds + [give_back(partner)]
