"""mpi4py's ULFM names (User-Level Failure Mitigation, MPI 5's fault tolerance) on allreduce's survival calls.

``Comm.Revoke``/``Is_revoked`` are :meth:`allreduce.ProcessGroup.revoke`; ``Get_failed``/``Ack_failed`` read
:func:`allreduce.failed_ranks`; ``Agree`` is :func:`allreduce.agree` (the AND of the flags, as
``MPI_Comm_agree``) and ``Shrink`` is :func:`allreduce.shrink_group`. As in ULFM, ``Agree`` raises
:class:`MPI.Exception <allreduce.mpi.errorcodes.Exception>` with ``ERR_PROC_FAILED`` while a failed rank has not been
acknowledged (the agreed flag is then in its ``flag``), and a revoked communicator refuses collectives (with
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
from .errorcodes import ERR_PROC_FAILED, error
from .groups import Group


class FailureMitigation:
    """The ULFM methods of :class:`~.comm.Comm` (a mixin: it needs ``process_group()``)."""

    _acked: frozenset[int] = frozenset()  # the failed ranks Ack_failed acknowledged

    def Revoke(self) -> None:
        """Break the communicator here and on every member: members blocked in one of its calls get out."""
        self.process_group().revoke()

    def Is_revoked(self) -> bool:
        return self.process_group().is_revoked

    def Get_failed(self) -> Group:
        """The ranks this process knows have failed, as a group of world ranks."""
        g = self.process_group()
        return Group.of(tuple(g.ranks[r] for r in api.failed_ranks(g)), None)

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
            failed = error(ERR_PROC_FAILED, f"ranks {unacked} failed (acknowledge them with Ack_failed)")
            failed.flag = agreed.value  # agreed even though the call raised, as in ULFM
            raise failed
        return agreed.value

    def Shrink(self):
        """A new communicator of the living members, renumbered in order."""
        return type(self)._of(api.shrink_group(group=self.process_group()))
