"""allreduce.MPI's handles and values, in one process (a world of one): communicators, groups, ops,
requests, statuses, infos and errors compare, pickle and fail as mpi4py's do."""

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


def test_comm_handles_compare_as_mpi4pys():
    assert MPI.Comm() == MPI.COMM_NULL and MPI.Comm() is not MPI.COMM_NULL and not MPI.COMM_NULL
    world = MPI.Comm(MPI.COMM_WORLD)
    assert world == MPI.COMM_WORLD and world is not MPI.COMM_WORLD
    assert MPI.Comm.Compare(world, MPI.COMM_WORLD) == MPI.IDENT
    dup = MPI.COMM_WORLD.Dup()
    assert dup != MPI.COMM_WORLD and MPI.COMM_WORLD.Compare(dup) == MPI.CONGRUENT
    dup.Free()
    assert dup == MPI.COMM_NULL
    with pytest.raises(TypeError):
        MPI.Comm((1, 2))
    with pytest.raises(MPI.Exception) as caught:
        MPI.Comm.Compare(MPI.COMM_NULL, MPI.COMM_NULL)
    assert caught.value.Get_error_class() == MPI.ERR_COMM
    for freed in (MPI.COMM_NULL, MPI.COMM_WORLD, MPI.COMM_SELF):
        with pytest.raises(MPI.Exception):
            freed.Free()
    assert MPI.COMM_NULL.Get_name() == "MPI_COMM_NULL" and MPI.COMM_SELF.Get_name() == "MPI_COMM_SELF"


def test_comm_self_is_a_communicator_of_this_process_alone():
    assert (MPI.COMM_SELF.Get_size(), MPI.COMM_SELF.Get_rank()) == (1, 0)
    out = np.zeros(3)
    MPI.COMM_SELF.Allreduce(np.arange(3.0), out)
    assert out.tolist() == [0.0, 1.0, 2.0]
    dup = MPI.COMM_SELF.Dup()
    dup.Send(np.arange(4, dtype=np.int32), dest=0, tag=5)
    got, status = np.zeros(4, np.int32), MPI.Status()
    dup.Recv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    assert got.tolist() == [0, 1, 2, 3] and (status.source, status.tag, status.Get_count(MPI.INT)) == (0, 5, 4)
    dup.Free()
    shared = MPI.COMM_SELF.Split_type(MPI.COMM_TYPE_SHARED)
    assert shared.Get_size() == 1 and MPI.COMM_SELF.Split_type(MPI.UNDEFINED) == MPI.COMM_NULL
    shared.Free()


def test_predefined_handles_pickle_to_themselves_and_others_refuse():
    for handle in (MPI.COMM_NULL, MPI.COMM_WORLD, MPI.COMM_SELF, MPI.GROUP_EMPTY, MPI.GROUP_NULL, MPI.SUM,
                   MPI.OP_NULL, MPI.DOUBLE, MPI.INFO_NULL):
        assert pickle.loads(pickle.dumps(handle)) is handle, handle
    copy = pickle.loads(pickle.dumps(MPI.Comm(MPI.COMM_WORLD)))
    assert copy == MPI.COMM_WORLD and copy is not MPI.COMM_WORLD
    other = pickle.loads(pickle.dumps(MPI.Op(MPI.MAX)))
    assert other == MPI.MAX and other is not MPI.MAX
    dup = MPI.COMM_WORLD.Dup()
    with pytest.raises(ValueError):
        pickle.dumps(dup)
    dup.Free()
    with pytest.raises(ValueError):
        pickle.dumps(MPI.COMM_WORLD.Get_group())


def test_groups_are_set_operations_on_world_ranks():
    world = MPI.COMM_WORLD.Get_group()
    assert (world.Get_size(), world.Get_rank()) == (1, 0)
    assert MPI.Group.Compare(MPI.Group.Union(MPI.GROUP_EMPTY, world), world) == MPI.IDENT
    assert MPI.Group.Difference(world, world).Get_size() == 0
    assert MPI.Group.Intersection(world, MPI.GROUP_EMPTY).Get_rank() == MPI.UNDEFINED
    assert world.Translate_ranks([0, MPI.PROC_NULL], MPI.GROUP_EMPTY) == [MPI.UNDEFINED, MPI.PROC_NULL]
    assert world.Range_incl([(0, 0, 1)]).Compare(world) == MPI.IDENT and world.Excl([0]).Get_size() == 0
    made = MPI.COMM_WORLD.Create(world)
    assert made.Get_size() == 1 and MPI.COMM_WORLD.Create(MPI.GROUP_EMPTY) == MPI.COMM_NULL
    made.Free()
    empty = MPI.Group.Difference(world, world)
    empty.Free()
    assert MPI.GROUP_EMPTY and MPI.GROUP_EMPTY.Get_size() == 0  # freeing a copy leaves the constant
    with pytest.raises(MPI.Exception):
        world.Incl([3])


