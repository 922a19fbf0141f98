"""What ``allreduce bench`` measures: collectives timed over a sweep of sizes, their results checked.

Every rank of a job runs the same sweep (:func:`sweep`): for each collective, size and algorithm it
runs ``warmup`` untimed calls, then ``iters`` timed ones, each timed with ``perf_counter`` around the
synchronous call, after a barrier so that the ranks start together. A row's time is the median over
iterations of the slowest rank (the per-iteration times are all-reduced with MAX). Bandwidths follow
nccl-tests: ``algbw = size / time``, and ``busbw = algbw * factor``, where the factor (2(n-1)/n for
all_reduce, (n-1)/n for reduce_scatter, all_gather and all_to_all, 1 for reduce and broadcast) makes
the number comparable with the link speed whatever the collective. For reduce_scatter, all_gather
and all_to_all the size is the whole buffer, ``world_size`` blocks of ``size / world_size`` bytes.

Inputs are small integers, so results are exact and known in advance: rank ``r`` holds
``(i + r) % m`` at element ``i``, where the modulus ``m`` is as large as it can be while the reduction
over all ranks stays exact in the dtype (for PRODUCT, rank ``r`` holds 2 where ``(i + r) % (n + 1) ==
0`` and 1 elsewhere). The inputs are periodic, so the expected output is computed over one period and
tiled. In-place collectives get a fresh copy of their input before each call; the buffer left by the
last timed call is checked, and the verdict is all-reduced so that one wrong rank marks the row.

The subcommand and its table are :mod:`.bench`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from .. import collectives, dtypes
from ..ops import ReduceOp, check_op, finish, reduce_into

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "reduce_scatter", "all_gather", "all_to_all")
_MAX_PERIOD = 1021  # the longest input pattern; a prime, so no power-of-two shift maps it onto itself
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes from ``"8"``, ``"64K"``, ``"64M"``, ``"1G"``, ``"64KiB"``, ``"64MB"``... (all powers of 1024).

    Raises:
        ValueError: not a whole number with one of those suffixes.
    """
    match = re.fullmatch(r"\s*(\d+)\s*(?:([KMG])(?:I?B)?|B)?\s*", text.upper())
    if not match:
        raise ValueError(f"not a size: {text!r}; use bytes with an optional K, M or G (or KiB, MiB, GiB) suffix")
    return int(match[1]) * _UNITS[match[2] or ""]


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """The sizes of the sweep: ``min_bytes`` times powers of ``factor``, up to ``max_bytes``."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size = size * factor if size else 1  # after 0 bytes, go on from 1
    return out


@dataclass(frozen=True)
class BenchOptions:
    """What to sweep; every rank of the job must use the same options."""

    collectives: tuple[str, ...] = ("all_reduce",)  # from COLLECTIVES, timed in this order
    min_bytes: int = 8  # first size of the sweep
    max_bytes: int = 64 * 2**20  # last size is the largest min_bytes * factor**k not above this
    factor: int = 2  # ratio between consecutive sizes
    iters: int = 20  # timed calls per row
    warmup: int = 5  # untimed calls before them
    dtype: np.dtype = np.dtype(np.float32)  # element type (a name such as "bfloat16" is accepted)
    op: ReduceOp = ReduceOp.SUM  # reduction for all_reduce, reduce, reduce_scatter (a name is accepted)
    algorithms: tuple[str, ...] = ("auto",)  # one row per algorithm; "all" = every registered one
    check: bool = True  # verify each row's result

    def __post_init__(self):
        unknown = [c for c in self.collectives if c not in COLLECTIVES]
        if unknown or not self.collectives:
            raise ValueError(f"unknown collective {unknown or ''}; use one or more of {', '.join(COLLECTIVES)}")
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise ValueError(f"sizes must satisfy 0 <= min ({self.min_bytes}) <= max ({self.max_bytes})")
        if self.factor < 2:
            raise ValueError(f"the size factor must be at least 2, got {self.factor}")
        if self.iters < 1 or self.warmup < 0:
            raise ValueError(f"need iters >= 1 and warmup >= 0, got {self.iters} and {self.warmup}")
        if not self.algorithms:
            raise ValueError("no algorithm given; use auto, all, or names such as ring,tree")
        dtype = dtypes.resolve(self.dtype)
        dtypes.code_of(dtype)  # TypeError for a dtype collectives cannot carry
        op = ReduceOp[self.op.upper()] if isinstance(self.op, str) else ReduceOp(self.op)
        if any(collectives.get(c).reduces for c in self.collectives):
            check_op(op, dtype)  # TypeError for e.g. AVG on integers
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "op", op)


@dataclass(frozen=True)
class Row:
    """One line of the table: a collective at one size with one algorithm."""

    collective: str
    size: int  # bytes: count * itemsize
    count: int  # elements in the whole buffer
    dtype: str
    op: str  # "none" for collectives that do not reduce
    algorithm: str
    time_us: float  # median over iterations of the slowest rank
    algbw: float  # GB/s (1e9 bytes per second)
    busbw: float  # GB/s
    correct: bool | None  # None when not checked
    ran: str = ""  # the algorithm the group chose when ``algorithm`` is "auto"


@dataclass(frozen=True)
class _Pattern:
    """The periodic small-integer input of every rank, and the exact results it leads to."""

    period: int
    product: bool  # PRODUCT's 1-or-2 pattern instead of (i + r) % period
    dtype: np.dtype

    def values(self, rank: int, start: int, count: int) -> np.ndarray:
        """Elements ``[start, start + count)`` of ``rank``'s input."""
        return _tile(self._one_period(rank), start, count)

    def reduced(self, op: ReduceOp, world_size: int, start: int, count: int) -> np.ndarray:
        """Elements ``[start, start + count)`` of every rank's input reduced with ``op``."""
        acc = self._one_period(0)
        for rank in range(1, world_size):
            reduce_into(op, acc, self._one_period(rank))
        finish(op, acc, world_size)  # AVG: the sum is exact, so one division gives the same bits anywhere
        return _tile(acc, start, count)

    def _one_period(self, rank: int) -> np.ndarray:
        i = (np.arange(self.period) + rank) % self.period
        return (np.where(i == 0, 2, 1) if self.product else i).astype(self.dtype)


