"""TensorFlow is an optional extra: allreduce imports without it, and allreduce.tensorflow says what to
install. Runs with or without TensorFlow installed (its absence is simulated)."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_TENSORFLOW = "import sys; sys.modules['tensorflow'] = None\n"  # any `import tensorflow` now fails


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TENSORFLOW + code], capture_output=True, text=True,
                          timeout=60)


def test_the_core_imports_no_tensorflow():
    done = subprocess.run([sys.executable, "-c", "import sys, allreduce; print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_tensorflow_layer_names_the_extra_to_install():
    for module in ("allreduce.tensorflow", "allreduce.tensorflow.keras"):
        done = run(f"import {module}")
        assert done.returncode != 0 and "pip install 'allreduce[tensorflow]'" in done.stderr, done.stderr
