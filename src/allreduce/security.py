"""What every TCP connection of a job proves itself with: the job's key and, when configured, TLS.

Built from the :class:`~.settings.Settings` the edge read (``ALLREDUCE_SECRET``, ``ALLREDUCE_TLS_*``)
and handed to the store and the transports, so that none of them reads the environment. Without a
secret or TLS the key is well known and proves nothing, so a listener then checks who connects
(:mod:`.peercred`): a process of this host must run as this user, and a group whose ranks all run on
this host takes no connection from another.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from dataclasses import dataclass, field

from . import auth, peercred, tls
from .settings import Settings

_log = logging.getLogger("allreduce")


@dataclass(frozen=True)
class Security:
    """The challenge-response key (:mod:`.auth`) and the TLS contexts (:mod:`.tls`; ``None``: plain TCP).

    The default is a job without a secret or TLS: the well-known key, membership only. ``one_host``:
    every rank of the group runs on this host (:meth:`among`), so a peer from elsewhere is a stranger.
    """

    key: bytes = field(default=auth.PUBLIC_KEY, repr=False)
    tls: tls.Tls | None = None
    one_host: bool = False

    @classmethod
    def of(cls, settings: Settings) -> Security:
        """What ``settings`` ask for.

        Raises:
            ValueError: a TLS file is missing or is not a PEM certificate or key (naming the variable).
        """
        contexts = tls.load(settings.tls_cert, settings.tls_key, settings.tls_ca) if settings.tls_cert else None
        return cls(auth.job_key(settings.secret), contexts)

    @property
    def proven(self) -> bool:
        """Whether a connection proves that its peer is of the job: by the job's secret or its CA."""
        return self.key != auth.PUBLIC_KEY or self.tls is not None

    def among(self, hosts: int) -> Security:
        """This security for a group whose ranks run on ``hosts`` hosts."""
        return dataclasses.replace(self, one_host=hosts == 1)

    def admits(self, sock: socket.socket) -> bool:
        """Whether the process that made an accepted connection may join (checked only when the key
        proves nothing). Asked once it has passed the handshake, so junk that never answers costs no
        look-up; a refusal is logged, and the caller answers :data:`.auth.STRANGER` and closes."""
        why = self._stranger(sock, accepted=True)
        if why is not None:
            _log.warning("allreduce: refused a connection without ALLREDUCE_SECRET: %s", why)
        return why is None

    def check_listener(self, sock: socket.socket) -> None:
        """``AuthError`` if the process listening where ``sock`` connected is not of the job (checked
        only when the key proves nothing): another user's, squatting a port the job announced."""
        why = self._stranger(sock, accepted=False)
        if why is not None:
            raise auth.AuthError(f"the process listening there is not of this job: {why}")

    def _stranger(self, sock: socket.socket, accepted: bool) -> str | None:
        if self.proven:
            return None
        try:
            host, port = sock.getpeername()[:2]
            return peercred.refusal(peercred.peer_owner(sock, accepted), f"{host}:{port}", not self.one_host)
        except OSError as exc:  # gone already
            return f"its peer is gone ({exc})"


def trusted(settings: Settings, hosts: int) -> bool:
    """Whether every peer of a group on ``hosts`` hosts is known to be of the job, so that its bytes
    may be unpickled: a secret or TLS proves it; on one host, without them, the peer's uid does."""
    return bool(settings.secret or settings.tls_cert) or hosts == 1
