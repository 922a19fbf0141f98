"""torch is an optional extra: the core imports and works without it; allreduce.torch says what to install."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_TORCH = "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH + code], capture_output=True, text=True, timeout=60)


def test_the_core_needs_no_torch():
    done = run("import numpy as np, allreduce, allreduce.api, allreduce.cli.bench, allreduce.cli\n"
               "from allreduce.buffers import as_array\n"
               "print(as_array(np.zeros(3)).size)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


def test_the_torch_layer_names_the_extra_to_install():
    done = run("import allreduce.torch")
    assert done.returncode != 0 and "pip install 'allreduce[torch]'" in done.stderr
