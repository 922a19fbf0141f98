"""Predictions across message sizes: the table, where the fastest algorithm changes, and a plot.

A *crossover* is where two algorithms take equally long: between two sizes of the sweep where the
fastest one changes, the point is found by interpolating the difference of their log times linearly
in log size (times follow ``alpha + beta m`` closely enough that this is where the curves cross).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable, Mapping

from . import Result, simulate
from ..model.network import Network


@dataclass(frozen=True)
class Crossover:
    """Where ``after`` becomes faster than ``before``."""

    nbytes: float
    before: str
    after: str


def sweep(collective: str, algorithms: list[str], sizes: list[int], size: int, network: Network,
          itemsize: int = 4, on_result: Callable[[Result], object] | None = None,
          networks: Mapping[str, Network] | None = None) -> dict[str, list[Result]]:
    """``{algorithm: [Result per size]}`` for every algorithm and size (bytes of the whole buffer);
    ``on_result`` is called after each simulation (e.g. to show progress); ``networks`` gives some
    algorithms a network of their own (the shared-memory lines' figures, say)."""
    def one(name: str, nbytes: int) -> Result:
        result = simulate(collective, name, nbytes, size, (networks or {}).get(name, network), itemsize=itemsize)
        if on_result is not None:
            on_result(result)
        return result

    return {name: [one(name, nbytes) for nbytes in sizes] for name in algorithms}


def fastest(table: dict[str, list[Result]]) -> list[str]:
    """Per size, the algorithm with the smallest time (the first listed on a tie)."""
    names = list(table)
    return [min(names, key=lambda name: table[name][i].time) for i in range(len(table[names[0]]))]


def crossovers(table: dict[str, list[Result]]) -> list[Crossover]:
    """Where the fastest algorithm changes along the sweep."""
    winners = fastest(table)
    found = []
    for i in range(1, len(winners)):
        before, after = winners[i - 1], winners[i]
        if before == after:
            continue
        a, b = table[before], table[after]
        lo, hi = math.log(max(a[i - 1].nbytes, 1)), math.log(max(a[i].nbytes, 1))
        d0 = math.log(a[i - 1].time / b[i - 1].time)
        d1 = math.log(a[i].time / b[i].time)
        at = lo if d0 == d1 else lo + (hi - lo) * d0 / (d0 - d1)
        found.append(Crossover(math.exp(min(max(at, lo), hi)), before, after))
    return found


def plot(table: dict[str, list[Result]], path: str, title: str) -> None:
    """Write a PNG of time against size per algorithm, crossovers marked, at ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for i, (name, results) in enumerate(table.items()):
        ax.plot([r.nbytes for r in results], [r.time * 1e6 for r in results], label=name, **curve_style(i))
    for cross in crossovers(table):
        ax.axvline(cross.nbytes, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{cross.before} -> {cross.after}\n{format_bytes(cross.nbytes)}", (cross.nbytes, 1),
                    xycoords=("data", "axes fraction"), xytext=(3, -4), textcoords="offset points",
                    va="top", fontsize=7, color="dimgrey")
    size_axis(ax)
    ax.set_yscale("log")
    ax.set_xlabel("message size")
    ax.set_ylabel("predicted time (us)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")


def curve_style(index: int) -> dict:
    """Matplotlib style of the ``index``-th curve: its own hollow marker and dash pattern, so that two
    curves with equal values stay visible one over the other."""
    return {"marker": MARKERS[index % len(MARKERS)], "markerfacecolor": "none", "markersize": 5 + index % 3,
            "linestyle": ("-", "--", "-.", ":")[index % 4], "linewidth": 1.2}


def size_axis(ax, which: str = "x") -> None:
    """Make ``ax``'s ``which`` axis a logarithmic size axis with ticks such as 64 B, 16 KiB, 4 MiB."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis.set_major_locator(LogLocator(base=2, numticks=9))
    axis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value).replace(".0 ", " ")))
    axis.set_minor_formatter(NullFormatter())


def format_bytes(nbytes: float) -> str:
    """``"64 MiB"``, ``"1.5 KiB"``, ``"8 B"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.3g} B"
