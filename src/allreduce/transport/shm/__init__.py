"""Shared-memory transport for the ranks of one host: rings of slots in memfd segments, no sockets on
the data path.

Set-up: every rank creates a *control segment* (``shmseg.py``) and listens on an abstract Unix socket
(no file system entry) whose random name it publishes in the store; ranks connect down and accept up
(the same mesh as TCP's, :mod:`..mesh`), check that the other end runs as the same user
(``SO_PEERCRED``), prove they belong to the group with a hello, and pass each other their control
segment's descriptor over the socket (``SCM_RIGHTS``). After that the socket carries only wake-ups,
the descriptors of registered buffers and notices to unmap freed ones; it also tells at once, by
closing, that a peer has died.

Channels: the control segment of rank ``p`` holds one *channel* per peer ``q``: two counters, each on
its own cache line (``sent``, written only by ``p``, and ``taken``, written only by ``q``) and a ring
of ``slots``. A slot holds the 40-byte frame header (the same as on TCP, compared byte for byte with
the expected one before anything is read, so mismatched calls raise ``Mismatch``), a small
descriptor and up to ``chunk`` bytes of payload. A message travels in one of four ways:

- *inline*: copied into consecutive slots, ``chunk`` bytes at a time, as slots come free; the
  receiver reduces straight out of the slot (``RecvSpec.absorb``) or copies into ``dest``. The send
  is done when its last chunk is posted. Messages up to ``inline_max``, and larger ones where none
  of the next three ways is open.
- *registered*: the payload already lies in a registered segment (``allreduce.empty``): the slot
  names the segment and offset, the receiver maps it (the descriptor came over the socket the first
  time) and reduces or copies straight out of it. Zero copies on the sending side.
- *staged*: a collective's payload up to ``staged_max`` (4 MiB) in private memory is copied once
  into a staging segment of the sender's, which the receiver maps and reduces or copies straight out
  of; the send is done at once. A memory copy runs two to three times faster than
  ``process_vm_readv``, which pins the peer's pages on every call; above a few MiB that cost is
  spread thin and the staging copy would only add memory traffic.
- *cross-memory*: larger payloads: the slot names the payload's address; the receiver reads it out of
  the sender's private memory with ``process_vm_readv`` (``cma.py``), piece by piece: straight into
  ``dest``, or, for a receive that reduces, into a small bounce buffer whose pieces are absorbed while
  still in cache. One copy, and no staging memory of the payload's size.

Registered and cross-memory sends are rendezvous: the send is done when the receiver has taken
the slot, so the sender's memory is not reused while it is read. Point-to-point sends (``send``/``isend``), whose
receiver may run later, are *buffered* instead: copied into a staging segment that is read like a registered one,
and done at once, as on TCP. Frames on one link keep their order, and receives that absorb complete
in list order, so reductions combine in the schedule's order.

Counters are aligned 8-byte words written with single stores; the protocol relies on the stores of
one process becoming visible to others in program order (x86-64 total store order), which is why
:func:`available` is limited to x86-64.

Waiting is cheap and fair on a busy machine: spin briefly, then ``sched_yield``, then sleep in
``poll`` on the peers' sockets and process descriptors after raising a *sleeping* flag that peers
check when they post, so a posted message wakes the sleeper at once. Spinning only pays while every
rank has a core: there is none when ranks outnumber cores, and neither spinning nor yielding while
other work keeps the cores busy (the load average is above the core count), because a waiting rank
would then only delay the peer it waits for. Every wait keeps the deadline; a peer that exits (its
pidfd or socket says so), closes or aborts (a state word and reason in its segment) raises
``PeerLost``, after anything it had already posted has been taken.

Files, one concern each: ``options`` (sizes and waiting policy, from ``ALLREDUCE_SHM_*``), ``layout``
(offsets in a control segment), ``peering`` (hello and notices over the Unix socket), ``link`` (the
link to one peer: what we know of it), ``dataplane`` (posting and taking slots), ``waiting`` (spin, yield, sleep),
``linepath`` (the small-message path: one line per rank and call, read in place, futex wake-ups) and
``transport`` (set-up, the exchange loop, teardown).
"""

from __future__ import annotations

import platform
import socket

from .. import shmseg
from .options import ShmOptions
from .transport import ShmTransport

__all__ = ["ShmOptions", "ShmTransport", "available"]


def available() -> bool:
    """Whether this machine can run the transport: Linux memfd, Unix seqpacket sockets, x86-64 ordering."""
    return (shmseg.available() and hasattr(socket, "AF_UNIX") and hasattr(socket, "SOCK_SEQPACKET")
            and hasattr(socket, "send_fds") and platform.machine().lower() in ("x86_64", "amd64"))
