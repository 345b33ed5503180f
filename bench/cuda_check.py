"""The backend's CUDA path on a GPU, in one run: the reference answer, batched generation equal to
one-at-a-time, namespace isolation of the prefix cache, and engine throughput at 1-64 streams with
and without a prefix hit. Prints the figures and writes bench/results/cuda_check.json.

    python -m bench.cuda_check [--model smollm2|PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import SamplingParams
from backend.model import LoadedModel, load_model
from backend.runner import ModelRunner
from bench.machine import describe
from kvfence.capability import _mint

GREEDY = SamplingParams(max_tokens=64, temperature=0.0)
TOPICS = ["rivers", "volcanoes", "bridges", "comets", "forests", "deserts", "glaciers", "islands"]


def chat_ids(loaded: LoadedModel, text: str) -> list[int]:
    tok = loaded.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": text}]))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def generate(
    engine: Engine, jobs: list[tuple[str, list[int]]], sampling: SamplingParams
) -> tuple[dict[int, list[int]], dict[int, int], float, float]:
    """Runs jobs to completion together: tokens, cached tokens, time to all first tokens, total."""
    ids = [engine.add(_mint(ns), prompt, sampling, ()) for ns, prompt in jobs]
    out: dict[int, list[int]] = {i: [] for i in ids}
    cached: dict[int, int] = {}
    start = time.perf_counter()
    first = 0.0
    while engine.has_work():
        for o in engine.step():
            out[o.seq_id].append(o.token_id)
            if o.cached_tokens is not None:
                cached[o.seq_id] = o.cached_tokens
        if not first and len(cached) == len(ids):
            sync()
            first = time.perf_counter() - start
    sync()
    return out, cached, first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results/cuda_check.json"))
    args = parser.parse_args()
    machine = describe()
    t0 = time.perf_counter()
    loaded = load_model(args.model, device=args.device)
    load_s = time.perf_counter() - t0
    engine = Engine(
        ModelRunner(loaded, num_blocks=8192),
        EngineConfig(num_blocks=8192, max_num_seqs=128, max_step_tokens=8192),
    )
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name(0) if loaded.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "dtype_reason": loaded.dtype_reason,
        "load_seconds": round(load_s, 2),
    }
    question = chat_ids(loaded, "What is the capital of France?")
    out, _, _, _ = generate(engine, [("ref", question)], SamplingParams(12, 0.0))
    answer = loaded.tokenizer.decode(next(iter(out.values())))
    report["reference_answer"] = answer
    report["reference_ok"] = answer.startswith("The capital of France is Paris")

    prompts = [chat_ids(loaded, f"Tell me about {t}, in detail.") for t in TOPICS[:4]]
    alone = [
        next(iter(generate(engine, [(f"solo{i}", p)], GREEDY)[0].values()))
        for i, p in enumerate(prompts)
    ]
    together, _, _, _ = generate(engine, [(f"batch{i}", p) for i, p in enumerate(prompts)], GREEDY)
    report["batched_equals_alone"] = list(together.values()) == alone

    long_prompt = chat_ids(loaded, " ".join(f"Fact {i} about {TOPICS[i % 8]}." for i in range(60)))
    _, a1, _, _ = generate(engine, [("tenant-a", long_prompt)], SamplingParams(1, 0.0))
    _, a2, _, _ = generate(engine, [("tenant-a", long_prompt)], SamplingParams(1, 0.0))
    _, b1, _, _ = generate(engine, [("tenant-b", long_prompt)], SamplingParams(1, 0.0))
    report["isolation"] = {
        "prompt_tokens": len(long_prompt),
        "a_first": min(a1.values()),
        "a_repeat": min(a2.values()),
        "b_same_prompt": min(b1.values()),
    }
    generate(engine, [("warm", prompts[0])] * 8, GREEDY)  # warm-up of the batched kernels
    rows = []
    for streams in args.streams:
        for hit in (False, True):
            jobs = [
                (f"s{streams}", chat_ids(loaded, f"{i} " + " ".join(TOPICS) * 30))
                for i in range(streams)
            ]
            if hit:  # fill each prompt's cache first: the measured run hits it
                generate(engine, jobs, SamplingParams(1, 0.0))
            out, cached, first, total = generate(engine, jobs, GREEDY)
            tokens = sum(len(v) for v in out.values())
            rows.append(
                {
                    "streams": streams,
                    "prefix": "hit" if hit else "miss",
                    "tokens_per_s": round(tokens / total, 1),
                    "all_first_tokens_ms": round(first * 1e3, 1),
                    "cached_tokens": min(cached.values()),
                    "prompt_tokens": len(jobs[0][1]),
                }
            )
            engine.flush(_mint(f"s{streams}"))
    report["throughput"] = rows
    report["gpu_memory_gib"] = (
        round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0
    )
    report["machine"] = machine
    print(json.dumps(report, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
