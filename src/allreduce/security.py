"""What every TCP connection of a job proves itself with: the job's key and, when configured, TLS.

Built from the :class:`~.settings.Settings` the edge read (``ALLREDUCE_SECRET``, ``ALLREDUCE_TLS_*``)
and handed to the store and the transports, so that none of them reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import auth, tls
from .settings import Settings


@dataclass(frozen=True)
class Security:
    """The challenge-response key (:mod:`.auth`) and the TLS contexts (:mod:`.tls`; ``None``: plain TCP).

    The default is a job without a secret or TLS: the well-known key, membership only.
    """

    key: bytes = field(default=auth.PUBLIC_KEY, repr=False)
    tls: tls.Tls | None = None

    @classmethod
    def of(cls, settings: Settings) -> "Security":
        """What ``settings`` ask for.

        Raises:
            ValueError: a TLS file is missing or is not a PEM certificate or key (naming the variable).
        """
        contexts = tls.load(settings.tls_cert, settings.tls_key, settings.tls_ca) if settings.tls_cert else None
        return cls(auth.job_key(settings.secret), contexts)
