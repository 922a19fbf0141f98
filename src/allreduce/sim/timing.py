"""Times :class:`~allreduce.model.traffic.Traffic` on a :class:`~allreduce.model.network.Network`.

Each rank has the time it finished its last step (``ready``); there is no global clock
tick, so fast ranks run ahead exactly as the executor lets them. One step at a time, for all its
messages at once (numpy):

1. each rank's copies of the step delay it by ``copy`` per byte;
2. a message starts when both its sender and its receiver have reached the step (a receiver that is
   still busy cannot take it in);
3. it lasts ``alpha + step + load * beta`` (``step`` once per step, since the step's messages run
   side by side), where ``load`` is the bytes the busiest resource it crosses must
   carry until it is through: the sender's egress, the receiver's ingress (each per class of link),
   and for a message between hosts both NICs (over all the host's ranks). A resource serves its
   messages of the step in equal shares, so a message of ``b`` bytes is through once the resource has
   carried every smaller message and ``b`` bytes of each other one; ``k`` equal messages thus take
   ``k b beta``. A port that also carries the other direction in the step is slower by ``duplex``;
4. the receiver then reduces it, ``gamma`` per byte, when the schedule says so; one rank reduces
   one segment at a time, so a reduced message is done when all the step's reductions of its
   receiver are;
5. a rank's step ends when all its messages (and reductions) have.

Shares are settled per step: the messages of one step on one port are taken to start together,
which is what a bulk-synchronous step does and what keeps the timing vectorized.

*Runs of equal steps.* Each step maps the ranks' times through maxima and fixed additions, so
delaying every rank by ``c`` delays the result by ``c``. A ring repeats one step ``n - 1`` times;
once such a step moves every rank by the same time, every later repetition does too, and the rest of
the run is skipped by adding that time (exact; ``tests/unit/test_sim_abridged.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..model.network import Network
from ..model.traffic import Traffic

# on_step(step, t0, end, done): per message of the step, start, end of transfer, end of reduction
StepHook = Callable[[int, np.ndarray, np.ndarray, np.ndarray], None]


def run(traffic: Traffic, network: Network, on_step: StepHook | None = None) -> np.ndarray:
    """Run ``traffic`` over ``network``; return each simulated rank's finishing time in seconds."""
    if network.stretch(traffic.size) > 1.0:  # ranks outnumber cores: stretched by each step's busy ranks
        busy = traffic.busy()
        networks = [network.for_ranks(traffic.size, b) for b in range(int(busy.max(initial=0)) + 1)]
    else:
        busy, networks = np.zeros(traffic.steps, np.int64), [network.for_ranks(traffic.size)]
    ready = np.zeros(traffic.ranks)
    ports = 2 * traffic.ranks
    repeats = _repeats(traffic) if on_step is None else np.zeros(traffic.steps, np.int64)
    s = 0
    while s < traffic.steps:
        before = ready.copy() if repeats[s] else None
        _step(traffic, networks[busy[s]], ready, s, ports, on_step)
        if before is not None:
            moved = ready - before
            if np.ptp(moved) <= 1e-12 * max(float(moved.max()), 0.0):  # every rank moved alike: so will the rest
                ready += moved.max() * repeats[s]
                s += int(repeats[s])
        s += 1
    return ready


