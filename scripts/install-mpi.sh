#!/bin/sh
# Installs Open MPI and mpi4py, which only tests/mpi/test_against_mpi4py.py needs: it runs one script
# under real mpi4py and under allreduce.MPI and compares their digests (it skips when they are absent).
# Usage: scripts/install-mpi.sh [python]   (default: .venv/bin/python). Needs root for apt-get.
set -eu
PY=${1:-.venv/bin/python}
if ! command -v mpirun >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev
fi
"$PY" -m pip install --quiet 'mpi4py>=3.1'
