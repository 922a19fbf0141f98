"""Derived MPI datatypes: layouts against numpy's own indexing, Pack/Unpack round trips, envelopes and
contents that rebuild the type (in this process), and derived buffers through point-to-point and
collectives on 1 to 3 forked ranks."""

import pickle

import numpy as np
import pytest

from allreduce import MPI


def _packed(datatype, data: np.ndarray) -> np.ndarray:
    out = bytearray(datatype.Pack_size(data.nbytes // datatype.extent) + 8)
    end = datatype.Pack(data, out, 0, MPI.COMM_SELF)
    return np.frombuffer(bytes(out[:end]), data.dtype)


@pytest.mark.parametrize("count,blocklength,stride", [(0, 2, 3), (1, 1, 1), (3, 2, 4), (5, 1, 7), (4, 3, 3)])
def test_vector_packs_the_strided_blocks_numpy_indexes(count, blocklength, stride):
    vector = MPI.DOUBLE.Create_vector(count, blocklength, stride).Commit()
    assert vector.size == count * blocklength * 8
    assert vector.extent == (((count - 1) * stride + blocklength) * 8 if count and blocklength else 0)
    data = np.arange(max(vector.extent // 8, 1) * 2, dtype=np.float64)
    if vector.extent == 0:
        return
    rows = data.size * 8 // vector.extent
    expected = np.concatenate([data[r * vector.extent // 8:][[i * stride + j for i in range(count)
                                                              for j in range(blocklength)]] for r in range(rows)])
    assert _packed(vector, data).tolist() == expected.tolist()


def test_unpack_writes_only_where_the_type_lies():
    indexed = MPI.INT.Create_indexed([2, 1, 3], [0, 4, 7])
    packed = np.array([10, 11, 12, 13, 14, 15], np.intc)
    target = np.full(10, -1, np.intc)
    assert indexed.Unpack(packed, 0, target, MPI.COMM_SELF) == packed.nbytes
    assert target.tolist() == [10, 11, -1, -1, 12, -1, -1, 13, 14, 15]


@pytest.mark.parametrize("order", [MPI.ORDER_C, MPI.ORDER_FORTRAN])
def test_subarray_is_numpy_slicing_in_its_order(order):
    sizes, subsizes, starts = [4, 5, 3], [2, 3, 2], [1, 2, 0]
    sub = MPI.FLOAT.Create_subarray(sizes, subsizes, starts, order).Commit()
    layout = "F" if order == MPI.ORDER_FORTRAN else "C"
    whole = np.arange(60, dtype=np.float32).reshape(sizes, order=layout)
    expected = whole[1:3, 2:5, 0:2].reshape(-1, order=layout)
    assert sub.extent == 60 * 4 and sub.size == expected.nbytes
    assert _packed(sub, whole.reshape(-1, order=layout)).tolist() == expected.tolist()


def test_struct_of_mixed_types_matches_a_numpy_structured_array():
    record = np.dtype([("a", np.float64), ("b", np.int32), ("c", np.int16, 3)], align=True)
    struct = MPI.Datatype.Create_struct([1, 1, 3], [record.fields[k][1] for k in "abc"],
                                        [MPI.DOUBLE, MPI.INT, MPI.SHORT]).Commit()
    assert (struct.size, struct.extent) == (8 + 4 + 6, record.itemsize)
    rows = np.zeros(3, record)
    rows["a"], rows["b"], rows["c"] = [1.5, -2.5, 3.5], [7, 8, 9], np.arange(9).reshape(3, 3)
    out = bytearray(struct.Pack_size(3))
    assert struct.Pack(rows, out, 0, MPI.COMM_SELF) == len(out)
    back = np.zeros(3, record)
    struct.Unpack(out, 0, back, MPI.COMM_SELF)
    assert back.tobytes() == rows.tobytes()


def test_resized_steps_by_its_extent():
    column = MPI.INT.Create_vector(3, 1, 4).Create_resized(0, 4)  # a column of a 3x4 matrix
    matrix = np.arange(12, dtype=np.intc)
    out = bytearray(column.Pack_size(4))
    assert column.Pack(matrix, out, 0, MPI.COMM_SELF) == 48  # the four columns
    assert np.frombuffer(bytes(out), np.intc).tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert column.Get_extent() == (0, 4) and column.Get_true_extent() == (0, 36)
    assert np.frombuffer(bytes(out[:column.Pack_size(1) * 1]), np.intc).tolist() == [0, 4, 8]


def test_pack_external_is_big_endian_and_round_trips():
    data = np.array([1.0, -2.0, 3.25], np.float64)
    z = np.array([1 + 2j], np.complex64)
    out = bytearray(24)
    assert MPI.DOUBLE.Pack_external("external32", data, out, 0) == 24
    assert np.frombuffer(bytes(out), ">f8").tolist() == data.tolist()
    back = np.zeros(3)
    MPI.DOUBLE.Unpack_external("external32", out, 0, back)
    assert back.tolist() == data.tolist()
    zout = bytearray(8)
    MPI.C_FLOAT_COMPLEX.Pack_external("external32", z, zout, 0)
    assert np.frombuffer(bytes(zout), ">c8").tolist() == z.tolist()
    with pytest.raises(MPI.Exception) as caught:
        MPI.DOUBLE.Pack(data, bytearray(8), 0, MPI.COMM_SELF)
    assert caught.value.Get_error_class() == MPI.ERR_TRUNCATE


@pytest.mark.parametrize("make", [
    lambda: MPI.INT.Create_vector(3, 2, 5), lambda: MPI.INT.Create_hvector(2, 1, 12),
    lambda: MPI.DOUBLE.Create_indexed([1, 2], [3, 0]), lambda: MPI.DOUBLE.Create_hindexed([2, 1], [16, 0]),
    lambda: MPI.SHORT.Create_indexed_block(2, [0, 5]), lambda: MPI.SHORT.Create_hindexed_block(1, [6, 0]),
    lambda: MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.DOUBLE, MPI.FLOAT]),
    lambda: MPI.INT.Create_subarray([3, 4], [2, 2], [1, 1]), lambda: MPI.INT.Create_resized(-4, 12),
    lambda: MPI.INT.Create_contiguous(3).Create_vector(2, 1, 2),
])
def test_decode_rebuilds_the_same_layout_and_pickles(make):
    made = make()
    old, name, kwargs = made.decode()
    again = getattr(old, f"Create_{name.lower()}")(**kwargs)  # a struct: DATATYPE_NULL, a classmethod
    for datatype in (again, pickle.loads(pickle.dumps(made))):
        assert (datatype.size, datatype.Get_extent(), datatype.Get_true_extent()) == \
            (made.size, made.Get_extent(), made.Get_true_extent())
        assert datatype.typemap.offsets.tolist() == made.typemap.offsets.tolist()
    ni, na, nc, nd, combiner = made.Get_envelope()
    assert [len(part) for part in made.Get_contents()] == [ni, na, nc, nd] and combiner == made.combiner


def test_handles_copy_and_null():
    assert MPI.Datatype() == MPI.DATATYPE_NULL and MPI.Datatype() is not MPI.DATATYPE_NULL
    copy = MPI.Datatype(MPI.INT)
    assert copy == MPI.INT and copy is not MPI.INT and pickle.loads(pickle.dumps(copy)) == MPI.INT
    with pytest.raises(TypeError):
        MPI.Datatype((1, 2, 3))
    with pytest.raises(ValueError):
        MPI.Datatype.Create_struct([1], [0], [MPI.INT, MPI.FLOAT])


def test_f90_types_are_predefined_basic_ones():
    assert MPI.Datatype.Create_f90_integer(4).size == 2 and MPI.Datatype.Create_f90_real(15, 300).size == 8
    made = MPI.Datatype.Create_f90_complex(6, 30)
    assert made.size == 8 and made.is_predefined and not made.is_named and made.decode()[2] == {"p": 6, "r": 30}


def derived_between_ranks(rank, size):
    """Columns of a matrix (a vector type) and records (a struct) through point-to-point and collectives;
    what each rank got, as lists, for the test to compare with numpy."""
    from allreduce import MPI

    comm = MPI.COMM_WORLD
    rows, cols = 5, size + 2  # a prime number of rows, more columns than ranks
    column = MPI.INT64_T.Create_vector(rows, 1, cols).Create_resized(0, 8).Commit()
    matrix = (np.arange(rows * cols, dtype=np.int64) + 100 * rank).reshape(rows, cols)
    got = {}
    ring = np.full((rows, cols), -1, np.int64)  # column 0 from the left neighbour into column 1
    comm.Sendrecv([matrix, 1, column], (rank + 1) % size, 3, [ring, (1, 1), column],
                  (rank - 1) % size, 3)
    got["ring"] = ring.tolist()
    total = np.full((rows, cols), -1, np.int64)  # columns 1..2 summed over ranks, in place of columns 1..2
    comm.Allreduce([matrix, (2, 1), column], [total, (2, 1), column], MPI.SUM)
    got["allreduce"] = total.tolist()
    gathered = np.full((rows, size), -1, np.int64)  # column `rank` of each rank as column `rank`
    comm.Allgather([matrix, (1, rank), column], [gathered, 1, MPI.INT64_T.Create_vector(rows, 1, size)
                                                 .Create_resized(0, 8).Commit()])
    got["allgather"] = gathered.tolist()
    record = np.dtype([("x", np.float64), ("n", np.int32)], align=True)
    struct = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.INT]).Commit()
    sent = np.zeros(3, record)
    sent["x"], sent["n"] = np.arange(3) + 0.5 * rank, np.arange(3) * (rank + 1)
    received = np.zeros(3, record)
    request = comm.Irecv([received, 3, struct], (rank - 1) % size, 9)
    comm.Send([sent, 3, struct], (rank + 1) % size, 9)
    request.Wait()
    got["struct"] = [received["x"].tolist(), received["n"].tolist()]
    broadcast = matrix.copy()
    comm.Bcast([broadcast, (1, cols - 1), column], root=size - 1)
    got["bcast"] = broadcast.tolist()
    return got


