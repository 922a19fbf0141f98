"""Forming a group: find where each rank runs, connect the transports, and leave again.

Used alike by :func:`allreduce.init_process_group`/:func:`allreduce.new_group` and by the
torch.distributed backend, which brings its own store. The environment has been read by the caller,
into :class:`~allreduce.settings.Settings` and :class:`~allreduce.transport.shm.ShmOptions`; the TCP
links prove themselves with the :class:`~allreduce.security.Security` the settings give. Every
group also gets a point-to-point messenger (:mod:`.p2p`), which listens and publishes its address here;
its links are made on first use.
"""

from __future__ import annotations

import socket
import time

from . import algorithms, logs, p2p, topology
from .addresses import is_loopback
from .errors import ResourceExhausted, exhausted
from .p2p.messenger import P2PPeering
from .runtime import ProcessGroup
from .rendezvous import LEFT_KEY
from .security import Security
from .settings import Settings
from .timeline import TimelineTransport
from .transport import mesh, shm
from .transport.routed import RoutedTransport
from .transport.tcp import TcpPeering, TcpTransport

_log = logs.get("transport")
LEAVE_GRACE = 5.0  # seconds the store host waits at exit for the others to finish with the store
GOODBYE_S = 1.0  # seconds the others give their goodbye: longer, and the store's host is frozen or gone
CLOSED_KEY = "closed"  # where the members of a group count out as they destroy it
# What a group writes per rank ("<kind>/<rank>"): host ids (topology), the mesh's and point-to-point
# addresses, heartbeats and failure reports (runtime.health).
RANK_KEYS = ("host", TcpPeering.kind, shm.ShmTransport.kind, P2PPeering.kind, "progress", mesh.FAILED)


def form_group(store, rank: int, size: int, timeout: float, name: str, ranks: list[int],
               settings: Settings, shm_options: shm.ShmOptions | None = None) -> ProcessGroup:
    """Join ``size`` ranks that share ``store`` into a :class:`ProcessGroup`.

    Args:
        store: the key-value store every member reaches (a prefix view for a subgroup).
        rank, size: this rank's index in the group and the group's size.
        timeout: seconds for connecting, and the deadline of every collective later.
        name: the group's name, unique in the job (it tags every connection).
        ranks: the members' ranks in the world group.
        settings, shm_options: what the environment asked for.

    Raises:
        RendezvousError: a peer could not be reached in time. ValueError: settings that cannot apply.
        ResourceExhausted: this rank ran out of descriptors or memory (told to the peers through the store).
    """
    check_forced_algorithm(settings.algorithm)
    logs.configure(settings.debug)
    logs.tag(ranks[rank])
    try:
        return _form(store, rank, size, timeout, name, ranks, settings, shm_options)
    except (OSError, ResourceExhausted) as exc:
        error = exc if isinstance(exc, ResourceExhausted) else exhausted(exc, f"rank {rank}/{size}: forming "
                                                                              f"process group '{name}'")
        if error is None:
            raise
        try:  # the peers waiting for this rank's addresses read why, instead of waiting out the timeout
            store.within(GOODBYE_S).set(f"{mesh.FAILED}/{rank}", f"{type(error).__name__}: {error}".encode())
        except Exception:
            pass
        if error is exc:
            raise
        raise error from exc


def _form(store, rank: int, size: int, timeout: float, name: str, ranks: list[int], settings: Settings,
          shm_options: shm.ShmOptions | None) -> ProcessGroup:
    topo = topology.discover(store, rank, size, timeout, settings.host_id)
    security = Security.of(settings).among(len(topo.hosts))
    transport, intra = connect(store, rank, size, topo, name, timeout, settings, security, shm_options)
    near = [r for r in topo.local_ranks if r != rank] if intra == "shm" else []
    _log.info("group %s: rank %d/%d reaches ranks %s by shared memory, ranks %s by TCP", name, rank, size,
              near, [r for r in range(size) if r != rank and r not in near])
    if settings.timeline:  # a Chrome trace per rank, written when the group closes
        transport = TimelineTransport(transport, settings.timeline, ranks[rank], name)
    try:  # point-to-point: listen and publish the address now; links are made on first use
        engine = p2p.Messenger.start(store, rank, size, bind_host(store, settings), name, timeout, security)
    except BaseException:
        transport.close()
        raise
    return ProcessGroup(store, rank, size, transport, timeout, name, ranks, topo, intra, settings, engine, shm_options)


