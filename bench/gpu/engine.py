"""Our engine in this process on one device: the reference answer, batched greedy equal to
one-at-a-time, namespace isolation of the prefix cache, and throughput with and without a
prefix hit at each stream count.

Invariant: every time is read after a device sync; the engine is given no end-of-sequence ids,
so every stream generates exactly `max_tokens` (as transformers is made to beside it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import SamplingParams
from backend.model import LoadedModel
from backend.runner import ModelRunner
from kvfence.capability import _mint

TOPICS = ["rivers", "volcanoes", "bridges", "comets", "forests", "deserts", "glaciers", "islands"]
REFERENCE = "The capital of France is Paris"
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Run:
    tokens: dict[int, list[int]]  # sequence id -> generated ids, in the order added
    cached: dict[int, int]  # sequence id -> prompt tokens served from the prefix cache
    first_s: float  # until every sequence had its first token
    total_s: float


def make_engine(
    loaded: LoadedModel, max_streams: int, graphs: bool | None = None
) -> tuple[Engine, dict[str, Any]]:
    """The engine, and how its decode steps run: `graphs` None is the runner's default (CUDA
    graphs on a GPU whose decode attention is ours), False the usual path for every step."""
    blocks = 8192
    config = EngineConfig(num_blocks=blocks, max_num_seqs=max_streams, max_step_tokens=8192)
    started = time.perf_counter()
    runner = ModelRunner(loaded, num_blocks=blocks, max_batch=max_streams, graphs=graphs)
    sync(loaded.device)
    made = {
        "decode_steps": runner.decode_steps,
        "sizes": list(runner.graphs.sizes) if runner.graphs is not None else [],
        "runner_start_s": round(time.perf_counter() - started, 2),
        "kernel_plans": runner.kernel_plans(),
    }
    return Engine(runner, config), made


def chat_ids(loaded: LoadedModel, text: str) -> list[int]:
    tok = loaded.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": text}]))


def row_prompts(loaded: LoadedModel, streams: int) -> list[list[int]]:
    """The prompts of one throughput row (~300 tokens each), the same for both engines."""
    return [chat_ids(loaded, f"{i} " + " ".join(TOPICS) * 30) for i in range(streams)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    engine: Engine, device: torch.device, jobs: list[tuple[str, list[int]]], max_tokens: int
) -> Run:
    """Runs (namespace, prompt) jobs to completion together, greedy."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ids = [engine.add(_mint(ns), prompt, sampling) for ns, prompt in jobs]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    cached: dict[int, int] = {}
    start = time.perf_counter()
    first = 0.0
    while engine.has_work():
        for o in engine.step():
            tokens[o.seq_id].append(o.token_id)
            if o.cached_tokens is not None:
                cached[o.seq_id] = o.cached_tokens
        if not first and len(cached) == len(ids):
            sync(device)
            first = time.perf_counter() - start
    sync(device)
    return Run(tokens, cached, first, time.perf_counter() - start)


def checks(engine: Engine, loaded: LoadedModel, max_tokens: int) -> dict[str, Any]:
    """The reference answer, batched == alone on 4 prompts, and namespace isolation."""
    question = chat_ids(loaded, "What is the capital of France?")
    answer = loaded.tokenizer.decode(
        _only(generate(engine, loaded.device, [("ref", question)], 12))
    )
    prompts = [chat_ids(loaded, f"Tell me about {t}, in detail.") for t in TOPICS[:4]]
    alone = [
        _only(generate(engine, loaded.device, [(f"solo{i}", p)], max_tokens))
        for i, p in enumerate(prompts)
    ]
    together = generate(
        engine, loaded.device, [(f"batch{i}", p) for i, p in enumerate(prompts)], max_tokens
    )
    text = " ".join(f"Fact {i} about {TOPICS[i % 8]}." for i in range(60))
    long_prompt = chat_ids(loaded, text)
    a1, a2, b1 = (
        generate(engine, loaded.device, [(ns, long_prompt)], 1)
        for ns in ("ten-a", "ten-a", "ten-b")
    )
    isolation = {
        "prompt_tokens": len(long_prompt),
        "a_first": min(a1.cached.values()),
        "a_repeat": min(a2.cached.values()),
        "b_same_prompt": min(b1.cached.values()),
    }
    return {
        "reference_answer": answer,
        "reference_ok": answer.startswith(REFERENCE),
        "batched_equals_alone": list(together.tokens.values()) == alone,
        "isolation": isolation,
        "isolation_ok": isolation["a_first"] == 0
        and isolation["a_repeat"] > 0
        and isolation["b_same_prompt"] == 0,
    }


def throughput_row(
    engine: Engine, loaded: LoadedModel, streams: int, hit: bool, max_tokens: int
) -> dict[str, Any]:
    """One row: `streams` prompts at once; for a hit, each prompt is cached by a 1-token pass
    in the same namespace first."""
    namespace = f"{'hit' if hit else 'miss'}{streams}"
    jobs = [(namespace, p) for p in row_prompts(loaded, streams)]
    if hit:
        generate(engine, loaded.device, jobs, 1)
    run = generate(engine, loaded.device, jobs, max_tokens)
    engine.flush(_mint(namespace))
    made = sum(len(t) for t in run.tokens.values())
    return {
        "streams": streams,
        "prefix": "hit" if hit else "miss",
        "tokens_per_s": round(made / run.total_s, 1),
        "all_first_tokens_ms": round(run.first_s * 1e3, 1),
        "cached_tokens": min(run.cached.values()),
        "prompt_tokens": len(jobs[0][1]),
        "tokens": made,
        "seconds": round(run.total_s, 3),
        "first_stream_ids": next(iter(run.tokens.values())),
    }


def usual_path_rows(
    loaded: LoadedModel, graph_rows: list[dict[str, Any]], streams: list[int], max_tokens: int
) -> dict[str, Any]:
    """The same prefix-miss rows with every step on the usual path (no CUDA graphs): tokens/s,
    and whether each row's first stream chose the same greedy tokens as with graphs."""
    engine, made = make_engine(loaded, max(streams), graphs=False)
    generate(engine, loaded.device, [("warm", row_prompts(loaded, 1)[0])] * 8, 8)
    mine = {r["streams"]: r for r in graph_rows if r["prefix"] == "miss"}
    rows = []
    for n in streams:
        row = throughput_row(engine, loaded, n, False, max_tokens)
        graphed = mine.get(n)
        rows.append({
            "streams": n,
            "tokens_per_s": row["tokens_per_s"],
            "graphs_tokens_per_s": graphed["tokens_per_s"] if graphed else None,
            "same_tokens": graphed["first_stream_ids"] == row["first_stream_ids"]
            if graphed else None,
        })  # fmt: skip
    return {"runner": made, "rows": rows}


def _only(run: Run) -> list[int]:
    return next(iter(run.tokens.values()))
