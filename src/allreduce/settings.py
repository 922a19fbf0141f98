"""Every ``ALLREDUCE_*`` setting of the library, read from the environment once, when a group forms.

The variables are listed in :data:`VARIABLES` (name, field, meaning); :meth:`Settings.from_env` turns
them into a frozen :class:`Settings` that is passed down to what needs it, so nothing below reads the
environment, and a bad value is an error naming the variable and what it may be. The shared-memory
transport's sizes (``ALLREDUCE_SHM_<FIELD>``) are read the same way into its own options.

Timeouts follow one policy: the ``timeout`` given to ``init_process_group`` (default
:data:`DEFAULT_TIMEOUT`) bounds the rendezvous, every wait on the store and every collective; a store
made by hand waits as long by default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TIMEOUT = 600.0  # seconds: rendezvous, store waits and collectives, unless the caller says otherwise
TRANSPORTS = ("auto", "shm", "tcp")


@dataclass(frozen=True)
class Settings:
    """The library's settings for one process; every field defaults to "not set"."""

    algorithm: str = "auto"  # ALLREDUCE_ALGO: force an algorithm wherever a collective has one by that name
    transport: str = "auto"  # ALLREDUCE_TRANSPORT: between ranks of one host, "shm", "tcp" or "auto"
    address: str = ""  # ALLREDUCE_ADDR: the address peers reach this rank on ("": the interface facing the store)
    host_id: str = ""  # ALLREDUCE_HOST_ID: which host this rank is on ("": read from the kernel)
    timeline: str = ""  # ALLREDUCE_TIMELINE: write a Chrome trace of every collective to this path
    profile: str = ""  # ALLREDUCE_PROFILE: the cost profile the planner reads ("": the user's cache)

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"ALLREDUCE_TRANSPORT={self.transport!r} is not one of {', '.join(TRANSPORTS)}")
        if not self.algorithm:
            raise ValueError("ALLREDUCE_ALGO is empty; unset it or name an algorithm (see `allreduce plan`)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
        """The settings the environment gives; unset or empty variables keep their defaults.

        Raises:
            ValueError: a value that is not allowed, naming the variable and the valid values.
        """
        given = {field: environ[name] for name, field, _ in VARIABLES if environ.get(name)}
        return cls(**given)

    def replace(self, **changes) -> "Settings":
        """A copy with ``changes`` (field names) applied and checked."""
        return dataclasses.replace(self, **changes)


VARIABLES = (  # (variable, Settings field, meaning), for the docs and for error messages
    ("ALLREDUCE_ALGO", "algorithm", "force an algorithm for the job wherever the collective has it"),
    ("ALLREDUCE_TRANSPORT", "transport", "auto (shared memory inside a host, TCP across), shm or tcp"),
    ("ALLREDUCE_ADDR", "address", "the address peers reach this rank on"),
    ("ALLREDUCE_HOST_ID", "host_id", "which host this rank is on, to group ranks by hand"),
    ("ALLREDUCE_TIMELINE", "timeline", "write a Chrome trace of every collective to this path"),
    ("ALLREDUCE_PROFILE", "profile", "the cost profile written by `allreduce tune`"),
)
