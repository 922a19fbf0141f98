#!/bin/sh
# Stop the single-node Slurm that scripts/slurm-up.sh started: its jobs, slurmd, slurmctld, and the
# munged it started. Each daemon is stopped by the process id in its pid file, nothing by name.
set -u

STATE=/var/spool/allreduce-slurm

stop() {  # stop the process whose id is in file $1; wait up to 10 s for it to end
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || return 0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 1
    done
    echo "slurm-down: process $pid ($1) did not stop" >&2
}

squeue -h -o %i 2>/dev/null | xargs -r scancel
stop "$STATE/slurmd.pid"
stop "$STATE/slurmctld.pid"
if [ -e "$STATE/munged.ours" ]; then
    stop /run/munge/munged.pid
    rm -f "$STATE/munged.ours"
fi
echo "slurm-down: stopped"
