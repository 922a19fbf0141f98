"""A rank that refuses its own arguments to a collective says so to its peers, written once for the
public functions (:mod:`allreduce.calls`) and ``allreduce.MPI``: a peer waiting in that call then
raises at once, naming the rank, instead of waiting to its deadline.

Two ways to say it: :func:`refusing` publishes the refusal in the group's heartbeat record
(``ProcessGroup.refused``), which costs nothing when no rank refuses; :func:`agreed` is for a call
that starts with a small all-reduce anyway (MPI's v- and w-collectives): every rank votes there.
"""

from __future__ import annotations

import functools
from typing import ParamSpec, Protocol, TypeVar
from collections.abc import Callable

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Refusable(Protocol):
    """A group that hears of a refusal: ``ProcessGroup``."""

    @property
    def issued(self) -> int: ...

    def refused(self, collective: str, reason: str, issued: int) -> None: ...


def refusing(function: Callable[_P, _R], collective: str, group_of: Callable[_P, Refusable | None],
             refusals: tuple[type[BaseException], ...]) -> Callable[_P, _R]:
    """``function``, which tells the peers of its group (``group_of(*args, **kwargs)``; ``None``: no
    group, and nobody waits) that this rank refused ``collective`` when it raises one of ``refusals``
    before issuing it, then raises as before."""
    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        g = group_of(*args, **kwargs)
        if g is None:
            return function(*args, **kwargs)
        issued = g.issued
        try:
            return function(*args, **kwargs)
        except refusals as exc:
            g.refused(collective, str(exc), issued)
            raise
    return call


def agreed(what: str, prepare: Callable[[], _R], rank: int, highest: Callable[[int], int]) -> _R:
    """``prepare()``'s value, once every rank has run its own ``prepare`` (its local checks of its
    arguments) without error: each votes its rank if it failed, ``-1`` if not, and ``highest`` (an
    all-reduce of the votes) tells each whether any failed, so a bad argument on one rank raises
    there and a ``ValueError`` naming it on the others, instead of leaving them waiting in a
    collective that rank never enters."""
    try:
        value, error = prepare(), None
    except (ValueError, TypeError) as exc:
        value, error = None, exc
    refuser = highest(-1 if error is None else rank)
    if error is not None:
        raise error
    if refuser >= 0:
        raise ValueError(f"{what}: rank {refuser} of this communicator refused its arguments; no data moved")
    return value  # type: ignore[return-value]
