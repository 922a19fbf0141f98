"""``allreduce soak``: run many random collectives, check every result against numpy, watch memory.

Every rank draws the same sequence of calls from one generator seeded on the command line: a
collective (every one, in its tensor and its list form, plus a send/recv ring shift), an element
count (0, 1, primes, powers of two, anything up to ``--max-count``), a dtype, a reduce op that dtype
allows, a root, and an algorithm from the registry (or the group's own choice). Some calls go to a
subgroup of the even ranks, some use registered buffers (``allreduce.empty``), and now and then a
batch of two to four is issued with ``async_op=True`` and waited together. Inputs are small integers
drawn from (seed, call, rank), so every rank can build every rank's input and the exact result with
numpy: a difference is a bug, never rounding.

Memory is read after the warm-up (every collective once at the largest count and dtype, then the
first tenth of the calls) and at the end. The run fails if a result was wrong, a call raised, or the
resident set grew by more than ``--rss-limit`` MiB. A hang cannot pass unnoticed: every call has the
group's timeout. Only rank 0 prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import os
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import reduce as fold
from collections.abc import Callable

import numpy as np

import allreduce as dist
from .. import algorithms, dtypes
from ..ops import ReduceOp, allowed_ops
from . import launcher
from .progress import Progress

KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
         "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier", "send_recv")
_SCHEDULES = {  # API form -> the registry's collective, whose algorithms the form accepts
    "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
           ReduceOp.BXOR: np.bitwise_xor}
_COUNTS = (0, 1, 2, 3, 5, 7, 13, 31, 64, 97, 127, 1000, 1021, 4096)  # drawn 60% of the time
_WARM_DTYPE = np.dtype(np.complex128)  # the widest: warm-up grows every buffer to its largest


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc
        return None


_LIBC = _libc()


@dataclass(frozen=True)
class SoakOptions:
    """What to run and what counts as a failure."""

    ops: int = 10_000  # random calls after the warm-up's one call per collective
    seed: int = 0  # the same on every rank, so that they draw the same calls
    max_count: int = 1 << 16  # the largest element count (per rank's block, for the list-shaped ones)
    rss_limit_mib: float = 32.0  # allowed growth of the resident set from warm-up to end
    timeout: float = 60.0  # seconds each call may take before it fails (a hang becomes an error)

    def __post_init__(self):
        if self.ops < 0 or self.max_count < 1 or self.rss_limit_mib < 0 or not self.timeout > 0:
            raise ValueError(f"invalid soak options: {self}")


@dataclass(frozen=True)
class Case:
    """One call, the same on every rank."""

    index: int  # its place in the sequence; seeds its inputs
    kind: str  # one of KINDS
    count: int  # elements (per rank's block for the list-shaped collectives and all_to_all)
    dtype: np.dtype
    op: ReduceOp  # for the reducing kinds
    root: int  # for the rooted kinds, a rank of the group that runs the call
    algorithm: str | None  # None: the group chooses
    subgroup: bool  # run by the even ranks only, on their subgroup
    registered: bool  # an in-place buffer from allreduce.empty


def draw(rng: np.random.Generator, index: int, size: int, max_count: int, sub_size: int) -> Case:
    """The next call of the sequence; ``sub_size`` is the subgroup's size (0: no subgroup)."""
    kind = KINDS[rng.integers(len(KINDS))]
    subgroup = bool(sub_size > 1 and rng.random() < 0.1)
    n = sub_size if subgroup else size
    count = int(rng.choice(_COUNTS)) if rng.random() < 0.6 else int(rng.integers(0, max_count + 1))
    dtype = dtypes.SUPPORTED[rng.integers(len(dtypes.SUPPORTED))]
    ops = sorted(allowed_ops(dtype))
    registered = kind in ("all_reduce", "broadcast") and hasattr(dist, "empty") and rng.random() < 0.1
    return Case(index, kind, min(count, max_count), dtype, ops[rng.integers(len(ops))], int(rng.integers(n)),
                _algorithm(rng, kind, n), subgroup, bool(registered))


def _algorithm(rng: np.random.Generator, kind: str, size: int) -> str | None:
    if kind in ("barrier", "send_recv") or rng.random() < 0.3:
        return None
    collective = _SCHEDULES.get(kind, kind)
    usable = []
    for name in algorithms.names(collective):
        try:  # some need a world of a shape this job does not have
            algorithms.get(collective, name)(0, size, 4, root=0)
            usable.append(name)
        except (ValueError, TypeError):
            pass
    return usable[rng.integers(len(usable))] if usable else None


