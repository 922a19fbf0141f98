"""Training throughput of examples/train.py: allreduce's DistributedOptimizer vs torch DDP on Gloo.

Runs ``allreduce run -n N -- python examples/train.py`` for each world size and mode, drops the first
epoch (warm-up), and prints the median samples/s of the rest (and of the repeats) as a Markdown
table. Other arguments go to train.py. Not a test: the numbers depend on the machine (on a 2-core
machine, 4 ranks share 2 cores).

    python benchmarks/train_throughput.py --sizes 2 4 --epochs 4 --repeats 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
MODES = {
    "DistributedOptimizer": [],
    "DistributedOptimizer, fp16": ["--compression", "fp16"],
    "DDP on gloo": ["--ddp", "gloo"],
    "DDP on allreduce": ["--ddp", "allreduce"],
}
RATE = re.compile(r"samples/s (\d+)")


def measure(size: int, extra: list[str], epochs: int, train_args: list[str]) -> float:
    """Median samples/s over the epochs after the first."""
    cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(size), "--", sys.executable, str(EXAMPLE),
           "--epochs", str(epochs), *extra, *train_args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    rates = [float(r) for r in RATE.findall(done.stdout)]
    return statistics.median(rates[1:] or rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over every configuration (interleaved)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args, train_args = parser.parse_known_args()
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):  # interleaved, so that a change in machine load hits every mode alike
        for mode in args.modes:
            for n in args.sizes:
                rates.setdefault((mode, n), []).append(measure(n, MODES[mode], args.epochs, train_args))
    print("| mode | " + " | ".join(f"{n} ranks (samples/s)" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for mode in args.modes:
        cells = [f"{statistics.median(rates[mode, n]):,.0f}" for n in args.sizes]
        print(f"| {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
