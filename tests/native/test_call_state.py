"""The state a call passes through is one type (``engines/callstate.py``'s twin and ``native/callstate.c``):
the compiled shortcut drives that struct, never the runtime's Python objects by attribute name, and the
twins offer the same fields and methods with the same rules."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

import allreduce
from allreduce.engines import callstate

SOURCES = Path(allreduce.__file__).parent
# the C API that reaches an object's attribute (or method) by its name
BY_NAME = re.compile(r"\b(PyObject_(Get|Set|Has|Del)Attr\w*|PyObject_GetOptionalAttr\w*|_PyObject_LookupAttr\w*"
                     r"|PyObject_(Vectorcall|Call)Method\w*|_PyObject_GetAttrId)\b")
# the names of the runtime's state: the call state's fields, and the parts of the group that held them once
RUNTIME = set(callstate.CallState.__slots__) | {"numbered", "jobs", "epoch", "shortcuts", "_calls", "_queue",
                                                "_claims", "_life", "_health"}


def test_no_compiled_source_looks_up_an_attribute_by_name():
    """Only Python's own protocols (a dunder: ``__buffer__``) may be reached by name."""
    sources = sorted((SOURCES / "native").glob("*.[ch]"))
    assert sources
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            looks = BY_NAME.search(line) and not re.search(r'"__\w+__"', line)
            assert not looks, f"{path.name}:{number} looks an attribute up by name: {line.strip()}"


def test_the_torch_shim_names_no_attribute_of_the_runtime():
    text = (SOURCES / "torch" / "c10d" / "shim.cpp").read_text()
    named = set(re.findall(r'(?:attr|py::str)\(\s*"(\w+)"', text))
    assert named and not named & RUNTIME, named & RUNTIME


def _twins() -> list:
    lock = threading.RLock()
    twins = [callstate.CallState(lock.acquire, lock.release)]
    compiled = pytest.importorskip("allreduce.native._line_plans", reason="the compiled engine is not built")
    return twins + [compiled.CallState(lock.acquire, lock.release)]


def test_the_twins_follow_the_same_rules():
    for state in _twins():
        assert (state.usable, state.busy, state.queued, state.issued, state.issuer, state.conflict,
                state.started) == (True, False, 0, 0, 0, None, None)
        state.progress = 7
        assert state.idle_claim(7) == 0  # the progress thread (a Work callback) never claims
        assert state.idle_claim(5) == 1 and state.busy and state.issuer == 5
        assert state.idle_claim(5) == 0  # busy
        state.begin(1, "call")
        assert state.started == (1, "call")
        state.queued = 1
        assert state.free() is True and not state.busy  # freed, with work queued behind it
        assert state.idle_claim(5) == 0
        state.queued = 0
        assert state.number() == 2 and state.issued == 2
        state.usable = False
        assert state.idle_claim(5) == 0 and state.issued == 2
        state.conflict = RuntimeError("two threads")
        assert isinstance(state.conflict, RuntimeError)


def test_the_twins_have_one_interface():
    python, compiled = _twins()
    public = [{name for name in dir(state) if not name.startswith("_")} for state in (python, compiled)]
    assert public[0] == public[1]