def _pattern(op: ReduceOp | None, world_size: int, dtype: np.dtype) -> _Pattern:
    """The input pattern for ``op`` (``None``: a collective that does not reduce)."""
    if op is ReduceOp.PRODUCT:
        return _Pattern(world_size + 1, True, dtype)
    limit = _exact_limit(dtype)
    if op in (ReduceOp.SUM, ReduceOp.AVG):  # world_size * (period - 1) must stay exact
        limit //= world_size
    return _Pattern(min(_MAX_PERIOD, limit + 1), False, dtype)


def _exact_limit(dtype: np.dtype) -> int:
    """The largest integer L such that 0..L are all exact in ``dtype``."""
    if dtype == np.bool_:
        return 1
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).max)
    if dtype == dtypes.bfloat16:
        return 2**8
    return 2 ** (np.finfo(dtype).nmant + 1)  # float16/32/64 and complex


def _tile(period: np.ndarray, start: int, count: int) -> np.ndarray:
    return np.resize(np.roll(period, -start), count)


@dataclass(frozen=True)
class _Case:
    """One collective at one size, ready to be called again and again."""

    count: int  # elements in the whole buffer
    call: Callable[[], object]  # one synchronous collective
    check: Callable[[], bool]  # whether the buffer now holds the expected result
    refill: Callable[[], object] = lambda: None  # restore the input an in-place call overwrote


@dataclass(frozen=True)
class _Setup:
    """What every case needs to know about the job and the row."""

    api: object
    rank: int
    world: int
    op: ReduceOp
    pattern: _Pattern
    kw: dict  # {"algorithm": name}, or {} for auto


def _in_place(s: _Setup, items: int, run, expected, checked: bool = True) -> _Case:
    fresh = s.pattern.values(s.rank, 0, items)
    x = fresh.copy()
    return _Case(items, lambda: run(x), lambda: not checked or np.array_equal(x, expected()),
                 lambda: np.copyto(x, fresh))


def _split(s: _Setup, block: int, in_blocks: int, out_blocks: int, run, expected) -> _Case:
    x = s.pattern.values(s.rank, 0, in_blocks * block)
    out = np.empty(out_blocks * block, x.dtype)
    return _Case(s.world * block, lambda: run(out, x), lambda: np.array_equal(out, expected()))


def _all_reduce(s: _Setup, items: int) -> _Case:
    return _in_place(s, items, lambda x: s.api.all_reduce(x, op=s.op, **s.kw),
                     lambda: s.pattern.reduced(s.op, s.world, 0, items))


def _reduce(s: _Setup, items: int) -> _Case:  # to rank 0, the only rank whose result is defined
    return _in_place(s, items, lambda x: s.api.reduce(x, 0, op=s.op, **s.kw),
                     lambda: s.pattern.reduced(s.op, s.world, 0, items), checked=s.rank == 0)


def _broadcast(s: _Setup, items: int) -> _Case:  # from rank 0
    return _in_place(s, items, lambda x: s.api.broadcast(x, 0, **s.kw), lambda: s.pattern.values(0, 0, items))


def _reduce_scatter(s: _Setup, block: int) -> _Case:
    return _split(s, block, s.world, 1, lambda out, x: s.api.reduce_scatter_tensor(out, x, op=s.op, **s.kw),
                  lambda: s.pattern.reduced(s.op, s.world, s.rank * block, block))


