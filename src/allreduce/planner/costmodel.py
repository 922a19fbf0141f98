"""The alpha-beta-gamma cost model: what the machine costs (a :class:`Profile`) and what each algorithm
is predicted to take on it (:func:`predict`).

A profile holds, per transport (``tcp``, ``shm``) and *scope* (``intra``: ranks of one host,
``inter``: between hosts), a :class:`~allreduce.model.network.Link` (alpha seconds per message, beta
seconds per byte, and how much a port slows down when it sends and receives at once), plus gamma
(seconds per byte reduced) per dtype, the cost of a local copy, and the cores per host (a host running
more ranks than it has cores is slower at everything its CPU does; see
:class:`~allreduce.model.network.Network`). ``allreduce tune`` measures it and stores it as JSON;
:func:`load` reads it from the file the caller names (``ALLREDUCE_PROFILE``, read into the group's
settings) or the user's cache (``~/.cache/allreduce/profile.json``), and anything a file leaves out
comes from :data:`DEFAULT`, measured on the development machine (the inter-host link there is an
assumed 10 GbE network, since one machine cannot measure it).

Predictions use each algorithm's own formula, ``algorithms.get(collective, name).cost(n, m, alpha,
beta, gamma)`` with ``m`` the bytes of the whole buffer (a pipelined entry at the chunk it runs),
priced on one *effective link*: on one host the intra-host link; with one rank per host the
inter-host link; otherwise the inter-host link with its bandwidth divided by the number of the host's
ranks that the algorithm has crossing hosts at once (counted from its schedules, once per world size;
all of the fullest host's ranks when hosts differ in size), which is what the host's NIC sees.
``beta`` is multiplied by ``duplex`` where some rank of the algorithm sends and receives in the same
step (counted from its schedules, once per world size), as most do; a binomial tree's ranks take
turns. The formulas count no local copies, so the busiest rank's copies (counted from the
schedules, once per world size) are added at ``copy`` per byte, and each of the busiest rank's schedule
steps (counted from the schedules) at the link's ``step`` (a pipelined entry, whose steps are its
chunks, pays it with each chunk's alpha). The simulator (:mod:`allreduce.sim`)
times the same schedules message by message when a finer answer is worth the wait;
``allreduce plan --simulate`` shows both.
"""

from __future__ import annotations

import functools
import json
import math
import os
import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import algorithms, collectives
from ..dtypes import resolve
from ..model import traffic
from ..model.network import Link, Network

TRANSPORTS = ("tcp", "shm")  # those ``allreduce tune`` measures
LINES = "lines"  # the shared-memory lines' own figures: a profile's link, priced as a transport of one host
SCOPES = ("intra", "inter")
FORMAT = 1  # version of the profile file


@dataclass(frozen=True)
class Profile:
    """Measured costs of one machine (or cluster); hashable so predictions can be cached."""

    links: tuple  # ((transport, scope, Link), ...)
    gamma: tuple  # ((dtype name, seconds per byte reduced), ...)
    copy: float  # seconds per byte of a local copy
    source: str = "built-in defaults"  # the file it was read from
    machine: str = ""  # what measured it, free text
    cores: int = 0  # cores per host (0: unknown, never fewer than the ranks)

    def link(self, transport: str, scope: str) -> Link:
        """The link of ``transport`` in ``scope``; a transport without its own intra-host figures (or
        any inter-host ones) falls back to TCP's."""
        for candidate in ((transport, scope), ("tcp", scope)):
            for t, s, link in self.links:
                if (t, s) == candidate:
                    return link
        raise ValueError(f"profile {self.source} has no {transport} {scope}-host link")

    def gamma_for(self, dtype) -> float:
        """Seconds per byte reduced for ``dtype``; float32's for a dtype the profile does not list."""
        table = dict(self.gamma)
        return table.get(dtype if isinstance(dtype, str) else str(np.dtype(dtype)), table["float32"])

    def network(self, hosts: int = 1, dtype="float32", transport: str = "tcp") -> Network:
        """The simulator's :class:`Network` for ``hosts`` hosts, reducing ``dtype`` over ``transport``."""
        return Network(self.link(transport, "intra"), self.link("tcp", "inter"), self.gamma_for(dtype),
                       self.copy, hosts, self.cores)

    def updated(self, links: dict | None = None, gamma: dict | None = None, copy: float | None = None,
                machine: str | None = None, cores: int | None = None) -> Profile:
        """A copy with the given ``{(transport, scope): Link}`` and ``{dtype: gamma}`` replaced, and the
        other fields that are not ``None``."""
        merged = {(t, s): link for t, s, link in self.links} | (links or {})
        return Profile(tuple((t, s, link) for (t, s), link in sorted(merged.items())),
                       tuple(sorted((dict(self.gamma) | (gamma or {})).items())),
                       self.copy if copy is None else copy, self.source, self.machine if machine is None else machine,
                       self.cores if cores is None else cores)

    def to_json(self) -> dict:
        links: dict = {}
        for t, s, link in self.links:
            links.setdefault(t, {})[s] = {"alpha": link.alpha, "beta": link.beta, "duplex": link.duplex,
                                          "step": link.step, "crowded": link.crowded}
        return {"format": FORMAT, "machine": self.machine, "cores": self.cores, "links": links,
                "gamma": dict(self.gamma), "copy": self.copy}


