"""Blocking ``dist.all_reduce(t)``, ``dist.broadcast(t, src)`` and ``dist.barrier()`` on the group's compiled
shortcut, which the shim calls itself once a shape has run, with no Python in between; and every way
such a kept shortcut goes stale, each sending the call back through the backend's Python method.

A probe counts the calls that reach the backend's ``*_now`` methods (it wraps them before the shim binds
them, at their first call): on the compiled engine, in a group whose ranks share the lines (more than
one rank), a shape's first call passes there and its later ones do not; elsewhere every call does.
Every result is checked against numpy's reduction of the inputs each rank computes for itself.
"""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from support import engines
from support.harness import free_port
from support.torch_harness import run_ranks, run_torch_ranks

import allreduce
import allreduce.torch  # registers the backend for the ranks that initialize torch themselves

pytestmark = engines.BOTH

NOW = ("allreduce_now", "broadcast_now", "barrier_now")
OPS = {dist.ReduceOp.SUM: np.add, dist.ReduceOp.MAX: np.maximum, dist.ReduceOp.PRODUCT: np.multiply,
       dist.ReduceOp.BOR: np.bitwise_or}
# dtype, op, counts: none, one, primes, fewer than and not divisible by the world size, past one line (chunked)
CASES = [(torch.float32, dist.ReduceOp.SUM, (0, 1, 2, 7, 1001, 40_000)), (torch.float64, dist.ReduceOp.MAX, (1, 13)),
         (torch.int32, dist.ReduceOp.PRODUCT, (3, 257)), (torch.uint8, dist.ReduceOp.BOR, (5,)),
         (torch.float16, dist.ReduceOp.SUM, (7,))]
CALLS = 4  # of each shape: the first plans it, the others may take its shortcut


def probe(group=None) -> dict[str, int]:
    """How many calls reach each ``*_now`` method of ``group``'s backend (the default group's), from now on."""
    impl = (group or dist.group.WORLD)._get_backend(torch.device("cpu")).impl
    counts = dict.fromkeys(NOW, 0)

    def counting(name: str):
        method = getattr(impl, name)

        def counted(*args):
            counts[name] += 1
            return method(*args)

        return counted

    for name in NOW:
        setattr(impl, name, counting(name))
    return counts


def direct(engine: str, size: int) -> bool:
    """Whether repeated calls should skip Python: the compiled lines exist (native engine, several ranks)."""
    return engine == "native" and size > 1


def inputs(rank: int, count: int, dtype: torch.dtype, call: int) -> torch.Tensor:
    """Small integers, different for each rank and call, that every op here reduces exactly."""
    return torch.from_numpy((np.arange(count) * (rank + 3) + call + rank) % 3 + 1).to(dtype)


def reference(size: int, count: int, dtype: torch.dtype, op, call: int) -> np.ndarray:
    ranks = [inputs(r, count, dtype, call).to(torch.float64 if dtype.is_floating_point else torch.int64).numpy()
             for r in range(size)]
    out = ranks[0]
    for other in ranks[1:]:
        out = OPS[op](out, other)
    return out


def _every_shape(rank: int, size: int):
    counts, wrong, python = probe(), [], {}
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    numbered = backend._get_sequence_number_for_group()
    for dtype, op, sizes in CASES:
        for count in sizes:
            t = torch.empty(count, dtype=dtype)
            before = counts["allreduce_now"]
            for call in range(CALLS):
                t.copy_(inputs(rank, count, dtype, call))  # the same memory each call, new values
                dist.all_reduce(t, op=op)
                if not np.array_equal(t.to(torch.float64).numpy(), reference(size, count, dtype, op, call)):
                    wrong.append(f"{dtype} {op} {count} call {call}: {t[:4].tolist()}")
            python[f"all_reduce {dtype} {count}"] = counts["allreduce_now"] - before
    t, before = torch.empty(11), counts["allreduce_now"]
    for call in range(CALLS):  # AVG's shortcut leaves its division to Python: every call passes there
        t.copy_(inputs(rank, 11, t.dtype, call))
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        want = (reference(size, 11, t.dtype, dist.ReduceOp.SUM, call).astype(np.float32) / size).astype(np.float32)
        if not np.array_equal(t.numpy(), want):
            wrong.append(f"AVG call {call}: {t[:4].tolist()}")
    averaged = counts["allreduce_now"] - before
    for root in range(size):
        t = torch.empty(9, dtype=torch.int64)
        before = counts["broadcast_now"]
        for call in range(CALLS):
            t.copy_(inputs(rank, 9, torch.int64, call))
            dist.broadcast(t, src=root)
            if t.tolist() != inputs(root, 9, torch.int64, call).tolist():
                wrong.append(f"broadcast from {root} call {call}: {t.tolist()}")
        python[f"broadcast from {root}"] = counts["broadcast_now"] - before
    for _call in range(CALLS):
        dist.barrier()
    python["barrier"] = counts["barrier_now"]
    calls = sum(len(sizes) for _, _, sizes in CASES) * CALLS + CALLS + size * CALLS + CALLS
    return wrong, python, averaged, backend._get_sequence_number_for_group() - numbered == calls