def _all_gather(s: _Setup, block: int) -> _Case:
    return _split(s, block, 1, s.world, lambda out, x: s.api.all_gather_into_tensor(out, x, **s.kw),
                  lambda: np.concatenate([s.pattern.values(q, 0, block) for q in range(s.world)]))


def _all_to_all(s: _Setup, block: int) -> _Case:
    return _split(s, block, s.world, s.world, lambda out, x: s.api.all_to_all_single(out, x, **s.kw),
                  lambda: np.concatenate([s.pattern.values(q, s.rank * block, block) for q in range(s.world)]))


# Each builder takes the elements of the buffer (in place) or of one block (split collectives).
_CASES = {
    "all_reduce": _all_reduce,
    "reduce": _reduce,
    "broadcast": _broadcast,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
}


def measure(api, collective: str, nbytes: int, algorithm: str, options: BenchOptions) -> Row:
    """Time ``collective`` on about ``nbytes`` bytes with ``algorithm``; every rank must call it.

    Args:
        api: the collective API of an initialized job (``allreduce``, or anything of its shape).
        collective: one of :data:`COLLECTIVES`.
        nbytes: the size; rounded down to whole elements (at least one per rank for split collectives).
        algorithm: a registered algorithm name, or ``"auto"`` to let the group choose.
        options: iterations, warm-up, dtype, op and whether to check.

    Returns:
        The same :class:`Row` on every rank.
    """
    rank, world = api.get_rank(), api.get_world_size()
    facts = collectives.get(collective)
    op = options.op if facts.reduces else None
    setup = _Setup(api, rank, world, options.op, _pattern(op, world, options.dtype),
                   {} if algorithm == "auto" else {"algorithm": algorithm})
    itemsize = options.dtype.itemsize
    items = facts.count_for(max(nbytes, itemsize), world, itemsize)
    case = _CASES[collective](setup, items)
    for _ in range(options.warmup):
        case.refill()
        case.call()
    times = np.empty(options.iters)
    for k in range(options.iters):
        case.refill()
        api.barrier()
        start = time.perf_counter()
        case.call()
        times[k] = time.perf_counter() - start
    api.all_reduce(times, op=ReduceOp.MAX)
    correct = None
    if options.check:
        wrong = np.array([0 if case.check() else 1], dtype=np.int32)
        api.all_reduce(wrong, op=ReduceOp.MAX)
        correct = not wrong[0]
    seconds = float(np.median(times))
    size = case.count * options.dtype.itemsize
    algbw = size / seconds / 1e9 if seconds > 0 else float("inf")
    ran = api.default_group().algorithm_of(collective, items, options.dtype, op or ReduceOp.SUM) \
        if algorithm == "auto" and hasattr(api, "default_group") else ""
    return Row(collective, size, case.count, str(options.dtype), options.op.name.lower() if op is not None else "none",
               algorithm, seconds * 1e6, algbw, algbw * facts.bus_factor(world), correct, ran)


def plan(api, options: BenchOptions) -> list[tuple[str, int, str]]:
    """The ``(collective, nbytes, algorithm)`` of each row, in order, with algorithm names checked.

    A named algorithm is used for the collectives that register it and skipped for the others;
    ``all`` stands for every algorithm a collective registers.

    Raises:
        ValueError: a named algorithm is registered for none of the chosen collectives.
    """
    named = set(options.algorithms) - {"auto", "all"}
    chosen: dict[str, list[str]] = {}
    for collective in options.collectives:
        registered = list(api.algorithms.names(collective)) if options.algorithms != ("auto",) else []
        chosen[collective] = []
        for algorithm in options.algorithms:
            for name in registered if algorithm == "all" else [algorithm]:
                if (name == "auto" or name in registered) and name not in chosen[collective]:
                    chosen[collective].append(name)
        named -= set(registered)
    if named:
        known = sorted({a for c in options.collectives for a in api.algorithms.names(c)})
        raise ValueError(f"algorithm {', '.join(sorted(named))} is not registered for "
                         f"{', '.join(options.collectives)}; registered: {', '.join(known)}")
    return [(c, nbytes, a) for c in options.collectives
            for nbytes in sizes(options.min_bytes, options.max_bytes, options.factor) for a in chosen[c]]


def sweep(api, options: BenchOptions, on_row: Callable[[Row], object] | None = None) -> list[Row]:
    """Measure every row of :func:`plan` on an initialized job; every rank must call it.

    Args:
        api: the collective API (``import allreduce as dist; sweep(dist, BenchOptions())``).
        options: what to sweep.
        on_row: called with each row as soon as it is measured (e.g. to print it).

    Returns:
        The rows, the same on every rank.
    """
    rows = []
    for collective, nbytes, algorithm in plan(api, options):
        rows.append(measure(api, collective, nbytes, algorithm, options))
        if on_row is not None:
            on_row(rows[-1])
    return rows
