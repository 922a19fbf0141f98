"""Hierarchical all-reduce and the topology it runs on: the schedule checked symbolically for many host
layouts; real groups where ``ALLREDUCE_HOST_ID`` makes one machine look like several hosts (shared
memory inside each, TCP between them); and real separate network stacks (namespaces, root only)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support import netns
import numpy as np
import pytest
from support.harness import on_hosts, run_ranks
from support.reference import counts_for, make_input, reduced, same

import allreduce as dist
from allreduce import algorithms, topology
from allreduce.algorithms import hierarchical
from allreduce.algorithms.verify import verify
from allreduce.dtypes import bfloat16
from allreduce.ops import ReduceOp, allowed_ops
from allreduce.settings import Settings
from allreduce.transport import shm


def layout(hosts: int, per_host: int, interleaved: bool = False) -> tuple:
    """Ranks per host: blocks (0, 1 | 2, 3) or interleaved (0, 2 | 1, 3)."""
    if interleaved:
        return tuple(tuple(range(h, hosts * per_host, hosts)) for h in range(hosts))
    return tuple(tuple(range(h * per_host, (h + 1) * per_host)) for h in range(hosts))


# ---- pure ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("hosts,per_host", [(1, 4), (2, 1), (2, 2), (2, 3), (3, 2), (4, 2), (2, 4), (3, 3)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cross", ["ring", "recursive_doubling", "direct"])
def test_schedule_is_an_all_reduce(hosts, per_host, interleaved, cross):
    size = hosts * per_host
    for count in counts_for(size):
        verify("all_reduce", "hierarchical", size, count, hosts=layout(hosts, per_host, interleaved), cross=cross)


def test_network_carries_each_byte_once_per_host():
    hosts, count = layout(2, 4), 4000
    sent = 0
    for rank in range(8):
        schedule = hierarchical.all_reduce(rank, 8, count, hosts=hosts)
        sent += sum(op.src.count for _, op in schedule.sends() if (op.peer < 4) != (rank < 4))
    assert sent == 2 * count  # each host sends (and receives) each element once: 2 hosts, ring of 2


def test_unequal_hosts_are_refused():
    with pytest.raises(ValueError, match="same number of ranks"):
        hierarchical.all_reduce(0, 3, 10, hosts=((0, 1), (2,)))
    with pytest.raises(ValueError, match="each rank once"):
        hierarchical.all_reduce(0, 4, 10, hosts=((0, 1), (1, 2)))


def test_topology_from_host_ids():
    t = topology.from_host_ids(3, ["a", "b", "a", "b", "a", "b"])
    assert t == topology.Topology(rank=3, size=6, local_rank=1, local_size=3, cross_rank=1, cross_size=2,
                                  hosts=((0, 2, 4), (1, 3, 5)))
    assert t.local_ranks == (1, 3, 5) and t.uniform
    uneven = topology.from_host_ids(2, ["a", "a", "a", "b"])
    assert (uneven.local_rank, uneven.cross_rank, uneven.cross_size, uneven.uniform) == (2, 0, 1, False)


def test_host_id_override(monkeypatch):
    assert topology.host_id(Settings.from_env({"ALLREDUCE_HOST_ID": "rack7-node3"}).host_id) == "rack7-node3"
    assert topology.host_id() == topology.host_id() != "rack7-node3"


# ---- processes -----------------------------------------------------------------------------------

def _checks(rank, size):
    group = dist.default_group()
    wrong = []
    dtypes = [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16)]
    dtypes += [bfloat16] if bfloat16 is not None else []
    for dtype in dtypes:
        for op in sorted(allowed_ops(dtype)):
            for count in counts_for(size) + [100_003]:
                inputs = [make_input(dtype, count, r, op) for r in range(size)]
                x = inputs[rank].copy()
                dist.all_reduce(x, op=op)
                if not same(x, reduced(op, inputs)):
                    wrong.append(f"all_reduce {dtype} {op.name} {count}")
    for algo in algorithms.names("all_reduce"):  # flat algorithms over the mixed links, too
        inputs = [make_input(np.float32, 1001, r) for r in range(size)]
        x = inputs[rank].copy()
        dist.all_reduce(x, algorithm=algo)
        if not same(x, reduced(ReduceOp.SUM, inputs)):
            wrong.append(f"all_reduce {algo}")
    mine = make_input(np.int32, 77, rank)
    gathered = np.empty(size * 77, np.int32)
    dist.all_gather_into_tensor(gathered, mine, algorithm="direct")
    if not same(gathered, np.concatenate([make_input(np.int32, 77, r) for r in range(size)])):
        wrong.append("all_gather")
    x = make_input(np.float64, 5000, rank)
    dist.broadcast(x, src=size - 1, algorithm="binomial")
    if not same(x, make_input(np.float64, 5000, size - 1)):
        wrong.append("broadcast")
    chosen = group.algorithm_for("all_reduce", None, 4 << 20, np.dtype(np.float32))
    return wrong, dist.get_topology(), group.intra, chosen


@pytest.mark.skipif(not shm.available(), reason="shared-memory transport needs Linux x86-64")
@pytest.mark.parametrize("hosts,per_host", [(2, 2), (2, 3), (4, 2)])
def test_hierarchical_over_pretend_hosts(hosts, per_host):
    size = hosts * per_host
    results = run_ranks(on_hosts(per_host, _checks), size, init=False, deadline=180)
    for rank, (wrong, topo, intra, chosen) in enumerate(results):
        assert wrong == [], (rank, wrong)
        assert topo.hosts == layout(hosts, per_host)
        assert (topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size) == (
            rank % per_host, per_host, rank // per_host, hosts)
        assert intra == "shm" and chosen == "hierarchical"


def _one_per_host(rank, size):
    return dist.get_topology(), dist.default_group().intra, dist.default_group().algorithm_for(
        "all_reduce", None, 4 << 20, np.dtype(np.float32))


def test_one_rank_per_host_is_flat_tcp():
    for topo, intra, chosen in run_ranks(on_hosts(1, _one_per_host), 3, init=False):
        assert topo.local_size == 1 and topo.cross_size == 3 and intra == "tcp" and chosen != "hierarchical"


_NAMESPACE_WORKER = textwrap.dedent("""
    import json, numpy as np, allreduce as dist
    dist.init_process_group(timeout=30)
    rank, size, group = dist.get_rank(), dist.get_world_size(), dist.default_group()
    ok = True
    for count in (1, 7, 1000, 300_001):
        x = np.arange(count, dtype=np.float64) * (rank + 1)
        dist.all_reduce(x)
        ok = ok and bool(np.array_equal(x, np.arange(count, dtype=np.float64) * size * (size + 1) / 2))
    topo = dist.get_topology()
    print(json.dumps({"ok": ok, "hosts": topo.hosts, "local_rank": topo.local_rank, "cross_rank": topo.cross_rank,
                      "intra": group.intra,
                      "chosen": group.algorithm_for("all_reduce", None, 1 << 20, np.dtype("f8"))}))
    dist.destroy_process_group()
