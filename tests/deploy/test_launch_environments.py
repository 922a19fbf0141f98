"""The variables cluster engines set, read by ``env://``; and jobs started with exactly those variables.

Kubernetes is simulated: each "pod" is a process given what Kubeflow's PyTorchJob puts in a pod's
environment. Slurm's and Open MPI's variables are checked here as data; their real launchers run in
test_slurm.py and test_mpirun.py.
"""

from __future__ import annotations

import sys

import pytest
from deployment import CHECK, assert_job, clean_env, run_all
from support.harness import free_port

from allreduce.rendezvous import from_environment
from allreduce.rendezvous.environment import JOB_PORT_BASE, JOB_PORTS, first_host, job_port


@pytest.mark.parametrize("nodelist, host", [
    ("vm", "vm"), ("node7,node3", "node7"), ("gpu[07-12,20]", "gpu07"), ("gpu[3],login1", "gpu3"),
    ("rack[2-3]-n[05-06],x", "rack2-n05"), ("a-b.example.org", "a-b.example.org"),
])
def test_first_host_of_a_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", ",a", "n[1-2", "n]1", "n[[1]]"])
def test_a_broken_node_list_is_an_error(nodelist):
    with pytest.raises(ValueError, match="node list"):
        first_host(nodelist)


def test_srun_step_needs_nothing_exported():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
           "SLURM_STEP_ID": "2", "SLURM_STEP_NODELIST": "cn[017-018]", "SLURM_JOB_NODELIST": "cn[016-018]",
           "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"}
    info = from_environment(env)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 8, 1, "slurm")
    assert (info.master_addr, info.master_port) == ("cn017", job_port(4242, 2))
    # the user's MASTER_ADDR / MASTER_PORT win over what Slurm implies
    assert from_environment({**env, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}).master_addr == "10.1.1.1"
    assert from_environment({**env, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}).master_port == 1234


def test_job_ports_differ_between_steps_and_jobs_and_stay_below_the_ephemeral_range():
    ports = {job_port(job, step) for job in range(1000, 1100) for step in range(8)}
    assert len(ports) == 800
    assert all(JOB_PORT_BASE <= port < JOB_PORT_BASE + JOB_PORTS < 32768 for port in ports)


def test_mpirun_port_follows_the_job():
    one = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "1519452161"}
    other = {**one, "PMIX_NAMESPACE": "1519452162"}
    assert from_environment(one).master_port != from_environment(other).master_port
    assert from_environment(one).master_addr == "127.0.0.1"
    assert from_environment({**one, "MASTER_PORT": "29999"}).master_port == 29999


def pytorchjob_pod(replica: str, index: int, replicas: int, port: int) -> dict[str, str]:
    """The environment Kubeflow's training operator gives a PyTorchJob pod (one process per pod)."""
    rank = 0 if replica == "master" else index + 1
    return {"MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "WORLD_SIZE": str(replicas), "RANK": str(rank),
            "PYTHONUNBUFFERED": "1", "PET_NNODES": str(replicas), "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "localhost", "PET_MASTER_PORT": str(port)}


def test_pytorchjob_pods_one_process_each():
    port = free_port()
    envs = [pytorchjob_pod("master", 0, 2, port), pytorchjob_pod("worker", 0, 2, port)]
    assert_job("\n".join(run_all([[sys.executable, CHECK]] * 2, [clean_env(**env) for env in envs])), 2, "env")


@pytest.mark.slow  # test_separate_hosts.py runs a launcher per host by default
def test_pytorchjob_pods_each_running_allreduce_run_from_the_pet_variables():
    """Several processes per pod: the pod's command is ``allreduce run`` with the PET_* values as flags."""
    port = free_port()
    envs = [pytorchjob_pod("master", 0, 2, port), pytorchjob_pod("worker", 0, 2, port)]
    commands = [[sys.executable, "-m", "allreduce", "run", "-n", "2", "--nnodes", env["PET_NNODES"],
                 "--node-rank", env["PET_NODE_RANK"], "--master-addr", env["PET_MASTER_ADDR"],
                 "--master-port", env["PET_MASTER_PORT"], "--", sys.executable, CHECK] for env in envs]
    assert_job("\n".join(run_all(commands, [clean_env(**env) for env in envs])), 4, "env")
