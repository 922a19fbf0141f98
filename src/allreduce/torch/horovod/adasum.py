"""Adasum: adaptive summation of gradients (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021), the reduce op Horovod calls ``Adasum``.

Two vectors ``a`` and ``b`` combine as

    adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b

which is ``a + b`` when they are orthogonal (independent directions add up) and ``a`` when ``a == b``
(the same direction is not taken twice). A vector whose squared norm is below ``TINY`` keeps
coefficient 1 on the other side's (so a zero vector, e.g. a joined rank's, changes nothing). Each
*segment* (one tensor of a fused buffer: one layer) gets its own coefficients, as in the paper.

``n`` ranks combine up a recursive-doubling tree over ``P``, the largest power of two <= ``n``:
first each extra rank ``P + i`` folds into rank ``i`` (``v[i] = adasum(v[i], v[P + i])``); then at
distance ``d = 1, 2, 4, ... < P`` rank ``i`` (a multiple of ``2d``) takes ``adasum(v[i], v[i + d])``.
For a power of two this is Horovod's tree; Horovod refuses other sizes on CPU, we fold.

Communication: one all-gather of every rank's vector (in the wire dtype of the compressor), after
which every rank evaluates the same tree in float64 and casts once, so every rank ends with the same
bits. That moves ``(n - 1)`` vectors per rank where Horovod's vector-halving distance-doubling moves
about two: fine for the few ranks of a host or a handful of hosts, and exact regardless.
"""

from __future__ import annotations

import sys

import torch

from ... import api

from ..common.compression import Compressor

TINY = sys.float_info.min ** 0.5  # squared norms below this count as zero (Horovod's threshold)


class AdasumOp:
    """The ``op`` that selects Adasum (``hvd.Adasum``): not element-wise, so not a :class:`ReduceOp`."""

    def __repr__(self) -> str:
        return "Adasum"


ADASUM = AdasumOp()


def combine(a: torch.Tensor, b: torch.Tensor, segment_of: torch.Tensor, segments: int) -> torch.Tensor:
    """``adasum(a[k], b[k])`` for each row pair, segment by segment (float64 rows of equal length).

    ``segment_of[j]`` is the segment of column ``j``.
    """
    def per_segment(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(values.shape[0], segments, dtype=values.dtype).index_add_(1, segment_of, values)

    dot, a_sq, b_sq = per_segment(a * b), per_segment(a * a), per_segment(b * b)
    a_coeff = torch.where(a_sq >= TINY, 1 - dot / (2 * a_sq.clamp(min=TINY)), 1.0)
    b_coeff = torch.where(b_sq >= TINY, 1 - dot / (2 * b_sq.clamp(min=TINY)), 1.0)
    return a_coeff.index_select(1, segment_of) * a + b_coeff.index_select(1, segment_of) * b


def tree(vectors: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The Adasum of the rows of ``vectors`` (one per rank, float64), combined as the module says.

    ``sizes`` are the segments' lengths, summing to the row length.
    """
    n = vectors.shape[0]
    power = 1 << (n.bit_length() - 1)
    segment_of = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
    v = vectors.clone()
    if n > power:
        v[:n - power] = combine(v[:n - power], v[power:], segment_of, len(sizes))
    distance = 1
    while distance < power:
        v[0:power:2 * distance] = combine(v[0:power:2 * distance], v[distance:power:2 * distance], segment_of,
                                          len(sizes))
        distance *= 2
    return v[0]


def start(flat: torch.Tensor, sizes: list[int], compressor: Compressor, group):
    """Begin the Adasum of the 1-D CPU tensor ``flat`` across ``group``: ``(work, finish)``, where
    ``finish()`` (after ``work`` is done) writes the result into ``flat``.

    Raises:
        TypeError: ``flat`` is not floating point.
    """
    if not flat.dtype.is_floating_point:
        raise TypeError(f"Adasum reduces floating-point tensors, got {flat.dtype}")
    size = api.get_world_size(group)
    wire, ctx = compressor.compress(flat)
    gathered = torch.empty(size * flat.numel(), dtype=wire.dtype)
    work = api.all_gather_into_tensor(gathered, wire.contiguous(), group=group, async_op=True)

    def finish() -> None:
        vectors = compressor.decompress(gathered.view(size, flat.numel()), ctx).to(torch.float64)
        flat.copy_(tree(vectors, sizes or [flat.numel()]))

    return work, finish


def reduce(flat: torch.Tensor, sizes: list[int], compressor: Compressor, group) -> None:
    """Replace ``flat`` by the Adasum of every rank's ``flat`` (blocking); see :func:`start`.

    Example (two ranks)::

        v = torch.tensor([1.0, 0.0]) if rank == 0 else torch.tensor([0.0, 1.0])
        reduce(v, [2], Compression.none, None)   # both: [1., 1.] (orthogonal: the sum)
    """
    work, finish = start(flat, sizes, compressor, group)
    work.wait()
    finish()
