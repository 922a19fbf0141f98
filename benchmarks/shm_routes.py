"""What one medium message costs on each shared-memory route, without the rest of the library.

    python benchmarks/shm_routes.py                 # messages of 64 KiB, 1 MiB and 16 MiB
    python benchmarks/shm_routes.py --sizes 256K,4M --reps 50

A forked child holds the payload. Per message size the table gives the receiver's time to reduce it
into its own array (float32 SUM) on each route:

- cross-memory: ``process_vm_readv`` of each piece into a cache-sized bounce buffer, reduced as it
  lands (the transport's route above ``staged_max``), for several piece sizes;
- staged: the sender's copy into shared memory, then the receiver's reduce straight out of it (the
  route up to ``staged_max``; the two run on different ranks, so their sum is the work, not the time).

The best of five batches is kept; the machine's load average is printed with the table. Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from allreduce.transport import cma, shmseg

PIECES = (64 << 10, 256 << 10, 1 << 20)


def _best(fn, reps: int) -> float:
    """Seconds per call of ``fn``: the best of five batches of ``reps`` calls."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def measure(sizes: list[int], reps: int) -> list[str]:
    """Markdown rows: size, then us per message for each cross-memory piece size and the staged route."""
    largest = max(sizes)
    private = np.ones(largest // 4, np.float32)  # the child's copy of this lies at the same address
    staging = shmseg.create(largest, "bench")
    shared = np.frombuffer(staging.map, np.float32, largest // 4)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the peer: touch its pages, say so, wait to be told to go
        private[:] = 2
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        os._exit(0)
    os.read(ready_r, 1)
    rows = []
    try:
        reader = cma.Reader(pid)
        if not cma.readable(pid, shmseg.address_of(private), b"\0\0\0\x40"):  # 2.0f
            raise SystemExit("process_vm_readv is refused here (ptrace_scope, seccomp); nothing to compare")
        source = shmseg.address_of(private)
        for size in sizes:
            count = size // 4
            mine, out = np.ones(count, np.float32), np.empty(count, np.float32)
            n = max(3, min(reps, (256 << 20) // size))
            cells = []
            for piece in PIECES:
                if piece > size:
                    cells.append("")
                    continue
                bounce = np.empty(piece // 4, np.float32)
                cells.append(f"{_best(lambda: _cross(reader, source, size, piece, bounce, mine, out), n) * 1e6:.0f} us")  # noqa: B023 - called within this iteration
            copy = _best(lambda: np.copyto(shared[:count], mine), n)  # noqa: B023 - called within this iteration
            reduce = _best(lambda: np.add(mine, shared[:count], out=out), n)  # noqa: B023 - called within this iteration
            cells += [f"{copy * 1e6:.0f} us", f"{reduce * 1e6:.0f} us", f"{(copy + reduce) * 1e6:.0f} us"]
            rows.append(f"| {size >> 10} KiB | " + " | ".join(cells) + " |")
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
        staging.close()
    return rows


def _cross(reader: cma.Reader, source: int, size: int, piece: int, bounce: np.ndarray, mine: np.ndarray,
           out: np.ndarray) -> None:
    """Read ``size`` bytes of the peer's array piece by piece and reduce each into ``out``."""
    address = shmseg.address_of(bounce)
    for at in range(0, size, piece):
        n = min(piece, size - at)
        reader.read(address, source + at, n)
        a = at // 4
        np.add(mine[a:a + n // 4], bounce[:n // 4], out=out[a:a + n // 4])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64K,1M,16M", help="comma list of message sizes (K, M suffixes)")
    parser.add_argument("--reps", type=int, default=200, help="calls per batch, at most")
    args = parser.parse_args(argv)
    units = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s) for s in args.sizes.split(",")]
    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, load average {load}")
    print(f"# {sys.executable} {' '.join(sys.argv)}\n")
    head = [f"cross-memory, {p >> 10} KiB pieces" for p in PIECES] + ["staged: copy", "staged: reduce", "staged: both"]
    print("| message | " + " | ".join(head) + " |")
    print("|" + " --- |" * (len(head) + 1))
    print("\n".join(measure(sizes, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
