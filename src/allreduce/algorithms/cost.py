"""Arithmetic shared by the alpha-beta-gamma cost formulas that each algorithm's module prices itself with.

Every formula answers ``cost(n, m, alpha, beta, gamma) -> seconds`` for ``n`` ranks and ``m`` bytes,
with ``alpha`` seconds per message (a rank's messages of one step travel together, so a step pays it
once), ``beta`` seconds per byte a rank sends (a step lasts as long as its busiest rank's sends) and
``gamma`` seconds per byte reduced. A *pipelined* algorithm cut into ``K`` chunks runs ``K + fill``
steps; more chunks pay more ``alpha`` but shrink the data that the steps filling and draining the
pipeline carry, so its time is smallest at ``K`` near ``sqrt(extra / alpha)``, which is what it is
priced at unless the caller fixes the chunk size.
"""

from __future__ import annotations

import math


def log2_ceil(n: int) -> int:
    """``ceil(log2 n)``: rounds of a doubling algorithm on ``n`` ranks (0 for one rank)."""
    return (n - 1).bit_length()


def log2_floor(n: int) -> int:
    """``floor(log2 n)``: rounds of the power-of-two part of ``n`` ranks."""
    return n.bit_length() - 1


def pipelined(fill: int, alpha: float, work: float, extra: float, chunks: int | None = None) -> float:
    """Seconds for ``chunks + fill`` steps of ``alpha`` each, moving ``work + extra / chunks`` seconds of data.

    Args:
        fill: steps the pipeline needs beyond one per chunk.
        alpha: seconds per step.
        work: seconds of transfer and reduction the busiest rank spends however the data is cut.
        extra: seconds that filling and draining the pipeline add when it holds a single chunk;
            ``chunks`` chunks cut them by ``chunks``.
        chunks: number of pipeline chunks; ``None`` picks the best whole number (about
            ``sqrt(extra / alpha)``).
    """
    if chunks is None:
        if alpha <= 0:
            return work  # endless small chunks: the fill costs nothing
        best = math.sqrt(extra / alpha)
        return min(pipelined(fill, alpha, work, extra, max(1, k)) for k in (math.floor(best), math.ceil(best)))
    return (chunks + fill) * alpha + work + extra / chunks


def chunks_of(nbytes: float, chunk_bytes: float | None) -> int | None:
    """Pipeline chunks that ``nbytes`` is cut into at ``chunk_bytes`` each (``None`` stays ``None``)."""
    if chunk_bytes is None:
        return None
    if chunk_bytes <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk_bytes} bytes")
    return max(1, math.ceil(nbytes / chunk_bytes))
