"""Every setting of the library (``ALLREDUCE_*``, and the user's cache directory), read from the environment once.

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
from dataclasses import dataclass, field

from .logs import LEVELS

DEFAULT_TIMEOUT = 600.0  # seconds: rendezvous, store waits and collectives, unless the caller says otherwise
TRANSPORTS = ("auto", "shm", "tcp")
ENGINES = ("auto", "python", "native")


@dataclass(frozen=True)
class Settings:
    """The library's settings for one process; every field defaults to "not set"."""

    algorithm: str = "auto"  # ALLREDUCE_ALGO: force an algorithm wherever a collective has one by that name
    transport: str = "auto"  # ALLREDUCE_TRANSPORT: between ranks of one host, "shm", "tcp" or "auto"
    address: str = ""  # ALLREDUCE_ADDR: the address peers reach this rank on ("": the interface facing the store)
    host_id: str = ""  # ALLREDUCE_HOST_ID: which host this rank is on ("": read from the kernel)
    timeline: str = ""  # ALLREDUCE_TIMELINE: write a Chrome trace of every collective to this path
    profile: str = ""  # ALLREDUCE_PROFILE: the cost profile the planner reads ("": the user's cache)
    debug: str = ""  # ALLREDUCE_DEBUG: log to stderr: WARN, INFO or DETAIL ("": as the application set logging)
    deterministic: str = ""  # ALLREDUCE_DETERMINISTIC: "1" reduces in rank order, the same bits every run
    tls_cert: str = ""  # ALLREDUCE_TLS_CERT: this rank's certificate (PEM); with the next two, TLS on every TCP link
    tls_key: str = ""  # ALLREDUCE_TLS_KEY: its private key (PEM)
    tls_ca: str = ""  # ALLREDUCE_TLS_CA: the CA that must have signed every peer's certificate (PEM)
    secret: str = field(default="", repr=False)  # ALLREDUCE_SECRET: the job's shared secret (never shown)
    cache_home: str = ""  # XDG_CACHE_HOME: the user's cache, where the default cost profile lives ("": ~/.cache)
    engine: str = "auto"  # ALLREDUCE_ENGINE: what runs a call: "python", "native" (compiled) or "auto"

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"ALLREDUCE_TRANSPORT={self.transport!r} is not one of {', '.join(TRANSPORTS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"ALLREDUCE_ENGINE={self.engine!r} is not one of {', '.join(ENGINES)}")
        if not self.algorithm:
            raise ValueError("ALLREDUCE_ALGO is empty; unset it or name an algorithm (see `allreduce plan`)")
        if self.debug.upper() not in LEVELS:
            raise ValueError(f"ALLREDUCE_DEBUG={self.debug!r} is not one of {', '.join(k for k in LEVELS if k)}")
        if self.deterministic not in ("", "0", "1"):
            raise ValueError(f"ALLREDUCE_DETERMINISTIC={self.deterministic!r} is not 0 or 1")
        tls = {"ALLREDUCE_TLS_CERT": self.tls_cert, "ALLREDUCE_TLS_KEY": self.tls_key, "ALLREDUCE_TLS_CA": self.tls_ca}
        if any(tls.values()) and not all(tls.values()):
            raise ValueError(f"TLS needs all of ALLREDUCE_TLS_CERT, ALLREDUCE_TLS_KEY and ALLREDUCE_TLS_CA; "
                             f"{', '.join(name for name, value in tls.items() if not value)} not set")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings the environment gives; unset or empty variables keep their defaults.

        Raises:
            ValueError: a value that is not allowed, naming the variable and the valid values.
        """
        given = {field: environ[name] for name, field, _ in VARIABLES if environ.get(name)}
        return cls(**given)

    def replace(self, **changes) -> Settings:
        """A copy with ``changes`` (field names) applied and checked."""
        return dataclasses.replace(self, **changes)


VARIABLES = (  # (variable, Settings field, meaning), for the docs and for error messages
    ("ALLREDUCE_ALGO", "algorithm", "force an algorithm for the job wherever the collective has it"),
    ("ALLREDUCE_TRANSPORT", "transport", "auto (shared memory inside a host, TCP across), shm or tcp"),
    ("ALLREDUCE_ADDR", "address", "the address peers reach this rank on"),
    ("ALLREDUCE_HOST_ID", "host_id", "which host this rank is on, to group ranks by hand"),
    ("ALLREDUCE_TIMELINE", "timeline", "write a Chrome trace of every collective to this path"),
    ("ALLREDUCE_PROFILE", "profile", "the cost profile written by `allreduce tune`"),
    ("ALLREDUCE_DEBUG", "debug", "log to stderr, tagged with the rank: WARN, INFO (rendezvous, transports, "
     "algorithms) or DETAIL (also every collective's fingerprint and time)"),
    ("ALLREDUCE_DETERMINISTIC", "deterministic", "1: sums, averages and products return the same bits "
     "every run (the left fold over ranks in rank order)"),
    ("ALLREDUCE_TLS_CERT", "tls_cert", "this rank's certificate (PEM file): with the next two, the store and "
     "every TCP link use mutually authenticated TLS 1.3"),
    ("ALLREDUCE_TLS_KEY", "tls_key", "the certificate's private key (PEM file)"),
    ("ALLREDUCE_TLS_CA", "tls_ca", "the CA (PEM file) that must have signed every rank's certificate"),
    ("ALLREDUCE_SECRET", "secret", "the job's shared secret that authenticates every connection; `allreduce run` "
     "makes one for a single node, several nodes must share one"),
    ("ALLREDUCE_ENGINE", "engine", "auto (the compiled engine where it was built, else Python), native "
     "(the compiled engine; an error where it is missing) or python"),
    ("XDG_CACHE_HOME", "cache_home", "the user's cache directory (default ~/.cache): `allreduce tune` writes the "
     "cost profile to allreduce/profile.json in it, where the planner reads it unless ALLREDUCE_PROFILE names one"),
)