def _default() -> Profile:
    """Typical of several ``allreduce tune`` runs on the development machine (a 2-core VM; single runs
    vary by up to 2x with the machine's other load); the inter-host link is an assumed 10 GbE."""
    return Profile(
        # the lines (algorithms/lines.py): alpha is one round, a post and a wait however many peers (an 8 B
        # all-reduce of 2 ranks in docs/performance.md, per-call work included), beta a byte read from a
        # peer's line (a memory copy); tune leaves them be
        links=(("lines", "intra", Link(9e-6, 0.06e-9)),
               ("shm", "intra", Link(40e-6, 0.2e-9, 1.5)),
               ("tcp", "inter", Link(60e-6, 0.8e-9)),
               ("tcp", "intra", Link(50e-6, 0.25e-9, 1.7))),
        gamma=(("bfloat16", 0.9e-9), ("float16", 15e-9), ("float32", 0.085e-9), ("float64", 0.09e-9)),
        copy=0.085e-9,
        cores=os.cpu_count() or 0,  # this machine's, which is where a profile-less job usually runs
    )


DEFAULT = _default()


def default_path(cache_home: str = "") -> str:
    """Where ``allreduce tune`` stores the profile and :func:`load` looks for it when no file is named:
    ``allreduce/profile.json`` in ``cache_home`` (``XDG_CACHE_HOME`` as the edge read it; "": ``~/.cache``)."""
    cache = cache_home or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "allreduce", "profile.json")


def load(path: str | None = None, cache_home: str = "") -> Profile:
    """The profile at ``path`` (default :func:`default_path` of ``cache_home``) over :data:`DEFAULT`.

    A missing file at the default place gives :data:`DEFAULT`; the file is read again only when it
    changes.

    Raises:
        ValueError: the file named by ``path`` is missing or malformed.
    """
    explicit = bool(path)
    path = path or default_path(cache_home)
    try:
        stamp = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        if explicit:
            raise ValueError(f"no cost profile at {path}; run `allreduce tune --output {path}` "
                             "to measure one") from None
        return DEFAULT
    return _read(path, stamp)


@functools.lru_cache(maxsize=8)
def _read(path: str, stamp: int) -> Profile:
    try:
        with open(path) as f:
            data = json.load(f)
        return from_json(data, source=path)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"cost profile {path} is unreadable ({exc}); "
                         "run `allreduce tune` to write a new one") from None


def from_json(data: dict, source: str = "") -> Profile:
    """A profile from its JSON form (as :meth:`Profile.to_json` writes it) over :data:`DEFAULT`."""
    if data.get("format", FORMAT) != FORMAT:
        raise ValueError(f"profile format {data.get('format')} is not {FORMAT}")
    links = {}
    for transport, scopes in data.get("links", {}).items():
        for scope, fields in scopes.items():
            if transport not in (*TRANSPORTS, LINES) or scope not in SCOPES:
                raise ValueError(f"unknown link {transport}/{scope}; known transports {(*TRANSPORTS, LINES)}, "
                                 f"scopes {SCOPES}")
            links[transport, scope] = Link(float(fields["alpha"]), float(fields["beta"]),
                                           float(fields.get("duplex", 1.0)), float(fields.get("step", 0.0)),
                                           float(fields.get("crowded", 1.0)))
    gamma = {str(resolve(name)): float(value) for name, value in data.get("gamma", {}).items()}
    cores = data.get("cores")
    profile = DEFAULT.updated(links, gamma, data.get("copy"), data.get("machine", ""),
                              None if cores is None else int(cores))
    return dataclasses.replace(profile, source=source)


