"""Streaming throughput of any OpenAI-compatible server: tokens/s and time to the first token.

Each scenario runs N concurrent chat streams of `max_tokens` tokens on ~340-token prompts, either
fresh (a prefix miss) or sent once beforehand under the same headers and salt (a prefix hit).
Run: .venv/bin/python -m bench.backend_throughput --backend | --vllm [--vllm-dtype float32]
     | --url URL --model M [--header K:V]; --emulate-avx2 caps the started server to AVX2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.machine import describe
from bench.targets import AVX2_CAPS, REPO_ROOT, Target, backend_target, url_target, vllm_target

DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "backend_throughput.json"
WORD_TEXT = (
    "river stone lantern orbit meadow copper violet harbor signal tundra maple quartz falcon "
    "ember glacier saddle thistle canyon beacon walnut prism cobalt willow marble ferry "
    "candle garden pepper summit velvet anchor basket cedar dune echo forest harvest island"
)
WORDS = tuple(WORD_TEXT.split())
INSTRUCTION = "\nWrite a long, detailed story that uses every one of the words above."


@dataclass(frozen=True, slots=True)
class StreamSample:
    ttft_s: float
    decode_s: float  # first content chunk to end of stream
    max_gap_s: float  # the longest wait between two content chunks (a decode stall)
    tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    target: str
    streams: int
    prefix: str  # "hit" or "miss"
    rounds: int
    tokens_per_s: float  # all generated tokens / wall time, prefill included
    ttft_p50_s: float
    ttft_p90_s: float
    stream_decode_tokens_per_s_p50: float  # one stream's rate after its first token
    max_gap_p50_s: float  # median over streams of a stream's longest inter-token wait
    max_gap_s: float  # the longest inter-token wait of any stream
    tokens_per_stream: float
    prompt_tokens: float | None
    cached_tokens: float | None


def make_prompt(words: int) -> str:
    """A prompt no earlier request has seen: a random nonce first, then random words."""
    rng = random.Random(secrets.randbits(64))
    return (
        secrets.token_hex(8) + " " + " ".join(rng.choice(WORDS) for _ in range(words)) + INSTRUCTION
    )


def chat_body(target: Target, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    if target.cache_salt is not None:
        body["cache_salt"] = target.cache_salt
    return body


def _usage_figures(usage: Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    details = usage.get("prompt_tokens_details") or {}
    return usage.get("completion_tokens"), usage.get("prompt_tokens"), details.get("cached_tokens")


async def stream_once(
    http: aiohttp.ClientSession, target: Target, prompt: str, max_tokens: int
) -> StreamSample:
    """Send one streaming chat request; count content chunks unless the server reports usage."""
    started = time.perf_counter()
    first: float | None = None
    last = 0.0
    gap = 0.0
    chunks = 0
    usage: Mapping[str, Any] = {}
    body = chat_body(target, prompt, max_tokens)
    url = f"{target.base_url}/v1/chat/completions"
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json", **target.headers(data)}
    async with http.post(url, data=data, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"]
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
                now = time.perf_counter()
                chunks += 1
                first = first if first is not None else now
                gap = max(gap, now - (last or now))
                last = now
    if first is None:
        raise RuntimeError(f"{target.name}: the stream carried no content")
    completion, prompt_tokens, cached = _usage_figures(usage)
    ended = time.perf_counter()
    return StreamSample(
        first - started, ended - first, gap, completion or chunks, prompt_tokens, cached
    )


async def run_round(
    http: aiohttp.ClientSession, target: Target, streams: int, hit: bool, args: argparse.Namespace
) -> tuple[list[StreamSample], float]:
    """One round: warm the prompts first when measuring a hit, then run all streams at once."""
    prompts = [make_prompt(args.prompt_words) for _ in range(streams)]
    if hit:
        for prompt in prompts:
            await stream_once(http, target, prompt, 1)
    started = time.perf_counter()
    samples = await asyncio.gather(
        *(stream_once(http, target, p, args.max_tokens) for p in prompts)
    )
    return list(samples), time.perf_counter() - started


def _mean(values: Sequence[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


async def run_scenario(
    http: aiohttp.ClientSession, target: Target, streams: int, hit: bool, args: argparse.Namespace
) -> ScenarioResult:
    samples: list[StreamSample] = []
    wall = 0.0
    for _ in range(args.rounds):
        round_samples, round_wall = await run_round(http, target, streams, hit, args)
        samples += round_samples
        wall += round_wall
    return summarize(target.name, streams, hit, args.rounds, samples, wall)


def summarize(
    name: str, streams: int, hit: bool, rounds: int, samples: list[StreamSample], wall: float
) -> ScenarioResult:
    """One scenario's figures from its rounds' samples and their summed wall time."""
    return ScenarioResult(
        target=name,
        streams=streams,
        prefix="hit" if hit else "miss",
        rounds=rounds,
        tokens_per_s=sum(s.tokens for s in samples) / wall,
        ttft_p50_s=statistics.median(s.ttft_s for s in samples),
        ttft_p90_s=statistics.quantiles([s.ttft_s for s in samples], n=10)[-1]
        if len(samples) > 1
        else samples[0].ttft_s,
        stream_decode_tokens_per_s_p50=statistics.median(
            (s.tokens - 1) / s.decode_s for s in samples if s.decode_s > 0
        ),
        max_gap_p50_s=statistics.median(s.max_gap_s for s in samples),
        max_gap_s=max(s.max_gap_s for s in samples),
        tokens_per_stream=statistics.fmean(s.tokens for s in samples),
        prompt_tokens=_mean([s.prompt_tokens for s in samples]),
        cached_tokens=_mean([s.cached_tokens for s in samples]),
    )


async def measure(target: Target, args: argparse.Namespace) -> list[ScenarioResult]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max(args.streams) + 1)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        # The first requests to a fresh server pay one-off costs (allocation, warm-up).
        await stream_once(http, target, make_prompt(args.prompt_words), args.max_tokens)
        results = []
        for streams in args.streams:
            for hit in [p == "hit" for p in args.prefix]:
                result = await run_scenario(http, target, streams, hit, args)
                print_row(result)
                results.append(result)
        return results


def print_row(r: ScenarioResult) -> None:
    cached = "-" if r.cached_tokens is None else f"{r.cached_tokens:.0f}"
    prompt = "-" if r.prompt_tokens is None else f"{r.prompt_tokens:.0f}"
    print(
        f"{r.target:<16} {r.streams:>7} {r.prefix:>6} {r.tokens_per_s:>9.1f} "
        f"{r.ttft_p50_s * 1000:>10.0f} {r.ttft_p90_s * 1000:>10.0f} "
        f"{r.stream_decode_tokens_per_s_p50:>9.1f} {r.max_gap_s * 1000:>8.0f} "
        f"{r.tokens_per_stream:>7.1f} {prompt:>7} {cached:>7}",
        flush=True,
    )


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def write_results(
    path: Path,
    results: list[ScenarioResult],
    target: Target,
    machine: Mapping[str, Any],
    args: argparse.Namespace,
) -> None:
    """Merge into the results file: a run replaces its target's rows and run record, so targets
    measured in separate runs stay side by side, each with the host and server it ran on."""
    doc: dict[str, Any] = {"runs": {}, "results": []}
    if path.is_file():
        doc = json.loads(path.read_text())
        doc.pop("machine", None)  # files written before runs were recorded per target
        doc.setdefault("runs", {})
    doc["runs"][target.name] = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "server": dict(target.server),
        "server_isa_caps": AVX2_CAPS if args.emulate_avx2 else {},
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "rounds": args.rounds,
    }
    doc["results"] = [r for r in doc["results"] if r["target"] != target.name]
    doc["results"] += [_rounded(asdict(r)) for r in results]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--vllm", action="store_true", help="start vLLM from .venv-vllm")
    which.add_argument("--backend", action="store_true", help="start kvfence's own backend")
    which.add_argument("--url", help="measure a running OpenAI-compatible server")
    p.add_argument("--model", default="smollm2", help="model name sent with --url")
    p.add_argument("--header", action="append", default=[], help="NAME:VALUE, repeatable")
    p.add_argument("--name", help="target name in the results (default: by kind, or the URL)")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--emulate-avx2",
        action="store_true",
        help="run the started server as on an AVX2-only CPU (ISA caps, see bench/targets.py)",
    )
    p.add_argument("--prefix", nargs="+", default=["miss", "hit"], choices=["miss", "hit"])
    p.add_argument("--cache-salt", help="send this cache_salt with every request (--url)")
    p.add_argument("--no-ignore-eos", action="store_true", help="server rejects ignore_eos")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=260, help="about 300 prompt tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--backend-model", default="smollm2", help="--model for kvfence backend")
    p.add_argument("--backend-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--backend-arg", action="append", default=[], help="extra backend option")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = describe()
    starter = vllm_target if args.vllm else backend_target if args.backend else url_target
    with starter(args) as target:
        print(json.dumps({"machine": machine, "server": target.server}))
        print(
            f"{'target':<16} {'streams':>7} {'prefix':>6} {'tokens/s':>9} {'ttft p50ms':>10} "
            f"{'ttft p90ms':>10} {'decode/s':>9} {'gap ms':>8} {'tok/str':>7} {'prompt':>7} "
            f"{'cached':>7}"
        )
        results = asyncio.run(measure(target, args))
    write_results(args.output, results, target, machine, args)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
