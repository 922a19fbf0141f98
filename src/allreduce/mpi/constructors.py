"""MPI's derived-datatype constructors and its packing calls, as methods of ``Datatype``.

Each constructor builds the new type's layout (:mod:`.derived`) from its old type's and records the
arguments it was called with, which ``Get_contents`` and ``decode`` give back (in MPI-3's form:
counts among the integers, byte displacements among the addresses). ``Pack`` and ``Unpack`` move
elements between a buffer laid out by the type and packed bytes; ``Pack_external`` writes MPI's
portable ``external32`` form (big-endian).
"""

from __future__ import annotations

import numpy as np

from . import derived
from .arrays import raw_bytes
from .environment import VERSION as _VERSION
from .errorcodes import ERR_ARG, ERR_COUNT, ERR_TRUNCATE, ERR_UNSUPPORTED_DATAREP, error as _error

COMBINER_NAMED, COMBINER_DUP, COMBINER_CONTIGUOUS = 0, 1, 2  # MPI's names for how a datatype was made
COMBINER_VECTOR, COMBINER_HVECTOR, COMBINER_INDEXED, COMBINER_HINDEXED = 3, 5, 6, 8
COMBINER_INDEXED_BLOCK, COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_DARRAY = 9, 11, 12, 13
COMBINER_F90_REAL, COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER, COMBINER_RESIZED = 14, 15, 16, 17
COMBINER_HINDEXED_BLOCK, COMBINER_VALUE_INDEX = 18, 0
COMBINER_NAMES = {COMBINER_NAMED: "NAMED", COMBINER_DUP: "DUP", COMBINER_CONTIGUOUS: "CONTIGUOUS",
                  COMBINER_VECTOR: "VECTOR", COMBINER_HVECTOR: "HVECTOR", COMBINER_INDEXED: "INDEXED",
                  COMBINER_HINDEXED: "HINDEXED", COMBINER_INDEXED_BLOCK: "INDEXED_BLOCK",
                  COMBINER_HINDEXED_BLOCK: "HINDEXED_BLOCK", COMBINER_STRUCT: "STRUCT",
                  COMBINER_SUBARRAY: "SUBARRAY", COMBINER_DARRAY: "DARRAY", COMBINER_RESIZED: "RESIZED",
                  COMBINER_F90_INTEGER: "F90_INTEGER", COMBINER_F90_REAL: "F90_REAL",
                  COMBINER_F90_COMPLEX: "F90_COMPLEX"}
F90_COMBINERS = (COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_F90_COMPLEX)
_INT_MAX = 2**31 - 1  # the most elements a count of MPI 3 (a C int) holds


def _counts(values, what: str) -> list[int]:
    values = [int(v) for v in values]
    if any(v < 0 for v in values):
        raise _error(ERR_COUNT, f"{what} must be >= 0, got {values}")
    return values


def _same_length(what: str, *sequences) -> None:
    if len({len(s) for s in sequences}) > 1:
        raise ValueError(f"{what}: blocklengths, displacements (and datatypes) must be as long as each other, "
                         f"got {[len(s) for s in sequences]}")


