"""A torch ``c10d.Store`` seen through allreduce's :class:`~allreduce.rendezvous.Store` interface.

torch hands a backend the store its ranks already met on (TCPStore, FileStore or HashStore, behind
a per-group prefix). Forming the allreduce group on that same store means no second rendezvous and
no second port. A store class only answers requests (:meth:`Store.execute`); this one maps each
request onto the torch store's method of the same meaning. torch signals a timed-out ``wait`` with
``DistStoreError``, which becomes the ``TimedOut`` answer (and the caller's :class:`CommTimeout`);
it reads a zero timeout as "forever", so a zero-timeout wait is a ``check``. Any other torch store
error (the host is gone) becomes :class:`PeerLost`.

:func:`connect_agent_store` is the ``allreduce.agent_stores`` entry point: under torchrun, whose agent
hosts a TCPStore, ``allreduce.init_process_group()`` joins it through torch's client.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from ...errors import PeerLost
from ...rendezvous import storewire as wire
from ...rendezvous.store import Store


class TorchStore(Store):
    """Requests answered by the torch store ``store``; ``timeout`` (seconds) as for any store.

    ``host``/``port`` are those of the TCPStore underneath, when it is one: they tell the transport
    which interface faces the other ranks. ``is_server`` marks the rank that, on leaving, waits for
    the others to be done with the store (rank 0, whose process hosts torch's TCPStore under
    ``env://`` and ``tcp://``).
    """

    def __init__(self, store: dist.Store, timeout: float, is_server: bool = False):
        super().__init__(timeout)
        self._store = store
        self.is_server = is_server
        base = store
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
        tcp = base if isinstance(base, dist.TCPStore) else None
        self.host = tcp.host if tcp else None
        self.port = tcp.port if tcp else None

    def __repr__(self) -> str:
        return f"TorchStore({type(self._store).__name__})"

    def beside(self, prefix: str, is_server: bool) -> TorchStore:
        """A store on the same torch store, under ``prefix``, that lives on when this one is closed (for a
        group shrunk from this one's, which outlives it)."""
        return TorchStore(dist.PrefixStore(prefix, self._store), self.timeout, is_server)

    def execute(self, request: wire.Request) -> wire.Response:
        try:
            return self._respond(request)
        except dist.DistError as exc:  # the store's host is gone or unreachable
            raise PeerLost(f"{self!r}: {str(exc).splitlines()[0]}") from exc

    def _respond(self, request: wire.Request) -> wire.Response:
        store = self._store
        if isinstance(request, wire.Set):
            store.set(request.key, request.value)
            return wire.Ok()
        if isinstance(request, (wire.Get, wire.Wait)):
            keys = [request.key] if isinstance(request, wire.Get) else list(request.keys)
            if not self._wait(keys, request.timeout_ms):
                return wire.TimedOut(tuple(key for key in keys if not store.check([key])))
            return wire.Value(store.get(request.key)) if isinstance(request, wire.Get) else wire.Ok()
        if isinstance(request, wire.Add):
            return wire.Count(store.add(request.key, request.amount))
        if isinstance(request, wire.Check):
            return wire.Flag(store.check(list(request.keys)))
        return wire.Flag(store.delete_key(request.key))

    def _wait(self, keys: list[str], timeout_ms: int) -> bool:
        """Whether ``keys`` are all set within ``timeout_ms`` (torch reads a zero timeout as 'forever')."""
        if timeout_ms == 0:
            return self._store.check(keys)
        try:
            self._store.wait(keys, datetime.timedelta(milliseconds=timeout_ms))
        except dist.DistStoreError:
            return False
        return True


def connect_agent_store(host: str, port: int, timeout: float) -> TorchStore:
    """A client of the TCPStore torchrun's agent hosts at ``host:port`` (see the module docstring)."""
    client = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))
    return TorchStore(client, timeout)
