"""The reliability campaign: ranks killed, frozen and cut off at random moments; nothing may hang or lie.

    python benchmarks/reliability_campaign.py                      # 200 kills, 30 stops, 12 cuts
    python benchmarks/reliability_campaign.py --kills 20 --stops 5 --cuts 0 --seed 2

Every trial forks a fresh job of 2-5 ranks on this host over TCP or shared memory (``auto``) that
all-reduces small (16 floats) or large (16 MiB) buffers of known values in a loop and checks every
result. One rank, any rank including rank 0 (which hosts the store), then:

- **kill**: SIGKILLs itself at a random moment: while the group forms, mid-collective, or between
  collectives (20 ms of compute between calls);
- **stop**: SIGSTOPs itself mid-collective and stays frozen: the others must give up at their
  collective timeout;
- **cut** (needs root, ``ip``; skipped otherwise): ranks run in network namespaces joined by a bridge
  (``tests/support/netns.py``), one per pretend host, and one host's link is set down or its veth pair
  deleted mid-collective.

For each kind the table counts trials, survivor errors, hangs (a rank that neither returned nor
raised within the trial's deadline), wrong results (a call that returned with a wrong element),
survivors that raised nothing or something outside ``AllreduceError``, survivors that named the
failed rank, and the time from the fault to each survivor's error.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import select
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the harness's free port, the namespace testbed

import numpy as np  # noqa: E402
from support import netns  # noqa: E402
from support.harness import free_port  # noqa: E402

import allreduce as dist  # noqa: E402

_CTX = mp.get_context("fork")
COUNTS = {"small": 16, "large": 4 << 20}  # float32 elements per all-reduce
PHASES = ("rendezvous", "collective", "between")  # when a kill lands
RUN_S = 12.0  # how long the ranks keep calling; a fault must end it long before


def _loop(rank: int, size: int, count: int, gap: float, until: float, on_warm=None) -> int:
    """All-reduce known values until ``until``; the number of calls that returned a wrong result."""
    x = np.empty(count, np.float32)
    expect = size * (size + 1) // 2
    wrong = 0
    for calls in range(1 << 30):
        if calls == 2 and on_warm is not None:
            on_warm()
        if time.monotonic() >= until:
            break
        x.fill(rank + 1)
        dist.all_reduce(x)
        wrong += int(not np.all(x == expect))
        time.sleep(gap)
    return wrong


def _rank(rank: int, trial: dict, port: int, faulted_at, results) -> None:
    """One rank of a kill or stop trial; puts (rank, kind, message, error time, wrong calls, destroy s)."""
    os.environ["ALLREDUCE_TRANSPORT"] = trial["transport"]
    victim = rank == trial["victim"]
    signum = signal.SIGKILL if trial["fault"] == "kill" else signal.SIGSTOP

    def fault() -> None:
        faulted_at.value = time.monotonic()
        os.kill(os.getpid(), signum)

    def arm() -> None:
        if victim:
            threading.Timer(trial["delay"], fault).start()

    if trial["phase"] == "rendezvous":
        arm()
    wrong, outcome = 0, ("no error", "", 0.0)
    try:
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=trial["size"],
                                timeout=trial["timeout"])
        gap = 0.02 if trial["phase"] == "between" else 0.0
        on_warm = arm if trial["phase"] != "rendezvous" else None
        wrong = _loop(rank, trial["size"], COUNTS[trial["payload"]], gap, time.monotonic() + RUN_S, on_warm)
    except dist.AllreduceError as exc:
        outcome = (type(exc).__name__, str(exc), time.monotonic())
    except Exception as exc:  # outside the error family: counted as such
        outcome = (f"other: {type(exc).__name__}", str(exc), time.monotonic())
    start = time.monotonic()
    if dist.is_initialized():
        dist.destroy_process_group()
    results.put((rank, *outcome, wrong, time.monotonic() - start))


def forked_trial(trial: dict) -> dict:
    """Run a kill or stop trial; what each survivor saw."""
    faulted_at = _CTX.Value("d", 0.0)
    results = _CTX.Queue()
    port = free_port()
    procs = [_CTX.Process(target=_rank, args=(r, trial, port, faulted_at, results), daemon=True)
             for r in range(trial["size"])]
    for p in procs:
        p.start()
    survivors = {r for r in range(trial["size"]) if r != trial["victim"]}
    seen: dict[int, tuple] = {}
    end = time.monotonic() + RUN_S + 3 * trial["timeout"] + 15
    while survivors - seen.keys() and time.monotonic() < end:
        try:
            rank, *rest = results.get(timeout=0.1)
            seen[rank] = tuple(rest)
        except queue.Empty:
            pass
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    return _record(trial, faulted_at.value, {r: seen.get(r) for r in survivors})


def _record(trial: dict, faulted_at: float, seen: dict[int, tuple | None]) -> dict:
    record = dict(trial, faulted=faulted_at > 0, hung=[], wrong=0, errors=[], missed=[], foreign=[])
    for rank, outcome in seen.items():
        if outcome is None:
            record["hung"].append(rank)
            continue
        kind, message, failed_at, wrong, destroy_s = outcome
        record["wrong"] += wrong
        if kind == "no error":
            record["missed"].append(rank)
        elif kind.startswith("other: "):
            record["foreign"].append((rank, kind, message[:300]))
        else:
            named = f"rank {trial['victim']}" in message
            record["errors"].append((kind, failed_at - faulted_at, named, destroy_s, message[:300]))
    return record


_NETNS_RANK = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import allreduce as dist
    rank, size, addr, port, count, timeout = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                              int(sys.argv[5]), float(sys.argv[6]))
    wrong, outcome = 0, ["no error", "", 0.0]
    try:
        dist.init_process_group(init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size, timeout=timeout)
        x = np.empty(count, np.float32)
        for calls in range(1 << 30):
            if calls == 2:
                print("ready", flush=True)
            x.fill(rank + 1)
            dist.all_reduce(x)
            wrong += int(not np.all(x == size * (size + 1) // 2))
    except dist.AllreduceError as exc:
        outcome = [type(exc).__name__, str(exc), time.monotonic()]
    start = time.monotonic()
    if dist.is_initialized():
        dist.destroy_process_group()
    print(json.dumps(outcome + [wrong, time.monotonic() - start]), flush=True)
""")


