"""Where the repository's parts are, for tests that start scripts or subprocesses."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
