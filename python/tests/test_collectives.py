"""hsdp's hierarchical collectives from Python, under mpirun (ctest -L python runs this file on 6
ranks as 2 nodes x 3, hsdp attached to mpi4py's MPI, and on 3 ranks with hsdp owning MPI).
mpi4py is the independent side: every rank's input is gathered with MPI's own allgather and
reduced with numpy.

    HSDP_PY_SESSION=attach|init   who initialises MPI (default attach)
"""

import os
import warnings

import numpy as np
import pytest

import hsdp

pytestmark = pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" not in os.environ and
                                "PMIX_RANK" not in os.environ,
                                reason="runs under mpirun (ctest -L python)")


@pytest.fixture(scope="module")
def ctx():
    how = os.environ.get("HSDP_PY_SESSION", "attach")
    if how == "attach":
        from mpi4py import MPI  # initialises MPI; hsdp joins it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s = hsdp.Session.attach()
            hsdp.Session.attach().close()  # a second attach does not warn again
        assert not s.owns_mpi
        # Open MPI's tuning applies only to init(): one warning, on rank 0 only.
        tuning = [w for w in caught if issubclass(w.category, hsdp.HsdpTuningWarning)]
        want = 1 if MPI.COMM_WORLD.rank == 0 and "OMPI_COMM_WORLD_SIZE" in os.environ else 0
        assert len(tuning) == want, tuning
        if tuning:
            assert "Session.init()" in str(tuning[0].message)
            assert "mpi4py.rc.initialize = False" in str(tuning[0].message)
    else:
        s = hsdp.Session.init()  # hsdp initialises MPI; mpi4py then finds it running
        from mpi4py import MPI
        assert s.owns_mpi
    comm = MPI.COMM_WORLD
    assert (s.rank, s.size) == (comm.rank, comm.size)
    yield s, comm
    s.close()


def layouts(size):
    """(intra_shard, inter_shard, ranks_per_node) meshes of this world: nodes of 3 (or of 1)."""
    rpn = 3 if size % 3 == 0 else 1
    nodes = size // rpn
    out = [(rpn, nodes, rpn), (rpn, 1, rpn), (1, nodes, rpn)]
    return sorted(set(out))


def rank_inputs(comm, x):
    return comm.allgather(x)


def shard_slots(comm, c):
    return comm.allgather((c.shard_index, comm.rank))


def group_members(comm, mesh, c):
    """World ranks of this rank's shard group (those sharing intra_group and inter_group... i.e.
    whose collective this rank takes part in), by gathering every rank's coordinates."""
    me = mesh.coords
    coords = comm.allgather((me["replica_rank"], c.shard_index))
    return [r for r, (rep, _) in enumerate(coords) if rep == me["replica_rank"]], coords


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8])
def test_all_gather_equals_mpi_allgather(ctx, dtype):
    s, comm = ctx
    for intra, inter, rpn in layouts(s.size):
        mesh = s.mesh(intra_shard=intra, inter_shard=inter, ranks_per_node=rpn)
        c = mesh.collectives(chunks=2)
        assert c.group_size == intra * inter
        n = 1001  # not a multiple of anything
        rng = np.random.default_rng(comm.rank * 7 + 1)
        x = (rng.standard_normal(n) * 100).astype(dtype)
        full = c.all_gather(x)
        members, coords = group_members(comm, mesh, c)
        xs = comm.allgather(x)
        expect = np.empty(n * c.group_size, dtype)
        for r in members:
            k = coords[r][1]
            expect[k * n:(k + 1) * n] = xs[r]
        assert full.dtype == dtype and np.array_equal(full, expect)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_equals_numpy(ctx, op):
    s, comm = ctx
    for intra, inter, rpn in layouts(s.size):
        mesh = s.mesh(intra_shard=intra, inter_shard=inter, ranks_per_node=rpn)
        c = mesh.collectives()
        g, n = c.group_size, 777
        x = np.random.default_rng(comm.rank + 100).standard_normal(g * n).astype(np.float32)
        out = c.reduce_scatter(x, op=op)
        members, coords = group_members(comm, mesh, c)
        xs = comm.allgather(x)
        total = np.sum([xs[r].astype(np.float64) for r in members], axis=0)
        if op == "avg":
            total /= g
        k = c.shard_index
        np.testing.assert_allclose(out, total[k * n:(k + 1) * n], rtol=1e-5, atol=1e-5)


def test_all_reduce_in_place_equals_numpy(ctx):
    s, comm = ctx
    for intra, inter, rpn in layouts(s.size):
        mesh = s.mesh(intra_shard=intra, inter_shard=inter, ranks_per_node=rpn)
        for chunks in (1, 3):
            c = mesh.collectives(chunks=chunks)
            x = np.random.default_rng(comm.rank + 200).standard_normal(12345).astype(np.float32)
            buf = x.copy()
            assert c.all_reduce(buf) is buf
            members, _ = group_members(comm, mesh, c)
            xs = comm.allgather(x)
            total = np.sum([xs[r].astype(np.float64) for r in members], axis=0)
            np.testing.assert_allclose(buf, total, rtol=1e-5, atol=1e-5)
            # Every member holds the same bits.
            same = comm.allgather(buf.tobytes())
            assert all(same[r] == same[members[0]] for r in members)