def save(profile: Profile, path: str) -> None:
    """Write ``profile`` as JSON at ``path``, creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(profile.to_json(), f, indent=1)
        f.write("\n")


def transport_for(collective: str, name: str, hosts: int, transport: str) -> str:
    """The transport whose figures price ``name``: the lines' own for an entry of the lines on one host."""
    return LINES if hosts == 1 and algorithms.get(collective, name).medium == "lines" else transport


def predict(collective: str, name: str, nbytes: int, size: int, network: Network, itemsize: int = 4) -> float | None:
    """Predicted seconds of ``name`` for a whole buffer of ``nbytes`` on ``size`` ranks, or ``None``
    when the algorithm has no formula.

    Example: ``predict("all_reduce", "ring", 2**20, 4, DEFAULT.network())`` is about a millisecond.
    """
    entry = algorithms.get(collective, name)
    if entry.cost is None:
        return None
    if size == 1:
        return 0.0
    network = network.stretched(*crowding(collective, name, size, network)) if network.stretch(size) > 1.0 \
        else network.for_ranks(size)
    alpha, beta = effective_link(collective, name, size, network, exchanges(collective, name, size))
    step = step_cost(size, network)
    facts = collectives.get(collective)
    count = facts.count_for(nbytes, size, itemsize)
    whole = facts.whole(count, size) * itemsize
    copying = network.copy * copy_share(collective, name, size) * whole
    if "chunk" in entry.options:  # a pipeline's steps are its chunks, each paying alpha
        extra, stepping = {"chunk_bytes": entry.options["chunk"] * itemsize}, 0.0
        alpha += step
    else:
        extra, stepping = {}, step * step_count(collective, name, size, min(count, 64 * size))
    return float(entry.cost(size, whole, alpha, beta, network.gamma, **extra)) + copying + stepping


def step_cost(size: int, network: Network) -> float:
    """Seconds per schedule step on the link of :func:`effective_link` (``network`` already stretched)."""
    if network.hosts == 1:
        return network.intra.step
    return network.inter.step if network.hosts >= size else max(network.intra.step, network.inter.step)


@functools.lru_cache(maxsize=1024)
def step_count(collective: str, name: str, size: int, count: int) -> int:
    """Schedule steps of ``name`` on ``size`` ranks for ``count`` elements (empty steps left out)."""
    return traffic.extract(collective, name, size, count, 1).steps


