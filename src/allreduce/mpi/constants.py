"""MPI's address constants as mpi4py shows them: ``BOTTOM``, ``IN_PLACE`` and ``BUFFER_AUTOMATIC``.

Each is a singleton that stands for an address (``int(MPI.BOTTOM) == 0``): it compares and hashes
as that number, converts to it (``int``, ``operator.index``), exports a buffer of no bytes and no
owner, refuses arithmetic, and pickles as its name. ``BOTTOM`` is the base of absolute addresses,
``IN_PLACE`` says a collective's receive buffer also holds the input, ``BUFFER_AUTOMATIC`` is the
buffer of buffered sends that MPI itself provides.
"""

from __future__ import annotations

from .. import native


class _Constant(native.exporter_base()):
    """One of MPI's address constants: ``type(constant)()`` is the constant itself."""

    _instance: _Constant | None = None
    _name = ""
    _address = 0

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __int__(self) -> int:
        return self._address

    __index__ = __int__

    def __eq__(self, other) -> bool:
        if isinstance(other, _Constant):
            return self is other
        if isinstance(other, int) and not isinstance(other, bool):
            return other == self._address
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._address)

    def __bool__(self) -> bool:
        return bool(self._address)

    def __buffer__(self, flags: int):
        return None  # no bytes, no owner (the compiled base exports that)

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


class BottomType(_Constant):
    _name, _address = "BOTTOM", 0


class InPlaceType(_Constant):
    _name, _address = "IN_PLACE", 1


class BufferAutomaticType(_Constant):
    _name, _address = "BUFFER_AUTOMATIC", 0


BOTTOM, IN_PLACE, BUFFER_AUTOMATIC = BottomType(), InPlaceType(), BufferAutomaticType()
