"""``MPI.Pickle``: how objects become bytes for the lower-case methods, and how mpi4py.util.pkl5
splits one into a pickle stream and its out-of-band buffers.

As in mpi4py: ``Pickle(dumps, loads, protocol, threshold)`` (pickle at its highest protocol by
default; ``protocol=None`` with a ``dumps`` of one's own calls it without a protocol, as json or yaml
want); ``dumps_oob`` pickles at protocol 5 or above and hands every contiguous buffer of at least
``THRESHOLD`` bytes (0.25 MiB unless set) out of band, as an :class:`MPI.buffer` of its memory (no
copy), and ``loads_oob`` takes the stream and those buffers back.
"""

from __future__ import annotations

import pickle as _pickle

from .memory import buffer

DEFAULT_THRESHOLD = 1024 ** 2 // 4  # bytes: smaller buffers stay inside the pickle stream


class Pickle:
    """Serialize and deserialize Python objects (mpi4py's ``MPI.Pickle``)."""

    def __init__(self, dumps=None, loads=None, protocol: int | None = None, threshold: int | None = None):
        self._dumps = _pickle.dumps if dumps is None else dumps
        self._loads = _pickle.loads if loads is None else loads
        self.PROTOCOL = protocol
        self.THRESHOLD = threshold

    @property
    def PROTOCOL(self) -> int | None:
        """The protocol ``dumps`` is called with (``None``: called without one)."""
        return self._protocol

    @PROTOCOL.setter
    def PROTOCOL(self, protocol: int | None) -> None:
        if protocol is None and self._dumps is _pickle.dumps:
            protocol = _pickle.HIGHEST_PROTOCOL
        self._protocol = protocol

    @property
    def THRESHOLD(self) -> int:
        """The size in bytes from which ``dumps_oob`` hands a buffer out of band (``None`` sets the default)."""
        return self._threshold

    @THRESHOLD.setter
    def THRESHOLD(self, threshold: int | None) -> None:
        self._threshold = DEFAULT_THRESHOLD if threshold is None else int(threshold)

    def dumps(self, obj) -> bytes:
        return self._dumps(obj) if self._protocol is None else self._dumps(obj, self._protocol)

    def loads(self, data):
        return self._loads(data)

    def dumps_oob(self, obj) -> tuple[bytes, list[buffer]]:
        """The pickle stream of ``obj`` and, in order, the buffers it left out of band."""
        protocol = _pickle.HIGHEST_PROTOCOL if self._protocol is None else self._protocol
        out_of_band: list[buffer] = []

        def keep_in_band(picklebuffer: _pickle.PickleBuffer) -> bool:
            raw = picklebuffer.raw()  # one-dimensional bytes, whichever order the array keeps them in
            if raw.nbytes < self._threshold:
                return True
            out_of_band.append(buffer(raw))
            return False

        return self._dumps(obj, max(protocol, 5), buffer_callback=keep_in_band), out_of_band

    def loads_oob(self, data, buffers):
        """The object of a stream from :meth:`dumps_oob` and its out-of-band buffers."""
        return self._loads(data, buffers=buffers)


pickle = Pickle()
