"""Point-to-point messages (``send``/``recv``/``isend``/``irecv``, and MPI's on top): matched by source
and tag as MPI matches them, on links and threads of their own, apart from the group's collectives.

- :mod:`.matching`: which receive a message goes to (pure);
- :mod:`.link`: one connection's frames in and out (non-blocking sockets, no policy);
- :mod:`.records`: the records of sends, receives, messages and peers, :class:`P2PWork` and :func:`wait_any`;
- :mod:`.engine`: the engine of one group: posting, sending eager and announced (rendezvous)
  messages, deadlines; :mod:`.receiving`: the frames that arrive; :mod:`.failure`: links lost, aborts;
- :mod:`.progress`: who polls the links, and when: the waiting thread, else a background thread;
  :mod:`.bell`: the wake-up of each.
"""

from .engine import EAGER_MAX, TAG_UB, Engine
from .records import WINDOW, P2PWork, wait_any

__all__ = ["EAGER_MAX", "TAG_UB", "WINDOW", "Engine", "P2PWork", "wait_any"]