@pytest.mark.parametrize("wire,tol", [("bf16", 2.0 ** -8), ("int8", 1.0 / 127), ("int4", 1.0 / 7)])
def test_inter_wire_of_all_gather(ctx, wire, tol):
    s, comm = ctx
    rpn = 3 if s.size % 3 == 0 else 1
    nodes = s.size // rpn
    if nodes < 2:
        pytest.skip("one node: nothing crosses nodes")
    mesh = s.mesh(intra_shard=rpn, inter_shard=nodes, ranks_per_node=rpn)
    c = mesh.collectives(gather_wire=wire, quant_block=256)
    n = 4096
    x = np.random.default_rng(comm.rank + 300).standard_normal(n).astype(np.float32)
    full = c.all_gather(x)
    members, coords = group_members(comm, mesh, c)
    xs = comm.allgather(x)
    for r in members:
        k = coords[r][1]
        got, ref = full[k * n:(k + 1) * n], xs[r]
        # The error of the wire: relative for bf16, of the block's largest magnitude for int8/4.
        bound = tol * (np.abs(ref) if wire == "bf16" else np.abs(ref).max()) + 1e-30
        assert (np.abs(got - ref) <= bound).all(), (wire, r)
    # Every rank decodes the same values.
    same = comm.allgather(full.tobytes())
    assert all(same[r] == same[members[0]] for r in members)
    # Per call: an exact fp32 gather on the same object.
    exact = c.all_gather(x, wire="fp32")
    for r in members:
        k = coords[r][1]
        assert np.array_equal(exact[k * n:(k + 1) * n], xs[r])


def test_buffer_protocol_and_dlpack_inputs(ctx):
    s, comm = ctx
    c = s.mesh(ranks_per_node=1, intra_shard=1, inter_shard=s.size).collectives()
    x = np.arange(10, dtype=np.float32) + comm.rank
    full_mv = np.empty(10 * s.size, np.float32)
    c.all_gather(memoryview(x), memoryview(full_mv))  # buffer protocol
    ref = np.concatenate(comm.allgather(x))
    k = comm.allgather(c.shard_index)
    expect = np.empty_like(full_mv)
    for r in range(s.size):
        expect[k[r] * 10:(k[r] + 1) * 10] = ref[r * 10:(r + 1) * 10]
    assert np.array_equal(full_mv, expect)


def test_bad_input_raises_on_every_rank_without_a_hang(ctx):
    s, comm = ctx
    mesh = s.mesh(ranks_per_node=1, intra_shard=1, inter_shard=s.size)
    c = mesh.collectives()
    with pytest.raises(hsdp.InvalidArgumentError, match="float64"):
        c.all_gather(np.zeros(8, np.float64))
    with pytest.raises(hsdp.InvalidArgumentError, match="elements"):
        c.all_gather(np.zeros(8, np.float32), np.zeros(3, np.float32))
    with pytest.raises(hsdp.InvalidArgumentError, match="differs"):
        c.all_gather(np.zeros(8, np.float32), np.zeros(8 * s.size, np.int32))
    with pytest.raises(hsdp.InvalidArgumentError, match="contiguous"):
        c.all_reduce(np.zeros((8, 8), np.float32)[:, ::2])
    with pytest.raises(hsdp.InvalidArgumentError, match="max"):
        c.all_reduce(np.zeros(8, np.float32), op="max")
    with pytest.raises(hsdp.InvalidArgumentError, match="multiple"):
        c.reduce_scatter(np.zeros(s.size * 4 + 1, np.float32))
    with pytest.raises(TypeError):  # a read-only output
        ro = np.zeros(8, np.float32)
        ro.flags.writeable = False
        c.all_reduce(ro)
    with pytest.raises(hsdp.InvalidArgumentError, match="int3"):
        mesh.collectives(gather_wire="int3")
    with pytest.raises(hsdp.InvalidArgumentError, match="5"):
        s.mesh(ranks_per_node=1, intra_shard=5, inter_shard=1)
    with pytest.raises(hsdp.FailedPreconditionError, match="already initialized"):
        hsdp.Session.init()
    # Everything still works after the errors (no collective was left half-issued).
    x = np.ones(4, np.float32)
    assert np.array_equal(c.all_reduce(x), np.full(4, s.size, np.float32))


def test_closed_session_refuses_use():
    # A second attach beside the module's session: closing it frees only its own objects.
    from mpi4py import MPI  # noqa: F401 (MPI is running: the module fixture started it)
    s2 = hsdp.Session.attach()
    m = s2.mesh(ranks_per_node=1, intra_shard=1, inter_shard=1)
    c = m.collectives()
    s2.close()
    assert s2.closed
    with pytest.raises(hsdp.FailedPreconditionError, match="closed"):
        c.all_reduce(np.ones(4, np.float32))
    with pytest.raises(hsdp.FailedPreconditionError, match="closed"):
        m.shape
    s2.close()  # idempotent
