"""The per-shape shortcut of a blocking all-reduce (a shape the group ran before goes straight to its
planned call) keeps what the general path guarantees: the result, deterministic mode switched on
after the shape was remembered, the one-thread rule, and a broken group's refusal."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import engines
from support.harness import run_ranks
from support.reference import left_fold_misses

import allreduce as dist
from allreduce.runtime import Shape

pytestmark = engines.BOTH


def _then_deterministic(rank: int, size: int) -> list[str]:
    wrong = []
    for _ in range(3):  # every shape left_fold_misses uses, remembered in the default (fast) mode
        left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 301)
    dist.use_deterministic_algorithms(True)
    wrong += left_fold_misses(lambda x, op: dist.all_reduce(x, op=op), rank, size, 301)
    x = np.arange(5, dtype=np.int64)
    for _ in range(3):
        dist.all_reduce(x)
    if x.tolist() != [i * size ** 3 for i in range(5)]:
        wrong.append(f"int64 {x.tolist()}")
    return wrong


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_deterministic_mode_set_after_a_shape_was_remembered_still_folds_in_rank_order(transport):
    assert run_ranks(_then_deterministic, 3, env={"ALLREDUCE_TRANSPORT": transport}) == [[]] * 3


def _second_thread(rank: int, size: int) -> str:
    x = np.ones(4, np.float32)
    dist.all_reduce(x)  # the shape is remembered
    work = dist.all_reduce(np.ones(4, np.float32), async_op=True) if rank == 0 else None
    seen = []

    def other():
        try:
            dist.all_reduce(x)
            seen.append("no error")
        except RuntimeError as exc:
            seen.append(str(exc))

    if rank == 0:
        thread = threading.Thread(target=other, name="intruder")
        thread.start()
        thread.join()
        try:
            work.wait()
        except Exception as exc:  # the call in flight fails with the conflict
            seen.append(type(exc).__name__)
        return " | ".join(seen)
    time.sleep(0.5)  # rank 0's async call waits for this one meanwhile: its calls are in flight
    try:
        dist.all_reduce(np.ones(4, np.float32))
    except dist.AllreduceError:
        pass
    return ""


def test_a_remembered_shape_from_a_second_thread_is_refused():
    results = run_ranks(_second_thread, 2, timeout=10, expect_errors=True)
    assert "while thread 'MainThread' has calls in flight" in results[0], results


# ---- the compiled shortcut (native) and its Python twin (run_planned) keep the general path's guarantees -----

SIZES = (0, 1, 2, 7, 13, 257, 1001)  # none, one, primes, fewer than and not divisible by the world size
PAIRS = [(np.float32, dist.ReduceOp.SUM), (np.float64, dist.ReduceOp.MAX), (np.int32, dist.ReduceOp.PRODUCT),
         (np.int64, dist.ReduceOp.MIN), (np.uint8, dist.ReduceOp.BOR), (np.float16, dist.ReduceOp.SUM),
         (np.float32, dist.ReduceOp.AVG), (np.float64, dist.ReduceOp.AVG)]


def _inputs(rank: int, size: int, count: int, dtype, call: int) -> list[np.ndarray]:
    """Every rank's input of one call: small integers, so every dtype and op is exact."""
    return [((np.arange(count) * (r + 3) + call + r) % 5 + 1).astype(dtype) for r in range(size)]


def _remembered_shapes(rank: int, size: int) -> list[str]:
    wrong = []
    kinds = set()
    for dtype, op in PAIRS:
        reference = {"SUM": np.add, "MAX": np.maximum, "PRODUCT": np.multiply, "MIN": np.minimum,
                     "BOR": np.bitwise_or, "AVG": np.add}[op.name]
        for count in SIZES:
            for call in range(4):  # the first call plans the shape; the others take its shortcut
                ins = _inputs(rank, size, count, dtype, call)
                x = ins[rank].copy()
                dist.all_reduce(x, op=op)
                want = ins[0].copy()
                for other in ins[1:]:
                    want = reference(want, other).astype(dtype)
                if op is dist.ReduceOp.AVG:  # the sum's division, in the dtype
                    np.divide(want, size, out=want)
                if not np.array_equal(x, want):
                    wrong.append(f"{np.dtype(dtype).name} {op.name} {count} call {call}: {x[:4]} != {want[:4]}")
            known = dist.default_group().shortcuts.get(Shape.all_reduce(np.dtype(dtype), count, op))
            kinds.add(type(known.run).__name__ if known else "none")
    return wrong + [f"shortcuts: {sorted(kinds)}"]