class Constructors:
    """The constructors of :class:`~allreduce.mpi.datatypes.Datatype`, which provides ``typemap`` (its
    layout), ``_basic()`` (its basic dtype) and ``fromcode``."""

    @classmethod
    def _made(cls, layout: derived.Layout, combiner: int, integers, addresses, datatypes, params: dict):
        for old in datatypes:
            old._basic()
        basic = layout.basic
        return cls(basic, "", layout.size // basic.itemsize, combiner, layout,
                   (list(integers), list(addresses), list(datatypes), dict(params)))

    def _repeated(self, count: int):
        """``Create_contiguous`` of a type without a layout: still none (so a huge count costs nothing).

        Past ``INT_MAX`` elements on an MPI before 4.0 (``Get_version``), whose counts are C ints, the type
        is what such an MPI makes and ``decode`` shows: a struct of a vector of ``INT_MAX``-element blocks
        and a contiguous rest. Either way its elements lie back to back and nothing is laid out.
        """
        if count > _INT_MAX and _VERSION < 4:
            blocks, rest = divmod(count, _INT_MAX)
            vector = type(self)(self._basic(), "", self.count * blocks * _INT_MAX, COMBINER_VECTOR, None,
                                ([blocks, _INT_MAX, _INT_MAX], [], [self],
                                 {"count": blocks, "blocklength": _INT_MAX, "stride": _INT_MAX}))
            parts, displacements = [vector, self._repeated(rest)], [0, blocks * _INT_MAX * self.extent]
            return type(self)(self._basic(), "", self.count * count, COMBINER_STRUCT, None,
                              ([2, 1, 1], displacements, parts,
                               {"blocklengths": [1, 1], "displacements": displacements, "datatypes": parts}))
        return type(self)(self._basic(), "", self.count * count, COMBINER_CONTIGUOUS, None,
                          ([count], [], [self], {"count": count}))

    def _f90(self, combiner: int, integers, params: dict):
        """The f90 type of ``combiner`` whose elements are this predefined type's."""
        return type(self)(self.dtype, "", 1, combiner, None, (list(integers), [], [], dict(params)))

    def Create_contiguous(self, count: int):
        """``count`` elements of this type back to back, as one element."""
        (count,) = _counts([count], "count")
        if self.layout is None:
            return self._repeated(count)
        return self._made(derived.blocks(self.typemap, [count], [0]), COMBINER_CONTIGUOUS, [count], [], [self],
                          {"count": count})

    def Create_vector(self, count: int, blocklength: int, stride: int):
        """``count`` blocks of ``blocklength`` elements, block ``i`` starting ``i * stride`` elements in."""
        count, blocklength = _counts([count, blocklength], "count and blocklength")
        extent = self.typemap.extent
        return self._made(derived.blocks(self.typemap, [blocklength] * count, [i * int(stride) * extent for i in
                                                                              range(count)]),
                          COMBINER_VECTOR, [count, blocklength, int(stride)], [], [self],
                          {"count": count, "blocklength": blocklength, "stride": int(stride)})

    def Create_hvector(self, count: int, blocklength: int, stride: int):
        """As ``Create_vector``, the stride in bytes."""
        count, blocklength = _counts([count, blocklength], "count and blocklength")
        return self._made(derived.blocks(self.typemap, [blocklength] * count, [i * int(stride) for i in range(count)]),
                          COMBINER_HVECTOR, [count, blocklength], [int(stride)], [self],
                          {"count": count, "blocklength": blocklength, "stride": int(stride)})

    def Create_indexed(self, blocklengths, displacements):
        """Blocks of ``blocklengths[i]`` elements at ``displacements[i]`` elements of this type."""
        blocklengths, displacements = _counts(blocklengths, "blocklengths"), [int(d) for d in displacements]
        _same_length("Create_indexed", blocklengths, displacements)
        extent = self.typemap.extent
        return self._made(derived.blocks(self.typemap, blocklengths, [d * extent for d in displacements]),
                          COMBINER_INDEXED, [len(blocklengths), *blocklengths, *displacements], [], [self],
                          {"blocklengths": blocklengths, "displacements": displacements})

    def Create_hindexed(self, blocklengths, displacements):
        """As ``Create_indexed``, the displacements in bytes."""
        blocklengths, displacements = _counts(blocklengths, "blocklengths"), [int(d) for d in displacements]
        _same_length("Create_hindexed", blocklengths, displacements)
        return self._made(derived.blocks(self.typemap, blocklengths, displacements), COMBINER_HINDEXED,
                          [len(blocklengths), *blocklengths], displacements, [self],
                          {"blocklengths": blocklengths, "displacements": displacements})

    def Create_indexed_block(self, blocklength: int, displacements):
        """Blocks of ``blocklength`` elements each, at ``displacements`` elements of this type."""
        (blocklength,), displacements = _counts([blocklength], "blocklength"), [int(d) for d in displacements]
        extent = self.typemap.extent
        return self._made(derived.blocks(self.typemap, [blocklength] * len(displacements),
                                         [d * extent for d in displacements]),
                          COMBINER_INDEXED_BLOCK, [len(displacements), blocklength, *displacements], [], [self],
                          {"blocklength": blocklength, "displacements": displacements})

    def Create_hindexed_block(self, blocklength: int, displacements):
        """As ``Create_indexed_block``, the displacements in bytes."""
        (blocklength,), displacements = _counts([blocklength], "blocklength"), [int(d) for d in displacements]
        return self._made(derived.blocks(self.typemap, [blocklength] * len(displacements), displacements),
                          COMBINER_HINDEXED_BLOCK, [len(displacements), blocklength], displacements, [self],
                          {"blocklength": blocklength, "displacements": displacements})

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes):
        """Block ``i`` is ``blocklengths[i]`` elements of ``datatypes[i]`` from byte ``displacements[i]``.

        Raises:
            ValueError: sequences of different lengths.
        """
        blocklengths, displacements = _counts(blocklengths, "blocklengths"), [int(d) for d in displacements]
        datatypes = list(datatypes)
        _same_length("Create_struct", blocklengths, displacements, datatypes)
        layout = derived.aligned(derived.merged([(t.typemap, b, d) for t, b, d in zip(datatypes, blocklengths,
                                                                                   displacements)]))
        return cls._made(layout, COMBINER_STRUCT, [len(blocklengths), *blocklengths], displacements, datatypes,
                         {"blocklengths": blocklengths, "displacements": displacements, "datatypes": datatypes})

    def Create_subarray(self, sizes, subsizes, starts, order: int = 0):
        """The ``subsizes`` block at ``starts`` of a ``sizes`` array (``ORDER_C`` or ``ORDER_FORTRAN``);
        its extent is the whole array's.

        Raises:
            ValueError: a block outside the array.
        """
        sizes, subsizes, starts = (list(map(int, v)) for v in (sizes, subsizes, starts))
        layout = derived.subarray(self.typemap, sizes, subsizes, starts, fortran=int(order) == 1)
        return self._made(layout, COMBINER_SUBARRAY, [len(sizes), *sizes, *subsizes, *starts, int(order)], [], [self],
                          {"sizes": sizes, "subsizes": subsizes, "starts": starts, "order": int(order)})

    def Create_darray(self, size: int, rank: int, gsizes, distribs, dargs, psizes, order: int = 0):
        """The part that process ``rank`` of ``size`` owns of a ``gsizes`` array dealt over a row-major
        grid of ``psizes`` processes (``distribs``/``dargs`` per dimension, see
        :func:`.derived.owned`), its elements in the array's order (``ORDER_C`` or ``ORDER_FORTRAN``);
        its extent is the whole array's.

        Raises:
            ValueError: sequences of different lengths, a grid of other than ``size`` processes, a
                rank outside it, or a distribution that does not cover its dimension.
        """
        gsizes, distribs, dargs, psizes = (list(map(int, v)) for v in (gsizes, distribs, dargs, psizes))
        size, rank, order = int(size), int(rank), int(order)
        _same_length("Create_darray", gsizes, distribs, dargs, psizes)
        if not gsizes or int(np.prod(psizes)) != size or not 0 <= rank < size:
            raise ValueError(f"Create_darray: rank {rank} of a grid {psizes} of {size} processes")
        coords = np.unravel_index(rank, psizes)  # MPI's process grid is row-major whatever the order
        indices = [derived.owned(g, d, a, p, int(c)) for g, d, a, p, c in zip(gsizes, distribs, dargs, psizes, coords)]
        layout = derived.picked(self.typemap, gsizes, indices, fortran=order == 1)
        integers = [size, rank, len(gsizes), *gsizes, *distribs, *dargs, *psizes, order]
        return self._made(layout, COMBINER_DARRAY, integers,
                          [], [self], {"size": size, "rank": rank, "gsizes": gsizes, "distribs": distribs,
                                       "dargs": dargs, "psizes": psizes, "order": order})

    def Create_resized(self, lb: int, extent: int):
        """This type with bounds ``lb`` and ``lb + extent``: successive elements step by ``extent`` bytes."""
        return self._made(derived.resized(self.typemap, lb, extent), COMBINER_RESIZED, [], [int(lb), int(extent)],
                          [self], {"lb": int(lb), "extent": int(extent)})

    @classmethod
    def Create_f90_integer(cls, r: int):
        """The smallest integer type holding ``r`` decimal digits."""
        for digits, code in ((2, "i1"), (4, "i2"), (9, "i4"), (18, "i8")):
            if int(r) <= digits:
                return cls.fromcode(code)._f90(COMBINER_F90_INTEGER, [int(r)], {"r": int(r)})
        raise _error(ERR_ARG, f"no integer type holds {r} decimal digits")

    @classmethod
    def Create_f90_real(cls, p: int, r: int):
        """The smallest real type of precision ``p`` digits and exponent range ``r``."""
        return cls.fromcode(_real_code(p, r, "f"))._f90(COMBINER_F90_REAL, [int(p), int(r)], {"p": int(p), "r": int(r)})

    @classmethod
    def Create_f90_complex(cls, p: int, r: int):
        """The smallest complex type whose parts have precision ``p`` and exponent range ``r``."""
        return cls.fromcode(_real_code(p, r, "c"))._f90(COMBINER_F90_COMPLEX, [int(p), int(r)],
                                                        {"p": int(p), "r": int(r)})

    # ---- packing ---------------------------------------------------------------------------------

    def Pack_size(self, count: int, comm=None) -> int:
        """Bytes ``count`` packed elements take."""
        return int(count) * self.typemap.size

    def Pack_external_size(self, datarep: str, count: int) -> int:
        _check_datarep(datarep)
        return self.Pack_size(count)

    def Pack(self, inbuf, outbuf, position: int, comm=None) -> int:
        """Pack the elements of ``inbuf`` (as many whole ones as it holds) into ``outbuf`` at byte
        ``position``; returns the position after them.

        Raises:
            MPI.Exception: ``ERR_TRUNCATE`` where ``outbuf`` has no room for them.
        """
        return self._pack(inbuf, outbuf, position, big_endian=None)

    def Unpack(self, inbuf, position: int, outbuf, comm=None) -> int:
        """Unpack bytes of ``inbuf`` from ``position`` into as many elements as ``outbuf`` holds;
        returns the position after them."""
        return self._unpack(inbuf, position, outbuf, big_endian=None)

    def Pack_external(self, datarep: str, inbuf, outbuf, position: int) -> int:
        """``Pack`` in the portable ``external32`` representation (big-endian)."""
        _check_datarep(datarep)
        return self._pack(inbuf, outbuf, position, big_endian=True)

    def Unpack_external(self, datarep: str, inbuf, position: int, outbuf) -> int:
        _check_datarep(datarep)
        return self._unpack(inbuf, position, outbuf, big_endian=True)

    def _pack(self, inbuf, outbuf, position: int, big_endian) -> int:
        layout, source, target = self.typemap, raw_bytes(inbuf, "inbuf", False), raw_bytes(outbuf, "outbuf", True)
        count = _whole(source.size, layout)
        packed = layout.pack(source, count)
        if big_endian is not None:
            packed = layout.swapped(packed, count, big_endian)
        return _put(packed, target, int(position))

    def _unpack(self, inbuf, position: int, outbuf, big_endian) -> int:
        layout, source, target = self.typemap, raw_bytes(inbuf, "inbuf", False), raw_bytes(outbuf, "outbuf", True)
        count, position = _whole(target.size, layout), int(position)
        packed = source[position:position + count * layout.size]
        if packed.size < count * layout.size:
            raise _error(ERR_TRUNCATE, f"Unpack: {count} elements need {count * layout.size} bytes from position "
                                       f"{position}, inbuf has {source.size - position}")
        if big_endian is not None:
            packed = layout.swapped(packed, count, big_endian)
        layout.unpack(packed, target, count)
        return position + packed.size


def _whole(nbytes: int, layout) -> int:
    """Elements of a buffer of ``nbytes`` bytes in Pack/Unpack: its bytes over the extent, as mpi4py counts."""
    if layout.extent <= 0:
        return 0
    return min(nbytes // layout.extent, layout.available(nbytes))


def _put(packed: np.ndarray, target: np.ndarray, position: int) -> int:
    if position < 0 or position + packed.size > target.size:
        raise _error(ERR_TRUNCATE, f"Pack: {packed.size} bytes at position {position} do not fit in outbuf's "
                                   f"{target.size}")
    target[position:position + packed.size] = packed
    return position + packed.size


def _check_datarep(datarep: str) -> None:
    if datarep != "external32":
        raise _error(ERR_UNSUPPORTED_DATAREP, f"data representation {datarep!r} is not offered: use 'external32'")


def _real_code(p: int, r: int, kind: str) -> str:
    for precision, exponent, size in ((6, 37, 4), (15, 307, 8)):
        if int(p) <= precision and int(r) <= exponent:
            return f"{kind}{size if kind == 'f' else 2 * size}"
    raise _error(ERR_ARG, f"no real type has precision {p} and exponent range {r}")

