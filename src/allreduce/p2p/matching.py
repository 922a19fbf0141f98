"""Which receive a message goes to, as MPI matches them: no sockets, no threads, no clocks.

A *receive* names a source and a tag, either of which may be ``None`` (any). A *message* arrives with
its source and tag. A message goes to the earliest posted receive that accepts it; a receive posted
goes to the earliest arrived message it accepts; what finds no partner waits in a queue. Messages
from one source arrive in the order they were sent (one stream per sender), so two messages with the
same source and tag are matched in the order they were sent: MPI's non-overtaking rule.

Receives and messages with a specific source and tag wait in one queue per ``(source, tag)``, so
matching them costs a dictionary lookup; receives with a wildcard wait in one list, scanned in the
order they were posted. Each side is numbered as it queues, so that a message accepted both by the
head of its ``(source, tag)`` queue and by a wildcard receive goes to whichever was posted first.

Example::

    m = Matcher()
    m.post(Receive(source=None, tag=7))      # -> None: nothing has arrived; the receive waits
    m.arrive(Envelope(source=2, tag=7))      # -> that receive
"""

from __future__ import annotations

import itertools
from collections import deque


class Receive:
    """What a posted receive accepts: ``source`` and ``tag``, ``None`` for any."""

    __slots__ = ("source", "tag", "order")

    def __init__(self, source: int | None, tag: int | None):
        self.source = source
        self.tag = tag
        self.order = 0  # set by the matcher when the receive queues

    def accepts(self, source: int, tag: int) -> bool:
        return (self.source is None or self.source == source) and (self.tag is None or self.tag == tag)


class Envelope:
    """What a receive learns of a message before it takes it: where it came from and how big it is."""

    __slots__ = ("source", "tag", "order")

    def __init__(self, source: int, tag: int):
        self.source = source
        self.tag = tag
        self.order = 0  # set by the matcher when the message queues


class Matcher:
    """Posted receives and unexpected messages of one rank; see the module docstring."""

    def __init__(self):
        self._count = itertools.count(1)
        self._posted: dict[tuple[int, int], deque] = {}  # (source, tag) -> receives naming both, in post order
        self._wild: list = []  # receives with a wildcard, in post order
        self._unexpected: dict[tuple[int, int], deque] = {}  # (source, tag) -> messages, in arrival order

    def post(self, receive: Receive):
        """The earliest unexpected message ``receive`` accepts, taken off its queue; or ``None``, and
        ``receive`` waits for :meth:`arrive`."""
        found = self._earliest(receive.source, receive.tag)
        if found is not None:
            queue = self._unexpected[(found.source, found.tag)]
            queue.popleft()
            if not queue:
                del self._unexpected[(found.source, found.tag)]
            return found
        receive.order = next(self._count)
        if receive.source is None or receive.tag is None:
            self._wild.append(receive)
        else:
            self._posted.setdefault((receive.source, receive.tag), deque()).append(receive)
        return None

    def arrive(self, message: Envelope, keep: bool = True):
        """The earliest posted receive that accepts ``message``, taken off its queue; or ``None``, and
        ``message`` waits as unexpected for :meth:`post` (unless not ``keep``: the caller queues it
        later with :meth:`keep`, once its payload is in)."""
        key = (message.source, message.tag)
        queue = self._posted.get(key)
        best = queue[0] if queue else None
        for receive in self._wild:
            if receive.accepts(*key):
                if best is None or receive.order < best.order:
                    best = receive
                break
        if best is None:
            if keep:
                self.keep(message)
            return None
        if queue and best is queue[0]:
            queue.popleft()
            if not queue:
                del self._posted[key]
        else:
            self._wild.remove(best)
        return best

    def keep(self, message: Envelope) -> None:
        """Queue ``message`` as unexpected (it found no receive)."""
        message.order = next(self._count)
        self._unexpected.setdefault((message.source, message.tag), deque()).append(message)

    def peek(self, source: int | None, tag: int | None):
        """The message a receive from ``source`` with ``tag`` would take now, left in place; or ``None``."""
        return self._earliest(source, tag)

    def withdraw(self, receive: Receive) -> None:
        """Take a posted ``receive`` off its queue (it failed); nothing if it is not queued."""
        if receive.source is None or receive.tag is None:
            if receive in self._wild:
                self._wild.remove(receive)
            return
        queue = self._posted.get((receive.source, receive.tag))
        if queue and receive in queue:
            queue.remove(receive)
            if not queue:
                del self._posted[(receive.source, receive.tag)]

    def posted(self) -> list:
        """Every receive still waiting, in the order posted."""
        waiting = [r for queue in self._posted.values() for r in queue] + self._wild
        return sorted(waiting, key=lambda r: r.order)

    def unexpected_count(self) -> int:
        """How many messages wait for a receive."""
        return sum(len(queue) for queue in self._unexpected.values())

    def _earliest(self, source: int | None, tag: int | None):
        if source is not None and tag is not None:
            queue = self._unexpected.get((source, tag))
            return queue[0] if queue else None
        best = None
        for (s, t), queue in self._unexpected.items():
            if (source is None or s == source) and (tag is None or t == tag):
                if best is None or queue[0].order < best.order:
                    best = queue[0]
        return best
