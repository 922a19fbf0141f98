"""The compiled engine's modules, and whether this process may use them.

``pip install`` compiles every ``_<name>.c`` here into the extension ``allreduce.native._<name>``
(see ``setup.py``; the other ``.c`` files here are shared by all of them). A build without a C
compiler still installs: the extensions are optional, and the pure-Python engine runs everything.
``ALLREDUCE_ENGINE`` picks: ``python`` never loads them, ``native`` requires them, ``auto`` (the
default) uses them where they loaded.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from ..settings import Settings


def load(name: str) -> tuple[ModuleType | None, str]:
    """The extension ``_<name>`` and a sentence on why it is or is not there."""
    try:
        return importlib.import_module(f"{__name__}._{name}"), "compiled"
    except ImportError as exc:
        return None, f"not built ({exc})"


def chosen(name: str, settings: Settings) -> tuple[ModuleType | None, str]:
    """The extension ``_<name>`` if ``settings`` let this process use it, and why or why not.

    Raises:
        ImportError: ``ALLREDUCE_ENGINE=native`` and the extension did not load.
    """
    if settings.engine == "python":
        return None, "ALLREDUCE_ENGINE=python"
    module, why = load(name)
    if module is None and settings.engine == "native":
        raise ImportError(f"ALLREDUCE_ENGINE=native, but the compiled engine is {why}; "
                          f"reinstall with a C compiler present, or set ALLREDUCE_ENGINE=python")
    return module, why


def exporter_base() -> type:
    """The base class that gives a class's ``__buffer__(flags)`` its meaning (``memoryview(obj)``):
    ``object`` from Python 3.12, which does so itself; before, the compiled ``_exporter.Exporter``, or
    ``object`` if it was not built (then such objects offer no buffer protocol)."""
    module = None if sys.version_info >= (3, 12) else load("exporter")[0]
    return object if module is None else module.Exporter
