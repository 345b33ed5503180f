"""Safe sharing figures: prefix-cache hit rate and prefill tokens saved under global sharing,
per-tenant isolation, and isolation plus declared public prefixes (bench/sharing_sim.py, over our
block pool) on the Mooncake conversation trace and a synthetic workload, at unlimited KV and a
constrained pool; and, on the real backend with SmolLM2 behind the real gateway, first-token
time on a public-prefix hit against a same-tenant hit of the same length. Prints a table and
writes bench/results/sharing.json.

    .venv/bin/python -m bench.sharing [--rounds 8] [--no-backend] [--trace PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe
from bench.sharing_sim import MODES, Workload, grid, mooncake, synthetic

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "sharing.json"
TRACE_NAME = Path("shared", "data", "mooncake", "conversation_trace.jsonl")
# The checkout is /work/main or a worktree /work/wt/<name>; the data sits beside them.
TRACE = next(
    (p / TRACE_NAME for p in (ROOT.parent, ROOT.parent.parent) if (p / TRACE_NAME).exists()),
    ROOT.parent / TRACE_NAME,
)
BACKEND_BLOCK = 16  # our backend's block size: the constrained pools are quoted in it too
WORDS = ("orders", "returns", "gift", "cards", "loyalty", "points", "shipping", "abroad")


def hit_rates(workload: Workload) -> list[dict[str, Any]]:
    rows = []
    for pool, mode, outcome in grid(workload):
        blocks = workload.constrained if pool == "constrained" else None
        rows.append({
            "workload": workload.name,
            "pool": pool,
            "pool_blocks": blocks,
            "pool_backend_blocks": (
                blocks * workload.tokens_per_block // BACKEND_BLOCK if blocks else None
            ),
            "mode": mode,
            "prompt_tokens": outcome.prompt_tokens,
            "prefill_saved_tokens": outcome.hit_tokens,
            "hit_rate": round(outcome.hit_rate, 4),
        })  # fmt: skip
    for row in rows:
        same = [r for r in rows if (r["workload"], r["pool"]) == (row["workload"], row["pool"])]
        best = next(r["hit_rate"] for r in same if r["mode"] == "global")
        row["of_global"] = round(row["hit_rate"] / best, 4) if best else None
    return rows


def system_prompt(seed: int, words: int = 300) -> str:
    """A system prompt of about `words` words (several hundred tokens), distinct per seed."""
    picks = [WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(words)]
    return f"Policy book {seed}. Answer in one sentence. Topics: " + " ".join(picks) + "."


def aligned_prompt(tokenizer: Any, seed: int) -> str:
    """A system prompt whose rendering ends exactly on a block boundary, so a public-prefix hit
    and a same-tenant hit reuse the same number of blocks (else the same-tenant one also reuses
    the template tokens after the system message, and the two first-token times differ by the
    prefill of that extra block, not by anything public)."""
    from backend.prompt import public_chat_ids

    for words in range(300, 400):
        text = system_prompt(seed, words)
        ids = public_chat_ids(tokenizer, [{"role": "system", "content": text}], False)
        if len(ids) % BACKEND_BLOCK == 0:
            return text
    raise RuntimeError("no system prompt ends on a block boundary")


def twin_prompt(tokenizer: Any, text: str) -> str:
    """An undeclared prompt of the same number of tokens as `text`."""
    from backend.prompt import public_chat_ids

    def size(t: str) -> int:
        return len(public_chat_ids(tokenizer, [{"role": "system", "content": t}], False))

    for word in ("page", "note", "file", "list", "card", "guide"):
        twin = text.replace("book", word, 1)
        if size(twin) == size(text):
            return twin
    raise RuntimeError("no twin prompt of the same length")


def _chat(system: str, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


async def _first_token(stack: Any, tenant: str, body: dict[str, Any]) -> tuple[float, int]:
    """Seconds to the first content chunk, and the cached tokens the answer reports."""
    start = time.perf_counter()
    first = None
    cached = 0
    async with await stack.post(tenant, body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("choices"):
                first = time.perf_counter() - start
            usage = event.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    assert first is not None, "no content chunk"
    return first, int(cached)


async def first_token_times(rounds: int) -> dict[str, Any]:
    """Each round: a declared prompt warmed by globex then asked by acme (a public-prefix hit),
    and an undeclared one of the same length warmed and asked by acme (a same-tenant hit), in
    alternating order; plus a cold miss. Medians over rounds."""
    from backend.model.load import load_model
    from tests.kit.stack import make_backend, make_keys, running_stack

    model = load_model("smollm2")
    declared = [aligned_prompt(model.tokenizer, r) for r in range(rounds)]
    entries = "".join(
        f"    - {{name: p{r}, model: smollm2, text: {json.dumps(text)}}}\n"
        for r, text in enumerate(declared)
    )
    extra = f"public:\n  cache: {{ceiling: 0.5, floor: 0.25}}\n  prefixes:\n{entries}"
    times: dict[str, list[float]] = {"public_hit": [], "same_tenant_hit": [], "miss": []}
    cached: dict[str, list[int]] = {k: [] for k in times}
    with tempfile.TemporaryDirectory() as tmp:
        keys = make_keys(Path(tmp))
        backend = make_backend(model, keys, blocks=4096)
        async with running_stack(backend, keys, "smollm2", extra=extra) as stack:
            await _first_token(stack, "acme", _chat("Warm up.", "Hi"))
            for r in range(rounds):
                own = twin_prompt(model.tokenizer, declared[r])
                order = ["public_hit", "same_tenant_hit"][:: 1 if r % 2 else -1]
                for kind in order:
                    public = kind == "public_hit"
                    system, warm = (declared[r], "globex") if public else (own, "acme")
                    await _first_token(stack, warm, _chat(system, f"Warm {r}?"))
                    t, c = await _first_token(stack, "acme", _chat(system, f"Question {r}?"))
                    times[kind].append(t)
                    cached[kind].append(c)
                t, c = await _first_token(stack, "acme", _chat(system_prompt(1000 + r), "Cold?"))
                times["miss"].append(t)
                cached["miss"].append(c)
    medians = {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()}
    return {
        "rounds": rounds,
        "ttft_ms_median": medians,
        "ttft_ms_all": {k: [round(x * 1000, 1) for x in v] for k, v in times.items()},
        "cached_tokens_median": {k: statistics.median(v) for k, v in cached.items()},
        "public_over_same_tenant": round(medians["public_hit"] / medians["same_tenant_hit"], 3),
    }


def print_table(rows: list[dict[str, Any]], ttft: dict[str, Any] | None) -> None:
    print(f"{'workload':10} {'pool':12} {'mode':9} {'hit rate':>9} {'of global':>10} "
          f"{'prefill saved':>14} {'prompt tokens':>14}")  # fmt: skip
    for r in rows:
        print(f"{r['workload']:10} {r['pool']:12} {r['mode']:9} {r['hit_rate']:9.2%} "
              f"{r['of_global']:10.2%} {r['prefill_saved_tokens']:14,} "
              f"{r['prompt_tokens']:14,}")  # fmt: skip
    if ttft is not None:
        m, c = ttft["ttft_ms_median"], ttft["cached_tokens_median"]
        print(f"\nfirst token (real backend, SmolLM2, median of {ttft['rounds']} rounds):")
        for kind in ("public_hit", "same_tenant_hit", "miss"):
            print(f"  {kind:16} {m[kind]:8.1f} ms   cached tokens {c[kind]:g}")
        print(f"  public / same-tenant: {ttft['public_over_same_tenant']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--pool-blocks", type=int, default=5000, help="of 512 tokens (Mooncake)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--no-backend", action="store_true", help="skip first-token times")
    args = parser.parse_args(argv)
    host = describe()
    workloads = [synthetic(block_size=BACKEND_BLOCK), mooncake(args.trace, args.pool_blocks)]
    rows = [row for w in workloads for row in hit_rates(w)]
    ttft = None if args.no_backend else asyncio.run(first_token_times(args.rounds))
    print_table(rows, ttft)
    result = {
        "host": host,
        "command": " ".join(["python -m bench.sharing", *(argv or sys.argv[1:])]),
        "modes": list(MODES),
        "workloads": {w.name: {"requests": len(w.requests), "tokens_per_block":
                               w.tokens_per_block, "distinct_blocks": w.distinct_blocks,
                               "constrained_blocks": w.constrained} for w in workloads},
        "hit_rates": rows,
        "first_token": ttft,
    }  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
