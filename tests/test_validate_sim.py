"""The simulator against real runs (slow: minutes). ``benchmarks/validate_sim.py`` does the work; this
checks its verdict on the bandwidth-bound sizes, where the testbed, not the machine's other load,
sets the pace. The full table (64 KiB .. 64 MiB) is in docs/performance.md."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import netns

pytestmark = pytest.mark.slow

_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "validate_sim.py")


def _validate(tmp_path, *argv) -> dict:
    spec = importlib.util.spec_from_file_location("validate_sim", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "v.json"
    assert module.main([*argv, "-b", "1M", "-e", "16M", "--iters", "3", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _check(table: list[dict]) -> None:
    assert {row["algorithm"] for row in table} >= {"ring", "tree"}
    wrong = [row for row in table if abs(row["error"]) > 0.2]
    assert not wrong, f"predictions off by more than 20%: {wrong}"


@pytest.mark.skipif(not netns.available(), reason="network namespaces need root, ip and tc")
def test_predictions_match_a_rate_limited_namespace_testbed(tmp_path):
    _check(_validate(tmp_path, "--where", "netns")["netns"])


def test_predictions_match_one_host(tmp_path):
    _check(_validate(tmp_path, "--where", "host", "--host-ranks", "2")["host2"])
