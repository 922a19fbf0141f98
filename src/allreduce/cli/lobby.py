"""The lobby of a job that may grow (``allreduce run --max-np``): a store in the launcher, which outlives
every worker, where replacement workers wait until the others let them in (:mod:`allreduce.resilience.grow`)."""

from __future__ import annotations

from .. import rendezvous
from ..rendezvous.environment import LOBBY, REPLACEMENT
from ..security import Security
from ..settings import Settings


class Lobby:
    """The launcher's end of the lobby: it hosts the store and tells which replacements are still outside."""

    def __init__(self, env: dict[str, str]):
        self._store = rendezvous.TCPStore("127.0.0.1", 0, is_server=True, security=Security.of(Settings.from_env(env)))

    @property
    def env(self) -> dict[str, str]:
        """What tells the workers where the lobby is."""
        return {LOBBY: f"127.0.0.1:{self._store.port}"}

    @property
    def replacement_env(self) -> dict[str, str]:
        """What tells a replacement worker where the lobby is, and that it joins there."""
        return {**self.env, REPLACEMENT: "1"}

    def outside(self, pids: set[int]) -> set[int]:
        """Those of ``pids`` (replacements) that were not let in: not registered yet, or still waiting. (One
        that was let in wrote its pid before the others could form a group with it.)"""
        admitted = int(self._store.add("admitted", 0))
        inside = {int(self._store.get(f"pid/{n}")) for n in range(1, admitted + 1) if self._store.check([f"pid/{n}"])}
        return pids - inside

    def close(self) -> None:
        self._store.close()