@pytest.mark.parametrize("size", [1, 2, 3])
def test_repeated_blocking_calls_skip_python_after_their_first(size, engine):
    want = 1 if direct(engine, size) else CALLS
    for wrong, python, averaged, numbered in run_torch_ranks(_every_shape, size):
        assert wrong == []
        assert python == dict.fromkeys(python, want), python
        assert averaged == CALLS
        assert numbered  # torch's sequence number counts the direct calls too


def _shapes_in_turn(rank: int, size: int):
    counts, seen = probe(), []
    a, b = torch.empty(5), torch.empty(5, dtype=torch.float64)
    c = torch.empty(6)
    for call in range(3):
        for t in (a, b, c):  # another dtype, another size
            t.copy_(inputs(rank, t.numel(), t.dtype, call))
            dist.all_reduce(t)
            seen.append(t.to(torch.float64).numpy().tolist() == reference(size, t.numel(), t.dtype,
                                                                         dist.ReduceOp.SUM, call).tolist())
    return all(seen), counts["allreduce_now"]


def test_each_shape_keeps_its_own_shortcut(engine):
    for right, python in run_torch_ranks(_shapes_in_turn, 2):
        assert right
        assert python == (3 if direct(engine, 2) else 9)


def _determinism_switched(rank: int, size: int):
    counts, steps = probe(), []
    t = torch.empty(4)
    for call, mode in enumerate((None, None, True, True, False, False)):
        if mode is not None and (call == 0 or mode != steps[-1][0]):
            allreduce.use_deterministic_algorithms(mode)
        before = counts["allreduce_now"]
        t.copy_(inputs(rank, 4, t.dtype, call))
        dist.all_reduce(t)
        right = t.numpy().tolist() == reference(size, 4, t.dtype, dist.ReduceOp.SUM, call).tolist()
        steps.append((mode, right, counts["allreduce_now"] - before))
    return steps


def test_switching_deterministic_mode_sends_the_next_call_the_general_way(engine):
    for steps in run_torch_ranks(_determinism_switched, 3):
        assert all(right for _, right, _ in steps), steps
        python = [through for _, _, through in steps]
        # the first call, and the first after each switch, pass through Python; the rest go direct
        assert python == ([1, 0, 1, 0, 1, 0] if direct(engine, 3) else [1] * 6), steps


def _formed_again(ports):
    def fn(rank: int, size: int):
        seen = []
        t = torch.empty(3)
        for port in ports:
            dist.init_process_group("allreduce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
            backend = dist.group.WORLD._get_backend(torch.device("cpu"))
            counts = probe()
            for call in range(3):
                t.copy_(inputs(rank, 3, t.dtype, call))
                dist.all_reduce(t)  # the same tensor, on the group formed again
                seen.append(t.tolist() == reference(size, 3, t.dtype, dist.ReduceOp.SUM, call).tolist())
            seen.append(counts["allreduce_now"])
            dist.destroy_process_group()
        blocking = dist.AllreduceOptions()
        blocking.asyncOp = False  # as dist.all_reduce(t) passes it, on the destroyed group's backend
        try:
            backend.allreduce([t], blocking)
            seen.append("no error")
        except allreduce.GroupBroken as exc:
            seen.append("destroyed" if "destroyed" in str(exc) else str(exc))
        return seen

    return fn


def test_a_group_destroyed_and_formed_again_takes_the_new_groups_shortcut(engine):
    through = 1 if direct(engine, 2) else 3
    ports = (free_port(), free_port())
    for seen in run_ranks(_formed_again(ports), 2, init=False):
        assert seen == [True, True, True, through] * 2 + ["destroyed"], seen


def _broken(rank: int, size: int):
    counts = probe()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    try:
        dist.all_reduce(torch.ones(4 + rank))  # the ranks disagree: the group breaks
    except allreduce.Mismatch as exc:
        failure = str(exc)
    before = counts["allreduce_now"]
    try:
        dist.all_reduce(t)  # the kept shortcut's shape, on the broken group
        return "no error"
    except allreduce.GroupBroken as exc:
        return counts["allreduce_now"] - before, t.tolist(), failure in str(exc)


def test_a_broken_group_refuses_the_kept_shortcuts_shape(engine):
    for through, values, names_the_failure in run_torch_ranks(_broken, 2):
        assert through == 1 and names_the_failure
        assert values == [8.0] * 4  # 1, 2, 4, 8: nothing ran after the failure


def _after_a_refusal(rank: int, size: int):
    counts, seen = probe(), []
    t = torch.empty(4)
    for call in range(4):
        if call == 2:
            try:  # every rank refuses alike: no number is taken, the group stays usable
                dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))
            except ValueError:
                seen.append("refused")
        before = counts["allreduce_now"]
        t.copy_(inputs(rank, 4, t.dtype, call))
        dist.all_reduce(t)
        seen.append((t.tolist() == reference(size, 4, t.dtype, dist.ReduceOp.SUM, call).tolist(),
                     counts["allreduce_now"] - before))
    return seen