def test_requests_are_null_once_complete_and_arrays_fill_statuses():
    request = MPI.COMM_SELF.Ibarrier()
    assert request and request != MPI.REQUEST_NULL
    assert request.Wait() is True and not request and request == MPI.REQUEST_NULL
    statuses: list = []
    requests = [MPI.Request() for _ in range(3)]
    assert MPI.Request.Waitall(requests, statuses) is True and len(statuses) == 3
    assert MPI.Request.Waitany(requests) == MPI.UNDEFINED and MPI.Request.Waitsome(requests) is None
    assert MPI.Request.Testany(requests) == (MPI.UNDEFINED, True)
    sending = MPI.COMM_SELF.Isend(np.ones(2), dest=0, tag=1)
    receiving = MPI.COMM_SELF.Irecv(got := np.zeros(2), source=0, tag=1)
    index = MPI.Request.Waitany([receiving, sending], MPI.Status())
    assert index in (0, 1) and MPI.Request.Waitall([receiving, sending]) and got.tolist() == [1.0, 1.0]
    with pytest.raises(MPI.Exception) as caught:
        MPI.REQUEST_NULL.Free()
    assert caught.value.Get_error_class() == MPI.ERR_REQUEST


def test_persistent_requests_send_the_buffer_at_each_start():
    data, got = np.zeros(3, np.int64), np.zeros(3, np.int64)
    send = MPI.COMM_SELF.Send_init(data, dest=0, tag=2)
    recv = MPI.COMM_SELF.Recv_init(got, source=0, tag=2)
    for round_ in range(3):
        data[:] = round_
        MPI.Prequest.Startall([recv, send])
        MPI.Request.Waitall([recv, send])
        assert got.tolist() == [round_] * 3


def test_status_is_a_value_mpi4py_can_inspect():
    status = MPI.Status()
    assert (status.source, status.tag, status.error, status.Get_count(MPI.BYTE)) == (MPI.ANY_SOURCE, MPI.ANY_TAG,
                                                                                      MPI.SUCCESS, 0)
    status.Set_elements(MPI.INT, 3)
    assert status.Get_count(MPI.BYTE) == 12 and status.Get_count(MPI.DOUBLE) == MPI.UNDEFINED
    copy = MPI.Status(status)
    assert copy.Get_count(MPI.INT) == 3 and pickle.loads(pickle.dumps(status)).Get_count(MPI.INT) == 3
    with pytest.raises(TypeError):
        MPI.Status(123)
    with pytest.raises(MPI.Exception):
        status.Get_count(MPI.DATATYPE_NULL)


def test_errors_carry_mpi4pys_classes_and_strings():
    assert issubclass(MPI.Exception, RuntimeError)
    error = MPI.Exception(MPI.ERR_ARG)
    assert error == MPI.ERR_ARG and int(error) == 13 and error.Get_error_class() == MPI.ERR_ARG
    assert str(error) == MPI.Get_error_string(MPI.ERR_ARG) and repr(error) == "MPI.Exception(13)"
    assert MPI.Exception(-1) == MPI.ERR_UNKNOWN and not MPI.Exception(MPI.SUCCESS)
    assert MPI.Exception(MPI.ERR_TYPE) < MPI.ERR_LASTCODE
    added = MPI.Add_error_class()
    code = MPI.Add_error_code(added)
    MPI.Add_error_string(code, "mine")
    assert MPI.Get_error_class(code) == added and MPI.Get_error_string(code) == "mine"
    assert MPI.COMM_WORLD.Get_attr(MPI.LASTUSEDCODE) >= code
    with pytest.raises(MPI.Exception):
        MPI.Get_error_string(10_000)


def test_user_ops_bounded_and_reducing_buffers_in_rank_order():
    def append(invec, inoutvec, datatype):
        a, b = np.frombuffer(invec, np.int32), np.frombuffer(inoutvec, np.int32).copy()
        inoutvec[:] = (a * 10 + b).astype(np.int32).tobytes()
    op = MPI.Op.Create(append, commute=False)
    target = np.array([1, 2], np.int32)
    op.Reduce_local(np.array([3, 4], np.int32), target)
    assert target.tolist() == [31, 42] and not op.is_predefined and not op.Is_commutative()
    op.Free()
    assert op == MPI.OP_NULL
    made = [MPI.Op.Create(append) for _ in range(MPI_MAX_USER_OPS)]
    with pytest.raises(RuntimeError):
        MPI.Op.Create(append)
    for o in made:
        o.Free()
    MPI.Op.Create(append).Free()  # room again
    with pytest.raises(MPI.Exception):
        MPI.SUM.Free()
    assert MPI.REPLACE(1, 2) == 2 and MPI.NO_OP(1, 2) == 1
    assert MPI.MINLOC((1, 5), (1, 2)) == (1, 2)


MPI_MAX_USER_OPS = 32


