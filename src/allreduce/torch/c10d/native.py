"""The C++ base class of the torch backend (``shim.cpp``), compiled against the installed torch on first use.

torch exposes ``c10d::Backend`` to Python without a constructor, so Python code can be the backend
torch registers in a ``ProcessGroup`` only through a small C++ subclass that forwards each virtual
method to a Python object (its ``impl``). It is built just in time by ``torch.utils.cpp_extension.load`` (a C++
compiler and ninja, about half a minute once; ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``
keeps it), named after the torch version so an upgraded torch gets its own build. Everything else
loads it through :func:`python_backend`, once per process (forked ranks inherit it).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import sysconfig
import threading

import torch

SOURCE = pathlib.Path(__file__).with_name("shim.cpp")
_loaded: dict[str, type] = {}
_lock = threading.Lock()


def python_backend() -> type:
    """``PythonBackend(rank, size, name, impl)``: a C++ ``c10d::Backend`` whose methods call ``impl``'s.

    Raises:
        RuntimeError: the shim could not be built (no C++ compiler or ninja); the message says what to install.
    """
    with _lock:
        if "PythonBackend" not in _loaded:
            _loaded["PythonBackend"] = _build().PythonBackend
        return _loaded["PythonBackend"]


def _build():
    from torch.utils import cpp_extension

    _find_ninja()
    name = "allreduce_shim_" + re.sub(r"\W", "_", torch.__version__)
    try:
        return cpp_extension.load(name, [str(SOURCE)], extra_cflags=["-O2"])  # torch builds unoptimized otherwise
    except Exception as exc:  # a missing compiler or ninja shows up as several exception types
        raise RuntimeError(
            f"the torch backend 'allreduce' compiles {SOURCE.name} against torch {torch.__version__} on first "
            f"use, and that failed: {exc}. It needs a C++ compiler (c++, or set CXX) and ninja "
            "(pip install 'allreduce[torch]' installs ninja)") from exc


def _find_ninja() -> None:
    """torch runs ``ninja`` from PATH; the ninja wheel puts it beside this interpreter's scripts, which
    a virtual environment used without activating it (``.venv/bin/python``) leaves off PATH."""
    scripts = sysconfig.get_path("scripts")
    if shutil.which("ninja") is None and shutil.which("ninja", path=scripts):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
