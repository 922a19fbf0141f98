"""Layouts of derived MPI datatypes: where each basic element of one element of the type lies in memory.

A layout is MPI's typemap, ``(byte offset, basic dtype)`` for each basic element in order, with the
type's bounds (``lb``, ``ub``: the extent that successive elements step by). Every constructor
(contiguous, vector, indexed, struct, subarray, resized...) is one of two operations on layouts:
``blocks`` (copies of one layout at byte displacements, each copy ``blocklength`` elements long) and
``merged`` (the blocks of several layouts, a struct). Moving data through a layout is a gather of
bytes: the byte positions of one element are computed once per layout (``byte_index``), and ``count``
elements are that index shifted by multiples of the extent, so ``pack`` and ``unpack`` are one numpy
fancy-index each. Packed elements lie back to back in typemap order, as MPI's ``MPI_Pack`` lays them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class Layout:
    """A typemap: ``offsets[k]`` is the byte offset of basic element ``k``, of dtype ``basics[kinds[k]]``."""

    offsets: np.ndarray  # int64, one per basic element, in typemap order
    kinds: np.ndarray  # intp, index into basics of each element's dtype
    basics: tuple  # the distinct basic numpy dtypes
    lb: int  # lower bound, in bytes
    ub: int  # upper bound, in bytes: extent = ub - lb

    @classmethod
    def of(cls, dtype: np.dtype, count: int = 1) -> Layout:
        """``count`` elements of the basic ``dtype`` back to back."""
        dtype = np.dtype(dtype)
        return cls(np.arange(count, dtype=np.int64) * dtype.itemsize, np.zeros(count, np.intp), (dtype,), 0,
                   count * dtype.itemsize)

    @property
    def extent(self) -> int:
        return self.ub - self.lb

    @cached_property
    def itemsizes(self) -> np.ndarray:
        return np.array([b.itemsize for b in self.basics], np.int64)[self.kinds]

    @cached_property
    def size(self) -> int:
        return int(self.itemsizes.sum())

    @cached_property
    def true_bounds(self) -> tuple[int, int]:
        """``(true_lb, true_ub)``: the first and one past the last byte the elements occupy."""
        if not self.offsets.size:
            return 0, 0
        return int(self.offsets.min()), int((self.offsets + self.itemsizes).max())

    @property
    def basic(self) -> np.dtype:
        """The one basic dtype of every element, else bytes (a struct of several)."""
        return self.basics[0] if len(self.basics) == 1 else np.dtype(np.uint8)

    @cached_property
    def dense(self) -> bool:
        """Whether the elements lie back to back from offset 0 and the extent is their size: then a
        buffer of this type is a plain array of its basic dtype, with no packing."""
        if len(self.basics) != 1 or self.lb != 0 or self.ub != self.size:
            return False
        return bool((self.offsets == np.arange(self.offsets.size) * self.basics[0].itemsize).all())

    @cached_property
    def byte_index(self) -> np.ndarray:
        """The byte offsets of one element's bytes, in packed order (computed once per layout)."""
        sizes = self.itemsizes
        starts = np.repeat(self.offsets - np.cumsum(sizes) + sizes, sizes)
        return starts + np.arange(int(sizes.sum()), dtype=np.int64)

    def index(self, count: int, start: int = 0) -> np.ndarray:
        """Byte positions of elements ``start`` to ``start + count`` of an array of this type."""
        steps = (np.arange(start, start + count, dtype=np.int64) * self.extent)[:, None]
        return (steps + self.byte_index[None, :]).reshape(-1)

    def available(self, nbytes: int) -> int:
        """How many whole elements of this type a buffer of ``nbytes`` bytes holds.

        Raises:
            ValueError: a type whose bytes lie before its buffer's start (a negative offset).
        """
        low, high = self.true_bounds
        if low < 0:
            raise ValueError(f"a datatype whose data starts {-low} bytes before its buffer cannot be read here")
        if high > nbytes:
            return 0
        if self.extent <= 0:
            return 1 if self.size else 0
        return (nbytes - high) // self.extent + 1

    def shifted(self, by: int) -> Layout:
        """This layout with every offset and bound ``by`` bytes lower (its bytes seen from ``by``)."""
        return Layout(self.offsets - by, self.kinds, self.basics, self.lb - by, self.ub - by)

    def pack(self, raw: np.ndarray, count: int, start: int = 0) -> np.ndarray:
        """The bytes of ``count`` elements of ``raw`` (a flat uint8 array), packed back to back."""
        return raw[self.index(count, start)]

    def unpack(self, packed: np.ndarray, raw: np.ndarray, count: int, start: int = 0) -> None:
        """Write the packed bytes of ``count`` elements into their places in ``raw``."""
        raw[self.index(count, start)] = packed.view(np.uint8).reshape(-1)[:count * self.size]

    def swapped(self, packed: np.ndarray, count: int, big_endian: bool) -> np.ndarray:
        """Packed bytes with each basic element in the byte order asked for (``external32`` is big-endian)."""
        out = packed.copy()
        sizes = np.tile(self.itemsizes, count)
        kinds = np.tile(self.kinds, count)
        starts = np.cumsum(sizes) - sizes
        for kind, basic in enumerate(self.basics):
            order = basic.byteorder if basic.byteorder in "<>" else ("<" if np.little_endian else ">")
            if basic.itemsize == 1 or basic.kind == "V" or (order == ">") == big_endian:
                continue
            chosen = starts[kinds == kind]
            item = basic.itemsize if basic.kind != "c" else basic.itemsize // 2
            for half in range(basic.itemsize // item):  # a complex number swaps its two parts apart
                picks = (chosen + half * item)[:, None] + np.arange(item)
                out[picks] = out[picks[:, ::-1]]
        return out


def blocks(layout: Layout, blocklengths, displacements) -> Layout:
    """Copies of ``layout``: block ``i`` is ``blocklengths[i]`` elements from byte ``displacements[i]``.

    Bounds are MPI's: the lowest lower bound and highest upper bound of the blocks that hold elements
    (``0, 0`` if none does).
    """
    return merged([(layout, int(b), int(d)) for b, d in zip(blocklengths, displacements)])


def merged(parts) -> Layout:
    """The layout of ``(layout, blocklength, byte displacement)`` blocks in order (a struct's)."""
    basics: list = []
    offsets, kinds, lows, highs = [], [], [], []
    for layout, blocklength, displ in parts:
        if blocklength <= 0:
            continue
        steps = displ + np.arange(blocklength, dtype=np.int64) * layout.extent
        offsets.append((steps[:, None] + layout.offsets[None, :]).reshape(-1))
        remap = np.array([_index_of(basics, b) for b in layout.basics], np.intp)
        kinds.append(np.tile(remap[layout.kinds] if layout.kinds.size else layout.kinds, blocklength))
        ends = (displ + layout.lb, displ + layout.lb + (blocklength - 1) * layout.extent)
        lows.append(min(ends))
        highs.append(max(ends) + layout.extent)
    if not offsets:
        return Layout(np.zeros(0, np.int64), np.zeros(0, np.intp), tuple(basics) or (np.dtype(np.uint8),), 0, 0)
    return Layout(np.concatenate(offsets), np.concatenate(kinds), tuple(basics), min(lows), max(highs))


def aligned(layout: Layout) -> Layout:
    """A struct's layout with its upper bound rounded up to its strictest alignment, as C pads a struct
    (and MPI a struct datatype) so that arrays of it keep every member aligned."""
    alignment = max((b.alignment for b in layout.basics), default=1) if layout.offsets.size else 1
    return resized(layout, layout.lb, -(-layout.extent // alignment) * alignment)


def _index_of(basics: list, dtype: np.dtype) -> int:
    if dtype not in basics:
        basics.append(dtype)
    return basics.index(dtype)


def resized(layout: Layout, lb: int, extent: int) -> Layout:
    return Layout(layout.offsets, layout.kinds, layout.basics, int(lb), int(lb) + int(extent))


def subarray(layout: Layout, sizes, subsizes, starts, fortran: bool) -> Layout:
    """The ``subsizes`` block at ``starts`` of a ``sizes`` array of ``layout`` elements, in C or Fortran
    order; its extent is the whole array's, as in MPI.

    Raises:
        ValueError: a block that does not lie inside the array.
    """
    sizes, subsizes, starts = (list(map(int, v)) for v in (sizes, subsizes, starts))
    if not (len(sizes) == len(subsizes) == len(starts)) or not sizes:
        raise ValueError(f"sizes, subsizes and starts must have one entry per dimension, got {sizes}, {subsizes}, "
                         f"{starts}")
    for n, sub, start in zip(sizes, subsizes, starts):
        if n < 1 or sub < 1 or start < 0 or start + sub > n:
            raise ValueError(f"subarray {subsizes} at {starts} does not lie inside an array of {sizes}")
    return picked(layout, sizes, [range(s, s + n) for s, n in zip(starts, subsizes)], fortran)


def picked(layout: Layout, sizes, indices, fortran: bool) -> Layout:
    """The elements of a ``sizes`` array of ``layout`` elements whose index along dimension ``d`` is in
    ``indices[d]`` (increasing), in C or Fortran order; its extent is the whole array's. A subarray
    picks a range in each dimension, a distributed array the indices its process owns."""
    order = "F" if fortran else "C"
    grid = np.arange(int(np.prod(sizes)), dtype=np.int64).reshape(sizes, order=order)
    chosen = grid[np.ix_(*[np.asarray(list(i), np.int64) for i in indices])].reshape(-1, order=order)
    inner = blocks(layout, [1] * chosen.size, chosen * layout.extent)
    return resized(inner, layout.lb, int(np.prod(sizes)) * layout.extent)


DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG = 0, 1, 2, -1


def owned(length: int, distrib: int, darg: int, procs: int, coord: int) -> range | list[int]:
    """The indices along one dimension of ``length`` that process ``coord`` of ``procs`` owns, as MPI's
    distributed arrays deal them: ``DISTRIBUTE_BLOCK`` one block of ``darg`` (default: the length over
    the processes, rounded up), ``DISTRIBUTE_CYCLIC`` blocks of ``darg`` (default 1) dealt round robin,
    ``DISTRIBUTE_NONE`` all of them.

    Raises:
        ValueError: an unknown distribution, a block too small to cover the dimension, ``NONE`` over
            more than one process.
    """
    if distrib == DISTRIBUTE_NONE:
        if procs != 1:
            raise ValueError(f"DISTRIBUTE_NONE over {procs} processes (it needs 1)")
        return range(length)
    if distrib == DISTRIBUTE_BLOCK:
        block = -(-length // procs) if darg == DISTRIBUTE_DFLT_DARG else int(darg)
        if block < 1 or block * procs < length:
            raise ValueError(f"blocks of {block} over {procs} processes do not cover {length} elements")
        return range(min(coord * block, length), min((coord + 1) * block, length))
    if distrib == DISTRIBUTE_CYCLIC:
        block = 1 if darg == DISTRIBUTE_DFLT_DARG else int(darg)
        if block < 1:
            raise ValueError(f"cyclic blocks of {block} elements")
        return [i for i in range(length) if (i // block) % procs == coord]
    raise ValueError(f"unknown distribution {distrib} (DISTRIBUTE_BLOCK, _CYCLIC or _NONE)")
