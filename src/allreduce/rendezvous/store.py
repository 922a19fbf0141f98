"""What a store is: the :class:`Store` interface, the meaning of each request, and two simple stores.

Every store speaks the same six requests (:mod:`.storewire`): set, get, add, wait, check, delete.
:class:`Store` turns its public methods into request messages and the answers back into values or
errors; a store class only says how a request is answered (:meth:`Store.execute`), and
:func:`apply_request` holds what each request means, so the in-memory store here, the TCP server
(:mod:`.storeserver`) and the file store (:mod:`.filestore`) cannot drift apart. A get or wait whose
keys are missing is parked until a later change sets them or its deadline passes, when it is
answered :class:`~.storewire.TimedOut` and the caller gets a :class:`CommTimeout` naming the keys.
:meth:`Store.within` bounds every request of a caller, waits and the network alike, by one deadline:
the store calls of a collective end with it even when the store's host is frozen.

This module changes when the store's semantics do; how the requests travel is elsewhere
(:mod:`.tcpstore` and :mod:`.storeserver` over TCP, :mod:`.filestore` through a shared file).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from ..errors import CommTimeout, RendezvousError
from ..settings import DEFAULT_TIMEOUT
from . import storewire
from .contents import Contents


def apply_request(data: Contents, request: storewire.Request) -> storewire.Response | None:
    """Apply ``request`` to ``data`` and return the answer, or ``None`` while a get/wait must wait.

    Counters are stored as decimal ASCII, so ``get`` of a counter reads e.g. ``b"3"``. A change that
    would break the store's limits is answered :class:`~.storewire.Failed`, naming the limit.
    """
    if isinstance(request, storewire.Set):
        refusal = data.put(request.key, request.value)
        return storewire.Failed(f"set({request.key!r}): {refusal}") if refusal else storewire.Ok()
    if isinstance(request, storewire.Get):
        value = data.get(request.key)
        return None if value is None else storewire.Value(value)
    if isinstance(request, storewire.Add):
        try:
            count = int((data.get(request.key) or b"0").decode("ascii")) + request.amount
        except (UnicodeDecodeError, ValueError):
            return storewire.Failed(f"add({request.key!r}): the key holds a value that is not a counter")
        if not storewire.I64_MIN <= count <= storewire.I64_MAX:
            return storewire.Failed(f"add({request.key!r}): the counter would overflow 64 bits")
        refusal = data.put(request.key, str(count).encode("ascii"))
        return storewire.Failed(f"add({request.key!r}): {refusal}") if refusal else storewire.Count(count)
    if isinstance(request, storewire.Wait):
        return storewire.Ok() if all(key in data for key in request.keys) else None
    if isinstance(request, storewire.Check):
        return storewire.Flag(all(key in data for key in request.keys))
    return storewire.Flag(data.pop(request.key) is not None)


def timed_out(data: Contents, request: storewire.Get | storewire.Wait) -> storewire.TimedOut:
    """The answer to a get or wait whose deadline passed: the keys still missing."""
    keys = (request.key,) if isinstance(request, storewire.Get) else request.keys
    return storewire.TimedOut(tuple(key for key in keys if key not in data))


def deadline(request: storewire.Request) -> float:
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
        if len(value) > storewire.MAX_VALUE:
            raise ValueError(f"store value of {len(value)} bytes is over the {storewire.MAX_VALUE}-byte limit")
        self._call(storewire.Set(_key(key), value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds (default ``self.timeout``) for it.

        Raises:
            CommTimeout: the key was not set in time; the message names it.
        """
        return self._call(storewire.Get(_key(key), self._timeout_ms(timeout))).value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key`` (created at 0); return the new count.

        Example: two ranks each call ``store.add("joined", 1)``; one gets 1, the other 2.

        Raises:
            ValueError: ``key`` holds a value that is not a counter, or the count would overflow.
        """
        if not isinstance(amount, int) or not storewire.I64_MIN <= amount <= storewire.I64_MAX:
            raise ValueError(f"add amount must be a 64-bit int, got {amount!r}")
        return self._call(storewire.Add(_key(key), amount)).count

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Return once every key is set, waiting up to ``timeout`` seconds (default ``self.timeout``).

        Raises:
            CommTimeout: some keys were not set in time; the message lists them.
        """
        self._call(storewire.Wait(_keys(keys), self._timeout_ms(timeout)))

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key is set, without waiting."""
        return self._call(storewire.Check(_keys(keys))).flag

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; return whether it was there."""
        return self._call(storewire.Delete(_key(key))).flag

    def prefix(self, prefix: str) -> Store:
        """A view of this store whose keys are ``prefix + "/" + key`` (for subgroups, later rounds)."""
        return PrefixStore(prefix, self)

    def within(self, seconds: float) -> Store:
        """A view of this store whose every request ends within ``seconds`` from now: its waits are cut
        to what is left, and a store reached over the network gives up on a silent host then.

        For the store calls a collective makes, which must end by its deadline even when the store's
        host is frozen (SIGSTOP, swapping): a fresh timeout for each would add up.

        Example: ``store.within(0.5).set("progress/3", b"7")`` returns or raises within 0.5 s.

        Raises:
            ValueError: ``seconds`` is not positive and finite.
        """
        return _Within(self, seconds)

    @property
    def base(self) -> Store:
        """The store this one is a view of (itself unless it is a prefix view)."""
        return self

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; a closed store refuses every request."""
        return self._closed

    def close(self) -> None:
        """Release this store's connections (and, on the rank that hosts it, the server)."""
        self._closed = True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def execute(self, request: storewire.Request) -> storewire.Response:
        """Answer ``request``, waiting as a get or wait requires; never ``None``.

        The one method a store class implements. Callers use the methods above, which check their
        arguments, refuse once the store is closed and turn the answer into a value or an error.
        """
        raise NotImplementedError

    def execute_by(self, request: storewire.Request, due: float) -> storewire.Response:
        """Answer ``request`` as :meth:`execute` does, but by ``due`` (``time.monotonic()``) at the latest.

        The store of :meth:`within`. Its waits are already cut to ``due``, so a store that answers from
        this process's memory or a local file keeps this default; the TCP store overrides it, since its
        host can fall silent.

        Raises:
            CommTimeout: no answer came by ``due``.
        """
        return self.execute(request)

    def _answer(self, request: storewire.Request, due: float | None = None) -> storewire.Response:
        if self._closed:
            raise RendezvousError(f"{self!r} is closed")
        return self.execute(request) if due is None else self.execute_by(request, due)

    def _call(self, request: storewire.Request) -> storewire.Response:
        response = self._answer(request)
        if isinstance(response, storewire.TimedOut):
            missing = listing(map(repr, response.missing))
            raise CommTimeout(f"{self!r}: {_describe(request)} timed out after "
                              f"{request.timeout_ms / 1000:g}s; still missing: {missing}")
        if isinstance(response, storewire.Failed):
            raise ValueError(f"{self!r}: {response.message}")
        return response

    def _timeout_ms(self, timeout: float | None) -> int:
        seconds = self.timeout if timeout is None else timeout
        if not seconds >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        return min(math.ceil(seconds * 1000), storewire.MAX_TIMEOUT_MS)


