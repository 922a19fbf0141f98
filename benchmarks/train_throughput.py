"""Training throughput of examples/train.py: allreduce's DistributedOptimizer vs torch DDP on Gloo.

Runs ``allreduce run -n N -- python examples/train.py`` for each world size and mode, drops the first
epoch (warm-up), and prints the median samples/s of the rest (and of the repeats) as a Markdown
table, with each mode's share of "compute alone" (the same ranks training without averaging, so
the same cores are shared the same way). Other arguments go to train.py. Not a test: the numbers
depend on the machine (on a 2-core machine, 4 ranks share 2 cores).

    python benchmarks/train_throughput.py --sizes 2 4 --epochs 4 --repeats 3
    python benchmarks/train_throughput.py --sizes 2 --hidden 2880 --modes "compute alone" "DDP on gloo" \
        "DDP on allreduce" "DDP on allreduce, TCP"          # an 8.4M-parameter MLP
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
TCP = {"ALLREDUCE_TRANSPORT": "tcp"}
MODES = {  # name: (train.py's arguments, environment)
    "compute alone": (["--alone"], {}),
    "DistributedOptimizer": ([], {}),
    "DistributedOptimizer, fp16": (["--compression", "fp16"], {}),
    "DistributedOptimizer, TCP": ([], TCP),
    "DDP on gloo": (["--ddp", "gloo"], {}),
    "DDP on allreduce": (["--ddp", "allreduce"], {}),
    "DDP on allreduce, TCP": (["--ddp", "allreduce"], TCP),
}
RATE = re.compile(r"samples/s (\d+)")


def measure(size: int, mode: str, epochs: int, train_args: list[str]) -> float:
    """Median samples/s over the epochs after the first."""
    extra, env = MODES[mode]
    cmd = [sys.executable, "-m", "allreduce", "run", "-n", str(size), "--", sys.executable, str(EXAMPLE),
           "--epochs", str(epochs), *extra, *train_args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
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
                rates.setdefault((mode, n), []).append(measure(n, mode, args.epochs, train_args))
    print("| mode | " + " | ".join(f"{n} ranks (samples/s)" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for mode in args.modes:
        cells = []
        for n in args.sizes:
            rate = statistics.median(rates[mode, n])
            alone = rates.get(("compute alone", n))
            share = f" ({rate / statistics.median(alone):.0%} of alone)" if alone and mode != "compute alone" else ""
            cells.append(f"{rate:,.0f}{share}")
        print(f"| {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
