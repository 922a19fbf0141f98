"""The simulator against real runs (slow: minutes). ``benchmarks/validate_sim.py`` does the work; this
checks its verdict on the bandwidth-bound sizes (1 .. 16 MiB). On the rate-limited namespace testbed
the network sets the pace and predictions must be within 20%. On one host the CPU sets it, and on a
small shared machine the same `tune` can see shared memory as full duplex in one run and as half
duplex in the next (whether both ranks hold a core at once), so there the test asks for 50% and
docs/performance.md gives the measured tables."""

from __future__ import annotations

import importlib.util
import json

import pytest

from support import netns
from support.paths import BENCHMARKS

pytestmark = pytest.mark.slow

_SCRIPT = str(BENCHMARKS / "validate_sim.py")


def _validate(tmp_path, *argv) -> dict:
    spec = importlib.util.spec_from_file_location("validate_sim", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "v.json"
    assert module.main([*argv, "-b", "1M", "-e", "16M", "--iters", "3", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _check(table: list[dict], tolerance: float) -> None:
    assert {row["algorithm"] for row in table} >= {"ring", "tree"}
    wrong = [row for row in table if abs(row["error"]) > tolerance]
    assert not wrong, f"predictions off by more than {tolerance:.0%}: {wrong}"


@pytest.mark.skipif(not netns.available(), reason="network namespaces need root, ip and tc")
def test_predictions_match_a_rate_limited_namespace_testbed(tmp_path):
    _check(_validate(tmp_path, "--where", "netns")["netns"], 0.2)


def test_predictions_match_one_host(tmp_path):
    _check(_validate(tmp_path, "--where", "host", "--host-ranks", "2")["host2"], 0.5)
