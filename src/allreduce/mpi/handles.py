"""mpi4py's object model of handles, shared by every handle class (``Comm``, ``Datatype``, ``Op``...).

An MPI object is reached through handles: Python objects that name it. As in mpi4py:

- ``Klass(obj)`` is another handle of ``obj``'s object (equal to it, not it); handles are unhashable,
  since what a handle names changes when it is freed;
- ``obj.handle`` is a number naming the object (``0`` for the null handle), read-only, and
  ``Klass.fromhandle(number)`` makes another handle of it, while some handle of it is alive;
- ``obj.free()`` frees what the handle names, except a predefined object (``MPI.INT``,
  ``MPI.COMM_WORLD``...): the module's constants stay as they are, and another handle of a
  predefined object just becomes null; freeing a null handle does nothing.

A class says what its handles share (``_shared``), whether that is predefined (``_is_predefined``)
and how one handle becomes null (``_release``).
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from .status import Status

_CONSTANTS: list = []  # the module's predefined handles themselves (freeing them does nothing)
_NAMED: weakref.WeakValueDictionary[int, Handle] = weakref.WeakValueDictionary()  # handle -> a live handle of it
HANDLE_SIZE = 8  # bytes of a handle, what MPI._sizeof answers for every handle class


def constant(handle):
    """Mark ``handle`` as one of the module's predefined handles; returns it."""
    _CONSTANTS.append(handle)
    return handle


class Handle:
    """The part of mpi4py's object model every handle class shares (see the module docstring)."""

    __hash__ = None

    def _shared(self):
        """What every handle of this object holds (``None``: a null handle)."""
        raise NotImplementedError

    def _is_predefined(self) -> bool:
        return False

    def _release(self) -> None:
        """Make this handle (this Python object alone) null."""
        raise NotImplementedError

    @property
    def handle(self) -> int:
        shared = self._shared()
        if shared is None:
            return 0
        _NAMED[id(shared)] = self
        return id(shared)

    @classmethod
    def fromhandle(cls, handle: int):
        """Another handle of the object ``handle`` names (``0``: the null handle).

        Raises:
            ValueError: no live handle names it.
        """
        if int(handle) == 0:
            return cls()
        found = _NAMED.get(int(handle))
        if found is None or found._shared() is None or id(found._shared()) != int(handle):
            raise ValueError(f"{cls.__name__}.fromhandle: no live {cls.__name__} has the handle {handle}")
        return cls(found)

    def toint(self) -> int:
        """MPI's integer handle: ``-1``, none, as mpi4py answers where MPI has none (a handle here is a
        Python object that no other process or language reads); :attr:`handle` names it in this one."""
        return -1

    def py2f(self) -> int:
        """The Fortran handle: ``-1``, none (see :meth:`toint`)."""
        return -1

    def free(self) -> None:
        """Free what this handle names, unless it is predefined (see the module docstring)."""
        if self._shared() is None or any(self is c for c in _CONSTANTS):
            return
        if not self._is_predefined():
            self.Free()
        if self._shared() is not None:
            self._release()


def sizeof(arg) -> int:
    """mpi4py's ``MPI._sizeof``: the size in bytes of a handle (or of a ``Status``) of a class or object.

    Raises:
        TypeError: not a handle, a Status or their class.
    """
    cls = arg if isinstance(arg, type) else type(arg)
    if issubclass(cls, Status):
        return Status.NBYTES
    if issubclass(cls, Handle):
        return HANDLE_SIZE
    raise TypeError(f"expecting an MPI handle or its class, got {type(arg).__name__}")


_CELLS: dict[int, ctypes.c_uint64] = {}  # id of a live handle -> the memory MPI._addressof gave for it


def addressof(obj) -> int:
    """mpi4py's ``MPI._addressof``: where the handle (or status) lives, memory that C code reads as an
    MPI handle (``MPI.__pyx_capi__``): a cell holding the handle's number, the object's own for as long
    as it lives (its number written again at each call); a Status's fields.

    Raises:
        TypeError: not a handle or a Status.
    """
    sizeof(type(obj))
    if not isinstance(obj, Handle):
        return np.frombuffer(obj.tomemory(), np.uint8).ctypes.data
    cell = _CELLS.get(id(obj))
    if cell is None:
        cell = _CELLS[id(obj)] = ctypes.c_uint64()
        weakref.finalize(obj, _CELLS.pop, id(obj), None)
    cell.value = obj.handle
    return ctypes.addressof(cell)


def handleof(obj) -> int:
    """mpi4py's ``MPI._handleof``: the handle's number (a Status's address, as MPI passes a status).

    Raises:
        TypeError: not a handle or a Status.
    """
    sizeof(type(obj))
    return obj.handle if isinstance(obj, Handle) else addressof(obj)
