"""MPI's ``Info`` (string hints, kept and ignored as MPI allows) and ``Errhandler`` handles.

Errors here always raise, whichever error handler a communicator is given: ``ERRORS_RETURN`` is
what mpi4py installs by default and what it turns into exceptions, so setting it changes nothing;
``ERRORS_ARE_FATAL`` is accepted and recorded.
"""

from __future__ import annotations

from .errorcodes import ERR_ERRHANDLER, ERR_INFO, ERR_INFO_KEY, ERR_INFO_NOKEY, error
from .handles import Handle, constant


class Info(Handle):
    """An ordered map of string keys to string values; ``Info()`` is ``INFO_NULL``."""

    def __init__(self, info: Info | None = None):
        if info is not None and not isinstance(info, Info):
            raise TypeError(f"Info() takes an Info, got {type(info).__name__}")
        self._items = info._items if info is not None else None

    @classmethod
    def Create(cls, items=None) -> Info:
        made = cls()
        made._items = {}
        for key, value in (dict(items) if items is not None else {}).items():
            made.Set(key, value)
        return made

    def _held(self) -> dict:
        if self._items is None:
            raise error(ERR_INFO, "the info is MPI.INFO_NULL")
        return self._items

    def Set(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not key or len(key) > 255:
            raise error(ERR_INFO_KEY, f"invalid info key {key!r}")
        self._held()[key] = str(value)

    def Get(self, key: str) -> str | None:
        return self._held().get(key)

    def Delete(self, key: str) -> None:
        if key not in self._held():
            raise error(ERR_INFO_NOKEY, f"no info key {key!r}")
        del self._items[key]

    def Get_nkeys(self) -> int:
        return len(self._held())

    def Get_nthkey(self, n: int) -> str:
        keys = list(self._held())
        if not 0 <= n < len(keys):
            raise error(ERR_INFO_KEY, f"key number {n} of an info with {len(keys)} keys")
        return keys[n]

    def Dup(self) -> Info:
        return Info.Create(self._held())

    def Free(self) -> None:
        self._held()
        self._items = None

    def __bool__(self) -> bool:
        return self._items is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, Info) and (self._items is other._items)

    def _shared(self):
        return self._items

    def _is_predefined(self) -> bool:
        return self._items is INFO_ENV._items

    def _release(self) -> None:
        self._items = None

    def __len__(self) -> int:
        return 0 if self._items is None else len(self._items)

    def __contains__(self, key) -> bool:
        return self._items is not None and key in self._items

    def __iter__(self):
        return iter(() if self._items is None else list(self._items))

    def __getitem__(self, key: str) -> str:
        if key not in self:
            raise KeyError(key)
        return self._items[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.Set(key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        del self._items[key]

    def get(self, key: str, default=None):
        return self._items.get(key, default) if self._items is not None else default

    def keys(self):
        return list(self)

    def values(self):
        return [self._items[k] for k in self]

    def items(self):
        return [(k, self._items[k]) for k in self]

    def copy(self) -> Info:
        return self.Dup()

    def clear(self) -> None:
        self._held().clear()

    def __reduce__(self):
        if self is INFO_NULL:
            return _info_null, ()
        return (type(self), ()) if self._items is None else (type(self).Create, (dict(self._items),))


def _info_null() -> Info:
    return INFO_NULL


INFO_NULL = constant(Info())
INFO_ENV = constant(Info.Create())


class Errhandler(Handle):
    """What a communicator does with an error: here every error raises, whichever is set."""

    def __init__(self, errhandler: Errhandler | None = None, name: str | None = None):
        if errhandler is not None and not isinstance(errhandler, Errhandler):
            raise TypeError(f"Errhandler() takes an Errhandler, got {type(errhandler).__name__}")
        self.name = errhandler.name if errhandler is not None else name

    def __bool__(self) -> bool:
        return self.name is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, Errhandler) and self.name == other.name

    def _shared(self):
        return _PREDEFINED_HANDLERS.get(self.name)

    def _is_predefined(self) -> bool:
        return True  # every error handler here is one of MPI's

    def _release(self) -> None:
        self.name = None

    def __reduce__(self):
        predefined = _PREDEFINED_HANDLERS.get(self.name)
        if self is ERRHANDLER_NULL or self is predefined:
            return _errhandler, (self.name,)
        return (type(self), ()) if predefined is None else (type(self), (predefined,))

    def Free(self) -> None:
        """This handle becomes ``ERRHANDLER_NULL`` (the predefined handlers stay what they are).

        Raises:
            MPI.Exception: ``ERR_ERRHANDLER`` for ``ERRHANDLER_NULL``.
        """
        if not self:
            raise error(ERR_ERRHANDLER, "MPI.ERRHANDLER_NULL cannot be freed")
        if all(self is not handler for handler in _PREDEFINED_HANDLERS.values()):
            self.name = None


def _errhandler(name: str | None) -> Errhandler:
    return _PREDEFINED_HANDLERS.get(name, ERRHANDLER_NULL)


ERRHANDLER_NULL = constant(Errhandler())
ERRORS_RETURN = constant(Errhandler(name="ERRORS_RETURN"))
ERRORS_ARE_FATAL = constant(Errhandler(name="ERRORS_ARE_FATAL"))
ERRORS_ABORT = constant(Errhandler(name="ERRORS_ABORT"))
_PREDEFINED_HANDLERS = {h.name: h for h in (ERRORS_RETURN, ERRORS_ARE_FATAL, ERRORS_ABORT)}
