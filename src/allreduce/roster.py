"""The roster: the groups this process is in, and which one a ``group`` argument names.

:mod:`.world` forms and closes the default group and the groups formed from it, and
:mod:`.resilience` replaces the default group with a shrunk or grown one; both keep them here, below
them, and the calls (:mod:`.calls`) and the layers above find their group by :func:`resolve_group`.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import logs, rendezvous
from .runtime import ProcessGroup
from .settings import Settings
from .transport.shm import ShmOptions


class NonMember:
    """What :func:`allreduce.new_group` returns on ranks outside the group: using it raises ``ValueError``."""

    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def __repr__(self) -> str:
        return f"<allreduce group {self.ranks}: this rank is not a member>"


Group = ProcessGroup | NonMember | None  # None: the default group


class Roster:
    """This process's groups, and the settings it formed them with (read from the environment at entry)."""

    world: ProcessGroup | None = None
    groups: list[ProcessGroup] = []
    new_groups = 0  # how many new_group calls named a group since the default group formed
    settings = Settings()
    shm_options = ShmOptions()


def entry_settings(env: Mapping[str, str]) -> tuple[Settings, ShmOptions, str | None]:
    """The job's settings and its lobby's address (``None``: it cannot grow), read from the environment
    once at a process's entry (init or join, which hand ``os.environ`` down), and the logging they ask for."""
    settings, shm_options = Settings.from_env(env), ShmOptions.from_env(env)
    logs.configure(settings.debug)
    return settings, shm_options, rendezvous.lobby_address(env)


def default_group() -> ProcessGroup:
    """The default group that :func:`allreduce.init_process_group` formed.

    Raises:
        RuntimeError: not initialized.
    """
    if Roster.world is None:
        raise RuntimeError("the default process group is not initialized; call allreduce.init_process_group() first")
    return Roster.world


def resolve_group(group: Group = None) -> ProcessGroup:
    """The :class:`ProcessGroup` a ``group`` argument names (``None``: the default group).

    Raises:
        RuntimeError: not initialized. ValueError: this rank is not a member. TypeError: not a group.
    """
    if group is None:
        return default_group()
    if isinstance(group, NonMember):
        raise ValueError(f"rank {default_group().rank} is not a member of group {group.ranks}")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a group from new_group(), got {type(group).__name__}")
    return group


def replace_default(world: ProcessGroup) -> None:
    """Make ``world`` the default group, closing the old one, every group formed from it, and its store
    unless ``world`` uses the same."""
    old = Roster.world
    if old is not None:
        for g in [*Roster.groups, old]:
            g.close()
        if old.store.base is not world.store.base:
            old.store.close()
    Roster.world, Roster.groups = world, []