def test_datatypes_numpy_cannot_hold_are_null_and_codes_map_both_ways():
    assert MPI.REAL16 == MPI.COMPLEX32 == MPI.DATATYPE_NULL and not MPI.DATATYPE_NULL and MPI.LONG_DOUBLE
    assert MPI.Datatype.fromcode("i") is MPI.INT and MPI.DOUBLE.tocode() == "d" and MPI.UNSIGNED_INT is MPI.UNSIGNED
    dup = MPI.DOUBLE.Dup()
    assert dup != MPI.DOUBLE and dup.Get_size() == 8 and dup.Get_envelope()[-1] == MPI.COMBINER_DUP
    with pytest.raises(ValueError):
        MPI.Datatype.fromcode("\0")
    with pytest.raises(MPI.Exception) as caught:
        MPI.DATATYPE_NULL.Get_size()
    assert caught.value.Get_error_class() == MPI.ERR_TYPE


def test_buffers_mpi4py_takes_are_read_in_place():
    memory = MPI.Alloc_mem(16)
    assert memory.nbytes == 16 and memory.address != 0
    MPI.COMM_SELF.Sendrecv([np.arange(4, dtype=np.int32), MPI.INT], 0, 0, [memory, MPI.INT], 0, 0)
    assert np.frombuffer(memory.tobytes(), np.int32).tolist() == [0, 1, 2, 3]
    MPI.Free_mem(memory)
    got = np.zeros(3)
    source = np.arange(3.0)

    class Exported:  # an object that offers only DLPack, as array libraries do
        def __dlpack__(self, **kwargs):
            return source.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return source.__dlpack_device__()
    MPI.COMM_SELF.Sendrecv(Exported(), 0, 0, got, 0, 0)
    assert got.tolist() == [0.0, 1.0, 2.0]
    MPI.COMM_SELF.Send(None, dest=MPI.PROC_NULL)  # None: no elements
    assert MPI.Get_address(source) == source.__array_interface__["data"][0]


def test_sendrecv_replace_sends_what_the_buffer_held():
    buf = np.arange(3, dtype=np.int32)
    MPI.COMM_SELF.Isendrecv_replace([buf, MPI.INT], 0, 4, 0, 4).Wait()
    assert buf.tolist() == [0, 1, 2]
    MPI.COMM_SELF.Sendrecv_replace(buf, 0, 4, 0, 4)
    assert buf.tolist() == [0, 1, 2]


def test_a_bad_send_in_sendrecv_leaves_no_receive_posted():
    with pytest.raises(ValueError):
        MPI.COMM_SELF.Sendrecv(np.ones(2), dest=7, recvbuf=np.zeros(2), source=0)
    MPI.COMM_SELF.Send(np.full(2, 3.0), dest=0, tag=9)
    got = np.zeros(2)
    MPI.COMM_SELF.Recv(got, source=0, tag=9)  # taken by this receive, not by the withdrawn one
    assert got.tolist() == [3.0, 3.0]


def test_a_probed_message_is_received_once_and_no_proc_stays():
    MPI.COMM_SELF.Send(np.arange(3.0), dest=0, tag=8)
    assert MPI.COMM_SELF.Improbe(0, 1) is None
    message = MPI.Message.Probe(MPI.COMM_SELF, 0, 8, status := MPI.Status())
    assert message and status.Get_count(MPI.DOUBLE) == 3
    got = np.zeros(3)
    message.Recv(got)
    assert got.tolist() == [0.0, 1.0, 2.0] and message == MPI.MESSAGE_NULL
    probed = MPI.COMM_SELF.Mprobe(MPI.PROC_NULL)
    assert probed == MPI.MESSAGE_NO_PROC and probed is not MPI.MESSAGE_NO_PROC
    probed.Recv(None)
    assert probed == MPI.MESSAGE_NULL and MPI.MESSAGE_NO_PROC  # a handle of its own is consumed
    copy = MPI.Message(MPI.MESSAGE_NO_PROC)
    copy.Recv(None)
    assert copy == MPI.MESSAGE_NULL and MPI.MESSAGE_NO_PROC  # the copy is consumed, the constant is not
    assert pickle.loads(pickle.dumps(MPI.MESSAGE_NO_PROC)) is MPI.MESSAGE_NO_PROC
    with pytest.raises(ValueError):
        pickle.dumps(MPI.COMM_SELF.Isend(b"", 0, 0))
    MPI.COMM_SELF.Recv(bytearray(0), 0, 0)


def test_object_receives_take_buffer_messages_and_ignore_a_buf_with_a_warning():
    comm = MPI.COMM_SELF
    sent = comm.Isend([None, 0, "B"], 0)
    assert comm.recv(None, 0) is None  # a message of no bytes is None
    sent.Wait()
    for value in ({"a": [1, 2.5]}, "text", None):
        sent = comm.Isend([MPI.pickle.dumps(value), "B"], 0)
        assert comm.irecv(None, 0).wait() == value
        sent.Wait()
    sent = comm.isend([42], 0)
    with pytest.warns(UserWarning, match="ignores its buf"):
        assert comm.recv(bytearray(1), 0) == [42]  # the buffer is too small: ignored, as it says
    sent.wait()
    with pytest.warns(UserWarning):
        assert comm.recv(bytearray(0), MPI.PROC_NULL) is None
