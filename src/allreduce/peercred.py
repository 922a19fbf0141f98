"""Which user runs the process at the other end of a TCP connection on this host.

Without ``ALLREDUCE_SECRET`` the handshake's key is well known, so it proves nothing: a process of
another user on the same host could pass it. The kernel knows better: ``/proc/net/tcp`` and
``/proc/net/tcp6`` list every socket of this network namespace with its owner's uid, so the row whose
local end is our peer's address and whose remote end is ours names the user that connected (Unix
sockets have ``SO_PEERCRED`` for the same). A peer with no row is on another host (or in another
network namespace). The parsing is pure (:func:`rows`, :func:`owner`), the reading is :func:`peer_owner`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from typing import NamedTuple

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Row(NamedTuple):
    """One socket of a ``/proc/net/tcp*`` table."""

    local: tuple[Address, int]
    remote: tuple[Address, int]
    uid: int
    inode: int  # 0: no process holds it any more (closing, TIME_WAIT), so its uid says nothing


class Owner(NamedTuple):
    """What the kernel says of a peer: ``local`` (a row for it exists on this host) and its ``uid``
    (``None`` when no process holds the socket any more)."""

    local: bool
    uid: int | None


def rows(text: str, byteorder: str = sys.byteorder, port: int | None = None) -> Iterator[Row]:
    """The sockets listed in the text of ``/proc/net/tcp`` or ``/proc/net/tcp6`` (its header skipped);
    with ``port``, only those with an end on it (skipped unparsed: a busy host lists thousands).

    The kernel prints each address as 32-bit words in host byte order, ports big-endian, in hex.
    """
    mark = None if port is None else f":{port:04X} "
    for line in text.splitlines()[1:]:
        fields = line.split() if mark is None or mark in line else ()
        if len(fields) < 10:
            continue
        yield Row(_endpoint(fields[1], byteorder), _endpoint(fields[2], byteorder), int(fields[7]), int(fields[9]))


def owner(tables: Iterable[str], peer: tuple[str, int], me: tuple[str, int] | None,
          byteorder: str = sys.byteorder) -> Owner:
    """Who holds the other end of our connection ``me`` <- ``peer``, given the tables' texts; with
    ``me`` ``None``, who listens at ``peer`` (on its address or on all of them)."""
    address = _address(peer[0])
    for text in tables:
        for row in rows(text, byteorder, peer[1]):
            if row.local[1] != peer[1]:
                continue
            if me is None:
                found = row.remote[1] == 0 and (row.local[0] == address or row.local[0].is_unspecified)
            else:
                found = row.local[0] == address and row.remote == (_address(me[0]), me[1])
            if found:
                return Owner(True, row.uid if row.inode else None)
    return Owner(address.is_loopback, None)


def peer_owner(sock: socket.socket, accepted: bool = True) -> Owner:
    """:func:`owner` of a TCP socket's peer, read from this host's tables now: the process that
    connected (``accepted``), else the one that listens where we connected."""
    me = sock.getsockname()[:2] if accepted else None
    return owner((_read(path) for path in TABLES), sock.getpeername()[:2], me)


def refusal(found: Owner, who: str, remote_ok: bool) -> str | None:
    """Why a peer (``who``, for the message) that the kernel says is ``found`` is not of this job, or
    ``None``: one on this host must run as this process's user (or root); one on another host is
    refused unless ``remote_ok``."""
    if not found.local:
        return None if remote_ok else f"{who} is on another host, and every rank of this group is on this one"
    if found.uid is None:
        return f"{who} is on this host, but no process owns its socket any more"
    if found.uid not in (os.getuid(), 0):
        return f"{who} runs as uid {found.uid}, not as this job's user (uid {os.getuid()})"
    return None


def _endpoint(field: str, byteorder: str) -> tuple[Address, int]:
    address, port = field.split(":")
    raw = b"".join(int(address[i:i + 8], 16).to_bytes(4, byteorder) for i in range(0, len(address), 8))
    ip = ipaddress.ip_address(raw)
    return _unmapped(ip), int(port, 16)


def _address(host: str) -> Address:
    return _unmapped(ipaddress.ip_address(host.split("%", 1)[0]))


def _unmapped(ip: Address) -> Address:
    """An IPv4 address seen through an IPv6 socket (``::ffff:a.b.c.d``) as the IPv4 address it is."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
