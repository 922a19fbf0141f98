"""Collectives of picklable Python objects, with torch.distributed's names and argument order.

Each object is pickled to bytes and moved by the byte-block collectives of :mod:`.uneven`, so no
rank needs to know another's size in advance. As in torch, lists are filled in place; ``src`` and
``dst`` are ranks in ``group``. Unpickling runs code the sender chose: use these only among ranks you
trust (every connection of a group is authenticated by the job's secret).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import uneven
from .arguments import check_rank, one_per_rank
from .world import Group, resolve_group


def dumps(obj: object) -> np.ndarray:
    """``obj`` pickled, as a uint8 array."""
    return np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)


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
    _check_length(object_list, g.size, "object_list")
    uneven.all_gather(g, dumps(obj), lambda blocks: _fill(object_list, blocks))


def gather_object(obj: object, object_gather_list: list[Any] | None = None, dst: int = 0,
                  group: Group = None) -> None:
    """Set ``object_gather_list[i]`` to rank i's ``obj`` on rank ``dst``; other ranks pass ``None``."""
    g = resolve_group(group)
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
