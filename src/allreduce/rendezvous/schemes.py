"""Which store an ``init_method`` names: a small registry of URL schemes, and the three built in.

It changes when a way of meeting is added or changed; what happens on the store once it is built
is :mod:`.join`. A scheme is a function ``build(url, rank, world_size, timeout, joining)`` that returns
the store, with rank and world size already settled; :class:`Joining` carries what the edge read for it
(the launcher's variables, the job's key and TLS), so that no scheme reads the environment:

- ``env://`` (the default): rank 0 hosts a :class:`TCPStore` at MASTER_ADDR:MASTER_PORT, bound to
  MASTER_ADDR, and every rank connects to it. Under torchrun, whose agent already hosts a store
  there, every rank is instead a client of the agent's (:func:`agent_store`);
- ``tcp://host:port``: the same at the address given;
- ``file:///path``: a :class:`FileStore` on a file every rank can reach.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, unquote, urlsplit

from ..errors import RendezvousError
from ..security import Security
from .environment import DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, LaunchInfo
from .filestore import FileStore
from .store import Store
from .tcpstore import TCPStore



@dataclass(frozen=True)
class Joining:
    """What the edge read for a rendezvous: the launcher's variables (:func:`~.environment.from_environment`,
    for ``env://`` and a rank or world size not given) and the job's key and TLS. The default is no
    launcher and no secret."""

    launch: LaunchInfo = field(default_factory=lambda: LaunchInfo(
        None, None, None, None, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, "none"))
    security: Security = Security()


Scheme = Callable[[SplitResult, int, int, float, Joining], Store]
_SCHEMES: dict[str, Scheme] = {}
AGENT_STORES = "allreduce.agent_stores"  # entry points: connect(host, port, timeout) -> Store
_agent_groups = itertools.count()  # groups this process formed on an agent's store, alike on every rank


def register_scheme(name: str, build: Scheme) -> None:
    """Make ``name://`` init_methods use the store ``build(url, rank, world_size, timeout, joining)`` returns.

    ``url`` is the init_method as parsed by ``urllib.parse.urlsplit``; rank and world size are
    already settled; ``joining`` is the :class:`Joining` the caller of the rendezvous gave.
    :func:`~.join.rendezvous` then holds the join barrier on the store.

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


def agent_store(launch: LaunchInfo, timeout: float) -> Store:
    """A client of the store torchrun's agent hosts, under keys of its own for this attempt and group.

    The agent speaks torch's store protocol, so the client is a plugin (the ``allreduce.agent_stores``
    entry points; ``allreduce[torch]`` provides one built on torch's ``TCPStore``). The agent's store
    outlives each group, so every group formed on it gets fresh keys.

    Raises:
        RendezvousError: no client can be loaded (torch is not installed); the message says what to install.
    """
    from importlib.metadata import entry_points  # here: it imports email, zipfile... which ranks rarely need

    failures = []
    for plugin in entry_points(group=AGENT_STORES):
        try:
            connect = plugin.load()
        except ImportError as exc:
            failures.append(f"{plugin.value}: {exc}")
            continue
        store = connect(launch.master_addr, launch.master_port, timeout)
        return store.prefix(f"allreduce/attempt_{launch.restart}/group_{next(_agent_groups)}")
    raise RendezvousError(
        f"torchrun's agent hosts the store at {launch.master_addr}:{launch.master_port} "
        f"(TORCHELASTIC_USE_AGENT_STORE=True) and joining it needs torch's store client, which could not be "
        f"loaded ({'; '.join(failures) or 'no plugin installed'}): pip install 'allreduce[torch]'")


def _env_store(url: SplitResult, rank: int, world_size: int, timeout: float, joining: Joining) -> Store:
    launch = joining.launch
    if launch.agent_store:
        return agent_store(launch, timeout)
    return TCPStore(launch.master_addr, launch.master_port, is_server=rank == 0, timeout=timeout,
                    world_size=world_size, security=joining.security)


def _tcp_store(url: SplitResult, rank: int, world_size: int, timeout: float, joining: Joining) -> Store:
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
    return TCPStore(url.hostname, port, is_server=rank == 0, timeout=timeout, world_size=world_size,
                    security=joining.security)


def _file_store(url: SplitResult, rank: int, world_size: int, timeout: float, joining: Joining) -> Store:
    if url.netloc not in ("", "localhost") or not url.path:
        raise ValueError(f"file:// init_method needs an absolute path, e.g. file:///shared/job42.store; "
                         f"got {url.geturl()!r}")
    return FileStore(unquote(url.path), timeout)


register_scheme("env", _env_store)
register_scheme("tcp", _tcp_store)
register_scheme("file", _file_store)
