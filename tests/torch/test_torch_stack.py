"""The modern torch stack on "allreduce": FSDP2, DTensor, DeviceMesh and the functional collectives,
each compared with the same computation on a Gloo group of the same ranks."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from support.torch_harness import batches, max_difference, model, run_torch_ranks, shard


def fsdp_weights(mesh: DeviceMesh, rank: int, size: int) -> dict:
    """A small MLP sharded by FSDP2 on ``mesh``, trained 20 steps; its full parameters at the end."""
    m = model(seed=0)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for batch in batches(20, 32):
        x, y = shard(batch, rank, size)
        opt.zero_grad()
        torch.nn.CrossEntropyLoss()(m(x), y).backward()
        opt.step()
    return {name: p.full_tensor().detach().numpy().copy() for name, p in m.named_parameters()}


def test_fsdp2_training_matches_gloo():
    def fn(rank, size):
        ours = fsdp_weights(init_device_mesh("cpu", (size,)), rank, size)
        gloo = fsdp_weights(DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu"), rank, size)
        return ours, gloo

    for ours, gloo in run_torch_ranks(fn, 2):
        assert max_difference(ours, gloo) <= 1e-5


def dtensor_results(mesh: DeviceMesh) -> dict:
    """DTensor's redistributions and a sharded matmul on a 1-D ``mesh``; plain tensors out."""
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    a, b = torch.randn(4 * size, 6), torch.randn(6, 2 * size)
    out = {}
    rows = distribute_tensor(a, mesh, [Shard(0)])
    out["shard->replicate (all_gather)"] = rows.redistribute(mesh, [Replicate()]).to_local()
    out["shard(0)->shard(1) (all_to_all)"] = rows.redistribute(mesh, [Shard(1)]).to_local()
    out["replicate->shard"] = distribute_tensor(a, mesh, [Replicate()]).redistribute(mesh, [Shard(0)]).to_local()
    partial = torch.distributed.tensor.DTensor.from_local(torch.full((2 * size, 3), rank + 1.0), mesh, [Partial()])
    out["partial->replicate (all_reduce)"] = partial.redistribute(mesh, [Replicate()]).to_local()
    out["partial->shard (reduce_scatter)"] = partial.redistribute(mesh, [Shard(0)]).to_local()
    product = rows @ distribute_tensor(b, mesh, [Replicate()])
    out["matmul"] = product.full_tensor()
    shards = distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])
    out["matmul of shards"] = shards.full_tensor()
    out["expected matmul"] = a @ b
    return {k: v.numpy().copy() for k, v in out.items()}


def test_dtensor_basics_match_gloo():
    def fn(rank, size):
        ours = dtensor_results(init_device_mesh("cpu", (size,)))
        gloo = dtensor_results(DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu"))
        return ours, gloo

    for ours, gloo in run_torch_ranks(fn, 2):
        assert ours.keys() == gloo.keys()
        for name in ours:
            assert (ours[name] == gloo[name]).all(), name
        assert abs(ours["matmul"] - ours["expected matmul"]).max() < 1e-5
        assert abs(ours["matmul of shards"] - ours["expected matmul"]).max() < 1e-5


def test_a_2d_mesh_and_functional_collectives():
    def fn(rank, size):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
        x = torch.arange(8.0).view(4, 2)
        spread = distribute_tensor(x, mesh, [Shard(0), Shard(1)])
        out = {"2-D round trip": spread.full_tensor(), "local shard": spread.to_local()}
        out["all_reduce on tp"] = funcol.all_reduce(torch.full((2,), rank + 1.0), "sum", tp).wait()
        out["all_gather on dp"] = funcol.all_gather_tensor(torch.full((1,), float(rank)), 0, dp).wait()
        out["reduce_scatter on tp"] = funcol.reduce_scatter_tensor(torch.arange(4.0) + rank, "sum", 0, tp).wait()
        out["mesh from the tp group"] = distribute_tensor(x, DeviceMesh.from_group(tp, "cpu"), [Shard(0)]).to_local()
        names = (tp.group_name != dp.group_name, dist.get_backend(tp))
        return {k: v.tolist() for k, v in out.items()}, names

    x = torch.arange(8.0).view(4, 2)
    for rank, (out, names) in enumerate(run_torch_ranks(fn, 4)):
        dp_index, tp_index = divmod(rank, 2)
        peers = [2 * dp_index, 2 * dp_index + 1]  # this rank's tp group
        assert out["2-D round trip"] == x.tolist()
        assert out["local shard"] == x[2 * dp_index:2 * dp_index + 2, tp_index:tp_index + 1].tolist()
        assert out["all_reduce on tp"] == [sum(p + 1.0 for p in peers)] * 2
        assert out["all_gather on dp"] == [float(tp_index), tp_index + 2.0]
        reduced = 2 * torch.arange(4.0) + sum(peers)
        assert out["reduce_scatter on tp"] == reduced[2 * tp_index:2 * tp_index + 2].tolist()
        assert out["mesh from the tp group"] == x[2 * tp_index:2 * tp_index + 2].tolist()
        assert names == (True, "allreduce")
