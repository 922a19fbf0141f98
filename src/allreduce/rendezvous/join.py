"""Meeting the other ranks: :func:`rendezvous` settles who this rank is, builds the store, and waits.

It changes when the join protocol does; which store a URL names is :mod:`.schemes`. Rank and world
size come from the argument, else the URL's ``?rank=&world_size=``, else the launcher's variables that
the caller read (:mod:`.environment`) and passed in a :class:`~.schemes.Joining`.

The join barrier: every rank writes its world size under its rank's key and counts itself in;
rank 0 waits for every rank's key, compares the world sizes and publishes a verdict the others
wait for. A rank that returns therefore knows that all ranks arrived and agree. A world size that
differs from rank 0's, or a rank too many (two processes given one rank, or a file left by an
earlier job), is a :class:`RendezvousError` now instead of a hung collective later.

Leaving is counted under :data:`LEFT_KEY` (:func:`allreduce.bootstrap.leave`), and the store's host
keeps the store until every rank has left. A rank that forms a new group at once, on the same
address, may therefore reach the old store; finding :data:`LEFT_KEY` in it, it hangs up and dials
again until the host has opened a fresh one, as torch's re-initialization allows.
"""

from __future__ import annotations

import time
from urllib.parse import SplitResult, parse_qs

from .. import logs
from ..errors import CommTimeout, PeerLost, RendezvousError
from ..settings import DEFAULT_TIMEOUT
from .environment import LaunchInfo
from .schemes import Joining, Scheme, lookup
from .store import Store, listing
from .tcpstore import TCPStore

REPORT_S = 5.0  # seconds between the lines that say the rendezvous is still waiting
_log = logs.get("rendezvous")
LEFT_KEY = "rendezvous/left"  # the count of ranks that left the group: a store that has it is ending


def rendezvous(init_method: str | None = None, rank: int = -1, world_size: int = -1,
               timeout: float = DEFAULT_TIMEOUT, joining: Joining = Joining()) -> tuple[Store, int, int]:
    """Meet the other ranks at ``init_method``; return the shared store, this rank and the world size.

    Every rank returns only once all ``world_size`` ranks have joined. The caller owns the store
    and closes it at the end (rank 0's close stops the TCP server, so rank 0 closes last).

    Args:
        init_method: ``env://`` (the default, for ``None``), ``tcp://host:port``, ``file:///path``,
            or a scheme added by :func:`~.schemes.register_scheme`.
        rank, world_size: -1 means "from the URL's query, else from ``joining.launch``".
        timeout: seconds for every rank to join, and the store's default wait (default: the group's
            timeout, 10 minutes).
        joining: the launcher's variables and the job's key and TLS, as the edge read them
            (``init_process_group`` passes ``Joining(from_environment(), Security.of(settings))``).

    Returns:
        ``(store, rank, world_size)``.

    Example (two ranks)::

        rank 0: store, rank, size = rendezvous("tcp://10.0.0.1:23456", rank=0, world_size=2)
        rank 1: store, rank, size = rendezvous("tcp://10.0.0.1:23456", rank=1, world_size=2)
        both return once both have joined: (TCPStore(10.0.0.1:23456), rank, 2)

    Raises:
        ValueError: an unknown scheme, a malformed URL, or a rank/world size that is missing or out
            of range; the message says what to set.
        CommTimeout: not every rank joined within ``timeout`` seconds; says how many did.
        RendezvousError: the store is unreachable, holds an ended group's keys, or the ranks disagree
            on the world size.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    url, build = lookup(init_method)
    rank, world_size = _identify(url, rank, world_size, joining.launch)
    logs.tag(rank)
    due = time.monotonic() + timeout
    store = _fresh(build, url, rank, world_size, timeout, joining)
    _log.info("rank %d/%d: rendezvous at %r%s", rank, world_size, store,
              " (hosted by this rank)" if getattr(store, "is_server", False) else "")
    try:
        _join(store, rank, world_size, due, timeout)
    except BaseException:
        store.close()
        raise
    return store, rank, world_size


def _identify(url: SplitResult, rank: int, world_size: int, launch: LaunchInfo) -> tuple[int, int]:
    """Settle rank and world size: argument, else URL query, else the launcher's variables."""
    query = parse_qs(url.query)
    rank = _from_query("rank", rank, query)
    world_size = _from_query("world_size", world_size, query)
    if -1 in (rank, world_size):
        if rank == -1:
            rank = _required(launch.rank, "rank", "RANK")
        if world_size == -1:
            world_size = _required(launch.world_size, "world_size", "WORLD_SIZE")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size} (need 0 <= rank < world_size)")
    return rank, world_size


def _from_query(name: str, argument: int, query: dict[str, list[str]]) -> int:
    if not isinstance(argument, int) or argument < -1:
        raise ValueError(f"{name} must be an int >= 0, or -1 to read it from the environment; "
                         f"got {argument!r}")
    if name not in query:
        return argument
    try:
        value = int(query[name][-1])
    except ValueError:
        raise ValueError(f"init_method has {name}={query[name][-1]!r}, which is not an integer") from None
    if argument not in (-1, value):
        raise ValueError(f"{name}={argument} disagrees with {name}={value} in the init_method")
    return value


def _required(value: int | None, argument: str, variable: str) -> int:
    if value is None:
        raise ValueError(f"{argument} is unknown: pass {argument}=, add ?{argument}= to the init_method, "
                         f"set {variable}, or start the job with a launcher (torchrun, mpirun, srun)")
    return value


