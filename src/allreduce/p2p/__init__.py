"""Point-to-point messages (``send``/``recv``/``isend``/``irecv``, and MPI's on top): matched by source
and tag as MPI matches them, on links and threads of their own, apart from the group's collectives.

- :mod:`.messenger`: :class:`Messenger`, the facade of one group's point-to-point, over its parts:
- :mod:`.ledger`: the operations pending and how they end, the messenger's life and failure;
- :mod:`.inbox`: receives posted, the messages that arrive, matched (:mod:`.matching`, pure);
- :mod:`.outbox`: sends, eager while credit lasts and announced otherwise;
- :mod:`.connections`: the links to and from peers: dialed, accepted, flushed, lost, closed;
- :mod:`.poller`: who polls the links, and when: the waiting thread, else a background thread;
  :mod:`.bell`: the wake-up of each;
- :mod:`.link`: one connection's frames in and out (non-blocking sockets, no policy);
- :mod:`.records`: the records of sends (:class:`.records.SendState`), receives, messages and peers,
  :class:`P2PWork` and :func:`wait_any`.
"""

from .messenger import TAG_UB, Messenger
from .outbox import EAGER_MAX
from .records import WINDOW, P2PWork, wait_any

__all__ = ["EAGER_MAX", "TAG_UB", "WINDOW", "Messenger", "P2PWork", "wait_any"]
