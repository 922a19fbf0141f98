"""Large messages between ranks of one host: the receiver copies the payload straight out of the
sender's array (``process_vm_readv``, :mod:`..transport.cma`): one copy, instead of two through a socket.

Each messenger keeps 16 random bytes (its *token*) at a fixed address, and the first frame on every link
it dials (IDENT) gives its process id and where the token lies. The receiver reads the token there:
only if the bytes are right is it that very process, on this host, and may the kernel let one read
the other (same user, Yama ``ptrace_scope`` below 2). Then the address an announced message carries
is read directly, and the sender is told TAKEN instead of CLEAR. Anything else (another host, another
pid namespace, a refusal) and payloads travel over the link as before.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket

import numpy as np

from .. import wire
from ..transport import cma


class Identity:
    """This process's token, and the IDENT frame that tells a peer where to find it."""

    def __init__(self):
        token = secrets.token_bytes(16)
        self._token = ctypes.create_string_buffer(token, len(token))  # kept alive as long as the messenger
        self.frame = wire.control(wire.IDENT) + wire.IDENTITY.pack(os.getpid(), ctypes.addressof(self._token), token)


def reader_for(sock: socket.socket, identity: bytes) -> cma.Reader | None:
    """A reader of the memory of the peer that sent ``identity`` (an IDENT payload) on ``sock``, if it
    runs on this host and the kernel lets this process read it; else ``None``."""
    pid, address, token = wire.IDENTITY.unpack(identity)
    try:
        if sock.getpeername()[0] != sock.getsockname()[0]:  # another host: its pid means nothing here
            return None
    except (OSError, IndexError):
        return None
    return cma.Reader(pid) if cma.readable(pid, address, token) else None


def address_of(view: memoryview) -> int:
    """Where the (writable, non-empty) bytes of ``view`` lie."""
    return np.frombuffer(view, np.uint8).ctypes.data