def _right_and_short(body, size: int, engine: str) -> None:
    """Every rank of ``body`` found nothing wrong, and remembered its shapes as the engine's kind of shortcut:
    the compiled one on the native engine, ``run_planned``'s Python twin on the Python engine."""
    kind = "Shortcut" if engine == "native" else "function"
    results = run_ranks(body, size)
    assert results == [[f"shortcuts: ['{kind}']"]] * size, results


@pytest.mark.parametrize("size", [2, 3])
def test_remembered_shapes_reduce_right(size, engine):
    _right_and_short(_remembered_shapes, size, engine)


def _numbered_with_the_general_path(rank: int, size: int) -> str:
    x = np.ones(2, np.float32)
    for _ in range(3):
        dist.all_reduce(x)  # #1..#3: the shape is remembered at #1
    dist.broadcast(np.ones(3), src=0)  # #4: the general path
    dist.all_reduce(np.ones(5, np.float64), async_op=True).wait()  # #5: the progress thread
    dist.all_reduce(x)  # #6: the shortcut again
    dist.broadcast(np.ones(3), src=0)  # #7: the broadcast's shortcut
    dist.barrier()  # #8: the general path
    dist.barrier()  # #9: the barrier's shortcut
    try:  # #10: rank 1 calls another shape, which every rank must name
        dist.all_reduce(x if rank == 0 else np.ones(3, np.float32))
    except dist.Mismatch as exc:
        return str(exc)
    return "no error"


def test_the_shortcut_numbers_calls_with_the_general_path():
    results = run_ranks(_numbered_with_the_general_path, 2, timeout=10, expect_errors=True)
    for rank, message in enumerate(results):
        assert f"rank {rank}/2" in message and "all_reduce #10" in message, results
    assert "rank 1" in results[0], results


def _late_peer(leave: str):
    def body(rank: int, size: int) -> str:
        x = np.ones(2, np.float32)
        for _ in range(3):
            dist.all_reduce(x)
        if rank == 1:
            if leave == "exit":
                import os
                os._exit(0)
            time.sleep(8)  # past rank 0's deadline
            return ""
        try:
            dist.all_reduce(x)  # #4: rank 1 never comes
        except dist.AllreduceError as exc:
            first = f"{type(exc).__name__}: {exc}"
        else:
            first = "no error"
        try:
            dist.all_reduce(x)
        except dist.GroupBroken as exc:
            return f"{first} || GroupBroken: {exc}"
        return f"{first} || no refusal"
    return body


@pytest.mark.parametrize("leave", ["exit", "stall"])
def test_a_shortcut_waiting_for_a_peer_that_is_gone_or_late_says_who(leave):
    results = run_ranks(_late_peer(leave), 2, timeout=2, deadline=60, expect_errors=True)
    first, _, later = results[0].partition(" || ")
    kind = "PeerLost" if leave == "exit" else "CommTimeout"
    assert first.startswith(kind) and "rank 0/2" in first and "all_reduce #4" in first and "rank 1" in first, first
    assert later.startswith("GroupBroken") and "all_reduce #4" in later, later


