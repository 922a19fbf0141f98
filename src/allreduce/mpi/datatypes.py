"""MPI datatypes as numpy dtypes: the basic ones mpi4py names, the derived ones made of them
(:mod:`.constructors`, laid out by :mod:`.derived`), and the queries mpi4py offers on them (sizes,
extents, envelopes and contents, typecodes).

``LONG_DOUBLE`` and its complexes are numpy's ``longdouble`` and ``clongdouble`` (C's ``long double``,
typecodes ``"g"`` and ``"G"``). The MINLOC/MAXLOC pair types (``FLOAT_INT``... ``LONG_DOUBLE_INT``) are
named types laid out as C's ``struct {value; int}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from ..dtypes import load_bfloat16
from .constructors import (  # noqa: F401 - MPI's combiner names are module attributes
    COMBINER_CONTIGUOUS, COMBINER_DARRAY, COMBINER_DUP, COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER,
    COMBINER_F90_REAL, COMBINER_HINDEXED, COMBINER_HINDEXED_BLOCK, COMBINER_HVECTOR, COMBINER_INDEXED,
    COMBINER_INDEXED_BLOCK, COMBINER_NAMED, COMBINER_NAMES, COMBINER_RESIZED, COMBINER_STRUCT, COMBINER_SUBARRAY,
    COMBINER_VALUE_INDEX, COMBINER_VECTOR, F90_COMBINERS, Constructors,
)
from . import derived
from .derived import Layout
from .errorcodes import ERR_ARG, ERR_KEYVAL, ERR_TYPE, error as _error
from .handles import Handle, constant

TYPECLASS_INTEGER, TYPECLASS_REAL, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4


@dataclass(eq=False)
class Datatype(Handle, Constructors):
    """An element type: a numpy dtype, or a derived layout of basic dtypes (:mod:`.derived`).

    Predefined datatypes are named (``MPI_DOUBLE``); ``dtype`` is ``None`` for ``DATATYPE_NULL``. A
    derived type's ``dtype`` is its one basic dtype (bytes for a struct of several) and ``count`` how
    many of those one element holds; so is a pair type's (named, with a layout).
    """

    dtype: np.dtype | Datatype | None = None  # the basic element (a Datatype: another handle of it)
    name: str = "MPI_DATATYPE_NULL"  # MPI's name, e.g. MPI_DOUBLE
    count: int = 1  # basic elements in one element of this type
    combiner: int = COMBINER_NAMED  # how the type was made
    layout: Layout | None = None  # where a derived type's elements lie; None: count dtypes back to back
    recipe: tuple = ((), (), (), ())  # (integers, addresses, datatypes, constructor arguments) it was made of

    def __post_init__(self) -> None:
        """``Datatype()`` is a null handle, ``Datatype(datatype)`` another handle of ``datatype`` (equal
        to it, not it), as in mpi4py."""
        other = self.dtype
        if isinstance(other, Datatype):
            self.__dict__.update(other.__dict__)
        elif other is not None and not isinstance(other, np.dtype):
            raise TypeError(f"Datatype() takes a Datatype to copy, got {type(other).__name__}")
        self.__dict__.setdefault("origin", self)  # what every handle of this type shares

    def _basic(self) -> np.dtype:
        if self.dtype is None:
            raise _error_type(f"{self.name} has no elements (it is MPI.DATATYPE_NULL)")
        return self.dtype

    @cached_property
    def typemap(self) -> Layout:
        """Where the basic elements of one element lie (computed once per type)."""
        return self.layout if self.layout is not None else Layout.of(self._basic(), self.count)

    @property
    def dense(self) -> bool:
        """Whether a buffer of this type is a plain array of its basic dtype (no packing needed)."""
        return self.layout is None or self.layout.dense

    @property
    def size(self) -> int:
        return self._basic().itemsize * self.count if self.layout is None else self.layout.size

    extent = property(lambda self: self.size if self.layout is None else self.layout.extent)
    lb = property(lambda self: 0 if self.layout is None else self.layout.lb)
    ub = property(lambda self: self.lb + self.extent)
    true_lb = property(lambda self: 0 if self.layout is None else self.layout.true_bounds[0])
    true_ub = property(lambda self: self.size if self.layout is None else self.layout.true_bounds[1])
    true_extent = property(lambda self: self.true_ub - self.true_lb)

    def Get_size(self) -> int:
        return self.size

    def Get_extent(self) -> tuple[int, int]:
        return self.lb, self.extent

    def Get_true_extent(self) -> tuple[int, int]:
        return self.true_lb, self.true_extent

    def Get_name(self) -> str:
        return self.name

    def Set_name(self, name: str) -> None:
        object.__setattr__(self, "name", str(name))

    @property
    def typestr(self) -> str:
        """The numpy type string of one element (``""`` for DATATYPE_NULL, ``V<extent>`` for a pair)."""
        if self.dtype is None:
            return ""
        if self._is_pair:
            return f"V{self.extent}"
        return self.dtype.str if self.count == 1 else f"{self.count}{self.dtype.str}"

    @property
    def typechar(self) -> str:
        if self.dtype is None:
            return ""
        return "V" if self._is_pair else self.dtype.char

    @property
    def _is_pair(self) -> bool:
        """A MINLOC/MAXLOC pair type, or a duplicate of one."""
        return pair_value(self) is not None or (self.combiner == COMBINER_DUP and self.recipe[2][0]._is_pair)

    @property
    def is_named(self) -> bool:
        return self.combiner == COMBINER_NAMED

    @property
    def is_predefined(self) -> bool:
        return self.combiner == COMBINER_NAMED or self.combiner in F90_COMBINERS

    def Get_envelope(self) -> tuple[int, int, int, int, int]:
        """``(integers, addresses, large counts, datatypes, combiner)``: how many of each
        ``Get_contents`` returns, and how the type was made."""
        integers, addresses, datatypes, _ = self.recipe
        return len(integers), len(addresses), 0, len(datatypes), self.combiner

    @property
    def envelope(self):
        return self.Get_envelope()

    def Get_contents(self) -> tuple[list, list, list, list]:
        """``(integers, addresses, large counts, datatypes)`` this type was made from.

        Raises:
            MPI.Exception: ``ERR_ARG`` for a predefined type, which has no contents.
        """
        if self.combiner == COMBINER_NAMED:
            raise _error(ERR_ARG, f"{self.name} is predefined: it has no contents")
        integers, addresses, datatypes, _ = self.recipe
        return list(integers), list(addresses), [], list(datatypes)

    @property
    def contents(self):
        return self.Get_contents()

    @property
    def combiner_name(self) -> str:
        return COMBINER_NAMES[self.combiner]

    def decode(self):
        """``(self, "NAMED", {})`` for a predefined type, else ``(old type, combiner name, the
        constructor's arguments)``: calling ``Create_<name>`` of the old type with them makes the type
        again (the old type is ``DATATYPE_NULL`` for a struct, whose arguments hold its datatypes)."""
        if self.combiner == COMBINER_NAMED:
            return self, "NAMED", {}
        datatypes, params = self.recipe[2], self.recipe[3]
        old = datatypes[0] if len(datatypes) == 1 else DATATYPE_NULL
        return old, self.combiner_name, dict(params)

    def Dup(self) -> Datatype:
        """A new type, the same as this one (``COMBINER_DUP``)."""
        self._basic()
        return Datatype(self.dtype, self.name, self.count, COMBINER_DUP, self.layout, ([], [], [self], {}))

    Create_dup = Dup

    @classmethod
    def fromcode(cls, code: str) -> Datatype:
        """The predefined datatype of a typecode (``"d"``, ``"i4"``, ``"?"``...), as mpi4py maps them.

        Raises:
            ValueError: a typecode no datatype here stands for.
        """
        found = _BY_CODE.get(code)
        if found is None:
            raise ValueError(f"cannot map typecode {code!r} to an MPI datatype")
        return found

    def tocode(self) -> str:
        """The typecode of a predefined datatype (``MPI.DOUBLE.tocode() == "d"``).

        Raises:
            ValueError: a datatype with no typecode.
        """
        for code, datatype in _BY_CODE.items():
            if datatype is self and len(code) == 1:
                return code
        if self.is_predefined and self.dtype is not None and not self._is_pair:
            return self.dtype.char
        if self.combiner == COMBINER_DUP and self.recipe[2]:
            return self.recipe[2][0].tocode()
        raise ValueError(f"cannot map {self.name or 'a derived datatype'} to a typecode")

    def Get_attr(self, keyval: int):
        """Datatypes carry no attributes here: every key is unknown (``ERR_KEYVAL``)."""
        raise _error(ERR_KEYVAL, f"{keyval} is not an attribute key of a datatype")

    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> Datatype:
        """The predefined type of ``typeclass`` (``TYPECLASS_INTEGER``...) that is ``size`` bytes.

        Raises:
            MPI.Exception: ``ERR_ARG`` where there is none.
        """
        found = _MATCHING.get((typeclass, int(size)))
        if found is None or not found:
            raise _error(ERR_ARG, f"no datatype of class {typeclass} is {size} bytes")
        return found

    @classmethod
    def Get_value_index(cls, value: Datatype, index: Datatype) -> Datatype:
        """The predefined pair type of (``value``, ``index``) that MINLOC/MAXLOC reduce: ``FLOAT_INT``
        for (``FLOAT``, ``INT``)...; ``DATATYPE_NULL`` for any other pair (an index not ``INT``).

        Raises:
            MPI.Exception: ``ERR_TYPE`` for ``DATATYPE_NULL`` arguments.
        """
        value._basic()
        index._basic()
        if index != INT:
            return DATATYPE_NULL
        return next((pair for pair, of in _PAIRS if of == value), DATATYPE_NULL)

    def Commit(self) -> Datatype:
        """Ready the type for communication: its layout's byte index is computed here, once."""
        if not self.dense:
            _ = self.typemap.byte_index  # computed once, on first read
        self._basic()
        return self

    def Free(self) -> None:
        """Nothing to release: a datatype here is a plain value (a predefined one cannot be freed)."""
        if self.combiner == COMBINER_NAMED:
            raise _error(ERR_TYPE, f"the predefined {self.name} cannot be freed")

    def __bool__(self) -> bool:
        return self.dtype is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return self.origin is other.origin or (self.dtype is None and other.dtype is None)

    __hash__ = None

    def _shared(self):
        return None if self.dtype is None else self.origin

    def _is_predefined(self) -> bool:
        return self.is_predefined

    def _release(self) -> None:
        self.__dict__.update(DATATYPE_NULL.__dict__)

    def __reduce__(self):
        if self.combiner == COMBINER_NAMED and self.name in _NAMED:
            named = _NAMED[self.name]
            return (_named, (self.name,)) if self is named else (type(self), (named,))
        return type(self), (self.dtype, self.name, self.count, self.combiner, self.layout, self.recipe)

    def __repr__(self) -> str:
        return f"<Datatype {self.name or self.combiner_name}>"


def _refused(name: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(f"Datatype.{name} (MPI 4.1) is not supported by allreduce.MPI; "
                                  "Get_value_index gives the predefined pair types")
    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not supported: {name} (raises NotImplementedError)."
    return refused


Datatype.Create_value_index = _refused("Create_value_index")


def _error_type(message: str):
    return _error(ERR_TYPE, message)


_NAMED: dict[str, Datatype] = {}


def _named(name: str) -> Datatype:
    if name == "MPI_BFLOAT16_T":
        _bfloat16_t()
    return _NAMED[name]


def _predefined(name: str, dtype) -> Datatype:
    made = constant(Datatype(None if dtype is None else np.dtype(dtype), f"MPI_{name}"))
    _NAMED[made.name] = made
    return made


DATATYPE_NULL = _predefined("DATATYPE_NULL", None)
BYTE = _predefined("BYTE", np.uint8)
CHAR = _predefined("CHAR", np.int8)
SIGNED_CHAR = _predefined("SIGNED_CHAR", np.int8)
UNSIGNED_CHAR = _predefined("UNSIGNED_CHAR", np.uint8)
SHORT = _predefined("SHORT", np.short)
UNSIGNED_SHORT = _predefined("UNSIGNED_SHORT", np.ushort)
INT = _predefined("INT", np.intc)
UNSIGNED = _predefined("UNSIGNED", np.uintc)
LONG = _predefined("LONG", np.int_)
UNSIGNED_LONG = _predefined("UNSIGNED_LONG", np.uint)
LONG_LONG = _predefined("LONG_LONG", np.longlong)
UNSIGNED_LONG_LONG = _predefined("UNSIGNED_LONG_LONG", np.ulonglong)
INT8_T = _predefined("INT8_T", np.int8)
INT16_T = _predefined("INT16_T", np.int16)
INT32_T = _predefined("INT32_T", np.int32)
INT64_T = _predefined("INT64_T", np.int64)
UINT8_T = _predefined("UINT8_T", np.uint8)
UINT16_T = _predefined("UINT16_T", np.uint16)
UINT32_T = _predefined("UINT32_T", np.uint32)
UINT64_T = _predefined("UINT64_T", np.uint64)
FLOAT = _predefined("FLOAT", np.float32)
DOUBLE = _predefined("DOUBLE", np.float64)
C_BOOL = _predefined("C_BOOL", np.bool_)
BOOL = _predefined("BOOL", np.bool_)
C_FLOAT_COMPLEX = _predefined("C_FLOAT_COMPLEX", np.complex64)
C_DOUBLE_COMPLEX = _predefined("C_DOUBLE_COMPLEX", np.complex128)
COMPLEX = _predefined("COMPLEX", np.complex64)
DOUBLE_COMPLEX = _predefined("DOUBLE_COMPLEX", np.complex128)

UNSIGNED_INT = UNSIGNED
WCHAR = _predefined("WCHAR", np.int32)
PACKED = _predefined("PACKED", np.uint8)
AINT = _predefined("AINT", np.intp)
OFFSET = _predefined("OFFSET", np.int64)
COUNT = _predefined("COUNT", np.int64)
FLOAT16_T = _predefined("FLOAT16_T", np.float16)
FLOAT32_T = _predefined("FLOAT32_T", np.float32)
FLOAT64_T = _predefined("FLOAT64_T", np.float64)
C_COMPLEX = C_FLOAT_COMPLEX
CXX_BOOL = _predefined("CXX_BOOL", np.bool_)
CXX_FLOAT_COMPLEX = _predefined("CXX_FLOAT_COMPLEX", np.complex64)
CXX_DOUBLE_COMPLEX = _predefined("CXX_DOUBLE_COMPLEX", np.complex128)
CHARACTER = _predefined("CHARACTER", np.int8)
LOGICAL = _predefined("LOGICAL", np.int32)
INTEGER = _predefined("INTEGER", np.int32)
REAL = _predefined("REAL", np.float32)
DOUBLE_PRECISION = _predefined("DOUBLE_PRECISION", np.float64)
LOGICAL1, LOGICAL2, LOGICAL4, LOGICAL8 = (_predefined(f"LOGICAL{n}", f"i{n}") for n in (1, 2, 4, 8))
INTEGER1, INTEGER2, INTEGER4, INTEGER8 = (_predefined(f"INTEGER{n}", f"i{n}") for n in (1, 2, 4, 8))
REAL2, REAL4, REAL8 = (_predefined(f"REAL{n}", f"f{n}") for n in (2, 4, 8))
COMPLEX8, COMPLEX16 = (_predefined(f"COMPLEX{n}", f"c{n}") for n in (8, 16))
LONG_DOUBLE = _predefined("LONG_DOUBLE", np.longdouble)
C_LONG_DOUBLE_COMPLEX = LONG_DOUBLE_COMPLEX = _predefined("C_LONG_DOUBLE_COMPLEX", np.clongdouble)
CXX_LONG_DOUBLE_COMPLEX = _predefined("CXX_LONG_DOUBLE_COMPLEX", np.clongdouble)
# the collectives carry none of these: DATATYPE_NULL, as in mpi4py on an MPI without them
REAL16 = COMPLEX4 = COMPLEX32 = INTEGER16 = LOGICAL16 = DATATYPE_NULL
UB = LB = DATATYPE_NULL


@cache
def _bfloat16_t() -> Datatype:
    """``BFLOAT16_T``, made on first use: its dtype comes from ``ml_dtypes``, slow to import (``..dtypes``)."""
    return _predefined("BFLOAT16_T", load_bfloat16())


def __getattr__(name: str) -> Datatype:
    if name == "BFLOAT16_T":
        return _bfloat16_t()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_PAIRS: list[tuple[Datatype, Datatype]] = []  # (a pair type, the type of its value)


def pair_value(datatype: Datatype) -> Datatype | None:
    """The value's type of a MINLOC/MAXLOC pair type (``DOUBLE`` for ``DOUBLE_INT``), else ``None``."""
    return next((value for pair, value in _PAIRS if datatype.origin is pair), None)


def _pair(name: str, value: Datatype) -> Datatype:
    """The pair type ``name``: a ``value`` and an ``int`` index laid out as C lays out
    ``struct {value; int index;}`` (the index at the next multiple of 4 bytes, the extent padded to
    the stricter alignment of the two); predefined and named, as in MPI."""
    record = np.dtype([("value", value.dtype), ("index", np.intc)], align=True)
    layout = derived.aligned(derived.merged([(value.typemap, 1, 0), (INT.typemap, 1, record.fields["index"][1])]))
    made = constant(Datatype(layout.basic, f"MPI_{name}", layout.size // layout.basic.itemsize, COMBINER_NAMED,
                             layout))
    _NAMED[made.name] = made
    _PAIRS.append((made, value))
    return made


SHORT_INT = _pair("SHORT_INT", SHORT)
INT_INT = TWOINT = _pair("2INT", INT)
LONG_INT = _pair("LONG_INT", LONG)
FLOAT_INT = _pair("FLOAT_INT", FLOAT)
DOUBLE_INT = _pair("DOUBLE_INT", DOUBLE)
LONG_DOUBLE_INT = _pair("LONG_DOUBLE_INT", LONG_DOUBLE)

_BY_CODE = {
    "c": CHAR, "b": SIGNED_CHAR, "h": SHORT, "i": INT, "l": LONG, "q": LONG_LONG, "B": UNSIGNED_CHAR,
    "H": UNSIGNED_SHORT, "I": UNSIGNED, "L": UNSIGNED_LONG, "Q": UNSIGNED_LONG_LONG, "f": FLOAT, "d": DOUBLE,
    "g": LONG_DOUBLE, "?": C_BOOL, "F": C_FLOAT_COMPLEX, "D": C_DOUBLE_COMPLEX, "G": C_LONG_DOUBLE_COMPLEX,
    "e": FLOAT16_T, "p": AINT, "P": UNSIGNED_LONG, "u": WCHAR,
    "i1": INT8_T, "i2": INT16_T, "i4": INT32_T, "i8": INT64_T, "u1": UINT8_T, "u2": UINT16_T, "u4": UINT32_T,
    "u8": UINT64_T, "f2": FLOAT16_T, "f4": FLOAT32_T, "f8": FLOAT64_T, "c8": C_FLOAT_COMPLEX,
    "c16": C_DOUBLE_COMPLEX, "b1": C_BOOL,
}
_BY_CODE.setdefault(f"f{LONG_DOUBLE.size}", LONG_DOUBLE)  # "f16" where long double is not double
_BY_CODE.setdefault(f"c{C_LONG_DOUBLE_COMPLEX.size}", C_LONG_DOUBLE_COMPLEX)


_MATCHING = {
    **{(TYPECLASS_INTEGER, n): t for n, t in ((1, INTEGER1), (2, INTEGER2), (4, INTEGER4), (8, INTEGER8))},
    **{(TYPECLASS_LOGICAL, n): t for n, t in ((1, LOGICAL1), (2, LOGICAL2), (4, LOGICAL4), (8, LOGICAL8))},
    **{(TYPECLASS_REAL, n): t for n, t in ((2, REAL2), (4, REAL4), (8, REAL8))},
    **{(TYPECLASS_COMPLEX, n): t for n, t in ((8, COMPLEX8), (16, COMPLEX16))},
}