def cut_trial(trial: dict) -> dict:
    """Ranks on pretend hosts; one host's link is set down or deleted mid-collective."""
    env = {"ALLREDUCE_TRANSPORT": "tcp", "ALLREDUCE_SECRET": "campaign",
           "PYTHONPATH": os.path.dirname(os.path.dirname(dist.__file__))}  # this very library
    size, victim = trial["size"], trial["victim"]
    seen: dict[int, tuple | None] = {}
    with netns.Testbed(size) as bed:
        procs = [bed.popen(i, [sys.executable, "-c", _NETNS_RANK, str(i), str(size), bed.addresses[0], "29500",
                               str(COUNTS[trial["payload"]]), str(trial["timeout"])],
                           env=dict(env, ALLREDUCE_ADDR=bed.addresses[i]), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True) for i in range(size)]
        ready = all(_ready(proc, time.monotonic() + 60) for proc in procs)
        time.sleep(trial["delay"])
        cut_at = time.monotonic()
        how = ["ip", "link", "set", "eth0", "down"] if trial["how"] == "down" else ["ip", "link", "del", "eth0"]
        bed.run(victim, how)
        for rank, proc in enumerate(procs):
            try:
                out = proc.communicate(timeout=max(1.0, cut_at + 3 * trial["timeout"] + 30 - time.monotonic()))[0]
                seen[rank] = tuple(json.loads(out.strip().splitlines()[-1]))
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                seen[rank] = None
    record = _record(trial, cut_at, seen)
    record["faulted"] = ready
    return record


