"""Which store an ``init_method`` names: a small registry of URL schemes, and the three built in.

It changes when a way of meeting is added or changed; what happens on the store once it is built
is :mod:`.join`. A scheme is a function ``build(url, rank, world_size, timeout)`` that returns the
store, with rank and world size already settled:

- ``env://`` (the default): rank 0 hosts a :class:`TCPStore` at MASTER_ADDR:MASTER_PORT, bound to
  MASTER_ADDR, and every rank connects to it;
- ``tcp://host:port``: the same at the address given;
- ``file:///path``: a :class:`FileStore` on a file every rank can reach.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import SplitResult, unquote, urlsplit

from allreduce.rendezvous.environment import from_environment
from allreduce.rendezvous.filestore import FileStore
from allreduce.rendezvous.store import Store
from allreduce.rendezvous.tcpstore import TCPStore

Scheme = Callable[[SplitResult, int, int, float], Store]
_SCHEMES: dict[str, Scheme] = {}


def register_scheme(name: str, build: Scheme) -> None:
    """Make ``name://`` init_methods use the store ``build(url, rank, world_size, timeout)`` returns.

    ``url`` is the init_method as parsed by ``urllib.parse.urlsplit``; rank and world size are
    already settled. :func:`~.join.rendezvous` then holds the join barrier on the store.

    Raises:
        ValueError: ``name`` is not a URL scheme, or is already registered.
    """
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", name):
        raise ValueError(f"{name!r} is not a URL scheme (lower-case letters, digits, '+', '-', '.')")
    if name in _SCHEMES:
        raise ValueError(f"rendezvous scheme {name}:// is already registered")
    _SCHEMES[name] = build


def unregister_scheme(name: str) -> None:
    """Forget ``name://``, registered by :func:`register_scheme` (a plugin unloading, a test ending).

    Raises:
        ValueError: ``name`` is not registered; the message lists the schemes that are.
    """
    if _SCHEMES.pop(name, None) is None:
        raise ValueError(f"rendezvous scheme {name}:// is not registered; known schemes: {_known()}")


def lookup(init_method: str | None) -> tuple[SplitResult, Scheme]:
    """``init_method`` parsed (``None`` is ``env://``) and the scheme that builds its store.

    Raises:
        ValueError: the scheme is not registered; the message lists the schemes that are.
    """
    url = urlsplit(init_method or "env://")
    build = _SCHEMES.get(url.scheme)
    if build is None:
        raise ValueError(f"init_method {init_method!r} has an unknown scheme; known schemes: {_known()}")
    return url, build


def _known() -> str:
    return ", ".join(f"{name}://" for name in sorted(_SCHEMES))


def _env_store(url: SplitResult, rank: int, world_size: int, timeout: float) -> Store:
    launch = from_environment()
    return TCPStore(launch.master_addr, launch.master_port, is_server=rank == 0, timeout=timeout,
                    world_size=world_size)


def _tcp_store(url: SplitResult, rank: int, world_size: int, timeout: float) -> Store:
    try:
        port = url.port
    except ValueError:
        port = None
    if not url.hostname or port is None:
        raise ValueError(f"tcp:// init_method needs host:port, e.g. tcp://10.0.0.1:23456; "
                         f"got {url.geturl()!r}")
    if port == 0 and world_size > 1:
        raise ValueError(f"tcp:// port 0 lets rank 0 pick a port the others cannot know; name a free port "
                         f"for world_size {world_size}")
    return TCPStore(url.hostname, port, is_server=rank == 0, timeout=timeout, world_size=world_size)


def _file_store(url: SplitResult, rank: int, world_size: int, timeout: float) -> Store:
    if url.netloc not in ("", "localhost") or not url.path:
        raise ValueError(f"file:// init_method needs an absolute path, e.g. file:///shared/job42.store; "
                         f"got {url.geturl()!r}")
    return FileStore(unquote(url.path), timeout)


register_scheme("env", _env_store)
register_scheme("tcp", _tcp_store)
register_scheme("file", _file_store)
