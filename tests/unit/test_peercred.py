"""The peer-credential check's parsing of /proc/net/tcp and /proc/net/tcp6, on sample text (pure), and
once against this host's own tables."""

from __future__ import annotations

import ipaddress
import os
import socket

from allreduce import peercred

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
# 127.0.0.1:54321 -> 127.0.0.1:29500 owned by uid 1000; the accepted end (29500 -> 54321) by uid 0; a
# listener; and a socket nobody holds any more (TIME_WAIT: inode 0).
TCP = HEADER + (
    "   0: 0100007F:734C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0\n"
    "   1: 0100007F:D431 0100007F:733C 01 00000000:00000000 00:00000000 00000000  1000        0 1002 1 0\n"
    "   2: 0100007F:733C 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0\n"
    "   3: 0100007F:D432 0100007F:733C 06 00000000:00000000 03:00000F9E 00000000     0        0 0 3 0\n"
    "   4: 0500000A:D433 0500000A:733C 01 00000000:00000000 00:00000000 00000000  65534        0 1004 1 0\n"
    "   5: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1005 1 0\n")
# [::1]:40000 -> [::1]:29500 by uid 1001, and 127.0.0.1:40001 -> [::ffff:127.0.0.1]:29500 seen through an
# IPv6 socket (v4-mapped), by uid 1002.
TCP6 = HEADER + (
    "   0: 00000000000000000000000001000000:9C40 00000000000000000000000001000000:733C 01 "
    "00000000:00000000 00:00000000 00000000  1001        0 2001 1 0\n"
    "   1: 0000000000000000FFFF00000100007F:9C41 0000000000000000FFFF00000100007F:733C 01 "
    "00000000:00000000 00:00000000 00000000  1002        0 2002 1 0\n")


def test_rows_decode_addresses_ports_uid_and_inode():
    got = list(peercred.rows(TCP, "little"))
    assert got[1] == peercred.Row((ipaddress.ip_address("127.0.0.1"), 54321),
                                  (ipaddress.ip_address("127.0.0.1"), 29500), 1000, 1002)
    assert got[4].local == (ipaddress.ip_address("10.0.0.5"), 54323) and got[4].uid == 65534
    six = list(peercred.rows(TCP6, "little"))
    assert six[0].local == (ipaddress.ip_address("::1"), 40000)
    assert six[1].local == (ipaddress.ip_address("127.0.0.1"), 40001)  # v4-mapped: the IPv4 address it is


def test_rows_on_a_port():
    assert [row.inode for row in peercred.rows(TCP, "little", 54321)] == [1002, 1003]  # either end on it
    assert list(peercred.rows(TCP, "little", 1)) == []


def test_rows_on_a_big_endian_host():
    text = HEADER + "   0: 7F000001:D431 7F000001:733C 01 0:0 0:0 0  7 0 9 1 0\n"
    assert next(peercred.rows(text, "big")).local == (ipaddress.ip_address("127.0.0.1"), 54321)


def test_owner_finds_the_peer_end_of_our_connection():
    tables = [TCP, TCP6]
    assert peercred.owner(tables, ("127.0.0.1", 54321), ("127.0.0.1", 29500), "little") == (True, 1000)
    assert peercred.owner(tables, ("10.0.0.5", 54323), ("10.0.0.5", 29500), "little") == (True, 65534)
    assert peercred.owner(tables, ("::1", 40000), ("::1", 29500), "little") == (True, 1001)
    # a v4 peer accepted on an IPv6 listener, or a v6 socket speaking to a v4 one: both spellings match
    assert peercred.owner(tables, ("::ffff:127.0.0.1", 54321), ("::ffff:127.0.0.1", 29500), "little") == (True, 1000)
    assert peercred.owner(tables, ("127.0.0.1", 40001), ("127.0.0.1", 29500), "little") == (True, 1002)
    assert peercred.owner(tables, ("fe80::1%eth0", 1), ("fe80::2%eth0", 2), "little") == (False, None)


def test_owner_of_a_socket_nobody_holds_or_a_missing_row():
    tables = [TCP, TCP6]
    assert peercred.owner(tables, ("127.0.0.1", 54322), ("127.0.0.1", 29500), "little") == (True, None)
    assert peercred.owner(tables, ("127.0.0.1", 1), ("127.0.0.1", 29500), "little") == (True, None)  # loopback
    assert peercred.owner(tables, ("10.9.9.9", 1), ("10.0.0.5", 29500), "little") == (False, None)  # another host
    assert peercred.owner(["", HEADER], ("10.9.9.9", 1), ("10.0.0.5", 2), "little") == (False, None)


def test_owner_of_a_listener_on_its_address_or_on_all():
    tables = [TCP, TCP6]
    assert peercred.owner(tables, ("127.0.0.1", 0x734C), None, "little") == (True, 0)
    assert peercred.owner(tables, ("10.0.0.5", 8080), None, "little") == (True, 1000)  # bound to 0.0.0.0
    assert peercred.owner(tables, ("127.0.0.1", 29500), None, "little") == (True, None)  # nobody listens there


def test_refusal_by_uid_and_by_host():
    me = os.getuid()
    assert peercred.refusal(peercred.Owner(True, me), "p", remote_ok=False) is None
    assert peercred.refusal(peercred.Owner(True, 0), "p", remote_ok=False) is None  # root may
    assert "runs as uid 4242" in peercred.refusal(peercred.Owner(True, 4242), "p", remote_ok=True)
    assert "no process owns" in peercred.refusal(peercred.Owner(True, None), "p", remote_ok=True)
    assert peercred.refusal(peercred.Owner(False, None), "p", remote_ok=True) is None
    assert "another host" in peercred.refusal(peercred.Owner(False, None), "p", remote_ok=False)


def test_this_hosts_tables_name_both_ends_of_our_own_connection():
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()) as client:
        assert peercred.peer_owner(client, accepted=False) == (True, os.getuid())
        accepted, _ = listener.accept()
        with accepted:
            assert peercred.peer_owner(accepted) == (True, os.getuid())
