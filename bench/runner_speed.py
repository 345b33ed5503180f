"""Speed of the model runner alone (no server, no scheduler): decode tokens/s at batch 1 and 8,
and the time to prefill a ~300-token prompt. Decode figures are the median of several runs (the
best beside it). Prints the figures and writes bench/results/runner_speed.json, with the host
(bench.machine) and the dtype `auto` chose and why. --profile adds where the time goes.

    .venv/bin/python -m bench.runner_speed [--dtype auto] [--threads 2] [--profile] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from backend.engine.plan import Chunk, SamplingParams, StepPlan
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner
from bench.machine import describe

GREEDY = SamplingParams(max_tokens=1 << 20, temperature=0.0)
BLOCK = 16
TOPICS = ["rivers", "volcanoes", "bridges", "comets", "forests", "deserts", "glaciers", "islands"]


def prompt_ids(loaded: LoadedModel, topic: str, words: int = 40) -> list[int]:
    body = " ".join(f"Tell me about {topic}, part {i}." for i in range(words // 5))
    return loaded.tokenizer.encode(
        loaded.tokenizer.render_chat([{"role": "user", "content": body}])
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def decode_rate(runner: ModelRunner, loaded: LoadedModel, batch: int, steps: int) -> float:
    """Prefill `batch` prompts in one step, then time `steps` batched decode steps."""
    prompts = [prompt_ids(loaded, TOPICS[i % len(TOPICS)]) for i in range(batch)]
    per_seq = -(-(max(map(len, prompts)) + steps + 1) // BLOCK)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    chunks = (
        Chunk(i, tuple(p), 0, tables[i], True, GREEDY, 0, len(p)) for i, p in enumerate(prompts)
    )
    last = runner.execute(StepPlan(tuple(chunks))).tokens
    sync(runner.device)
    start = time.perf_counter()
    for step in range(steps):
        plan = StepPlan(
            tuple(
                Chunk(i, (last[i],), len(p) + step, tables[i], True, GREEDY, step + 1, len(p))
                for i, p in enumerate(prompts)
            )
        )
        last = runner.execute(plan).tokens
    sync(runner.device)
    return batch * steps / (time.perf_counter() - start)


def prefill_seconds(runner: ModelRunner, loaded: LoadedModel, repeats: int) -> tuple[int, float]:
    ids = prompt_ids(loaded, "lighthouses", words=120)
    table = tuple(range(-(-len(ids) // BLOCK)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(StepPlan((Chunk(0, tuple(ids), 0, table, True, GREEDY, 0, len(ids)),)))
        sync(runner.device)
        times.append(time.perf_counter() - start)
    return len(ids), statistics.median(times)


def top_ops(work: Callable[[], object], rows: int = 12) -> list[dict[str, Any]]:
    """The ops `work` spends its time in, by self time (torch.profiler, CPU)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [
        {
            "op": e.key,
            "self_ms": round(e.self_cpu_time_total / 1e3, 2),
            "share": round(e.self_cpu_time_total / total, 3),
            "calls": e.count,
        }
        for e in events[:rows]
    ]


def profiles(runner: ModelRunner, loaded: LoadedModel) -> dict[str, list[dict[str, Any]]]:
    ids = prompt_ids(loaded, "lighthouses", words=120)
    table = tuple(range(-(-len(ids) // BLOCK)))
    prefill = StepPlan((Chunk(0, tuple(ids), 0, table, True, GREEDY, 0, len(ids)),))
    out = {"prefill": top_ops(lambda: runner.execute(prefill))}
    for batch in (1, 8):
        out[f"decode_batch{batch}_16_steps"] = top_ops(
            lambda b=batch: decode_rate(runner, loaded, b, 16)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5, help="timed decode runs per batch size")
    parser.add_argument("--profile", action="store_true", help="add the top ops of each phase")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results/runner_speed.json"))
    args = parser.parse_args()
    machine = describe()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    runner = ModelRunner(loaded, num_blocks=256, block_size=BLOCK)
    with torch.inference_mode():
        decode_rate(runner, loaded, 1, 8)  # warm-up
        runs = {
            batch: [decode_rate(runner, loaded, batch, args.steps) for _ in range(args.runs)]
            for batch in (1, 8)
        }
        tokens, seconds = prefill_seconds(runner, loaded, repeats=5)
        profiled = profiles(runner, loaded) if args.profile else None
    report: dict[str, Any] = {
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "dtype_reason": loaded.dtype_reason,
        "threads": args.threads,
        "decode_steps": args.steps,
        "method": f"decode: median and best of {args.runs} runs after a warm-up; "
        "prefill: median of 5",
        **{
            f"decode_tokens_per_s_batch{b}": round(statistics.median(r), 1) for b, r in runs.items()
        },
        **{f"decode_tokens_per_s_batch{b}_best": round(max(r), 1) for b, r in runs.items()},
        "prefill_tokens": tokens,
        "prefill_seconds": round(seconds, 4),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "machine": machine,
    }
    for key, value in report.items():
        if key != "machine":
            print(f"{key:>32}: {value}")
    if profiled is not None:
        report["profile"] = profiled
        for phase, ops in profiled.items():
            print(f"{phase}: " + ", ".join(f"{o['op']} {o['share']:.0%}" for o in ops[:6]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
