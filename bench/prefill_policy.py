"""First-token time under concurrent prefix misses, per chunked-prefill policy: N prompts of
~345 tokens arrive together at the engine (no HTTP), each then decodes `max_tokens` tokens.

For each policy and step budget it reports the p50 / p90 time to the first token, tokens/s over
the whole round, and the longest wait between two tokens of a stream that had started (how hard
prefill starves decode). Prints a table and writes bench/results/prefill_policy.json.

    .venv/bin/python -m bench.prefill_policy [--budgets 128 256 512 1024 4096] [--threads 2]
        [--clock wall|cpu]   # cpu: the engine thread's CPU time (use with --threads 1 on a
                             # shared machine: other processes then cannot inflate the figures)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import PREFILL_POLICIES, SamplingParams
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner
from bench.backend_throughput import INSTRUCTION, WORDS
from bench.machine import describe
from kvfence.capability import _mint

BLOCKS = 2048


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    max_step_tokens: int
    streams: int
    prompt_tokens: int
    ttft_p50_s: float
    ttft_p90_s: float
    tokens_per_s: float
    max_gap_p50_s: float  # median over streams of a stream's longest wait between two tokens
    max_gap_s: float
    steps: int


def prompts(loaded: LoadedModel, n: int, words: int, seed: int) -> list[list[int]]:
    """n distinct chat prompts shaped like bench.backend_throughput's (same words, instruction)."""
    rng = random.Random(seed)
    tok = loaded.tokenizer
    out = []
    for i in range(n):
        text = f"{seed:08x}{i:08x} " + " ".join(rng.choice(WORDS) for _ in range(words))
        out.append(tok.encode(tok.render_chat([{"role": "user", "content": text + INSTRUCTION}])))
    return out


def one_round(
    runner: ModelRunner,
    config: EngineConfig,
    jobs: list[list[int]],
    max_tokens: int,
    clock: Callable[[], float],
) -> tuple[list[float], list[float], float, int]:
    """first-token times, longest token gaps, the round's time, steps (all from the start)."""
    engine = Engine(runner, config)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ids = [
        engine.add(_mint(f"ns-{time.monotonic_ns()}-{i}"), p, sampling) for i, p in enumerate(jobs)
    ]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    gap = dict.fromkeys(ids, 0.0)
    start = clock()
    steps = 0
    while engine.has_work():
        outputs = engine.step()
        now = clock() - start
        steps += 1
        for o in outputs:
            first.setdefault(o.seq_id, now)
            gap[o.seq_id] = max(gap[o.seq_id], now - last.get(o.seq_id, now))
            last[o.seq_id] = now
    return [first[i] for i in ids], [gap[i] for i in ids], clock() - start, steps


def measure(
    runner: ModelRunner,
    loaded: LoadedModel,
    policy: str,
    budget: int,
    args: argparse.Namespace,
    clock: Callable[[], float],
) -> PolicyResult:
    config = EngineConfig(
        num_blocks=BLOCKS,
        max_num_seqs=64,
        max_step_tokens=budget,
        prefill_policy=policy,  # type: ignore[arg-type]
    )
    ttft: list[float] = []
    gaps: list[float] = []
    walls: list[float] = []
    steps = 0
    jobs: list[list[int]] = []
    for r in range(args.rounds):
        jobs = prompts(loaded, args.streams, args.prompt_words, seed=1000 * budget + r)
        first, gap, wall, steps = one_round(runner, config, jobs, args.max_tokens, clock)
        ttft += first
        gaps += gap
        walls.append(wall)
    return PolicyResult(
        policy=policy,
        max_step_tokens=budget,
        streams=args.streams,
        prompt_tokens=round(statistics.fmean(len(p) for p in jobs)),
        ttft_p50_s=round(statistics.median(ttft), 3),
        ttft_p90_s=round(statistics.quantiles(ttft, n=10)[-1], 3),
        tokens_per_s=round(args.streams * args.max_tokens / statistics.median(walls), 1),
        max_gap_p50_s=round(statistics.median(gaps), 3),
        max_gap_s=round(max(gaps), 3),
        steps=steps,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=260, help="about 345 tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budgets", type=int, nargs="+", default=[128, 256, 512, 1024, 4096])
    parser.add_argument("--policies", nargs="+", default=list(PREFILL_POLICIES))
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results/prefill_policy.json"))
    args = parser.parse_args()
    machine = describe()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    loaded = load_model(args.model, device="cpu", dtype=args.dtype)
    runner = ModelRunner(loaded, num_blocks=BLOCKS)
    rows: list[PolicyResult] = []
    print(
        f"dtype {loaded.dtype_name} ({loaded.dtype_reason}), threads {args.threads}, "
        f"clock {args.clock}"
    )
    print(
        f"{'policy':<6} {'budget':>6} {'ttft p50':>9} {'ttft p90':>9} {'tok/s':>7} "
        f"{'gap p50':>8} {'gap max':>8} {'steps':>6}"
    )
    with torch.inference_mode():
        one_round(runner, EngineConfig(num_blocks=BLOCKS), prompts(loaded, 2, 40, 7), 4, clock)
        for budget, policy in itertools.product(args.budgets, args.policies):
            r = measure(runner, loaded, policy, budget, args, clock)
            rows.append(r)
            print(
                f"{r.policy:<6} {r.max_step_tokens:>6} {r.ttft_p50_s:>9.3f} {r.ttft_p90_s:>9.3f} "
                f"{r.tokens_per_s:>7.1f} {r.max_gap_p50_s:>8.3f} {r.max_gap_s:>8.3f} {r.steps:>6}",
                flush=True,
            )
    report: dict[str, Any] = {
        "dtype": loaded.dtype_name,
        "dtype_reason": loaded.dtype_reason,
        "threads": args.threads,
        "clock": args.clock,
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "machine": machine,
        "results": [asdict(r) for r in rows],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
