"""How OpenMP's idle threads wait, side by side in one run: decode tokens/s of the model runner
at batch 1 and 8 and the CPU its threads burn while the engine has no work, for each wait
policy and thread count, on a quiet host and with a CPU hog on every core beside it (bench.hog).

Each policy runs in its own process (OpenMP reads its settings once, when torch loads):
`passive` (sleep at once), `spin-N` (spin N rounds, then sleep: GOMP_SPINCOUNT; the backend
runs spin-5000) and `active` (spin until work comes). Prints a table and writes
bench/results/omp_policy.json.

    .venv/bin/python -m bench.omp_policy [--steps 32] [--runs 3] [--spins 5000,20000]
        [--threads 2,1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.hog import cpu_hog
from bench.machine import describe

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, os, resource, statistics, sys, time
import torch
from backend.model import load_model
from backend.runner import ModelRunner
from bench.runner_speed import BLOCK, decode_rate
steps, runs, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
loaded = load_model("smollm2")
runner = ModelRunner(loaded, num_blocks=256, block_size=BLOCK)
out = {"dtype": str(loaded.dtype).removeprefix("torch.")}
with torch.inference_mode():
    decode_rate(runner, loaded, 1, 8)
    for batch in (1, 8):
        out[f"batch{batch}"] = statistics.median(
            decode_rate(runner, loaded, batch, steps) for _ in range(runs))
    decode_rate(runner, loaded, 1, 4)  # work, then nothing: what do the idle threads burn?
    used = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    before, start = used(), time.perf_counter()
    time.sleep(2.0)
    out["idle_cpu_share"] = (used() - before) / (time.perf_counter() - start)
print(json.dumps(out))
"""


def policies(spins: list[int]) -> dict[str, dict[str, str]]:
    out = {"passive": {"OMP_WAIT_POLICY": "PASSIVE"}}
    for n in spins:
        out[f"spin-{n}"] = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(n)}
    out["active"] = {"OMP_WAIT_POLICY": "ACTIVE"}
    return out


def measure(env: dict[str, str], steps: int, runs: int, threads: int) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    full |= env | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps), str(runs), str(threads)],
        env=full, cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--spins", default="5000,20000")
    parser.add_argument("--threads", default="2", help="thread counts, e.g. 2,1")
    parser.add_argument("--out", default=str(ROOT / "bench/results/omp_policy.json"))
    args = parser.parse_args()
    chosen = policies([int(n) for n in args.spins.split(",") if n])
    rows: list[dict[str, Any]] = []
    counts = [int(n) for n in args.threads.split(",") if n]
    for host in ("quiet", "hog"):
        with cpu_hog(None if host == "hog" else 0):
            for (name, env), threads in itertools.product(chosen.items(), counts):
                t0 = time.perf_counter()
                print(f"  {host:5} {name:12} x{threads} ...", end="", flush=True, file=sys.stderr)
                row = {"host": host, "policy": name, "threads": threads, "env": env}
                row |= measure(env, args.steps, args.runs, threads)
                print(f" {time.perf_counter() - t0:.0f} s", file=sys.stderr)
                rows.append(row)
    print(f"{'host':6}{'policy':14}{'threads':>8}{'batch 1 tok/s':>15}{'batch 8 tok/s':>15}"
          f"{'idle CPU':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['host']:6}{r['policy']:14}{r['threads']:8}{r['batch1']:15.1f}"
              f"{r['batch8']:15.1f}{r['idle_cpu_share']:10.0%}")  # fmt: skip
    report = {"machine": describe(), "steps": args.steps, "runs": args.runs, "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