def test_a_refusal_sends_the_next_call_the_general_way(engine):
    later = 0 if direct(engine, 2) else 1
    for seen in run_torch_ranks(_after_a_refusal, 2):
        assert seen == [(True, 1), (True, later), "refused", (True, 1), (True, later)], seen


def _late_peer(port: int):
    def fn(rank: int, size: int):
        dist.init_process_group("allreduce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=2))
        try:
            counts = probe()
            t = torch.ones(2)
            for _ in range(3):
                dist.all_reduce(t)
            if rank == 1:
                time.sleep(4)  # past rank 0's deadline
                return None
            before = counts["allreduce_now"]
            try:
                dist.all_reduce(t)
                return "no error"
            except TimeoutError as exc:
                return counts["allreduce_now"] - before, str(exc)
        finally:
            dist.destroy_process_group()

    return fn


def test_a_timeout_on_the_kept_shortcut_is_in_torchs_words(engine):
    results = run_ranks(_late_peer(free_port()), 2, init=False, deadline=60)
    through, message = results[0]
    assert through == (0 if direct(engine, 2) else 1)
    assert "Timed out" in message and "all_reduce #4" in message and "rank 1" in message, message


def _second_thread(rank: int, size: int):
    import threading

    counts, seen = probe(), []
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.5)  # rank 0's async call waits for this one meanwhile: its calls are in flight
        try:
            dist.all_reduce(torch.ones(4))
        except allreduce.AllreduceError:
            pass
        return seen
    work = dist.all_reduce(torch.ones(4), async_op=True)
    before = counts["allreduce_now"]

    def other():
        try:
            dist.all_reduce(t)  # the kept shortcut's shape, from another thread
            seen.append("no error")
        except RuntimeError as exc:
            seen.append(str(exc))

    thread = threading.Thread(target=other, name="intruder")
    thread.start()
    thread.join()
    try:
        work.wait()
    except allreduce.AllreduceError as exc:  # the call in flight fails with the conflict
        seen.append(type(exc).__name__)
    return seen + [counts["allreduce_now"] - before]


def test_a_kept_shortcut_called_from_a_second_thread_is_refused(engine):
    seen = run_torch_ranks(_second_thread, 2)[0]
    assert "while thread 'MainThread' has calls in flight" in seen[0] and seen[-1] == 1, seen


def _interrupted(rank: int, size: int):
    import signal

    counts = probe()
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        time.sleep(1.5)
        with pytest.raises(allreduce.AllreduceError):  # rank 0 aborted this call, or the next
            dist.all_reduce(t)
            dist.all_reduce(t)
        return None

    def alarm(*_):
        raise RuntimeError("alarm")

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    before = counts["allreduce_now"]
    with pytest.raises(RuntimeError, match="^alarm$"):  # the handler's own exception
        dist.all_reduce(t)
    with pytest.raises(allreduce.GroupBroken) as broken:
        dist.all_reduce(t)
    return str(broken.value), counts["allreduce_now"] - before


def test_an_interrupted_call_on_the_kept_shortcut_raises_the_callers_exception_and_breaks_the_group(engine):
    later, through = run_torch_ranks(_interrupted, 2)[0]
    assert "all_reduce #4 (lines) was interrupted by RuntimeError" in later, later
    assert through == (1 if direct(engine, 2) else 2)  # the first call direct; the broken group's through Python
