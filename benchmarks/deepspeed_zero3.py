"""ZeRO-3 step time on the "allreduce" backend against Gloo, in the same run: DeepSpeed, DeepSpeedCPUAdam,
a ~25M-parameter MLP, two ranks under ``allreduce run`` (``DS_ACCELERATOR=cpu``).

Each backend gets its own job (DeepSpeed keeps the process groups it makes, so one job cannot swap
backends), one after the other; each rank times ``STEPS`` steps after ``WARMUP``, and the table
shows rank 0's median step, the time inside ``engine.backward`` (ZeRO-3 reduce-scatters the gradients
there) and inside ``engine.step`` (the parameters gathered again). Nothing runs on import.

    python benchmarks/deepspeed_zero3.py                 # 25M parameters, 5M-element buckets
    python benchmarks/deepspeed_zero3.py --width 800     # ~2.5M parameters
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BACKENDS = ("allreduce", "gloo")
WARMUP, STEPS, BATCH, LAYERS = 2, 8, 32, 4


def rank_job(backend: str, width: int, bucket: int) -> None:
    """One rank: train, then rank 0 prints its timings as one JSON line."""
    import deepspeed
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    import allreduce.torch  # noqa: F401  (registers the backend)

    deepspeed.init_distributed(dist_backend=backend)
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    config = {"train_micro_batch_size_per_gpu": BATCH,
              "zero_optimization": {"stage": 3, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                                    "stage3_prefetch_bucket_size": bucket},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=DeepSpeedCPUAdam(model.parameters(), lr=1e-4),
                                      config=config)
    x = torch.randn(BATCH, width)
    times: dict[str, list[float]] = {"step": [], "backward": [], "optimizer": []}
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        loss = engine(x).square().mean()
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        if i >= WARMUP:
            for key, value in (("step", t3 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2)):
                times[key].append(value)
    if torch.distributed.get_rank() == 0:
        params = sum(p.ds_numel for p in model.parameters())
        print("RESULT " + json.dumps({"params": params, **{k: statistics.median(v) for k, v in times.items()}}))


def run(backend: str, width: int, bucket: int) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "allreduce", "run", "-n", "2", "--", sys.executable, __file__,
                           "--rank-job", backend, "--width", str(width), "--bucket", str(bucket)],
                          capture_output=True, text=True, env=env, check=False)
    for line in done.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"{backend} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2500, help="features per layer (4 layers; 2500: 25M parameters)")
    parser.add_argument("--bucket", type=int, default=5_000_000, help="ZeRO bucket sizes, in elements")
    parser.add_argument("--rank-job", metavar="BACKEND", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        return rank_job(args.rank_job, args.width, args.bucket)
    results = {backend: run(backend, args.width, args.bucket) for backend in BACKENDS}
    print(f"ZeRO-3, {results['gloo']['params'] / 1e6:.1f}M parameters, 2 ranks, median of {STEPS} steps (s)")
    print(f"{'backend':<10} {'step':>8} {'backward':>9} {'optimizer':>10}")
    for backend, r in results.items():
        print(f"{backend:<10} {r['step']:8.3f} {r['backward']:9.3f} {r['optimizer']:10.3f}")
    print(f"allreduce / gloo: {results['allreduce']['step'] / results['gloo']['step']:.2f}x")


if __name__ == "__main__":
    main()