def _ready(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether ``proc`` printed ``ready`` (after two all-reduces) before ``deadline``."""
    if not select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
        return False
    return proc.stdout.readline().strip() == "ready"


def draw(kind: str, rng: random.Random, timeout: float) -> dict:
    size = rng.randint(2, 5)
    trial = {"fault": kind, "size": size, "victim": rng.randrange(size), "timeout": timeout,
             "payload": rng.choice(list(COUNTS)), "transport": rng.choice(["tcp", "auto"])}
    if kind == "kill":
        trial["phase"] = rng.choice(PHASES)
        trial["delay"] = rng.uniform(0.0, 0.05) if trial["phase"] == "rendezvous" else rng.uniform(0.0, 0.3)
    elif kind == "stop":
        trial.update(phase="collective", delay=rng.uniform(0.0, 0.3))
    else:
        trial.update(size=rng.randint(2, 3), transport="tcp", how=rng.choice(["down", "delete"]),
                     delay=rng.uniform(0.0, 0.3))
        trial["victim"] = rng.randrange(trial["size"])
    return trial


def table(records: list[dict]) -> str:
    rows = ["| fault | trials | survivor errors | hangs | wrong results | no error / other exception "
            "| errors naming the rank | time to error: median | max | destroy max |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[str, list[dict]] = {}
    order = {"kill": 0, "stop": 1, "cut": 2}
    void = [r for r in records if not r["faulted"]]
    records = [r for r in records if r["faulted"]]
    for r in sorted(records, key=lambda r: (order[r["fault"]], r["transport"] == "auto", r.get("phase", ""))):
        fault = {"kill": f"kill -9, {r.get('phase')}", "stop": "SIGSTOP", "cut": f"link {r.get('how')}"}[r["fault"]]
        groups.setdefault(f"{fault}, {'TCP' if r['transport'] == 'tcp' else 'shared memory'}", []).append(r)
    for label, rs in groups.items():
        errs = [e for r in rs for e in r["errors"]]
        ttes = sorted(e[1] for e in errs)
        rows.append(f"| {label} | {len(rs)} | {len(errs)} | {sum(len(r['hung']) for r in rs)} "
                    f"| {sum(r['wrong'] for r in rs)} | {sum(len(r['missed']) for r in rs)} / "
                    f"{sum(len(r.get('foreign', ())) for r in rs)} "
                    f"| {sum(e[2] for e in errs)} of {len(errs)} "
                    f"| {statistics.median(ttes):.3f} s | {ttes[-1]:.3f} s "
                    f"| {max(e[3] for e in errs):.2f} s |" if errs else f"| {label} | {len(rs)} | 0 | - | - | - |")
    if void:
        rows.append(f"\n{len(void)} more trials ended before their fault came (the job failed first, e.g. its first "
                    f"all-reduce outlasted the timeout on an overloaded machine): "
                    f"{sum(len(r['hung']) for r in void)} hangs, {sum(r['wrong'] for r in void)} wrong results, "
                    f"{sum(len(r['errors']) for r in void)} errors of "
                    f"{sum(len(r['errors']) + len(r['missed']) for r in void)} ranks.")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--stops", type=int, default=30)
    parser.add_argument("--cuts", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=3.0, help="rendezvous and collective timeout (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log", help="write every trial's record here (JSON lines)")
    parser.add_argument("--table", metavar="LOG", help="only print the table of a log written by --log")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as lines:
            print(table([json.loads(line) for line in lines]))
        return 0
    rng = random.Random(args.seed)
    kinds = ["kill"] * args.kills + ["stop"] * args.stops
    if args.cuts and netns.available():
        kinds += ["cut"] * args.cuts
    elif args.cuts:
        print("link cuts skipped: they need root, ip and tc (network namespaces)", file=sys.stderr)
    rng.shuffle(kinds)
    records = []
    log = open(args.log, "w") if args.log else None
    for n, kind in enumerate(kinds, 1):
        trial = draw(kind, rng, args.timeout)
        record = cut_trial(trial) if kind == "cut" else forked_trial(trial)
        records.append(record)
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        bad = _bad(record)
        print(f"{n}/{len(kinds)} {kind} size {trial['size']} victim {trial['victim']} {trial['transport']} "
              f"{trial['payload']} {trial.get('phase', trial.get('how'))}: "
              f"{'BAD ' + json.dumps(record) if bad else 'ok'}", file=sys.stderr, flush=True)
    print(table(records))
    return int(any(_bad(r) for r in records))


def _bad(record: dict) -> bool:
    """A hang, a wrong result, an exception outside the family, or a survivor of a fault that raised nothing."""
    return bool(record["hung"] or record["wrong"] or record.get("foreign") or (record["faulted"] and record["missed"]))


if __name__ == "__main__":
    sys.exit(main())
