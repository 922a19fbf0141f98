"""MPI.Finalize (run at exit) is collective, as MPI's: ranks done early wait for the others, so
rank 0, which hosts the store, does not take it away from a rank still at work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from allreduce import MPI

LATE = textwrap.dedent("""
    import time
    from allreduce import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == comm.size - 1:
        time.sleep(6.5)  # longer than a leaving store host waits for the others without Finalize
        MPI.COMM_SELF.Get_group().Free()
        comm.Get_group().Free()
    print(comm.rank, "done", flush=True)
""")


def test_ranks_done_early_wait_at_exit_for_a_late_one(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(LATE)
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "3", "--no-tag-output", "--",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(done.stdout.split("\n")[:3]) == ["0 done", "1 done", "2 done"]


def test_handles_have_no_integer_or_fortran_handle():
    request = MPI.COMM_SELF.Send_init(b"", MPI.PROC_NULL, 0)
    for obj in (MPI.COMM_WORLD, MPI.INT, MPI.GROUP_EMPTY, request, MPI.INFO_NULL, MPI.MESSAGE_NULL):
        assert (obj.toint(), obj.py2f()) == (-1, -1), obj
    request.Free()
