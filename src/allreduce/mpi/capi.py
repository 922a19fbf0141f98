"""mpi4py's C API, ``MPI.__pyx_capi__``: for each handle class a C function that makes a handle object
of an MPI handle, and one that gives the address of an object's MPI handle.

A C extension written against mpi4py imports ``PyMPI<Class>_New`` (``PyObject *(MPI_<Class>)``) and
``PyMPI<Class>_Get`` (``MPI_<Class> *(PyObject *)``) from this dict of PyCapsules, each named by its
C signature. Here an MPI handle is the number ``obj.handle`` (:mod:`.handles`) and a status its
fields' memory, so each function is a ctypes callback into Python, made once and kept alive by this
module, as the capsules hold only their pointers and names. ``Get`` answers ``MPI._addressof(obj)``,
memory that holds the object's handle number; ``New`` makes another handle of the object a number
names (``Klass.fromhandle``), or for a status a copy of the fields at an address. A callback that
raises (no live handle has that number) reports the error as unraisable and returns ``NULL``.
"""

from __future__ import annotations

import ctypes

from .comm import Comm
from .datatypes import Datatype
from .groups import Group
from .handles import addressof
from .info import Errhandler, Info
from .messages import Message
from .reductions import Op
from .refused import File, Session, Win
from .requests import Grequest, Prequest, Request
from .status import Status

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_GET = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)  # MPI_<Class> *(PyObject *)
_NEW = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_uint64)  # PyObject *(MPI_<Class>)
_NEW_STATUS = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)  # PyObject *(MPI_Status *)

_alive: list = []  # the callbacks and the capsules' names: C code holds their addresses


def _capsule(function, signature: str):
    name = signature.encode()
    _alive.extend((function, name))
    return _new_capsule(ctypes.cast(function, ctypes.c_void_p), name, None)


def _status_of(address: int | None) -> Status:
    """A status holding a copy of the fields at ``address`` (an empty one for ``NULL``)."""
    status = Status()
    if address:
        fields = status.tomemory().cast("B")
        fields[:] = ctypes.string_at(address, fields.nbytes)
    return status


def _table() -> dict:
    capi = {"PyMPIStatus_New": _capsule(_NEW_STATUS(_status_of), "PyObject *(MPI_Status *)"),
            "PyMPIStatus_Get": _capsule(_GET(addressof), "MPI_Status *(PyObject *)")}
    for cls, getter in ((Datatype, None), (Request, None), (Prequest, "Request"), (Grequest, "Request"),
                        (Message, None), (Op, None), (Group, None), (Info, None), (Errhandler, None),
                        (Session, None), (Comm, None), (Win, None), (File, None)):
        name = cls.__name__
        capi[f"PyMPI{name}_New"] = _capsule(_NEW(cls.fromhandle), f"PyObject *(MPI_{getter or name})")
        if getter is None:
            capi[f"PyMPI{name}_Get"] = _capsule(_GET(addressof), f"MPI_{name} *(PyObject *)")
    return capi


CAPI = _table()
