"""Rendezvous: how the ranks of a job find each other, chosen by the ``init_method`` URL.

:func:`rendezvous` looks the URL's scheme up in a small registry, settles rank and world size (the
argument, else the URL's ``?rank=&world_size=``, else the launcher's environment), has the scheme
build a store, and holds a join barrier on it. This package exports exactly that public surface;
each part lives in a module of its own:

- :mod:`.join`: :func:`rendezvous`, its join barrier, and :data:`LEFT_KEY`, where ranks count out;
- :mod:`.schemes`: the registry of URL schemes (``env://``, ``tcp://``, ``file://``);
- :mod:`.environment`: rank, world size and store address from the launcher's variables;
- :mod:`.store`: the :class:`Store` interface, what each request means, :class:`HashStore` and
  :class:`PrefixStore`;
- :mod:`.contents`: what a store holds, and its :class:`StoreLimits`;
- :mod:`.storewire`: the store's wire format, bytes in, messages out, no I/O;
- :mod:`.tcpstore` and :mod:`.storeserver`: the TCP store's client and its host's server;
- :mod:`.filestore`: the store on a shared file.
"""

from __future__ import annotations

from .contents import StoreLimits
from .environment import LaunchInfo, from_environment, is_replacement, lobby_address
from .filestore import FileStore
from .join import LEFT_KEY, rendezvous
from .schemes import Joining, Scheme, register_scheme, unregister_scheme
from .store import HashStore, PrefixStore, Store
from .tcpstore import TCPStore

__all__ = ["rendezvous", "LEFT_KEY", "register_scheme", "unregister_scheme", "Scheme", "Joining", "Store",
           "PrefixStore", "HashStore", "TCPStore", "FileStore", "StoreLimits", "LaunchInfo", "from_environment",
           "lobby_address", "is_replacement"]
