#!/bin/sh
# Start a single-node Slurm on this machine (root, Debian/Ubuntu): munged, slurmctld and slurmd on
# localhost, one partition "debug" with this host as its only node. The node declares four CPUs per
# core (SlurmdParameters=config_overrides), so `srun -n 4` runs on a 2-core machine. Afterwards
# `srun -n 4 python script.py` and `sbatch` work as on a cluster; scripts/slurm-down.sh stops it.
# Safe to run again: a Slurm already up is left as it is.
set -eu

STATE=/var/spool/allreduce-slurm   # this script's spool, logs and pid files
CONF=/etc/slurm/slurm.conf
MARK="# written by allreduce's scripts/slurm-up.sh"
DEADLINE=60                        # seconds to wait for the node to come up idle

node_idle() {  # scontrol answers at once when slurmctld is down, where sinfo retries for seconds
    scontrol ping >/dev/null 2>&1 && sinfo -h -o %t 2>/dev/null | grep -q idle
}

if [ "$(id -u)" != 0 ]; then
    echo "slurm-up: run as root (it installs packages and starts daemons)" >&2
    exit 1
fi
if node_idle; then
    echo "slurm-up: Slurm is already up:"; sinfo
    exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge
fi
if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    echo "slurm-up: $CONF exists and was not written by this script; not touching it" >&2
    exit 1
fi

host=$(hostname -s)
cpus=$(( $(nproc) * 4 ))
mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
cat > "$CONF" <<EOF
$MARK: a single-node Slurm for tests.
ClusterName=allreduce
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

# munge: a key readable by its daemon only, and the daemon itself
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid
    touch "$STATE/munged.ours"  # so slurm-down.sh stops it, and only then
fi

[ -s "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null || slurmctld
[ -s "$STATE/slurmd.pid" ] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null || slurmd

waited=0
until node_idle; do
    if [ "$waited" -ge "$DEADLINE" ]; then
        echo "slurm-up: the node is not idle after ${DEADLINE}s; see $STATE/*.log" >&2
        sinfo >&2 || true
        exit 1
    fi
    sleep 1
    waited=$((waited + 1))
done
echo "slurm-up: Slurm is up ($cpus CPUs on node $host):"
sinfo
