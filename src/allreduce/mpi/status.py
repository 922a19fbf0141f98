"""MPI's ``Status``: where a received message came from, its tag, its error and its size, in the
fields C code reads through ``MPI._addressof``; and the envelope's wildcards (``ANY_SOURCE``...)."""

from __future__ import annotations

import numpy as np

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2
UNDEFINED = -32766
_SOURCE, _TAG, _ERROR, _NBYTES, _CANCELLED = range(5)


class Status:
    """Where a received message came from, its tag, its error and its size in bytes."""

    NBYTES = 24  # the size of an MPI_Status (what MPI._sizeof answers)

    def __init__(self, status: Status | None = None):
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status() takes a Status to copy, got {type(status).__name__}")
        self._fields = np.array([ANY_SOURCE, ANY_TAG, 0, 0, 0], np.int64) if status is None else status._fields.copy()

    def Get_source(self) -> int:
        return int(self._fields[_SOURCE])

    def Set_source(self, source: int) -> None:
        self._fields[_SOURCE] = source

    def Get_tag(self) -> int:
        return int(self._fields[_TAG])

    def Set_tag(self, tag: int) -> None:
        self._fields[_TAG] = tag

    def Get_error(self) -> int:
        return int(self._fields[_ERROR])

    def Set_error(self, error: int) -> None:
        self._fields[_ERROR] = error

    def Get_count(self, datatype=None) -> int:
        """Whole elements of ``datatype`` (default: bytes) in the message, ``UNDEFINED`` if not whole."""
        size = 1 if datatype is None else datatype.Get_size()
        nbytes = int(self._fields[_NBYTES])
        if size == 0:
            return 0 if nbytes == 0 else UNDEFINED
        return nbytes // size if nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype, count: int) -> None:
        self._fields[_NBYTES] = int(count) * (1 if datatype is None else datatype.Get_size())

    def Is_cancelled(self) -> bool:
        return bool(self._fields[_CANCELLED])

    def Set_cancelled(self, flag: bool) -> None:
        self._fields[_CANCELLED] = bool(flag)

    source = property(Get_source, Set_source)
    tag = property(Get_tag, Set_tag)
    error = property(Get_error, Set_error)
    cancelled = property(Is_cancelled, Set_cancelled)

    @property
    def count(self) -> int:
        return int(self._fields[_NBYTES])

    @count.setter
    def count(self, nbytes: int) -> None:
        self._fields[_NBYTES] = nbytes

    def tomemory(self) -> memoryview:
        """The status's fields as writable memory (MPI_Status's layout is the implementation's)."""
        return memoryview(self._fields)

    def __reduce__(self):
        return type(self), (), {"_fields": self._fields.copy()}

    def __eq__(self, other) -> bool:
        return isinstance(other, Status) and bool((self._fields == other._fields).all())

    __hash__ = None

    def fill(self, source: int, tag: int, nbytes: int) -> None:
        self._fields[:] = source, tag, 0, nbytes, 0

    def empty(self) -> None:
        """The status of an inactive request: any source, any tag, no error, nothing received."""
        self._fields[:] = ANY_SOURCE, ANY_TAG, 0, 0, 0