def _from_a_callback(rank: int, size: int) -> list[str]:
    x = np.ones(2, np.float32)
    dist.all_reduce(x)  # remembered
    seen = []

    def again(_future):
        try:
            dist.all_reduce(x)
            seen.append("no error")
        except RuntimeError as exc:
            seen.append(str(exc))

    if rank == 1:
        time.sleep(0.3)  # rank 0's work pends meanwhile: its callback runs on the progress thread
    work = dist.all_reduce(np.ones(3, np.float32), async_op=True)
    if rank == 0:
        work.get_future().add_done_callback(again)
    work.wait(20)
    dist.all_reduce(x)  # the group still works, from its own thread
    return seen + [str(x.tolist())]


def test_a_remembered_shape_from_a_work_callback_is_refused():
    (refused, works), (alone,) = run_ranks(_from_a_callback, 2, timeout=10)
    assert "from a Work callback" in refused and works == alone == "[4.0, 4.0]", (refused, works, alone)


def _after_destroy(rank: int, size: int) -> str:
    x = np.ones(2, np.float32)
    group = dist.new_group([0, 1])
    for _ in range(3):
        dist.all_reduce(x, group=group)
    dist.destroy_process_group(group)
    try:
        dist.all_reduce(x, group=group)
    except dist.GroupBroken as exc:
        return str(exc)
    return "no error"


def test_a_destroyed_group_refuses_a_remembered_shape():
    for message in run_ranks(_after_destroy, 2, timeout=10):
        assert "was destroyed" in message, message


def _interrupted_small(rank: int, size: int) -> tuple[str, str]:
    import signal

    x = np.ones(2, np.float32)
    for _ in range(3):
        dist.all_reduce(x)
    if rank == 1:
        time.sleep(1.5)
    else:
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("alarm")))
        signal.setitimer(signal.ITIMER_REAL, 0.3)
    outcomes = []
    for _ in range(2):
        try:
            dist.all_reduce(x)
            outcomes.append("no error")
        except (dist.AllreduceError, TimeoutError) as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
    return tuple(outcomes)


def test_an_interrupted_shortcut_raises_the_callers_exception_and_breaks_the_group():
    results = run_ranks(_interrupted_small, 2, timeout=10, deadline=60)
    (first, later) = results[0]
    assert first == "TimeoutError: alarm", results[0]
    assert later.startswith("GroupBroken") and "all_reduce #4 (lines) was interrupted by TimeoutError" in later, later
    # rank 1 may finish #4 on what rank 0 had posted, then learns of the abort at #5
    assert any(o.startswith("PeerLost") and "rank 0 aborted" in o for o in results[1]), results[1]


def _broadcasts_and_barriers(rank: int, size: int) -> list[str]:
    wrong, kinds = [], set()
    g = dist.default_group()
    for dtype in (np.float32, np.int64, np.uint8):
        for count in SIZES:
            for root in range(size):
                for call in range(3):
                    x = _inputs(rank, size, count, dtype, call)[rank]
                    want = _inputs(root, size, count, dtype, call)[root]
                    dist.broadcast(x, src=root)
                    if not np.array_equal(x, want):
                        wrong.append(f"broadcast {np.dtype(dtype).name} {count} from {root} call {call}: {x[:4]}")
                known = g.shortcuts.get(Shape.broadcast(np.dtype(dtype), count, root))
                kinds.add(type(known.run).__name__ if known else "none")
    for call in range(3):  # a barrier waits for the last rank however it is run
        if rank == size - 1:
            time.sleep(0.5)
        began = time.monotonic()
        dist.barrier()
        if rank == 0 and time.monotonic() - began < 0.4:
            wrong.append(f"barrier {call} returned before the last rank came")
    known = g.shortcuts.get(Shape.barrier())
    kinds.add(type(known.run).__name__ if known else "none")
    return wrong + [f"shortcuts: {sorted(kinds)}"]


@pytest.mark.parametrize("size", [2, 3])
def test_remembered_broadcasts_and_barriers_take_their_shortcut(size, engine):
    _right_and_short(_broadcasts_and_barriers, size, engine)


