"""Fault tolerance: how the processes of a job go on when one of them dies, and how replacements join.

Its own row of the layers, below :mod:`allreduce.world` (which opens the lifelines with the default
group) and above the group runtime, which knows only that a group may have a ``membership``:

- :mod:`.lifeline`: the failure detector: a ring of connections, deaths spread by word, links made on use;
- :mod:`.linkage`: the lifelines' authenticated dial and its answer;
- :mod:`.agreement`: fault-tolerant agreement over the lifelines (one decision for every survivor);
- :mod:`.membership`: a group's members as lifeline ids: failed ranks, agree, revoke;
- :mod:`.shrink`: the group of a group's survivors, on the old store or a new one;
- :mod:`.grow`: the job's lobby, where replacement processes wait until the members let them in;
- :mod:`.recovery`: the public functions (``failed_ranks``, ``agree``, ``shrink_group``, ``grow_group``,
  ``joiners_waiting``, ``join_group``, ``is_replacement``) and this process's lifelines and lobby.
"""

from .membership import Agreement
from .recovery import (
    SHRINK_ABORT, SHRINK_DEFAULT, agree, failed_ranks, grow_group, is_replacement, join_group, joiners_waiting,
    shrink_group,
)

__all__ = [
    "SHRINK_ABORT", "SHRINK_DEFAULT", "Agreement", "agree", "failed_ranks", "grow_group", "is_replacement",
    "join_group", "joiners_waiting", "shrink_group",
]
