"""mpi4py's ULFM names (User-Level Failure Mitigation, MPI 5's fault tolerance) on allreduce's survival calls.

``Comm.Revoke``/``Is_revoked`` are :meth:`allreduce.ProcessGroup.revoke`; ``Get_failed``/``Ack_failed`` read
:func:`allreduce.failed_ranks`; ``Agree`` is :func:`allreduce.agree` (the AND of the flags, as
``MPI_Comm_agree``) and ``Shrink`` is :func:`allreduce.shrink_group`. As in ULFM, ``Agree`` raises
:class:`Exception` with ``ERR_PROC_FAILED`` while a failed rank has not been acknowledged (the agreed
flag is then in its ``flag``), and a revoked communicator refuses collectives (with
:class:`allreduce.Revoked`). Shrinking ``COMM_WORLD`` makes the shrunk group the default one, so
``COMM_WORLD`` then names it too (torch's rule; in ULFM the old world stays revoked).

Example (four ranks, rank 2 killed)::

    try:
        comm.Allreduce(x, y)
    except allreduce.AllreduceError:
        comm.Revoke()
        comm.Ack_failed()
        comm = comm.Shrink()            # ranks 0, 1, 3 become 0, 1, 2
"""

from __future__ import annotations

from .. import api
from ..errors import AllreduceError

ERR_PROC_FAILED = 75  # mpi4py's numbers on Open MPI
ERR_PROC_FAILED_PENDING = 76
ERR_REVOKED = 77
_STRINGS = {ERR_PROC_FAILED: "MPI_ERR_PROC_FAILED: a process in the communicator has failed",
            ERR_PROC_FAILED_PENDING: "MPI_ERR_PROC_FAILED_PENDING: a pending operation's peer has failed",
            ERR_REVOKED: "MPI_ERR_REVOKED: the communicator was revoked"}


class Exception(AllreduceError):  # noqa: A001  (mpi4py's name: MPI.Exception)
    """mpi4py's ``MPI.Exception``: an error class (``ERR_PROC_FAILED``, ``ERR_REVOKED``) and its words."""

    def __init__(self, ierr: int = 0, detail: str = "", flag: int | None = None):
        super().__init__(f"{_STRINGS.get(ierr, f'MPI error {ierr}')}{': ' + detail if detail else ''}")
        self.error_code = self.error_class = ierr
        self.flag = flag  # Agree's flag, agreed even though the call raised

    def Get_error_class(self) -> int:
        return self.error_class

    def Get_error_code(self) -> int:
        return self.error_code

    def Get_error_string(self) -> str:
        return _STRINGS.get(self.error_code, f"MPI error {self.error_code}")

    @property
    def error_string(self) -> str:
        return self.Get_error_string()


class Group:
    """The ranks of a communicator that ``Get_failed`` returns (mpi4py's ``MPI.Group``, read-only)."""

    def __init__(self, ranks: list[int]):
        self.ranks = tuple(ranks)

    def Get_size(self) -> int:
        return len(self.ranks)

    def Get_rank(self) -> int:
        return -32766  # MPI.UNDEFINED: the caller is alive, so never in a group of the failed

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks: list[int] | None = None, group=None) -> list[int]:
        """The communicator's ranks of this group's ``ranks`` (all of them by default)."""
        return [self.ranks[r] for r in (range(len(self.ranks)) if ranks is None else ranks)]

    def __repr__(self) -> str:
        return f"<allreduce.MPI.Group of ranks {list(self.ranks)}>"


class FailureMitigation:
    """The ULFM methods of :class:`~.comm.Comm` (a mixin: it needs ``process_group()``)."""

    _acked: frozenset[int] = frozenset()  # the failed ranks Ack_failed acknowledged

    def Revoke(self) -> None:
        """Break the communicator here and on every member: members blocked in one of its calls get out."""
        self.process_group().revoke()

    def Is_revoked(self) -> bool:
        return self.process_group().is_revoked

    def Get_failed(self) -> Group:
        """The ranks this process knows have failed."""
        return Group(api.failed_ranks(self.process_group()))

    def Ack_failed(self, num_to_ack: int | None = None) -> int:
        """Acknowledge the first ``num_to_ack`` failed ranks (default: all known); returns how many are acknowledged."""
        failed = api.failed_ranks(self.process_group())
        self._acked = frozenset(failed if num_to_ack is None else failed[:num_to_ack]) | self._acked
        return len(self._acked)

    def Agree(self, flag: int) -> int:
        """The bitwise AND of every living member's ``flag``, the same on all of them.

        Raises:
            Exception: ``ERR_PROC_FAILED`` if a member failed that this rank has not acknowledged.
        """
        agreed = api.agree(int(flag), self.process_group())
        unacked = sorted(set(agreed.failed) - self._acked)
        if unacked:
            raise Exception(ERR_PROC_FAILED, f"ranks {unacked} failed (acknowledge them with Ack_failed)",
                            agreed.value)
        return agreed.value

    def Shrink(self):
        """A new communicator of the living members, renumbered in order."""
        return type(self)(api.shrink_group(group=self.process_group()))
