"""One exception family for everything that goes wrong between ranks.

Messages always say who is speaking and about what: this rank and the world size, the collective and
its sequence number, the algorithm and step, and the peer involved, e.g.
``rank 3/8: all_reduce #42 (ring, step 5/14) timed out after 30s waiting for rank 2``.
Bad arguments are not in this family: they raise the built-in ``ValueError``/``TypeError`` before
anything is sent.
"""

from __future__ import annotations

import errno
import resource
from typing import TypeVar


class AllreduceError(RuntimeError):
    """Base of every communication error raised by ``allreduce``."""

    peer: int | None = None  # the rank the error is about, where there is one (see with_peer)


class CommTimeout(AllreduceError, TimeoutError):
    """A wait passed its deadline: a peer is alive but did not take part in time."""


class PeerLost(AllreduceError, ConnectionError):
    """A peer's connection closed or reset: it died, or it aborted after an error of its own."""


class Mismatch(AllreduceError):
    """Peers called different collectives, or the same one with different arguments."""


class ProtocolError(AllreduceError):
    """A frame that is not valid for this protocol arrived (corrupt, foreign or hostile peer)."""


class Interrupted(AllreduceError):
    """A collective was cut short on this rank by an exception of the caller's (``KeyboardInterrupt``, one
    raised by a signal handler). Its peers cannot finish it, so the group breaks as after a communication
    error; the caller sees its own exception, and this one is the failure later calls name."""


class ResourceExhausted(AllreduceError):
    """This rank ran out of a resource (file descriptors, memory, shared-memory space): an error at once,
    never a retry that would spin until a peer is blamed at the deadline."""


def exhausted(exc: BaseException, doing: str) -> ResourceExhausted | None:
    """:class:`ResourceExhausted` naming the resource if ``exc`` is an ``OSError`` for one, e.g.
    ``accepting a connection: out of file descriptors (EMFILE, ulimit -n 1024)``; else ``None``."""
    code = getattr(exc, "errno", None)
    if code == errno.EMFILE:
        what = f"out of file descriptors (EMFILE, ulimit -n {resource.getrlimit(resource.RLIMIT_NOFILE)[0]})"
    elif code == errno.ENFILE:
        what = "the system is out of file descriptors (ENFILE, fs.file-max)"
    elif code in (errno.ENOMEM, errno.ENOBUFS):
        what = f"out of memory ({errno.errorcode[code]})"
    elif code == errno.ENOSPC:
        what = "out of space for shared memory (ENOSPC: /dev/shm or memfd)"
    else:
        return None
    return ResourceExhausted(f"{doing}: {what}")


class GroupBroken(AllreduceError):
    """A previous collective failed; the group cannot be used again and must be re-created."""


class Revoked(GroupBroken):
    """A member revoked the group (it learned of a failure, see ``ProcessGroup.revoke``): the call it cut
    short and every later one raise this; the survivors may still agree, shrink and destroy."""


class Untrusted(AllreduceError, PermissionError):
    """A call that would unpickle a peer's bytes in a group whose peers nothing proves to be of the job."""


class RendezvousError(AllreduceError):
    """The ranks could not find each other (store unreachable, bad init_method, wrong world size)."""


_E = TypeVar("_E", bound=AllreduceError)


def with_peer(exc: _E, peer: int) -> _E:
    """``exc`` with its ``peer`` attribute set to the rank it is about, which the group's message names.

    Example: ``raise with_peer(PeerLost("connection to rank 2 closed"), 2)``.
    """
    exc.peer = peer
    return exc