""")


@pytest.mark.skipif(not (shm.available() and netns.available()), reason="needs root, ip and tc (network namespaces)")
def test_hierarchical_across_network_namespaces(tmp_path):
    """Two namespaces of two ranks: host identity tells them apart by itself (no ALLREDUCE_HOST_ID)."""
    script = tmp_path / "worker.py"
    script.write_text(_NAMESPACE_WORKER)
    env = {"ALLREDUCE_HOST_ID": "", "ALLREDUCE_TRANSPORT": "auto", "ALLREDUCE_ALGO": "auto",
           "ALLREDUCE_SECRET": "namespace-test", "WORLD_SIZE": "4", "MASTER_PORT": "29511"}
    with netns.Testbed(2) as bed:
        procs = [bed.popen(rank // 2, [sys.executable, str(script)],
                           env={**env, "RANK": str(rank), "MASTER_ADDR": bed.addresses[0]},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank in range(4)]
        outputs = [proc.communicate(timeout=90) for proc in procs]
    for rank, ((out, err), proc) in enumerate(zip(outputs, procs)):
        assert proc.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result == {"ok": True, "hosts": [[0, 1], [2, 3]], "local_rank": rank % 2, "cross_rank": rank // 2,
                          "intra": "shm", "chosen": "hierarchical"}, result