def effective_link(collective: str, name: str, size: int, network: Network, duplex: bool = True) -> tuple[float, float]:
    """``(alpha, beta)`` of the single link the formula of ``name`` is priced on (module docstring);
    ``duplex``: whether its ranks send and receive at once (see :func:`exchanges`)."""
    intra, inter = network.intra, network.inter
    intra_beta = intra.beta * (intra.duplex if duplex else 1.0)
    inter_beta = inter.beta * (inter.duplex if duplex else 1.0)
    hosts = network.hosts
    if hosts == 1:
        return intra.alpha, intra_beta
    if hosts >= size:
        return inter.alpha, inter_beta
    # hosts of unequal size: as if the fullest host's ranks all crossed at once
    share = nic_share(collective, name, size, hosts) if size % hosts == 0 else -(-size // hosts)
    return max(intra.alpha, inter.alpha), max(intra_beta, inter_beta * share)


def crowding(collective: str, name: str, size: int, network: Network) -> tuple[float, float]:
    """How much slower ``name``'s per-byte and its fixed costs are where a host's ranks outnumber its
    cores: each step is stretched by its busy ranks (:meth:`Network.stretch`), weighted by the bytes
    of the step's busiest rank and by steps respectively. A pipeline keeps every rank busy once full."""
    if "chunk" in algorithms.get(collective, name).options:
        return network.stretch(size), network.stretch(size)
    busy, weight = activity(collective, name, size, network.hosts)
    slow = np.array([network.stretch(size, b) for b in busy])
    return (float(np.average(slow, weights=weight)) if weight.sum() else network.stretch(size),
            float(slow.mean()) if slow.size else 1.0)


@functools.lru_cache(maxsize=256)
def activity(collective: str, name: str, size: int, hosts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step with messages of ``name``: the most busy ranks of one host, and the bytes its busiest
    rank sends and receives (of a buffer of ``64 * size`` bytes)."""
    flow = traffic.extract(collective, name, size, 64 * size, 1, hosts)
    steps = np.repeat(np.arange(flow.steps), np.diff(flow.offsets))
    moved = np.zeros((flow.steps, flow.ranks))
    np.add.at(moved, (steps, flow.src), flow.nbytes)
    np.add.at(moved, (steps, flow.dst), flow.nbytes)
    sending = np.diff(flow.offsets) > 0
    return flow.busy()[sending], moved.max(axis=1, initial=0.0)[sending]


@functools.lru_cache(maxsize=256)
def exchanges(collective: str, name: str, size: int) -> bool:
    """Whether some rank of ``name`` sends and receives in the same step (a pipeline's do, once it has
    several chunks)."""
    if "chunk" in algorithms.get(collective, name).options:
        return True
    flow = traffic.extract(collective, name, size, 64 * size, 1)
    for s in range(flow.steps):
        rows = slice(flow.offsets[s], flow.offsets[s + 1])
        if np.intersect1d(flow.src[rows], flow.dst[rows]).size:
            return True
    return False


@functools.lru_cache(maxsize=256)
def copy_share(collective: str, name: str, size: int) -> float:
    """The most bytes one rank copies locally in ``name``, as a fraction of the whole buffer."""
    count = 64 * size  # enough for every chunk of every rank to be non-empty
    flow = traffic.extract(collective, name, size, count, 1)
    copied = np.bincount(flow.copy_rank, weights=flow.copy_bytes, minlength=flow.ranks)
    return float(copied.max(initial=0.0)) / collectives.get(collective).whole(count, size)


@functools.lru_cache(maxsize=256)
def nic_share(collective: str, name: str, size: int, hosts: int) -> int:
    """The most messages that cross one host's NIC in one direction in one step of ``name``."""
    flow = traffic.extract(collective, name, size, size, 1, hosts)
    most = 0
    for s in range(flow.steps):
        crossing = flow.inter[flow.offsets[s]:flow.offsets[s + 1]]
        for hosts_of in (flow.src_host, flow.dst_host):
            ids = hosts_of[flow.offsets[s]:flow.offsets[s + 1]][crossing]
            most = max(most, int(np.bincount(ids).max(initial=0)) if ids.size else 0)
    return most


def explain(collective: str, nbytes: int, size: int, network: Network, itemsize: int = 4,
            candidates: tuple[str, ...] | None = None) -> str:
    """Why :func:`best` picks what it picks, in one line: its predicted time, how much faster it is
    than the runner-up, and whether per-message latency or moving and reducing bytes dominates.

    Example: ``"ring (48.1 ms, 1.21x faster than rabenseifner; 99% of it is moving and reducing bytes)"``.
    """
    candidates = algorithms.anywhere(collective, algorithms.names(collective)) if candidates is None else candidates
    choice = best(collective, nbytes, size, network, itemsize, candidates)
    seconds = predict(collective, choice, nbytes, size, network, itemsize)
    if seconds is None:
        return f"{choice} (the collective's default: no prediction to compare)"
    if size == 1:
        return f"{choice} (one rank: nothing to send)"
    others = sorted((t, name) for name in candidates if name != choice
                    for t in [predict(collective, name, nbytes, size, network, itemsize)] if t is not None)
    versus = ""
    if others and seconds > 0:
        ratio, runner_up = others[0][0] / seconds, others[0][1]
        versus = f", as fast as {runner_up}" if ratio < 1.005 else f", {ratio:.2f}x faster than {runner_up}"
    latency_only = dataclasses.replace(network, intra=dataclasses.replace(network.intra, beta=0.0),
                                       inter=dataclasses.replace(network.inter, beta=0.0), gamma=0.0, copy=0.0)
    latency = predict(collective, choice, nbytes, size, latency_only, itemsize) or 0.0
    bound = (f"{latency / seconds:.0%} of it is per-message latency" if latency * 2 >= seconds
             else f"{1 - latency / seconds:.0%} of it is moving and reducing bytes")
    return f"{choice} ({_duration(seconds)}{versus}; {bound})"


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def best(collective: str, nbytes: int, size: int, network: Network, itemsize: int = 4,
         candidates: tuple[str, ...] | None = None) -> str:
    """The algorithm among ``candidates`` (default: all that run on any transport) with the smallest
    predicted time; the collective's default when none has a formula (the first candidate when the
    default is not one)."""
    candidates = algorithms.anywhere(collective, algorithms.names(collective)) if candidates is None else candidates
    times = {name: predict(collective, name, nbytes, size, network, itemsize) for name in candidates}
    priced = {name: t for name, t in times.items() if t is not None and math.isfinite(t)}
    if priced:
        return min(priced, key=priced.get)
    default = algorithms.DEFAULTS[collective]
    return default if default in candidates else candidates[0]
