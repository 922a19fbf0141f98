"""The compiled lines' reader against arbitrary line contents: a peer's lines area filled with random
bytes (numbers, call and fingerprint words, headers, flags, times, payloads), then runs of every kind
of plan on them. Every run must return DONE, WAITING or MISMATCH, or raise a Python exception; the
process must never crash. The rounds run in a forked child, so that a crash fails this test alone;
``LINES_FUZZ_ROUNDS`` runs more of them (``make fuzz``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from allreduce import dtypes
from allreduce.transport.shm import layout

_line_plans = pytest.importorskip("allreduce.native._line_plans", reason="the compiled engine is not built")

ROUNDS = int(os.environ.get("LINES_FUZZ_ROUNDS", "5000"))
CAPACITY = 256  # payload bytes of a line: small, so random counts often fit, and often do not


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes]


def _fuzz(rounds: int, seed: int) -> None:
    """Runs ``rounds`` random plans of rank 0 of ``size`` against peers whose areas hold random bytes."""
    rng = np.random.default_rng(seed)
    area = layout.lines_size(CAPACITY)
    codes = list(range(-1, len(dtypes.SUPPORTED) + 3))  # with unknown ones
    planned = [dtypes.code_of(d) for d in dtypes.SUPPORTED if _line_plans.itemsize(dtypes.code_of(d)) == d.itemsize]
    for _ in range(rounds):
        size = int(rng.integers(1, 5))
        memory = _aligned(area * size)
        peers = memory[area:]
        peers[:] = rng.integers(0, 256, peers.size, dtype=np.uint8)
        words = peers.view(np.int64)
        bases = tuple(memory.ctypes.data + r * area for r in range(size))
        lines = _line_plans.Lines(0, bases, layout.line_size(CAPACITY), CAPACITY, 1e-6, 1e-5,
                                  float(rng.choice([0.0, 1e-4, 10.0])), 1e-6, 1e-4, bool(rng.integers(2)))
        wild = rng.integers(10) == 0  # now and then arguments out of range, which plan() must refuse
        kind = int(rng.integers(-1, 6) if wild else rng.integers(0, 5))
        code = int(rng.choice(codes) if wild else rng.choice(planned))
        op = int(rng.integers(-1, 9) if wild else rng.choice([0, 2, 3, 6]))
        count = int(rng.integers(-2, 300) if wild else rng.integers(0, CAPACITY // dtypes.dtype_of(code).itemsize + 1))
        root = int(rng.integers(-1, size + 1) if wild else rng.integers(0, size))
        per_line = int(rng.integers(-1, 300) if wild else rng.integers(1, 33)) if kind < 2 and rng.integers(2) else 0
        header = bytes(rng.integers(0, 256, int(rng.choice([40, 40, 39])), dtype=np.uint8))
        fingerprint = int(rng.integers(0, 1 << 62))
        try:
            plan = lines.plan(kind, code, op, count, root, fingerprint, header, per_line)
        except (ValueError, OverflowError, TypeError):
            continue
        item = dtypes.dtype_of(code).itemsize
        number, call = int(rng.integers(1, 1 << 40)), int(rng.integers(0, 1 << 40))
        if rng.integers(2):  # peers show the awaited round: the fold, mismatch and copy paths on random payloads
            for r in range(1, size):
                for parity in (0, 1):
                    head = ((r - 1) * area + layout.LINES_FIRST + parity * layout.line_size(CAPACITY)) // 8
                    words[head + layout.LINE_NUMBER] = number + parity
                    if rng.integers(3):
                        words[head + layout.LINE_CALL] = call
                        words[head + layout.LINE_PRINT] = fingerprint
        nbytes = max(count, 0) * item + int(rng.choice([0, 0, 0, item, -item]))
        data = _aligned(max(nbytes, 0)) if rng.integers(8) else None
        out = _aligned(max(nbytes, 0) * size) if rng.integers(2) else None
        try:
            state = plan.run(number, call, data, out, 2e-4, 1e-4)
            while state == _line_plans.WAITING and rng.integers(2):
                state = plan.resume(data, out, 1e-4)
            assert state in (_line_plans.DONE, _line_plans.WAITING, _line_plans.MISMATCH)
        except (ValueError, BufferError, TypeError):
            pass
        lines.close()
        try:
            plan.run(number, call, data, out, 1e-4, 1e-4)
            raise AssertionError("a plan ran on closed lines")
        except RuntimeError:
            pass


def test_no_line_contents_crash_the_reader():
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when every round ended, 1 on an assertion, killed by a crash
        code = 1
        try:
            _fuzz(ROUNDS, 23)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else "-"
    assert os.WIFEXITED(status), f"the reader crashed: {status} (signal {signal})"
    assert os.WEXITSTATUS(status) == 0, "a round ended in an unexpected state (run _fuzz in-process to see it)"
