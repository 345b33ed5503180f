"""Requests per arm `kvfence probe` needs to reach `shared` at alpha 1e-8, by the cached-token
counter and by timing alone, on our backend (two credentials in one namespace) and on a real
vLLM behind a proxy that drops `cache_salt` (and, for timing alone, strips usage), beside the
250 per arm of Gu et al.; and how often it says `shared` on isolated endpoints (must be never).

    .venv/bin/python -m bench.probe_power                 # both targets, about 30 minutes
    .venv/bin/python -m bench.probe_power --targets backend --runs 3 --null-runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kvfence.probe.cli import probe
from kvfence.probe.client import Endpoint, Identity
from kvfence.probe.method import ProbeConfig, ProbeResult
from kvfence.probe.stats import TimingTest

DEFAULT_OUTPUT = Path(__file__).parent / "results" / "probe_power.json"
PUBLISHED_PER_ARM = 250  # Gu et al., ICML 2025: 250 hit and 250 miss procedures per test
GOAL_TIMING_PER_ARM = 20


@dataclass(frozen=True)
class Row:
    target: str
    case: str  # metadata | timing | null
    test: str
    verdict: str
    per_arm: int  # cross rounds run: requests per arm
    requests: int  # every request of the run, control and primes included
    prompt_tokens: int
    seconds: float
    p_value: float | None
    control_auc: float | None
    hit_ms: float | None
    miss_ms: float | None


def row(target: str, case: str, result: ProbeResult) -> Row:
    t = result.timing
    ms = lambda s: None if s is None else round(s * 1000, 1)  # noqa: E731
    return Row(
        target,
        case,
        str(result.config.test),
        str(result.decision.outcome),
        result.rounds,
        result.requests,
        result.tokens,
        round(result.elapsed_s, 2),
        t.p_value,
        None if t.control_auc is None else round(t.control_auc, 4),
        ms(t.cross_hit.median_s),
        ms(t.cross_miss.median_s),
    )


def machine() -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = sorted(set(re.findall(r"\b(avx512_bf16|amx_bf16|avx512f|avx2)\b", info)))
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    vllm = subprocess.run(
        [".venv-vllm/bin/python", "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "cpu_model": model.group(1) if model else platform.processor(),
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
        "torch": torch_version,
        "vllm": vllm.stdout.strip() or None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


async def run_case(
    target: str, case: str, url: str, a: Identity, b: Identity, config: ProbeConfig, runs: int
) -> list[Row]:
    rows = []
    for i in range(runs):
        result = await probe(Endpoint(url, "smollm2"), a, b, config)
        rows.append(row(target, case, result))
        r = rows[-1]
        print(
            f"{target:<20} {case:<8} {r.test:<8} run {i + 1:>2}/{runs}: {r.verdict:<12} "
            f"n/arm {r.per_arm:>3}  requests {r.requests:>4}  p {r.p_value or float('nan'):.2g}  "
            f"hit {r.hit_ms} ms  miss {r.miss_ms} ms  {r.seconds:.0f} s",
            flush=True,
        )
    return rows


async def measure_target(
    name: str,
    shared_url: str,
    stripped_url: str,
    isolated_url: str,
    ids: tuple[Identity, Identity, Identity],
    config: ProbeConfig,
    args: argparse.Namespace,
) -> list[Row]:
    """`ids`: A, B sharing A's cache at `shared_url`, and B isolated from A at `isolated_url`."""
    a, b_shared, b_isolated = ids
    rows = await run_case(name, "metadata", shared_url, a, b_shared, config, args.runs)
    for test in (TimingTest.RANK_SUM, TimingTest.KS):
        timing = replace(config, use_metadata=False, test=test)
        rows += await run_case(name, "timing", stripped_url, a, b_shared, timing, args.runs)
    null = replace(config, budget=args.null_budget)
    rows += await run_case(name, "null", isolated_url, a, b_isolated, null, args.null_runs)
    return rows


@asynccontextmanager
async def backend_urls() -> AsyncIterator[str]:
    from backend.model import load_model
    from tests.kit.namespace_proxy import backend_behind_proxy
    from tests.kit.stack import make_keys

    loaded = load_model("smollm2")
    with tempfile.TemporaryDirectory(prefix="kvfence-probe-bench-") as tmp:
        async with backend_behind_proxy(loaded, make_keys(Path(tmp))) as url:
            yield url


