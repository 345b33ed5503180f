"""Speed of the model runner alone (no server, no scheduler): decode tokens/s at batch 1 and 8,
and the time to prefill a ~300-token prompt. Decode figures are the median of several runs (the
best beside it). Prints the figures and writes bench/results/runner_speed.json.

    .venv/bin/python bench/runner_speed.py [--device auto] [--dtype bfloat16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner

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
    chunks = (Chunk(i, tuple(p), 0, tables[i], True, GREEDY, 0) for i, p in enumerate(prompts))
    last = runner.execute(StepPlan(tuple(chunks)))
    sync(runner.device)
    start = time.perf_counter()
    for step in range(steps):
        plan = StepPlan(
            tuple(
                Chunk(i, (last[i],), len(p) + step, tables[i], True, GREEDY, step + 1)
                for i, p in enumerate(prompts)
            )
        )
        last = runner.execute(plan)
    sync(runner.device)
    return batch * steps / (time.perf_counter() - start)


def prefill_seconds(runner: ModelRunner, loaded: LoadedModel, repeats: int) -> tuple[int, float]:
    ids = prompt_ids(loaded, "lighthouses", words=120)
    table = tuple(range(-(-len(ids) // BLOCK)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(StepPlan((Chunk(0, tuple(ids), 0, table, True, GREEDY, 0),)))
        sync(runner.device)
        times.append(time.perf_counter() - start)
    return len(ids), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5, help="timed decode runs per batch size")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results/runner_speed.json"))
    args = parser.parse_args()
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
    report = {
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
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
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    for key, value in report.items():
        print(f"{key:>28}: {value}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
