"""The C++ base class of the torch backend (``shim.cpp``), compiled against the installed torch on first use.

torch exposes ``c10d::Backend`` to Python without a constructor, so Python code can be the backend
torch registers in a ``ProcessGroup`` only through a small C++ subclass that forwards each virtual
method to a Python object (its ``impl``). It is built just in time by ``torch.utils.cpp_extension.load`` (a C++
compiler and ninja, about half a minute once; ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``
keeps it), named after the torch version so an upgraded torch gets its own build. Everything else
loads it through :func:`python_backend`, once per process (forked ranks inherit it).

torch runs ``ninja`` from PATH. The ninja wheel puts it beside this interpreter's scripts, which a
virtual environment used without activating it (``.venv/bin/python``) leaves off PATH; then the build
runs in a child process whose PATH has it, and this process loads what the child built, so that the
user's environment is never changed.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping

import torch

SOURCE = pathlib.Path(__file__).with_name("shim.cpp")
FLAGS = ["-O2"]  # torch builds unoptimized otherwise
# what the child runs: build (or find built) and say where the module is
_BUILD = ("import sys; from torch.utils import cpp_extension; "
          "print(cpp_extension.load(sys.argv[1], [sys.argv[2]], extra_cflags=sys.argv[3:]).__file__)")
_loaded: dict[str, type] = {}
_lock = threading.Lock()


def python_backend(environ: Mapping[str, str]) -> type:
    """``PythonBackend(rank, size, name, impl)``: a C++ ``c10d::Backend`` whose methods call ``impl``'s.

    ``environ`` is the process's environment, read by the caller (the entry point); its PATH says
    whether torch will find ninja.

    Raises:
        RuntimeError: the shim could not be built (no C++ compiler or ninja); the message says what to install.
    """
    with _lock:
        if "PythonBackend" not in _loaded:
            _loaded["PythonBackend"] = _build(environ).PythonBackend
        return _loaded["PythonBackend"]


def _build(environ: Mapping[str, str]):
    from torch.utils import cpp_extension

    name = "allreduce_shim_" + re.sub(r"\W", "_", torch.__version__)
    path, scripts = environ.get("PATH", ""), sysconfig.get_path("scripts")
    try:
        if shutil.which("ninja", path=path) is None and shutil.which("ninja", path=scripts):
            return _build_aside(name, {**environ, "PATH": scripts + os.pathsep + path})
        return cpp_extension.load(name, [str(SOURCE)], extra_cflags=FLAGS)
    except Exception as exc:  # a missing compiler or ninja shows up as several exception types
        raise RuntimeError(
            f"the torch backend 'allreduce' compiles {SOURCE.name} against torch {torch.__version__} on first "
            f"use, and that failed: {exc}. It needs a C++ compiler (c++, or set CXX) and ninja "
            "(pip install 'allreduce[torch]' installs ninja)") from exc


def _build_aside(name: str, env: dict[str, str]):
    """The shim built by a child process that runs with ``env``, loaded into this one."""
    done = subprocess.run([sys.executable, "-c", _BUILD, name, str(SOURCE), *FLAGS], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    spec = importlib.util.spec_from_file_location(name, done.stdout.strip().splitlines()[-1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
