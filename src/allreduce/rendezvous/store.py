"""What a store is: the :class:`Store` interface, the meaning of each request, and two simple stores.

Every store speaks the same six requests (:mod:`.storewire`): set, get, add, wait, check, delete.
:class:`Store` turns its public methods into request messages and the answers back into values or
errors; a store class only says how a request is answered (:meth:`Store.execute`), and
:func:`apply_request` holds what each request means, so the in-memory store here, the TCP server
(:mod:`.storeserver`) and the file store (:mod:`.filestore`) cannot drift apart. A get or wait whose
keys are missing is parked until a later change sets them or its deadline passes, when it is
answered :class:`~.storewire.TimedOut` and the caller gets a :class:`CommTimeout` naming the keys.

This module changes when the store's semantics do; how the requests travel is elsewhere
(:mod:`.tcpstore` and :mod:`.storeserver` over TCP, :mod:`.filestore` through a shared file).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from allreduce.errors import CommTimeout, RendezvousError
from allreduce.rendezvous import storewire as wire
from allreduce.settings import DEFAULT_TIMEOUT


def apply_request(data: dict[str, bytes], request: wire.Request) -> wire.Response | None:
    """Apply ``request`` to ``data`` and return the answer, or ``None`` while a get/wait must wait.

    Counters are stored as decimal ASCII, so ``get`` of a counter reads e.g. ``b"3"``.
    """
    if isinstance(request, wire.Set):
        data[request.key] = request.value
        return wire.Ok()
    if isinstance(request, wire.Get):
        value = data.get(request.key)
        return None if value is None else wire.Value(value)
    if isinstance(request, wire.Add):
        try:
            count = int(data.get(request.key, b"0").decode("ascii")) + request.amount
        except (UnicodeDecodeError, ValueError):
            return wire.Failed(f"add({request.key!r}): the key holds a value that is not a counter")
        if not wire.I64_MIN <= count <= wire.I64_MAX:
            return wire.Failed(f"add({request.key!r}): the counter would overflow 64 bits")
        data[request.key] = str(count).encode("ascii")
        return wire.Count(count)
    if isinstance(request, wire.Wait):
        return wire.Ok() if all(key in data for key in request.keys) else None
    if isinstance(request, wire.Check):
        return wire.Flag(all(key in data for key in request.keys))
    return wire.Flag(data.pop(request.key, None) is not None)


def timed_out(data: dict[str, bytes], request: wire.Get | wire.Wait) -> wire.TimedOut:
    """The answer to a get or wait whose deadline passed: the keys still missing."""
    keys = (request.key,) if isinstance(request, wire.Get) else request.keys
    return wire.TimedOut(tuple(key for key in keys if key not in data))


def deadline(request: wire.Request) -> float:
    """The monotonic time by which a get or wait must be answered (now, for the other requests)."""
    return time.monotonic() + getattr(request, "timeout_ms", 0) / 1000


class Store:
    """A key-value store shared by the ranks of one job (torch's ``Store`` on bytes).

    Safe to share between threads. ``timeout`` is the default wait of ``get`` and ``wait``, in seconds
    (default: the group's timeout, 10 minutes). Methods raise :class:`RendezvousError` once the store
    is closed, and the TCP store raises :class:`PeerLost` if its server goes away.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        if not 0 < timeout < math.inf:
            raise ValueError(f"store timeout must be a positive, finite number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._closed = False

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing any previous value and releasing its waiters."""
        value = bytes(value)
        if len(value) > wire.MAX_VALUE:
            raise ValueError(f"store value of {len(value)} bytes is over the {wire.MAX_VALUE}-byte limit")
        self._call(wire.Set(_key(key), value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds (default ``self.timeout``) for it.

        Raises:
            CommTimeout: the key was not set in time; the message names it.
        """
        return self._call(wire.Get(_key(key), self._timeout_ms(timeout))).value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key`` (created at 0); return the new count.

        Example: two ranks each call ``store.add("joined", 1)``; one gets 1, the other 2.

        Raises:
            ValueError: ``key`` holds a value that is not a counter, or the count would overflow.
        """
        if not isinstance(amount, int) or not wire.I64_MIN <= amount <= wire.I64_MAX:
            raise ValueError(f"add amount must be a 64-bit int, got {amount!r}")
        return self._call(wire.Add(_key(key), amount)).count

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Return once every key is set, waiting up to ``timeout`` seconds (default ``self.timeout``).

        Raises:
            CommTimeout: some keys were not set in time; the message lists them.
        """
        self._call(wire.Wait(_keys(keys), self._timeout_ms(timeout)))

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key is set, without waiting."""
        return self._call(wire.Check(_keys(keys))).flag

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; return whether it was there."""
        return self._call(wire.Delete(_key(key))).flag

    def prefix(self, prefix: str) -> "Store":
        """A view of this store whose keys are ``prefix + "/" + key`` (for subgroups, later rounds)."""
        return PrefixStore(prefix, self)

    @property
    def base(self) -> "Store":
        """The store this one is a view of (itself unless it is a prefix view)."""
        return self

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; a closed store refuses every request."""
        return self._closed

    def close(self) -> None:
        """Release this store's connections (and, on the rank that hosts it, the server)."""
        self._closed = True

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def execute(self, request: wire.Request) -> wire.Response:
        """Answer ``request``, waiting as a get or wait requires; never ``None``.

        The one method a store class implements. Callers use the methods above, which check their
        arguments, refuse once the store is closed and turn the answer into a value or an error.
        """
        raise NotImplementedError

    def _answer(self, request: wire.Request) -> wire.Response:
        if self._closed:
            raise RendezvousError(f"{self!r} is closed")
        return self.execute(request)

    def _call(self, request: wire.Request) -> wire.Response:
        response = self._answer(request)
        if isinstance(response, wire.TimedOut):
            missing = listing(map(repr, response.missing))
            raise CommTimeout(f"{self!r}: {_describe(request)} timed out after "
                              f"{request.timeout_ms / 1000:g}s; still missing: {missing}")
        if isinstance(response, wire.Failed):
            raise ValueError(f"{self!r}: {response.message}")
        return response

    def _timeout_ms(self, timeout: float | None) -> int:
        seconds = self.timeout if timeout is None else timeout
        if not seconds >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        return min(math.ceil(seconds * 1000), wire.MAX_TIMEOUT_MS)


def _key(key: str) -> str:
    wire.check_key(key)
    return key


def _keys(keys: Iterable[str]) -> tuple[str, ...]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of str, not a single key")
    return tuple(_key(key) for key in keys)


def _describe(request: wire.Get | wire.Wait) -> str:
    if isinstance(request, wire.Get):
        return f"get({request.key!r})"
    return f"wait for {len(request.keys)} keys"


def listing(items: Iterable[str], shown: int = 8) -> str:
    """``items`` joined by commas, the first ``shown`` of them: ``"'a', 'b' and 3 more"``."""
    items = list(items)
    listed = ", ".join(items[:shown])
    return listed + (f" and {len(items) - shown} more" if len(items) > shown else "")


class PrefixStore(Store):
    """A view of ``store`` whose keys are ``prefix/key``. Closing the view leaves ``store`` open."""

    def __init__(self, prefix: str, store: Store):
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"store prefix must be a non-empty str, got {prefix!r}")
        super().__init__(store.timeout)
        self._prefix = prefix + "/"
        self._store = store

    def __repr__(self) -> str:
        return f"PrefixStore({self._prefix[:-1]!r}, {self._store!r})"

    @property
    def base(self) -> Store:
        return self._store.base

    def execute(self, request: wire.Request) -> wire.Response:
        if isinstance(request, (wire.Wait, wire.Check)):
            request = replace(request, keys=tuple(self._prefix + key for key in request.keys))
        else:
            request = replace(request, key=self._prefix + request.key)
        return self._store._answer(request)


class HashStore(Store):
    """A store in this process's memory: for threads standing in for ranks, and world size 1."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._data: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"HashStore(<{len(self._data)} keys>)"

    def execute(self, request: wire.Request) -> wire.Response:
        due = deadline(request)
        with self._changed:
            while (response := apply_request(self._data, request)) is None:
                remaining = due - time.monotonic()
                if remaining <= 0:
                    return timed_out(self._data, request)
                self._changed.wait(remaining)
            if isinstance(request, wire.MUTATIONS):
                self._changed.notify_all()
            return response
