"""Running a test module on both engines: ``pytestmark = engines.BOTH`` in a module of forked-rank tests
runs each of its tests once per engine (``ALLREDUCE_ENGINE=python``, then ``native``), the ranks
inheriting the variable; the native run is skipped, saying why, where the compiled engine is not
built. A test about one engine's internals narrows it: ``@engines.only("python")``. ``TEST_ENGINES``
(a comma list) narrows every marked test to those engines (``make asan`` runs the native ones)."""

from __future__ import annotations

import os

import pytest

from allreduce import native

NAMES = ("python", "native")
BOTH = pytest.mark.engines(*NAMES)


def only(*names: str):
    """Run the marked test on these engines alone."""
    return pytest.mark.engines(*names)


def _missing() -> str | None:
    """Why the compiled engine cannot run here, or ``None``."""
    module, why = native.load("line_plans")
    return None if module is not None else f"the compiled engine is {why}"


def parametrize(metafunc) -> None:
    """``pytest_generate_tests``: the engine parameter of a test marked ``engines`` (the closest mark
    wins: a test's own narrows its module's)."""
    mark = metafunc.definition.get_closest_marker("engines")
    if mark is None:
        return
    missing = _missing()
    wanted = os.environ.get("TEST_ENGINES", ",".join(NAMES)).split(",")
    params = [pytest.param(name, marks=pytest.mark.skip(reason=missing) if name == "native" and missing else ())
              for name in mark.args if name in wanted]
    if not params:
        params = [pytest.param(None, marks=pytest.mark.skip(reason="not on the engines TEST_ENGINES names"))]
    metafunc.parametrize("engine", params, indirect=True)


@pytest.fixture(autouse=True)
def engine(request, monkeypatch) -> str | None:
    """The engine this run of the test is on (``None`` outside tests marked ``engines``), set in the
    environment its forked ranks inherit."""
    name = getattr(request, "param", None)
    if name is not None:
        monkeypatch.setenv("ALLREDUCE_ENGINE", name)
    return name
