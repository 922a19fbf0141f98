"""Another user's process on the host, without ALLREDUCE_SECRET: refused by the store and by a rank's
point-to-point port (so it cannot make a rank unpickle), while the job goes on. And a group across
hosts without a secret refuses every call that unpickles, until one is set."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time

import pytest
from support.harness import free_port, on_hosts, run_ranks

import allreduce as dist
from allreduce import MPI, wire
from allreduce.dtypes import code_of
from allreduce.errors import RendezvousError
from allreduce.p2p.messenger import P2PPeering
from allreduce.rendezvous import TCPStore
from allreduce.security import Security

NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                             reason="a stranger of another uid needs root to setuid")


def as_stranger(attack, *args) -> str:
    """Run ``attack(*args)`` in a forked child that runs as uid 65534; what it returned, or its error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, attack, report, and leave without cleaning up the parent's state
        os.close(read)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            outcome = str(attack(*args))
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


class Payload:
    """Unpickling this creates the directory ``marker``: the proof that a rank ran the stranger's code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def join_store_and_write(port: int) -> str:
    with TCPStore("127.0.0.1", port, timeout=5) as store:
        store.set("evil", b"1")
    return "joined"


@as_root
def test_another_users_process_cannot_join_the_store():
    with TCPStore("127.0.0.1", 0, is_server=True, timeout=5) as server:
        outcome = as_stranger(join_store_and_write, server.port)
        assert outcome.startswith("RendezvousError") and "another user" in outcome, outcome
        assert not server.check(["evil"])
        with TCPStore("127.0.0.1", server.port, timeout=5) as ours:  # the store goes on serving the job
            ours.set("k", b"v")
            assert server.get("k") == b"v"


def send_pickle_as_rank_1(address: str, name: str, marker: str) -> str:
    """Link with rank 0's point-to-point port as rank 1 would, and send it a message that runs code."""
    sock = P2PPeering(1, 2, "127.0.0.1", f"{name}/p2p", Security(), [0]).dial(0, address, time.monotonic() + 10)
    evil = pickle.dumps(Payload(marker))
    sock.sendall(wire.message(0, 0, code_of("uint8"), len(evil), len(evil)) + evil)
    time.sleep(1.0)  # give rank 0 the time to read it before the rank sends its own
    sock.close()
    return "sent"


@as_root
def test_another_users_process_cannot_make_a_rank_unpickle(tmp_path):
    marker = str(tmp_path / "ran")
    port = free_port()

    def body(rank, size):
        outcome = None
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=30)
        try:
            group = dist.default_group()
            if rank == 0:
                address = group.store.get("p2p/0").decode()
                outcome = as_stranger(send_pickle_as_rank_1, address, group.name, marker)
                group.store.set("attacked", outcome.encode())
                got = MPI.COMM_WORLD.recv(source=1)
            else:
                group.store.get("attacked", timeout=30)
                MPI.COMM_WORLD.send({"from": "rank 1"}, dest=0)
                got = None
            dist.barrier()
            return outcome, got
        finally:
            dist.destroy_process_group()

    (outcome, got), _ = run_ranks(body, 2, init=False)
    assert not os.path.exists(marker), "rank 0 ran the stranger's pickle"
    assert outcome.startswith("RendezvousError") and "another user" in outcome, outcome
    assert got == {"from": "rank 1"}


def squat(tell: int, stop: tuple[int, int]) -> str:
    """Listen where a rank would and say where (on the fd ``tell``), until ``stop``'s write end closes."""
    os.close(stop[1])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        os.write(tell, str(listener.getsockname()[1]).encode())
        os.read(stop[0], 1)
    return "done"


@as_root
def test_a_rank_does_not_talk_to_another_users_listener():
    """A port announced in a store a stranger could write (torch's), or squatted: the dialer checks."""
    read, write = os.pipe()
    stop = os.pipe()
    stranger = threading.Thread(target=as_stranger, args=(squat, write, stop))
    stranger.start()
    port = int(os.read(read, 16))
    for fd in (read, write, stop[0]):
        os.close(fd)
    try:
        with pytest.raises(RendezvousError, match="not of this job: 127.0.0.1:.* runs as uid 65534"):
            TCPStore("127.0.0.1", port, timeout=5)
        with pytest.raises(RendezvousError, match="not of this job: 127.0.0.1:.* runs as uid 65534"):
            P2PPeering(1, 2, "127.0.0.1", "g/p2p", Security(), [0]).dial(0, f"127.0.0.1:{port}",
                                                                            time.monotonic() + 5)
    finally:
        os.close(stop[1])
        stranger.join()


# ---- across hosts ----------------------------------------------------------------------------------

def each_unpickling_call(rank, size):
    """Every call that unpickles a peer's bytes, each: ``"ok"`` or the error it raised."""
    comm = MPI.COMM_WORLD
    calls = {
        "broadcast_object_list": lambda: dist.broadcast_object_list([rank], src=0),
        "all_gather_object": lambda: dist.all_gather_object([None] * size, rank),
        "gather_object": lambda: dist.gather_object(rank, [None] * size if rank == 0 else None, dst=0),
        "scatter_object_list": lambda: dist.scatter_object_list([None], [0, 1] if rank == 0 else None, src=0),
        "bcast": lambda: comm.bcast(rank), "allgather": lambda: comm.allgather(rank),
        "alltoall": lambda: comm.alltoall([rank] * size), "allreduce": lambda: comm.allreduce(rank),
        "sendrecv": lambda: comm.sendrecv(rank, dest=1 - rank, source=1 - rank),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "ok"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def test_unpickling_across_hosts_without_a_secret_is_refused():
    for outcome in run_ranks(on_hosts(1, each_unpickling_call), 2, init=False):
        for name, said in outcome.items():
            assert said.startswith("Untrusted") and "ALLREDUCE_SECRET" in said and "export" in said, (name, said)


def test_unpickling_across_hosts_with_a_secret_works():
    secret = {"ALLREDUCE_SECRET": "s3cret-for-this-test"}
    for outcome in run_ranks(on_hosts(1, each_unpickling_call), 2, init=False, env=secret):
        assert set(outcome.values()) == {"ok"}, outcome