def _key(key: str) -> str:
    storewire.check_key(key)
    return key


def _keys(keys: Iterable[str]) -> tuple[str, ...]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of str, not a single key")
    return tuple(_key(key) for key in keys)


def _describe(request: storewire.Get | storewire.Wait) -> str:
    if isinstance(request, storewire.Get):
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

    def execute(self, request: storewire.Request) -> storewire.Response:
        return self._store._answer(self._prefixed(request))

    def execute_by(self, request: storewire.Request, due: float) -> storewire.Response:
        return self._store._answer(self._prefixed(request), due)

    def _prefixed(self, request: storewire.Request) -> storewire.Request:
        if isinstance(request, (storewire.Wait, storewire.Check)):
            return replace(request, keys=tuple(self._prefix + key for key in request.keys))
        return replace(request, key=self._prefix + request.key)


_ANSWER_S = 0.1  # at most this much of a bounded view's time is kept for the store's answer


class View(Store):
    """``store`` seen through rules of a subclass's own (when requests end, what ends them); closing
    the view leaves ``store`` open."""

    def __init__(self, store: Store, timeout: float):
        super().__init__(timeout)
        self._store = store

    def __repr__(self) -> str:
        return repr(self._store)

    @property
    def base(self) -> Store:
        return self._store.base


class _Within(View):
    """A view of ``store`` whose requests end ``seconds`` from its making (see :meth:`Store.within`);
    its default wait is what is left, and a request made later fails at once."""

    def __init__(self, store: Store, seconds: float):
        super().__init__(store, seconds)
        self._due = time.monotonic() + seconds

    def execute(self, request: storewire.Request) -> storewire.Response:
        return self.execute_by(request, self._due)

    def execute_by(self, request: storewire.Request, due: float) -> storewire.Response:
        due = min(due, self._due)
        if time.monotonic() >= due:  # e.g. an earlier call met a frozen host and used the time up
            raise CommTimeout(f"{self!r}: no time left for {type(request).__name__.lower()}")
        return self._store._answer(request, due)

    def _timeout_ms(self, timeout: float | None) -> int:
        """The wait the store is asked for: what is left, less a margin for its answer to come back, so that
        a busy host says which key timed out before the caller's own deadline cuts it off."""
        left = self._due - time.monotonic()
        return min(super()._timeout_ms(timeout), max(math.floor((left - min(_ANSWER_S, left / 4)) * 1000), 0))


class HashStore(Store):
    """A store in this process's memory: for threads standing in for ranks, and world size 1."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._data = Contents()
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"HashStore(<{len(self._data)} keys>)"

    def execute(self, request: storewire.Request) -> storewire.Response:
        due = deadline(request)
        with self._changed:
            while (response := apply_request(self._data, request)) is None:
                remaining = due - time.monotonic()
                if remaining <= 0:
                    return timed_out(self._data, request)
                self._changed.wait(remaining)
            if isinstance(request, storewire.MUTATIONS):
                self._changed.notify_all()
            return response