def _fresh(build: Scheme, url: SplitResult, rank: int, world_size: int, timeout: float,
           joining: Joining) -> Store:
    """The store ``build`` makes, once it is not an ended group's (see the module docstring): a TCP
    client dials again for up to ``timeout`` seconds, any other store holding :data:`LEFT_KEY` is stale."""
    due = time.monotonic() + timeout
    pause = 0.01
    while True:
        store, where = _unless_ended(build, url, rank, world_size, timeout, joining)
        if store is not None:
            return store
        if time.monotonic() >= due:
            raise CommTimeout(f"rank {rank}/{world_size}: {where} still serves the previous group: its host "
                              f"(rank 0) did not close it; it closes the store once every rank has called "
                              f"destroy_process_group()")
        time.sleep(min(pause, _left(due)))
        pause = min(pause * 2, 0.25)


def _unless_ended(build: Scheme, url: SplitResult, rank: int, world_size: int, timeout: float,
                  joining: Joining) -> tuple[Store | None, str]:
    """The store ``build`` makes, or ``None`` where it was an ended group's TCP store (dial again);
    and what it was, for the error."""
    try:
        store = build(url, rank, world_size, timeout, joining)
    except PeerLost as exc:  # the old group's host closed its store as we dialled
        return None, f"the store of {url.geturl()} ({exc})"
    try:
        if not store.check([LEFT_KEY]):
            return store, repr(store)
    except PeerLost:  # ... or just after
        pass
    except BaseException:
        store.close()
        raise
    store.close()
    if not isinstance(store, TCPStore) or store.is_server:
        raise RendezvousError(f"rank {rank}/{world_size}: {store!r} holds the keys of a group that ended; "
                              f"remove a file:// file after each job, or give each group a fresh store")
    return None, repr(store)


def _join(store: Store, rank: int, world_size: int, due: float, timeout: float) -> None:
    """The join barrier (see the module docstring), under keys ``rendezvous/...``, by ``due``."""
    me = f"rank {rank}/{world_size}"
    keys = store.prefix("rendezvous")
    keys.set(f"world_size/{rank}", str(world_size).encode())
    joined = keys.add("joined", 1)
    if joined > world_size:
        raise RendezvousError(f"{me}: {_too_many(store, joined, world_size)}")
    try:
        if rank == 0:
            everyone = [f"world_size/{r}" for r in range(world_size)]
            _patiently(lambda seconds: keys.wait(everyone, timeout=seconds), due,
                       lambda: f"{me}: waiting for ranks {_absent(keys, world_size)} to join at {store!r}")
            verdict = _verdict(store, keys, world_size)
            keys.set("verdict", verdict.encode())
        else:
            def waiting() -> str:
                return f"{me}: waiting at {store!r}; {keys.add('joined', 0)} of {world_size} ranks joined"

            root_size = int(_patiently(lambda seconds: keys.get("world_size/0", timeout=seconds), due, waiting))
            if root_size != world_size:
                raise RendezvousError(f"{me}: rank 0 has world_size {root_size}, this rank {world_size}; "
                                      f"start every rank with the same world size")
            verdict = _patiently(lambda seconds: keys.get("verdict", timeout=seconds), due, waiting).decode()
    except CommTimeout as exc:
        joined = keys.add("joined", 0)
        absent = "" if rank else f" (missing: ranks {_absent(keys, world_size)})"
        raise CommTimeout(f"{me}: rendezvous at {store!r} timed out after {timeout:g}s: {joined} of "
                          f"{world_size} ranks joined{absent}") from exc
    if verdict:
        raise RendezvousError(f"{me}: {verdict}")
    _log.info("%s: all %d ranks joined", me, world_size)


def _patiently(wait, due: float, waiting):
    """``wait(seconds)`` in slices of :data:`REPORT_S` until it returns or ``due`` passes, logging
    ``waiting()`` after each slice, so that a job missing a node says so instead of going quiet."""
    start = time.monotonic()
    while True:
        try:
            return wait(min(REPORT_S, _left(due)))
        except CommTimeout:
            if _left(due) <= 0:
                raise
            _log.warning("%s (%.0f s so far, %.0f s left)", waiting(), time.monotonic() - start, _left(due))


def _verdict(store: Store, keys: Store, world_size: int) -> str:
    """Rank 0's judgement once every rank's key is in: "" if all agree, else what is wrong."""
    joined = keys.add("joined", 0)
    if joined > world_size:
        return _too_many(store, joined, world_size)
    sizes = {r: int(keys.get(f"world_size/{r}")) for r in range(world_size)}
    wrong = ", ".join(f"rank {r} has {size}" for r, size in sizes.items() if size != world_size)
    if wrong:
        return f"ranks disagree on world_size: rank 0 has {world_size}, {wrong}"
    return ""


def _too_many(store: Store, joined: int, world_size: int) -> str:
    return (f"{joined} ranks joined a world of {world_size} at {store!r}: two processes were given one "
            f"rank, or the store holds an earlier job's keys (remove a file:// file after each job)")


def _absent(keys: Store, world_size: int) -> str:
    return listing(str(r) for r in range(world_size) if not keys.check([f"world_size/{r}"]))


def _left(due: float) -> float:
    return max(due - time.monotonic(), 0.0)