def _step(traffic: Traffic, network: Network, ready: np.ndarray, s: int, ports: int, on_step) -> None:
    """Advance ``ready`` through step ``s`` (the numbered points of the module docstring)."""
    intra, inter = network.intra, network.inter
    a, b = traffic.copy_offsets[s], traffic.copy_offsets[s + 1]
    if a < b:
        np.add.at(ready, traffic.copy_rank[a:b], traffic.copy_bytes[a:b] * network.copy)
    a, b = traffic.offsets[s], traffic.offsets[s + 1]
    if a == b:
        return
    src, dst, cross = traffic.src[a:b], traffic.dst[a:b], traffic.inter[a:b]
    nbytes = traffic.nbytes[a:b]
    t0 = np.maximum(ready[src], ready[dst])
    duplex = np.where(cross, inter.duplex, intra.duplex)
    load = _load(src * 2 + cross, dst * 2 + cross, nbytes, ports, duplex)
    if cross.any():
        load[cross] = np.maximum(load[cross], _load(traffic.src_host[a:b][cross], traffic.dst_host[a:b][cross],
                                                    nbytes[cross], traffic.hosts, inter.duplex))
    end = (t0 + np.where(cross, inter.alpha + inter.step, intra.alpha + intra.step)
           + load * np.where(cross, inter.beta, intra.beta))
    reduced = np.bincount(dst, weights=nbytes * traffic.reduce[a:b], minlength=traffic.ranks)
    done = end + np.where(traffic.reduce[a:b], reduced[dst] * network.gamma, 0.0)
    if on_step is not None:
        on_step(s, t0, end, done)
    np.maximum.at(ready, src, end)
    np.maximum.at(ready, dst, done)


def _repeats(traffic: Traffic) -> np.ndarray:
    """Per step, how many steps right after it are the same as it (messages and copies alike)."""
    same = np.ones(traffic.steps, bool)  # step s is the same as step s - 1
    same[:1] = False
    for offsets, columns in ((traffic.offsets, (traffic.src, traffic.dst, traffic.nbytes, traffic.reduce,
                                                traffic.inter, traffic.src_host, traffic.dst_host)),
                             (traffic.copy_offsets, (traffic.copy_rank, traffic.copy_bytes))):
        length = np.diff(offsets)
        same[1:] &= length[1:] == length[:-1]
        step = np.repeat(np.arange(traffic.steps), length)
        back = np.r_[0, length][step]  # rows back to the same place in the previous step
        rows = np.arange(len(step))
        differ = (step == 0) | (rows < back)
        ok = rows >= back
        for column in columns:
            differ[ok] |= column[rows[ok]] != column[rows[ok] - back[ok]]
        same &= np.bincount(step[differ], minlength=traffic.steps) == 0
    repeats = np.zeros(traffic.steps, np.int64)
    for s in range(traffic.steps - 2, -1, -1):
        repeats[s] = repeats[s + 1] + 1 if same[s + 1] else 0
    return repeats


def _load(out_port: np.ndarray, in_port: np.ndarray, nbytes: np.ndarray, ports: int, duplex) -> np.ndarray:
    """Per message, the bytes its busier port must carry until it is through (see :func:`_shared`),
    times ``duplex`` where that port also carries the other direction."""
    sending = np.bincount(out_port, minlength=ports)
    receiving = np.bincount(in_port, minlength=ports)
    at_src = _shared(out_port, nbytes, sending) * np.where(receiving[out_port] > 0, duplex, 1.0)
    at_dst = _shared(in_port, nbytes, receiving) * np.where(sending[in_port] > 0, duplex, 1.0)
    return np.maximum(at_src, at_dst)


def _shared(port: np.ndarray, nbytes: np.ndarray, per_port: np.ndarray) -> np.ndarray:
    """Bytes each message's port has carried when the message is through, if the port serves all
    its messages at once in equal shares: a message of ``b`` bytes finishes after the port carried all
    the smaller ones and ``b`` of every other, ``sum(min(b, b_j))``. ``per_port``: messages per port."""
    if per_port.max(initial=0) <= 1:
        return nbytes
    order = np.lexsort((nbytes, port))
    p, b = port[order], nbytes[order]
    first = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])  # where each port's run begins
    run = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(p)]))
    before = np.cumsum(b) - b  # bytes of the smaller messages, within the port's run
    before -= before[first][run]
    left = np.r_[first[1:], len(p)][run] - np.arange(len(p))  # this message and the larger ones
    done = np.empty_like(b)
    done[order] = before + left * b
    return done