@pytest.mark.parametrize("size", [1, 2, 3])
def test_derived_types_between_ranks_match_numpy(size):
    from support.harness import run_ranks

    rows, cols = 5, size + 2
    mats = [(np.arange(rows * cols, dtype=np.int64) + 100 * r).reshape(rows, cols) for r in range(size)]
    for rank, got in enumerate(run_ranks(derived_between_ranks, size)):
        ring = np.full((rows, cols), -1, np.int64)
        ring[:, 1] = mats[(rank - 1) % size][:, 0]
        assert got["ring"] == ring.tolist()
        total = np.full((rows, cols), -1, np.int64)
        total[:, 1:3] = sum(m[:, 1:3] for m in mats)
        assert got["allreduce"] == total.tolist()
        assert got["allgather"] == np.stack([mats[r][:, r] for r in range(size)], axis=1).tolist()
        left = (rank - 1) % size
        assert got["struct"] == [(np.arange(3) + 0.5 * left).tolist(), (np.arange(3) * (left + 1)).tolist()]
        bcast = mats[rank].copy()
        bcast[:, cols - 1] = mats[size - 1][:, cols - 1]
        assert got["bcast"] == bcast.tolist()


@pytest.mark.parametrize("gsizes,psizes", [([7], [3]), ([5, 6], [2, 3]), ([4, 1, 3], [2, 1, 2]), ([2, 3], [3, 1])])
@pytest.mark.parametrize("distrib", [MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC])
@pytest.mark.parametrize("order", [MPI.ORDER_C, MPI.ORDER_FORTRAN])
def test_darray_types_of_every_rank_pick_each_element_once_as_numpy_deals_them(gsizes, psizes, distrib, order):
    size, layout = int(np.prod(psizes)), "F" if order == MPI.ORDER_FORTRAN else "C"
    whole = np.arange(int(np.prod(gsizes)), dtype=np.float64).reshape(gsizes, order=layout)
    seen = []
    for rank in range(size):
        coords = np.unravel_index(rank, psizes)  # the process grid is row-major
        picks = []
        for g, p, c in zip(gsizes, psizes, coords):
            block = -(-g // p)
            picks.append([i for i in range(g) if (i // block == c if distrib == MPI.DISTRIBUTE_BLOCK else i % p == c)])
        expected = whole[np.ix_(*picks)].reshape(-1, order=layout)
        darray = MPI.DOUBLE.Create_darray(size, rank, gsizes, [distrib] * len(gsizes),
                                          [MPI.DISTRIBUTE_DFLT_DARG] * len(gsizes), psizes, order).Commit()
        assert darray.extent == whole.nbytes and darray.size == expected.nbytes
        assert _packed(darray, whole.reshape(-1, order=layout)).tolist() == expected.tolist()
        old, name, params = darray.decode()
        assert old == MPI.DOUBLE and name == "DARRAY" and MPI.DOUBLE.Create_darray(**params).size == darray.size
        seen += expected.tolist()
    assert sorted(seen) == sorted(whole.reshape(-1).tolist())  # every element, once


def test_darray_cyclic_blocks_and_bad_grids():
    cyclic = MPI.INT.Create_darray(2, 1, [10], [MPI.DISTRIBUTE_CYCLIC], [3], [2]).Commit()
    assert _packed(cyclic, np.arange(10, dtype=np.intc)).tolist() == [3, 4, 5, 9]
    with pytest.raises(ValueError):
        MPI.INT.Create_darray(4, 0, [10], [MPI.DISTRIBUTE_BLOCK], [2], [4])  # blocks of 2 do not cover 10
    with pytest.raises(ValueError):
        MPI.INT.Create_darray(3, 0, [10], [MPI.DISTRIBUTE_BLOCK], [MPI.DISTRIBUTE_DFLT_DARG], [2])


@pytest.mark.parametrize("nnodes,dims,expected", [(4, [0], [4]), (8, 3, [2, 2, 2]), (12, [0, 0], [4, 3]),
                                                  (12, [0, 3, 0], [2, 3, 2]), (1, 2, [1, 1]), (7, 2, [7, 1]),
                                                  (36, 3, [4, 3, 3])])
def test_compute_dims_balances_the_grid(nnodes, dims, expected):
    assert MPI.Compute_dims(nnodes, dims) == expected
    assert int(np.prod(expected)) == nnodes


def test_compute_dims_refuses_fixed_sizes_that_do_not_divide():
    with pytest.raises(MPI.Exception):
        MPI.Compute_dims(10, [3, 0])


def alltoallw_at_absolute_addresses(rank, size):
    """Alltoallw of MPI.BOTTOM with struct types of absolute addresses: block r of a strided matrix
    column to rank r, received into every other element of a row (only those are written)."""
    from allreduce import MPI

    n = 3  # elements per block, a prime
    sent = (np.arange(size * n * 2, dtype=np.int64) + 1000 * rank).reshape(size * n, 2)  # column 0 moves
    got = np.full(size * n * 2, -1, np.int64)
    every_other = MPI.INT64_T.Create_vector(n, 1, 2).Commit()
    column = MPI.INT64_T.Create_vector(n, 1, 2).Commit()
    at = MPI.Get_address
    stypes = [MPI.Datatype.Create_struct([1], [at(sent) + r * n * 2 * 8], [column]).Commit() for r in range(size)]
    rtypes = [MPI.Datatype.Create_struct([1], [at(got) + r * n * 2 * 8], [every_other]).Commit() for r in range(size)]
    MPI.COMM_WORLD.Alltoallw((MPI.BOTTOM, ([1] * size, [0] * size), stypes),
                             (MPI.BOTTOM, ([1] * size, [0] * size), rtypes))
    return got.tolist()


@pytest.mark.parametrize("size", [1, 2, 3])
def test_alltoallw_reads_and_writes_absolute_addresses_from_bottom(size):
    from support.harness import run_ranks

    n = 3
    for rank, got in enumerate(run_ranks(alltoallw_at_absolute_addresses, size)):
        expected = np.full(size * n * 2, -1, np.int64)
        for r in range(size):  # rank r's rows r*n..r*n+n-1, column 0, into every other element of block r
            expected[r * n * 2:(r + 1) * n * 2:2] = (np.arange(size * n * 2) + 1000 * r).reshape(size * n, 2)[
                rank * n:(rank + 1) * n, 0]
        assert got == expected.tolist()


def test_bottom_with_relative_displacements_is_refused():
    relative = (MPI.BOTTOM, ([1], [0]), [MPI.INT])  # displacement 0: not an address
    with pytest.raises(ValueError, match="absolute addresses"):
        MPI.COMM_SELF.Alltoallw(relative, (np.zeros(1, np.intc), ([1], [0]), [MPI.INT]))
