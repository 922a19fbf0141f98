"""allreduce.MPI's surface without forming a group: names and signatures as in mpi4py, buffer
arguments, what is refused, and that ``import allreduce`` does not load it."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

from allreduce import MPI
from allreduce.mpi.bufferargs import simple, vector
from support.paths import SRC

COMM_METHODS = [
    "Allreduce", "Reduce", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather", "Allgatherv",
    "Alltoall", "Alltoallv", "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan", "Barrier", "Send", "Recv",
    "Sendrecv", "Isend", "Irecv", "Iallreduce", "Probe", "Iprobe", "allreduce", "reduce", "bcast", "gather",
    "scatter", "allgather", "alltoall", "scan", "exscan", "send", "recv", "isend", "irecv", "sendrecv", "barrier",
    "Get_rank", "Get_size", "Split", "Dup", "Free", "Abort",
]
REQUEST_METHODS = ["Wait", "Test", "wait", "test", "Waitall", "waitall", "Testall", "testall"]


def test_the_library_does_not_load_mpi_until_asked():
    probe = ("import sys, allreduce; before = 'allreduce.mpi' in sys.modules; from allreduce import MPI; "
             "print(before, 'allreduce.mpi' in sys.modules, MPI.__name__)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SRC)})
    assert done.stdout.split() == ["False", "True", "allreduce.mpi"], done.stderr


def test_a_process_started_alone_is_a_world_of_one():
    probe = ("from allreduce import MPI; import numpy as np; c = MPI.COMM_WORLD; out = np.zeros(2); "
             "c.Allreduce(np.ones(2), out); print(c.Get_rank(), c.Get_size(), c.allreduce(5), out.tolist())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "OMPI_", "PMI_", "SLURM_"))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": str(SRC)})
    assert done.stdout.strip() == "0 1 5 [1.0, 1.0]", done.stderr


def test_names_and_signatures_are_mpi4pys():
    real = pytest.importorskip("mpi4py.MPI")
    for cls, real_cls, name in [(MPI.Comm, real.Intracomm, n) for n in COMM_METHODS] + \
            [(MPI.Request, real.Request, n) for n in REQUEST_METHODS]:
        ours, theirs = inspect.signature(getattr(cls, name)), inspect.signature(getattr(real_cls, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        for param in ours.parameters.values():
            default = theirs.parameters[param.name].default
            if isinstance(default, int) or default is None:
                assert param.default == default, f"{name}({param.name}=...)"
    for name in ("ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "SUCCESS"):
        assert getattr(MPI, name) == getattr(real, name), name
    for name in ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC",
                 "DOUBLE", "FLOAT", "INT", "LONG", "BYTE", "C_BOOL", "INT64_T", "Wtime", "Get_processor_name",
                 "Status", "Request", "COMM_WORLD", "COMM_NULL", "IN_PLACE"):
        assert hasattr(real, name) and hasattr(MPI, name), name
    for datatype in (MPI.DOUBLE, MPI.FLOAT, MPI.INT, MPI.LONG, MPI.SHORT, MPI.BYTE, MPI.C_BOOL, MPI.UINT64_T):
        assert datatype.Get_size() == getattr(real, datatype.name[4:]).Get_size(), datatype.name


def test_ops_combine_objects_as_mpi4py_does():
    assert MPI.SUM([1], [2]) == [1, 2] and MPI.PROD(3, 4) == 12 and MPI.MAX("a", "b") == "b"
    assert (MPI.LAND(2, 3), MPI.LOR(0, 0), MPI.LXOR(5, 0)) == (True, False, True)
    assert MPI.MAXLOC((1, 5), (1, 2)) == (1, 2) and MPI.MINLOC([0, 9], [3, 1]) == (0, 9)


def test_what_is_not_offered_raises_naming_the_feature():
    with pytest.raises(NotImplementedError, match="dynamic process"):
        MPI.Open_port  # noqa: B018 - looking it up is what raises
    for make, words in ((MPI.Win.Create, "one-sided"), (MPI.File.Open, "MPI-IO"), (MPI.Session.Init, "sessions")):
        with pytest.raises(NotImplementedError, match=words):
            make(MPI.COMM_SELF)
    assert not MPI.WIN_NULL and MPI.Win() == MPI.WIN_NULL != MPI.FILE_NULL
    with pytest.raises(MPI.Exception) as caught:
        MPI.WIN_NULL.Free()
    assert caught.value.Get_error_class() == MPI.ERR_WIN
    with pytest.raises(NotImplementedError, match="inter-communicators"):
        MPI.Intercomm(MPI.COMM_WORLD)
    assert MPI.Intercomm() == MPI.COMM_NULL
    with pytest.raises(NotImplementedError, match="process topologies"):
        MPI.COMM_WORLD.Create_cart([2])
    with pytest.raises(NotImplementedError, match="Create_value_index"):
        MPI.Datatype.Create_value_index(MPI.DOUBLE, MPI.INT)
    with pytest.raises(NotImplementedError, match="generalized requests"):
        MPI.Grequest.Start(None, None, None)
    with pytest.raises(NotImplementedError, match="MAXLOC on buffers"):
        MPI.MAXLOC.for_buffers()
    with pytest.raises(AttributeError):
        MPI.No_such_thing  # noqa: B018 - looking it up is what raises


def test_buffer_arguments_are_views_in_mpi4pys_forms():
    x = np.arange(10, dtype=np.float64)
    assert simple(x, "buf", False).base is not None and simple(x, "buf", False).size == 10
    assert simple([x, MPI.DOUBLE], "buf", False).tolist() == x.tolist()
    assert simple([x, 3, MPI.DOUBLE], "buf", False).tolist() == [0, 1, 2]
    assert simple([x, (3, 4), "d"], "buf", False).tolist() == [4, 5, 6]
    assert simple([x, MPI.INT], "buf", False).size == 20  # the bytes, read as another type
    assert simple([x, 2, MPI.DOUBLE.Create_contiguous(3)], "buf", False).tolist() == [0, 1, 2, 3, 4, 5]
    assert vector([x, 3], 2, "buf", False)[1:] == ([3, 3], [0, 3])  # one count for every rank
    assert vector([x, (2, 3)], 2, "buf", False)[1:] == ([2, 2], [0, 3])  # a tuple: (counts, displs)
    assert vector([x, [2, 3]], 2, "buf", False)[1:] == ([2, 3], [0, 2])  # a list: the counts
    assert vector([x, [1, 4]], 2, "buf", False)[1:] == ([1, 4], [0, 1])
    assert vector([x, ([1, 4], [5, 0]), MPI.DOUBLE], 2, "buf", False)[1:] == ([1, 4], [5, 0])
    assert vector([x, [1, 2], [0, 8], MPI.DOUBLE], 2, "buf", False)[1:] == ([1, 2], [0, 8])
    assert vector(x, 5, "buf", False)[1:] == ([2] * 5, [0, 2, 4, 6, 8])
    with pytest.raises(ValueError, match="do not fit"):
        simple([x, (5, 6), MPI.DOUBLE], "buf", False)
    with pytest.raises(ValueError, match="do not fit"):
        vector([x, [6, 6]], 2, "buf", False)
    with pytest.raises(BufferError, match="read-only"):
        simple(np.frombuffer(b"12345678", np.float64), "recvbuf", True)