async def bench_backend(args: argparse.Namespace) -> list[Row]:
    from tests.kit.namespace_proxy import NAMESPACE_HEADER

    def raw(name: str, namespace: str) -> Identity:
        return Identity(name, key=f"key-{name}", headers=((NAMESPACE_HEADER, namespace),))

    config = ProbeConfig(letters=args.backend_letters, partial_letters=24, budget=args.budget)
    ids = (raw("A", "one"), raw("B", "one"), raw("B", "two"))
    async with backend_urls() as url:
        # The timing runs ignore the counter (use_metadata=False) on the same endpoint.
        return await measure_target("kvfence-backend", url, url, url, ids, config, args)


async def bench_vllm(args: argparse.Namespace) -> list[Row]:
    from tests.fakes.salt_dropping_proxy import RewritingProxy
    from tests.kit.vllm_server import running_vllm

    a = Identity("A", body=(("cache_salt", "bench-salt-a"),))
    b = Identity("B", body=(("cache_salt", "bench-salt-b"),))
    config = ProbeConfig(letters=args.vllm_letters, partial_letters=140, budget=args.budget)
    with running_vllm() as url:
        async with RewritingProxy(url) as drop, RewritingProxy(url, strip_usage=True) as strip:
            return await measure_target(
                "vllm-salt-dropping", drop.url, strip.url, url, (a, b, b), config, args
            )


def summarise(rows: Sequence[Row]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r.target, r.case, r.test) for r in rows):
        group = [r for r in rows if (r.target, r.case, r.test) == key]
        verdicts = {v: sum(r.verdict == v for r in group) for v in {r.verdict for r in group}}
        per_arm = [r.per_arm for r in group if r.verdict == "shared"]
        out.append(
            {
                "target": key[0],
                "case": key[1],
                "test": key[2],
                "runs": len(group),
                "verdicts": verdicts,
                "per_arm_to_shared_median": statistics.median(per_arm) if per_arm else None,
                "per_arm_to_shared_max": max(per_arm) if per_arm else None,
                "requests_median": statistics.median(r.requests for r in group),
                "published_per_arm": PUBLISHED_PER_ARM,
            }
        )
    return out


def print_summary(summary: list[dict[str, Any]]) -> None:
    head = f"{'target':<20} {'case':<8} {'test':<8} {'runs':>4}  {'verdicts':<34}"
    print(f"\n{head} n/arm med/max  requests")
    for s in summary:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(s["verdicts"].items()))
        n = f"{s['per_arm_to_shared_median']}/{s['per_arm_to_shared_max']}"
        print(
            f"{s['target']:<20} {s['case']:<8} {s['test']:<8} {s['runs']:>4}  {verdicts:<34} "
            f"{n:>13}  {s['requests_median']:>8}"
        )
    print(f"(Gu et al.: {PUBLISHED_PER_ARM} per arm; goal: <= {GOAL_TIMING_PER_ARM} by timing)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--targets", nargs="+", choices=["backend", "vllm"], default=["backend", "vllm"])
    p.add_argument("--runs", type=int, default=5, help="runs per shared case")
    p.add_argument("--null-runs", type=int, default=20, help="runs on each isolated endpoint")
    p.add_argument("--budget", type=int, default=50, help="cross rounds at most (shared cases)")
    p.add_argument("--null-budget", type=int, default=20, help="cross rounds of an isolated run")
    p.add_argument("--backend-letters", type=int, default=64)
    p.add_argument("--vllm-letters", type=int, default=260)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started, measured = time.time(), commit()  # the code measured, not what is checked out later
    rows: list[Row] = []
    if "backend" in args.targets:
        rows += asyncio.run(bench_backend(args))
    if "vllm" in args.targets:
        rows += asyncio.run(bench_vllm(args))
    summary = summarise(rows)
    print_summary(summary)
    doc = {
        "machine": machine(),
        "commit": measured,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "minutes": round((time.time() - started) / 60, 1),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "command": " ".join(["python -m bench.probe_power", *(argv or sys.argv[1:])]),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "alpha": ProbeConfig().alpha,
        "summary": summary,
        "runs": [asdict(r) for r in rows],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
