"""The handle classes of MPI features this library does not offer: one-sided communication (``Win``),
MPI-IO (``File``) and MPI-4 sessions (``Session``).

The classes and their null handles exist, as in mpi4py on an MPI without the feature, so code
that names them (``MPI.WIN_NULL``, ``isinstance(x, MPI.Win)``) imports and runs; making one
(``Win.Create``, ``File.Open``, ``Session.Init``...) raises ``NotImplementedError`` naming the
feature, and every method of a null handle raises ``MPI.Exception`` with the feature's error class.
"""

from __future__ import annotations

from .errorcodes import ERR_FILE, ERR_SESSION, ERR_WIN, error
from .handles import Handle


class _Refused(Handle):
    """A null handle of a feature that is not offered."""

    feature = ""  # what the feature is called
    error_class = 0  # MPI's error class for a null handle of it
    makers: tuple[str, ...] = ()  # the class methods that would make a handle

    def __init__(self, handle: _Refused | None = None):
        kind = next(c for c in type(self).__mro__ if _Refused in c.__bases__)  # Win, File or Session
        if handle is not None and not isinstance(handle, kind):
            raise TypeError(f"{type(self).__name__}() takes a {kind.__name__}, got {type(handle).__name__}")

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        kind = next(c for c in type(self).__mro__ if _Refused in c.__bases__)
        return isinstance(other, kind)

    def _shared(self):
        return None  # only null handles exist

    def __reduce__(self):
        null = f"{type(self).__name__.upper()}_NULL"
        return null if self is globals().get(null) else (type(self), ())

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def null(*args, **kwargs):
            raise error(self.error_class, f"{type(self).__name__}.{name} of a null handle: {self.feature} is not "
                                          "supported by allreduce.MPI")
        return null


def _maker(cls, name: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(f"{cls.__name__}.{name}: {cls.feature} is not supported by allreduce.MPI")
    refused.__name__ = name
    return staticmethod(refused)


class Win(_Refused):
    feature, error_class = "one-sided communication (MPI.Win)", ERR_WIN
    makers = ("Create", "Allocate", "Allocate_shared", "Create_dynamic")


class File(_Refused):
    feature, error_class = "MPI-IO (MPI.File)", ERR_FILE
    makers = ("Open",)


class Session(_Refused):
    feature, error_class = "MPI-4 sessions (MPI.Session)", ERR_SESSION
    makers = ("Init",)


for _cls in (Win, File, Session):
    for _name in _cls.makers:
        setattr(_cls, _name, _maker(_cls, _name))

WIN_NULL, FILE_NULL, SESSION_NULL = Win(), File(), Session()
