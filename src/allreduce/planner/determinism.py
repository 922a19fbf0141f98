"""Deterministic mode: reductions that return the left fold over ranks in rank order, bit for bit.

With the mode on, an all-reduce, reduce or reduce-scatter with SUM, AVG or PRODUCT of a floating
dtype returns ``((x0 op x1) op x2) op ...`` elementwise, computed in the dtype, whatever the
algorithm, transport, world size or timing: the planner runs only algorithms that reduce in rank
order (see :func:`allreduce.algorithms.in_rank_order`). MIN, MAX, the bitwise ops and integer dtypes
give the same bits in any order already, so the mode leaves them alone.

The switch is process-wide, as torch's ``use_deterministic_algorithms``: set by the API it overrides
``ALLREDUCE_DETERMINISTIC`` (read into each group's settings when it forms) for every group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ops import ReduceOp
from ..settings import Settings

ORDER_SENSITIVE = frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT})  # ops whose bits depend on order

_chosen: bool | None = None  # set by use_deterministic_algorithms; None: as the environment says
epoch = 0  # how many times it was set: a plan remembered under an older epoch may be the other mode's
_switched: list[Callable[[], None]] = []  # told of every switch (the groups, which retire their shortcuts)


def use_deterministic_algorithms(mode: bool) -> None:
    """Turn deterministic mode on or off for every group of this process (overriding the environment)."""
    global _chosen, epoch
    _chosen = bool(mode)
    epoch += 1
    for told in _switched:
        told()


def on_switch(told: Callable[[], None]) -> None:
    """Call ``told()`` after every switch of the mode (from the thread that switched it)."""
    _switched.append(told)


def enabled(settings: Settings) -> bool:
    """Whether deterministic mode is on: as last set by :func:`use_deterministic_algorithms`, else as
    the group's ``settings`` say."""
    if _chosen is not None:
        return _chosen
    return settings.deterministic == "1"


def order_matters(op: ReduceOp, dtype: np.dtype) -> bool:
    """Whether the order of a reduction with ``op`` on ``dtype`` changes its bits (so that deterministic
    mode must run it in rank order)."""
    return op in ORDER_SENSITIVE and not (np.issubdtype(dtype, np.integer) or dtype == np.bool_)
