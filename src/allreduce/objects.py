"""Collectives of picklable Python objects, with torch.distributed's names and argument order.

Each object is pickled to bytes and moved by the byte-block collectives of :mod:`.uneven`, so no
rank needs to know another's size in advance. As in torch, lists are filled in place; ``src`` and
``dst`` are ranks in ``group``. Unpickling runs code the sender chose, so these refuse
(:func:`check_trusted`) in a group whose peers nothing proves to be of the job: one that spans hosts
without ``ALLREDUCE_SECRET`` (or TLS). On one host, the peers' uid proves it.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import security, uneven
from .arguments import check_rank, one_per_rank
from .errors import Untrusted
from .roster import Group, resolve_group
from .runtime import ProcessGroup

HOW_TO_TRUST = ("set the same ALLREDUCE_SECRET on every rank: `allreduce run` sets one; before torchrun, mpirun "
                "or srun, export ALLREDUCE_SECRET=$(python -c 'import secrets; print(secrets.token_hex(16))')")


def dumps(obj: object) -> np.ndarray:
    """``obj`` pickled, as a uint8 array."""
    return np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)


def check_trusted(g: ProcessGroup, what: str) -> None:
    """``Untrusted`` unless ``g``'s peers are known to be of the job, so their pickles may be loaded.

    Every rank decides alike (same settings, same topology), so all refuse before anything moves.
    """
    if not security.trusted(g.settings, len(g.topology.hosts)):
        raise Untrusted(f"{what} unpickles what other ranks send, and this group spans {len(g.topology.hosts)} "
                        f"hosts without ALLREDUCE_SECRET, so any process that reaches its ports could send code "
                        f"to run here; {HOW_TO_TRUST}")


def loads(block: np.ndarray) -> Any:
    """The object pickled in ``block`` (uint8)."""
    return pickle.loads(block.tobytes())


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Group = None) -> None:
    """Replace ``object_list``'s items with those of rank ``src``; lists must be as long on every rank.

    Example (two ranks)::

        objs = [{"lr": 0.1}, "run-7"] if rank == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)   # both: [{"lr": 0.1}, "run-7"]
    """
    g = resolve_group(group)
    check_trusted(g, "broadcast_object_list")
    check_rank(src, g.size, "src")
    got = loads(uneven.broadcast(g, dumps(list(object_list)) if g.rank == src else None, src))
    if len(got) != len(object_list):
        raise ValueError(f"object_list has {len(object_list)} items here but {len(got)} on rank {src}")
    object_list[:] = got


def all_gather_object(object_list: list[Any], obj: object, group: Group = None) -> None:
    """Set ``object_list[i]`` to rank i's ``obj`` on every rank; ``object_list`` holds one item per rank.

    Example (two ranks)::

        out = [None, None]
        dist.all_gather_object(out, {"rank": rank})   # both: [{"rank": 0}, {"rank": 1}]
    """
    g = resolve_group(group)
    check_trusted(g, "all_gather_object")
    _check_length(object_list, g.size, "object_list")
    uneven.all_gather(g, dumps(obj), lambda blocks: _fill(object_list, blocks))


def gather_object(obj: object, object_gather_list: list[Any] | None = None, dst: int = 0,
                  group: Group = None) -> None:
    """Set ``object_gather_list[i]`` to rank i's ``obj`` on rank ``dst``; other ranks pass ``None``."""
    g = resolve_group(group)
    check_trusted(g, "gather_object")
    check_rank(dst, g.size, "dst")
    if g.rank == dst:
        _check_length(object_gather_list, g.size, "object_gather_list")
    elif object_gather_list is not None:
        raise ValueError(f"object_gather_list must be None on ranks other than dst={dst}")
    uneven.gather(g, dumps(obj), dst, lambda blocks: _fill(object_gather_list or [], blocks))


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None = None,
                        src: int = 0, group: Group = None) -> None:
    """Rank ``src`` sends ``scatter_object_input_list[r]`` to rank r, which stores it as
    ``scatter_object_output_list[0]``; other ranks pass no input list.
    """
    g = resolve_group(group)
    check_trusted(g, "scatter_object_list")
    check_rank(src, g.size, "src")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("scatter_object_output_list must be a list of at least one item")
    blocks = None
    if g.rank == src:
        _check_length(scatter_object_input_list, g.size, "scatter_object_input_list")
        blocks = [dumps(obj) for obj in scatter_object_input_list or []]
    scatter_object_output_list[0] = loads(uneven.scatter(g, blocks, src))


def _fill(objects: list[Any], blocks: list[np.ndarray]) -> None:
    objects[:] = [loads(block) for block in blocks]


def _check_length(objects: list[Any] | None, size: int, name: str) -> None:
    """``objects`` is a list (torch fills lists in place) of one item per rank."""
    if objects is not None and not isinstance(objects, list):
        raise ValueError(f"{name} must be a list, got {type(objects).__name__}")
    one_per_rank(objects, size, name, "item")