def _memory_it_may_not_write(rank: int, size: int) -> list[str]:
    x = np.full(4, rank + 1.0, np.float32)
    dist.all_reduce(x)  # remembered
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    strided = np.ones(8, np.float32)[::2]  # the remembered dtype and count, not contiguous
    seen = []
    for refused in (frozen, strided):  # the general path's error, before anything is sent
        try:
            dist.all_reduce(refused)
            seen.append("accepted")
        except ValueError as exc:
            seen.append("read-only" if "read-only" in str(exc) else "contiguous" if "contiguous" in str(exc) else "?")
    dist.all_reduce(x)  # the group is still usable, and the shortcut still runs
    return seen + [x.tolist()]


def test_a_shortcut_leaves_memory_it_may_not_write_in_place_to_the_general_path():
    for result in run_ranks(_memory_it_may_not_write, 2, timeout=10):
        assert result == ["read-only", "contiguous", [6.0] * 4], result


def _collected_once_destroyed(rank: int, size: int) -> bool:
    import gc
    import weakref

    group = dist.new_group([0, 1])
    x = np.ones(2, np.float32)
    for _ in range(3):
        dist.all_reduce(x, group=group)  # its shortcut holds the group's parts, the group its shortcuts
    dist.destroy_process_group(group)
    gone = weakref.ref(group)
    del group
    gc.collect()
    return gone() is None


def test_a_destroyed_group_with_shortcuts_is_collected():
    assert run_ranks(_collected_once_destroyed, 2, timeout=10) == [True, True]


def _chunks_between_rounds(rank: int, size: int) -> list[str]:
    wrong, kinds = [], set()
    big, small = 30011, 5  # float32: chunked (many chunks of a 4 KiB line), then one round
    for call in range(4):
        for count in (big, small, big):
            ins = _inputs(rank, size, count, np.float32, call)
            x = ins[rank].copy()
            dist.all_reduce(x)
            if not np.array_equal(x, sum(ins[1:], ins[0])):
                wrong.append(f"{count} call {call}")
    for count in (big, small):
        known = dist.default_group().shortcuts.get(Shape.all_reduce(np.dtype(np.float32), count, dist.ReduceOp.SUM))
        kinds.add(type(known.run).__name__ if known else "none")
    return wrong + [f"shortcuts: {sorted(kinds)}"]


@pytest.mark.parametrize("size", [2, 3])
def test_chunked_shortcuts_take_their_line_numbers_between_one_round_calls(size, engine, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_SHM_LINE_CHUNK", "4096")
    _right_and_short(_chunks_between_rounds, size, engine)


def _kept_and_stale(rank: int, size: int) -> tuple[list[bool], list[float]]:
    g = dist.new_group([0, 1])
    x = np.ones(4, np.float32)

    def compiled():
        return g.shortcuts.compiled(Shape.all_reduce(x.dtype, x.size, dist.ReduceOp.SUM))

    dist.all_reduce(x, group=g)  # 2: the shape is remembered
    kept = compiled()
    seen = [kept(x)]  # 4: a caller that keeps the shortcut runs on it
    dist.use_deterministic_algorithms(True)
    seen.append(kept(x))  # made under the other mode: refused, nothing done
    dist.all_reduce(x, group=g)  # 8: the general path remembers the shape anew
    again = compiled()
    seen += [again is not kept, again(x)]  # 16
    try:  # every rank refuses alike: the group stays usable, and retires what it kept
        dist.all_gather_into_tensor(np.empty(3, np.float32), np.ones(2, np.float32), group=g)
    except ValueError:
        seen.append(again(x))
    dist.all_reduce(x, group=g)  # 32
    last = compiled()
    seen.append(last(x))  # 64
    dist.destroy_process_group(g)
    seen.append(last(x))  # a destroyed group's shortcut runs nothing
    return seen, x.tolist()


@engines.only("native")
def test_a_kept_compiled_shortcut_refuses_once_stale():
    for seen, values in run_ranks(_kept_and_stale, 2, timeout=10):
        assert seen == [True, False, True, True, False, True, False], seen
        assert values == [64.0] * 4