def check_forced_algorithm(name: str) -> None:
    """``ValueError`` unless ``name`` (``ALLREDUCE_ALGO``) is ``auto`` or some collective's algorithm."""
    known = sorted({a for c in algorithms.COLLECTIVES for a in algorithms.names(c)})
    if name != "auto" and name not in known:
        raise ValueError(f"ALLREDUCE_ALGO={name!r} is not an algorithm; use auto or one of {', '.join(known)}")


def connect(store, rank: int, size: int, topo: topology.Topology, name: str, timeout: float,
            settings: Settings, security: Security, shm_options: shm.ShmOptions | None = None):
    """``(transport, intra)``: shared memory among this host's ranks where the platform allows, TCP to
    the others (proving itself with ``security``); ``settings.transport`` may force one. ``intra`` names
    the one used inside a host."""
    local = list(topo.local_ranks)
    if settings.transport == "shm" and (len(topo.hosts) > 1 or not shm.available()):
        why = (f"this group spans {len(topo.hosts)} hosts" if len(topo.hosts) > 1
               else "this platform lacks memfd, Unix seqpacket sockets or x86-64 memory ordering")
        raise ValueError(f"ALLREDUCE_TRANSPORT=shm needs every rank on one host of a capable platform, but {why}; "
                         "unset it to let each pair of ranks use what reaches it")
    if settings.transport == "tcp" or len(local) == 1 or not shm.available():
        return TcpTransport.connect(rank, size, store, bind_host(store, settings), name, timeout, security), "tcp"
    near = shm.ShmTransport.connect(rank, size, store, name, timeout, local, shm_options or shm.ShmOptions())
    if len(local) == size:
        return near, "shm"
    try:
        far = TcpTransport.connect(rank, size, store, bind_host(store, settings), name, timeout, security)
    except BaseException:
        near.close()
        raise
    others = [r for r in range(size) if r not in local]
    return RoutedTransport(rank, size, [(near, [r for r in local if r != rank]), (far, others)]), "shm"


def bind_host(store, settings: Settings) -> str:
    """The address peers reach this rank on: ``settings.address``, else the interface facing the store."""
    if settings.address:
        return settings.address
    store = store.base  # a subgroup's prefix view: the address is the underlying store's
    host = getattr(store, "host", None)
    if not host or is_loopback(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
        probe.connect((host, getattr(store, "port", 9)))
        return probe.getsockname()[0]


def release(store, size: int) -> None:
    """Count this rank out of the destroyed group whose keys ``store`` holds; the last one out deletes
    them all (peers may read a rank's keys until they close too), so that a job forming groups in a loop
    stays within the store's limits. Bounded and best effort, as leaving is."""
    try:
        if store.within(GOODBYE_S).add(CLOSED_KEY, 1) < size:
            return
        bounded = store.within(LEAVE_GRACE)
        for rank in range(size):
            for kind in RANK_KEYS:
                bounded.delete_key(f"{kind}/{rank}")
        bounded.delete_key(CLOSED_KEY)
    except Exception:  # the store host may be gone, or the grace over (CommTimeout)
        pass


def leave(store, size: int, wait: bool = True) -> None:
    """Say goodbye through the store; its host waits (briefly) until everyone has, then closes it.

    After a failure (``wait=False``) nobody waits: the missing ranks may be dead. Every store call is
    bounded, so that leaving takes seconds at most even when the store's host is frozen.
    """
    host = wait and getattr(store.base, "is_server", False)
    bounded = store.within(LEAVE_GRACE if host else GOODBYE_S)
    try:
        left = bounded.add(LEFT_KEY, 1)
        while host and left < size:
            time.sleep(0.01)
            left = bounded.add(LEFT_KEY, 0)
    except Exception:  # the store host may be gone, or the grace over (CommTimeout); leaving is best effort
        pass
    store.close()