def make_input(case: Case, rank: int, n: int, seed: int, count: int | None = None) -> np.ndarray:
    """Rank ``rank``'s input (of ``n`` ranks): small integers whose reduction is exact in any order.

    For PRODUCT, only one rank holds a factor 2 at each element, so no product overflows a float16.
    """
    count = case.count if count is None else count
    rng = np.random.default_rng([seed, case.index & 0xFFFFFFFF, rank])
    if case.dtype == np.bool_:
        return rng.integers(0, 2, count).astype(bool)
    if case.op is ReduceOp.PRODUCT:
        values = np.where((np.arange(count) % n == rank) & (rng.random(count) < 0.5), 2, 1)
    elif case.dtype.kind == "u" or case.op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        values = rng.integers(0, 10, count)
    else:
        values = rng.integers(-4, 6, count)
    return values.astype(case.dtype)


def reduced(op: ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    """``op`` over ``inputs`` element-wise in their dtype; AVG divides the sum by their number."""
    ufunc = _UFUNCS[op]
    result = fold(lambda a, b: ufunc(a, b).astype(a.dtype), inputs).copy()
    if op is ReduceOp.AVG and len(inputs) > 1:
        np.divide(result, len(inputs), out=result, casting="unsafe")
    return result


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def issue(case: Case, group, rank: int, n: int, seed: int, async_op: bool):
    """Start ``case`` on ``group`` as rank ``rank`` of ``n``; return ``(work, check)``: the Work
    (``None`` once done) and a function that tells, after the wait, whether the result is right."""
    c, dt, kind = case.count, case.dtype, case.kind
    inputs = [make_input(case, r, n, seed) for r in range(n)]
    mine = inputs[rank]
    kw = {"group": group, "async_op": async_op}
    if case.algorithm is not None:
        kw["algorithm"] = case.algorithm
    if kind in ("all_reduce", "reduce", "broadcast"):
        x = dist.empty(c, dt) if case.registered else np.empty(c, dt)
        x[...] = mine
        if kind == "all_reduce":
            want = reduced(case.op, inputs)
            return dist.all_reduce(x, case.op, **kw), lambda: _same(x, want)
        if kind == "reduce":
            want = reduced(case.op, inputs) if rank == case.root else mine
            return dist.reduce(x, case.root, case.op, **kw), lambda: _same(x, want)
        return dist.broadcast(x, case.root, **kw), lambda: _same(x, inputs[case.root])
    if kind in ("all_gather", "all_gather_into_tensor", "gather"):
        want = np.concatenate(inputs)
        if kind == "all_gather_into_tensor":
            out = np.empty(n * c, dt)
            return dist.all_gather_into_tensor(out, mine, **kw), lambda: _same(out, want)
        outs = [np.empty(c, dt) for _ in range(n)]
        if kind == "all_gather":
            return dist.all_gather(outs, mine, **kw), lambda: _same(np.concatenate(outs), want)
        work = dist.gather(mine, outs if rank == case.root else None, case.root, **kw)
        return work, lambda: rank != case.root or _same(np.concatenate(outs), want)
    if kind in ("reduce_scatter", "reduce_scatter_tensor", "all_to_all_single"):
        blocks = [make_input(case, r, n, seed, n * c) for r in range(n)]
        if kind == "all_to_all_single":
            want = np.concatenate([b[rank * c:(rank + 1) * c] for b in blocks])
            out = np.empty(n * c, dt)
            return dist.all_to_all_single(out, blocks[rank], **kw), lambda: _same(out, want)
        want = reduced(case.op, blocks)[rank * c:(rank + 1) * c]
        out = np.empty(c, dt)
        if kind == "reduce_scatter_tensor":
            return dist.reduce_scatter_tensor(out, blocks[rank], case.op, **kw), lambda: _same(out, want)
        pieces = [blocks[rank][i * c:(i + 1) * c] for i in range(n)]
        return dist.reduce_scatter(out, pieces, case.op, **kw), lambda: _same(out, want)
    if kind == "scatter":  # piece r is rank r's, sent by the root
        out = np.empty(c, dt)
        work = dist.scatter(out, inputs if rank == case.root else None, case.root, **kw)
        return work, lambda: _same(out, inputs[rank])
    if kind == "barrier":
        return dist.barrier(**kw), lambda: True
    return None, _ring_shift(group, rank, n, inputs)


def _ring_shift(group, rank: int, n: int, inputs: list[np.ndarray]):
    """Send to the next rank and receive from the previous one; even ranks send first, so a ring of
    blocking calls cannot wait in a circle."""
    if n == 1:
        return lambda: True
    got = np.empty_like(inputs[rank])
    steps = [lambda: dist.send(inputs[rank], (rank + 1) % n, group=group),
             lambda: dist.recv(got, (rank - 1) % n, group=group)]
    for step in steps if rank % 2 == 0 else steps[::-1]:
        step()
    return lambda: _same(got, inputs[(rank - 1) % n])


def rss() -> int:
    """This process's resident set in bytes (0 where ``/proc`` is missing), read after handing the
    heap's free pages back to the system (glibc's ``malloc_trim``), so that it counts live memory and
    not the allocator's slack, which comes and goes with the sizes drawn."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


@dataclass
class Tally:
    """What one rank saw."""

    calls: Counter  # by kind
    wrong: Counter  # by kind
    error: str  # the first failure, if a call raised
    rss_warm: int  # bytes after the warm-up
    rss_end: int  # bytes at the end
    seconds: float
    interrupted: bool = False  # Ctrl-C (SIGINT) stopped the run: the counts are this rank's so far


def soak(options: SoakOptions, on_batch: Callable[[int, Tally], object] | None = None) -> Tally:
    """Run the soak as this rank of the default group (every rank calls it); see the module docstring.

    ``on_batch(done, tally)`` is called after each batch of calls (e.g. to show progress). A Ctrl-C
    ends the run early with the tally so far and ``interrupted`` set.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(list(range(0, size, 2))) if size > 2 else None
    sub_size = (size + 1) // 2 if sub is not None else 0
    rng = np.random.default_rng(options.seed)
    tally = Tally(Counter(), Counter(), "", 0, 0, 0.0)
    start = time.monotonic()
    warm = [Case(-1 - i, kind, options.max_count, _WARM_DTYPE, ReduceOp.SUM, 0, None, False, False)
            for i, kind in enumerate(KINDS)]
    batch: list[Case] = warm
    done = 0
    try:
        _run(warm, sub, rank, size, options.seed, tally)
        while done < options.ops:
            if done >= options.ops // 10 and not tally.rss_warm:
                tally.rss_warm = rss()
            many = int(rng.integers(2, 5)) if rng.random() < 0.1 else 1
            batch = [draw(rng, done + i, size, options.max_count, sub_size) for i in range(many)]
            batch = batch[:options.ops - done]
            _run(batch, sub, rank, size, options.seed, tally)
            done += len(batch)
            if on_batch is not None:
                on_batch(done, tally)
    except dist.AllreduceError as exc:
        tally.error = f"rank {rank}: call #{done} ({', '.join(c.kind for c in batch)}): {exc}"
    except KeyboardInterrupt:
        tally.interrupted = True
        tally.error = f"rank {rank}: interrupted at call #{done}"
    tally.rss_warm = tally.rss_warm or rss()
    tally.rss_end = rss()
    tally.seconds = time.monotonic() - start
    if sub is not None and not tally.error and isinstance(sub, dist.ProcessGroup):
        dist.destroy_process_group(sub)
    return tally


def _run(cases: list[Case], sub, rank: int, size: int, seed: int, tally: Tally) -> None:
    """Issue ``cases`` (async when there are several), wait for them, check and count them."""
    issued = []
    for case in cases:
        group, me, n = None, rank, size
        if case.subgroup:
            if rank % 2:
                continue  # the even ranks run it
            group, me, n = sub, rank // 2, sub.size
        async_op = len(cases) > 1 and case.kind != "send_recv"
        issued.append((case, *issue(case, group, me, n, seed, async_op)))
    for case, work, check in issued:
        if work is not None:
            work.wait()
        tally.calls[case.kind] += 1
        tally.wrong[case.kind] += not check()


def summary(tally: Tally, options: SoakOptions) -> tuple[bool, list[str]]:
    """Sum every rank's tally (a collective: every rank calls it); the verdict and rank 0's lines."""
    counts = np.array([tally.calls[k] for k in KINDS] + [tally.wrong[k] for k in KINDS], np.int64)
    dist.all_reduce(counts)
    memory = np.array([tally.rss_warm, tally.rss_end, tally.rss_end - tally.rss_warm, tally.seconds])
    dist.all_reduce(memory, dist.ReduceOp.MAX)
    calls, wrong = counts[:len(KINDS)], counts[len(KINDS):]
    growth = memory[2] / (1 << 20)
    ok = not wrong.sum() and growth <= options.rss_limit_mib
    lines = [f"allreduce soak: {dist.get_world_size()} ranks, {options.ops} random calls after "
             f"{len(KINDS)} warm-up calls, seed {options.seed}, counts up to {options.max_count}"]
    lines += [f"  {kind:24s} {c:8d} calls {w:6d} wrong" for kind, c, w in zip(KINDS, calls, wrong)]
    lines += [f"total: {calls.sum()} calls (summed over ranks), {wrong.sum()} wrong, 0 hangs, 0 errors, "
              f"{memory[3]:.1f}s",
              f"memory: resident set {memory[0] / (1 << 20):.1f} MiB after warm-up, {memory[1] / (1 << 20):.1f} MiB "
              f"at the end; largest growth {growth:+.1f} MiB (limit {options.rss_limit_mib:g})",
              "PASS" if ok else "FAIL"]
    return ok, lines


# ---- the command ---------------------------------------------------------------------------------

def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``soak`` subcommand."""
    parser = subparsers.add_parser(
        "soak",
        help="run many random collectives, check every result and watch memory",
        description="Run random collectives (kinds, sizes, dtypes, ops, algorithms, subgroups, async "
        "batches), check each against numpy, and fail on a wrong result, an error or memory growth.",
        epilog="examples: allreduce soak -n 4 --ops 10000; allreduce run -n 4 -- python -m allreduce soak",
    )
    parser.add_argument("-n", "--nproc", metavar="N", type=launcher.int_at_least(1), default=None,
                        help="start a job of N local ranks (default: run as a rank of the current job)")
    parser.add_argument("--ops", type=launcher.int_at_least(0), default=10_000, help="random calls (default 10000)")
    parser.add_argument("--seed", type=launcher.int_at_least(0), default=None,
                        help="seed of the sequence of calls (default: a fresh one, printed)")
    parser.add_argument("--max-count", type=launcher.int_at_least(1), default=1 << 16,
                        help="largest element count drawn (default 65536)")
    parser.add_argument("--rss-limit", type=float, default=32.0, metavar="MIB",
                        help="allowed growth of each rank's resident set after warm-up, in MiB (default 32)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each call may take (default 60)")
    parser.add_argument("--transport", choices=("auto", "shm", "tcp"), default=None,
                        help="force a transport for the job started with -n (ALLREDUCE_TRANSPORT)")
    parser.set_defaults(main=main, error=parser.error)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the ``soak`` subcommand: 0 when every result was right and memory stayed flat, else 1."""
    try:
        options = SoakOptions(args.ops, secrets.randbelow(2**31) if args.seed is None else args.seed,
                              args.max_count, args.rss_limit, args.timeout)
    except ValueError as exc:
        args.error(str(exc))
    if args.transport and args.nproc is None:
        args.error("--transport applies to the job that -n starts; inside a job, set ALLREDUCE_TRANSPORT")
    if args.nproc is not None:
        cmd = [sys.executable, "-m", "allreduce", "soak", "--ops", str(options.ops), "--seed", str(options.seed),
               "--max-count", str(options.max_count), "--rss-limit", str(options.rss_limit_mib),
               "--timeout", str(options.timeout)]
        forced = {"ALLREDUCE_TRANSPORT": args.transport} if args.transport else {}
        return launcher.launch(launcher.LaunchConfig(nproc=args.nproc, tag_output=False), cmd, forced)
    started = not dist.is_initialized()
    if started:
        try:
            dist.init_process_group(timeout=options.timeout)
        except ValueError as exc:  # not inside a job
            args.error(f"{exc}; or give -n N to start a job of N ranks")
    try:
        with Progress(options.ops, "allreduce soak") if dist.get_rank() == 0 else contextlib.nullcontext() as bar:
            tally = soak(options, None if bar is None else
                         lambda done, t: bar.advance(done - bar.done, f"{sum(t.wrong.values())} wrong"))
        if tally.interrupted:  # the group is broken: rank 0 says what it had done, the others stay quiet
            if dist.get_rank() == 0:
                print(f"allreduce soak: interrupted after {sum(tally.calls.values())} calls on rank 0, "
                      f"{sum(tally.wrong.values())} wrong, {tally.seconds:.1f}s; --seed {options.seed} "
                      f"replays the same calls", file=sys.stderr, flush=True)
            return 130
        if tally.error:  # the group is broken: no summary, every rank says what it saw
            print(f"allreduce soak: FAIL after {sum(tally.calls.values())} calls: {tally.error}",
                  file=sys.stderr, flush=True)
            return 1
        ok, lines = summary(tally, options)
        if dist.get_rank() == 0:
            print("\n".join(lines), flush=True)
        return 0 if ok else 1
    except KeyboardInterrupt:  # between calls, e.g. in the summary: the launcher reports it, no traceback here
        return 130
    finally:
        if started:
            dist.destroy_process_group()
