"""Ranks as Ray actors: :func:`form_group` makes a list of actors one ``allreduce`` job.

Ray starts the processes, so there is no launcher to set ``RANK`` or ``MASTER_ADDR``, and no address
to pick by hand: the rendezvous goes through Ray. The first actor hosts the group's store on a free
port of its node's address and returns that address through an actor call; then every actor joins it
at once, ``actors[i]`` as rank ``i``. Afterwards the actors' own methods call ``allreduce.all_reduce``
and the rest of the API as any rank does. The calls run through ``__ray_call__``, which every Ray
actor has, so the actors' class needs nothing of ours.

Connections authenticate with ``ALLREDUCE_SECRET`` like every job's: give the actors the same one
through Ray, e.g. ``ray.init(runtime_env={"env_vars": {"ALLREDUCE_SECRET": secret}})``.

For Ray Train, nothing here is needed: ``TorchTrainer(..., torch_config=TorchConfig(backend="allreduce"))``
works as is, because the torch backend registers itself when torch is imported.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from . import api
from .rendezvous import TCPStore
from .security import Security
from .settings import DEFAULT_TIMEOUT, Settings

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("allreduce.ray needs Ray: pip install 'allreduce[ray]'") from exc

_SLACK_S = 30.0  # what Ray may add to a call beyond the group's own deadline (scheduling, pickling)
_hosted: dict[str, TCPStore] = {}  # in the first actor: the store it hosts, between the two calls


def form_group(actors: Sequence, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Make ``actors`` the ranks of one group (``actors[i]`` is rank ``i``): their default group.

    Returns once every actor has joined; each actor may then call the collectives of ``allreduce``
    from its methods, and calls :func:`destroy_group` (or ``destroy_process_group``) at the end.

    Args:
        actors: handles of live Ray actors, each not yet in a group.
        timeout: seconds for the group to form, and the deadline of each of its collectives.

    Raises:
        ValueError: no actors. ray.exceptions.GetTimeoutError: the actors did not answer in time.
        ray.exceptions.RayTaskError: an actor failed to join; it carries the actor's error.

    Example (two actors of a class ``Worker`` whose ``total`` method calls ``allreduce.all_reduce``)::

        workers = [Worker.remote() for _ in range(2)]
        form_group(workers)
        ray.get([w.total.remote() for w in workers])
    """
    if not actors:
        raise ValueError("form_group needs at least one actor")
    size, token = len(actors), secrets.token_hex(8)
    host, port = ray.get(actors[0].__ray_call__.remote(_host_store, token, size, timeout),
                         timeout=timeout + _SLACK_S)
    joined = [actor.__ray_call__.remote(_join, token, rank, size, host, port, timeout)
              for rank, actor in enumerate(actors)]
    ray.get(joined, timeout=timeout + _SLACK_S)


def destroy_group(actors: Sequence, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Close the group that :func:`form_group` made of ``actors``, in every one of them at once."""
    ray.get([actor.__ray_call__.remote(_leave) for actor in actors], timeout=timeout + _SLACK_S)


def _host_store(_actor, token: str, size: int, timeout: float) -> tuple[str, int]:
    store = TCPStore(ray.util.get_node_ip_address(), 0, is_server=True, timeout=timeout, world_size=size,
                     security=_security())
    _hosted[token] = store
    return store.host, store.port


def _join(_actor, token: str, rank: int, size: int, host: str, port: int, timeout: float) -> None:
    store = _hosted.pop(token) if rank == 0 else TCPStore(host, port, timeout=timeout, security=_security())
    api.init_process_group(store=store, rank=rank, world_size=size, timeout=timeout)


def _security() -> Security:
    """The actor's key and TLS, from its environment: its store is made here, before init_process_group."""
    return Security.of(Settings.from_env())


def _leave(_actor) -> None:
    api.destroy_process_group()
