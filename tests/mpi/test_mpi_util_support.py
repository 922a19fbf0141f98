"""What mpi4py's own utilities (mpi4py.util.pkl5) ask of ``MPI``, in one process: buffers that export
their memory, pickles with out-of-band buffers, per-communicator locks, a private duplicate with
fresh tags, attribute delete callbacks, and probed messages as handles (test_mpi_pickled_ranks.py
runs the same between ranks)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from allreduce import MPI


@pytest.fixture(autouse=True, scope="module")
def world_of_one():
    """This process joins a world of one on first use; leave it after, so later tests fork cleanly."""
    yield
    MPI.Finalize()


def _address(obj) -> int:
    return np.frombuffer(obj, np.uint8).__array_interface__["data"][0]


def test_buffer_exports_its_memory_to_memoryview_and_pickle():
    made = MPI.buffer.allocate(6)
    view = memoryview(made)
    assert (view.nbytes, view.format, view.readonly) == (6, "B", False)
    view[2] = 7
    assert made[2] == 7 and made.tobytes() == bytes([0, 0, 7, 0, 0, 0])
    array = np.arange(5, dtype=np.int32)
    shared = MPI.buffer(array)
    np.frombuffer(shared, np.int32)[1] = -4  # the same memory, not a copy
    assert array.tolist() == [0, -4, 2, 3, 4]
    assert memoryview(MPI.buffer(b"xyz").toreadonly()).readonly
    stream = pickle.dumps(array, 5, buffer_callback=lambda _: False)
    assert pickle.loads(stream, buffers=[shared]).tolist() == array.tolist()


@pytest.mark.parametrize("threshold", [-1, 0, 64, 4096, None])
@pytest.mark.parametrize("length", [0, 1, 16, 17, 1031])
@pytest.mark.parametrize("order", ["C", "F"])
def test_dumps_oob_hands_large_buffers_out_of_band_without_copying(threshold, length, order):
    pickler = MPI.Pickle()
    pickler.THRESHOLD = threshold
    limit = 1024 ** 2 // 4 if threshold is None else threshold
    assert pickler.THRESHOLD == limit
    sent = np.asarray(np.arange(length * 4, dtype=np.float32).reshape(length, 4), order=order)
    data, bufs = pickler.dumps_oob({"a": sent, "n": length})
    assert type(data) is bytes and type(bufs) is list
    if sent.nbytes >= limit:
        assert len(bufs) == 1 and type(bufs[0]) is MPI.buffer and len(bufs[0]) == sent.nbytes
        assert sent.nbytes == 0 or bufs[0].address == sent.__array_interface__["data"][0]
    else:
        assert bufs == []
    back = pickler.loads_oob(data, bufs)
    assert back["n"] == length and back["a"].tolist() == sent.tolist() and back["a"].flags.f_contiguous == (
        order == "F" or length <= 1)


def test_pickle_protocol_and_threshold_follow_mpi4py():
    assert MPI.Pickle().PROTOCOL == pickle.HIGHEST_PROTOCOL and MPI.pickle.THRESHOLD == 1024 ** 2 // 4
    calls = []
    own = MPI.Pickle(lambda obj, *rest: calls.append(rest) or b"x", lambda data: data)
    assert own.PROTOCOL is None and own.dumps(1) == b"x" and calls == [()]  # called without a protocol
    fixed = MPI.Pickle(protocol=2, threshold=100)
    assert (fixed.PROTOCOL, fixed.THRESHOLD) == (2, 100)
    fixed.PROTOCOL = None
    assert fixed.PROTOCOL == pickle.HIGHEST_PROTOCOL
    assert pickle.loads(fixed.dumps_oob(np.arange(3))[0], buffers=[]).tolist() == [0, 1, 2]  # < threshold: in band


def test_comm_lock_is_shared_by_handles_and_held_by_object_collectives():
    comm = MPI.COMM_SELF.Dup()
    table = MPI._comm_lock_table(comm)
    assert table == {} and MPI._comm_lock_table(MPI.Comm(comm)) is table
    lock = MPI._comm_lock(comm, "send")
    assert MPI._comm_lock(MPI.Comm(comm), "send") is lock and table["send"] is lock
    assert comm.bcast("x") == "x" and comm.gather(1) == [1] and comm.scatter(None) is None
    assert comm.allgather(2) == [2] and comm.alltoall(None) == [None]
    assert {"bcast", "gather", "scatter", "allgather", "alltoall"} <= set(table)
    assert not any(held.locked() for held in table.values())
    comm.Free()


def test_commctx_intra_gives_one_private_duplicate_and_fresh_tags():
    comm = MPI.COMM_SELF.Dup()
    first, tag0 = MPI._commctx_intra(comm)
    again, tag1 = MPI._commctx_intra(MPI.Comm(comm))
    assert type(first) is MPI.Intracomm and first == again and first != comm
    assert comm.Compare(first) == MPI.CONGRUENT and (tag0, tag1) == (0, 1)
    first.Send(b"ab", 0, tag1)  # messages on the duplicate never meet the communicator's
    assert not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG) and first.Iprobe(0, tag1)
    first.Recv(bytearray(2), 0, tag1)
    comm.Free()
    with pytest.raises(MPI.Exception):
        MPI._commctx_intra(comm)  # freed: COMM_NULL
    with pytest.raises(NotImplementedError):
        MPI._commctx_inter(MPI.COMM_SELF)


def test_attribute_delete_callbacks_run_when_the_attribute_leaves():
    deleted = []
    keyval = MPI.Comm.Create_keyval(delete_fn=lambda comm, key, value: deleted.append((key, value)))
    comm = MPI.COMM_SELF.Dup()
    comm.Set_attr(keyval, "a")
    comm.Delete_attr(keyval)
    comm.Set_attr(keyval, "b")
    comm.Free()
    assert deleted == [(keyval, "a"), (keyval, "b")]
    MPI.Comm.Free_keyval(keyval)


def test_dup_keeps_the_class_of_the_communicator():
    class Mine(MPI.Intracomm):
        def __new__(cls, comm=None):
            return MPI.Comm.__new__(cls, comm)

    comm = Mine(MPI.COMM_SELF)
    dup = comm.Dup()
    assert type(dup) is Mine and dup.Get_size() == 1
    dup.Free()


def test_probed_messages_are_handles_freed_and_consumed_one_by_one():
    noproc = MPI.COMM_SELF.Mprobe(MPI.PROC_NULL)
    assert noproc == MPI.MESSAGE_NO_PROC and noproc is not MPI.MESSAGE_NO_PROC
    noproc.Recv((None, 0, MPI.BYTE))
    assert noproc == MPI.MESSAGE_NULL and MPI.MESSAGE_NO_PROC
    MPI.COMM_SELF.Send(b"abc", 0, 5)
    message = MPI.COMM_SELF.Mprobe(0, 5)
    other = MPI.Message(message)
    assert other == message and not (other != message) and MPI.Message() != message
    with pytest.raises(TypeError):
        hash(message)
    got = bytearray(3)
    message.Recv(got)
    assert got == b"abc" and message == MPI.MESSAGE_NULL
    other.free()
    assert not other
    MPI.MESSAGE_NO_PROC.free()
    assert MPI.MESSAGE_NO_PROC  # the predefined one stays
    request = MPI.COMM_SELF.Isend(b"", MPI.PROC_NULL)
    request.free()
    request.free()
    assert request == MPI.REQUEST_NULL


@pytest.mark.parametrize("name,value", [("SHORT_INT", "h"), ("INT_INT", "i"), ("LONG_INT", "l"), ("FLOAT_INT", "f"),
                                        ("DOUBLE_INT", "d")])
def test_pair_types_are_named_c_structs_of_a_value_and_an_int(name, value):
    pair = getattr(MPI, name)
    record = np.dtype([("value", value), ("index", "i")], align=True)
    assert pair.is_named and pair.is_predefined and pair.combiner == MPI.COMBINER_NAMED
    assert (pair.size, pair.extent, pair.lb) == (np.dtype(value).itemsize + 4, record.itemsize, 0)
    assert (pair.typechar, pair.typestr) == ("V", f"V{record.itemsize}")
    assert MPI._typecode(pair) is None and MPI._typealign(pair) == record.alignment
    assert MPI.Datatype.Get_value_index(MPI.Datatype.fromcode(value), MPI.INT) == pair
    assert MPI.Datatype.Get_value_index(MPI.Datatype.fromcode(value), MPI.SHORT) == MPI.DATATYPE_NULL
    with pytest.raises(ValueError):
        pair.tocode()
    rows = np.zeros(3, record)
    rows["value"], rows["index"] = [5, -1, 7], [0, 1, 2]
    packed = bytearray(pair.Pack_size(3, MPI.COMM_SELF))
    assert pair.Pack(rows, packed, 0, MPI.COMM_SELF) == 3 * pair.size  # the padding is not packed
    expected = b"".join(row["value"].tobytes() + row["index"].tobytes() for row in rows)
    assert bytes(packed[:3 * pair.size]) == expected
    assert MPI.TWOINT == MPI.INT_INT and MPI.INT_INT.name == "MPI_2INT"
