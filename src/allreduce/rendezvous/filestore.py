"""A store on a shared file, for ``file://`` rendezvous on one host or a shared filesystem.

The file is an append-only log of the requests that changed the store (set, add, delete), each as
the frame :mod:`.storewire` would send over TCP. Every process replays the log into a dict as it
grows, reading only the bytes added since it last looked, and answers from the dict with the same
:func:`~.store.apply_request` as the other stores. A change is appended under an exclusive
``flock`` after catching up with the log, so counters stay atomic across processes; reads take a
shared lock, so they never see half a record. A get or wait that must wait polls, sleeping 1 ms at
first and up to 50 ms.

The file outlives the job, as torch's does, and a later job must not find it: remove it after the
job (the launcher, or the last rank through :meth:`FileStore.cleanup` once all are done). A stale
file shows up at the next rendezvous as more ranks joined than the world size.
POSIX only (``fcntl``); on a network filesystem, ``flock`` must be supported across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time

from ..errors import ProtocolError, RendezvousError
from ..settings import DEFAULT_TIMEOUT
from . import storewire
from .contents import Contents
from .store import Store, apply_request, deadline, timed_out

_FIRST_PAUSE = 0.001  # seconds between the first polls of a waiting get
_LAST_PAUSE = 0.05  # the longest pause between polls


class FileStore(Store):
    """A store kept in the file at ``path`` (created if missing), shared by every process that opens it.

    ``timeout`` is the default wait of ``get`` and ``wait`` (default: the group's timeout, 10 minutes).

    Example (two ranks on one host)::

        rank 0: store = FileStore("/shared/job42.store", timeout=60); store.set("hello", b"hi")
        rank 1: store = FileStore("/shared/job42.store", timeout=60); store.get("hello") -> b"hi"

    Raises:
        RendezvousError: the file cannot be opened, or it is not a store log (corrupt or foreign).
    """

    def __init__(self, path: str | os.PathLike, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise RendezvousError(f"cannot open the store file {self.path} ({exc}); file:// needs a path "
                                  f"every rank can create or open for writing") from exc
        self._lock = threading.Lock()  # flock does not exclude threads sharing this descriptor
        self._data = Contents()
        self._decoder = storewire.RequestDecoder()
        self._offset = 0  # bytes of the log replayed into _data

    def __repr__(self) -> str:
        return f"FileStore({self.path})"

    def close(self) -> None:
        if not self.closed:
            super().close()
            os.close(self._fd)

    def cleanup(self) -> None:
        """Close the store and delete its file; call it once, when every rank is done with the store."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def execute(self, request: storewire.Request) -> storewire.Response:
        due = deadline(request)
        changes = isinstance(request, storewire.MUTATIONS)
        pause = _FIRST_PAUSE
        while True:
            with self._lock, _flocked(self._fd, exclusive=changes):
                self._catch_up()
                response = apply_request(self._data, request)
                if response is not None and changes and not isinstance(response, storewire.Failed):
                    self._append(storewire.encode(request))
                if response is None and time.monotonic() >= due:
                    response = timed_out(self._data, request)
            if response is not None:
                return response
            time.sleep(min(pause, max(due - time.monotonic(), 0.0)))
            pause = min(pause * 2, _LAST_PAUSE)

    def _catch_up(self) -> None:
        """Replay the records other processes appended since the last look."""
        size = os.fstat(self._fd).st_size
        while self._offset < size:
            data = os.pread(self._fd, size - self._offset, self._offset)
            if not data:  # truncated under us
                break
            self._offset += len(data)
            try:
                records = self._decoder.feed(data)
            except ProtocolError as exc:
                raise RendezvousError(f"{self.path} is not a store file, or it is corrupt ({exc}); "
                                      f"remove it and start the job again") from exc
            for record in records:
                apply_request(self._data, record)

    def _append(self, record: bytes) -> None:
        """Append ``record`` (already applied to the dict) to the log; the lock is held and caught up."""
        view = memoryview(record)
        while view:
            view = view[os.write(self._fd, view):]
        self._offset += len(record)


@contextlib.contextmanager
def _flocked(fd: int, exclusive: bool):
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
