"""Our backend beside vLLM in one run: the roofline (bench.roofline, in a process of its own under
the servers' environment), then the streaming scenarios of bench.backend_throughput against our
backend and against vLLM, one server at a time, and the goals judged on the same run's figures.

Invariant: figures are compared only within one run; each run is recorded under its label with
the host, both servers' settings and the goals, and replaces only that label's entry.

    .venv/bin/python -m bench.backend_side_by_side --label after [--emulate-avx2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import backend_throughput as bt
from bench.machine import describe
from bench.targets import (
    AVX2_CAPS,
    REPO_ROOT,
    _dtype_arg,
    backend_target,
    server_env,
    vllm_target,
)

DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "backend_side_by_side.json"
GOALS = {
    "tokens_per_s_8_streams_vs_vllm": ">= 1.5x, miss and hit",
    "first_token_vs_vllm": "<= 0.5x in every cell",
    "batch1_decode_share_of_roofline": ">= 0.85",
}


def roofline(args: argparse.Namespace) -> dict[str, Any]:
    """bench.roofline in a fresh interpreter with the servers' caps (torch reads them at import)."""
    command = [sys.executable, "-m", "bench.roofline", "--threads", str(args.backend_threads)]
    command += ["--dtype", _dtype_arg(args.backend_arg)]
    with server_env(args) as env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        out = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench.roofline failed: {out.stderr.strip()[-2000:]}")
    parsed: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return parsed


def judge(rows: Sequence[Mapping[str, Any]], ours: str, peer: str, roof: Mapping[str, Any]) -> Any:
    """Each goal's figures from this run: our value over vLLM's per cell, and the roofline share."""
    cells: dict[tuple[int, str], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["streams"], r["prefix"]), {})[r["target"]] = r
    ratios = []
    for (streams, prefix), both in sorted(cells.items()):
        if ours not in both or peer not in both:
            continue
        a, b = both[ours], both[peer]
        ratios.append(
            {
                "streams": streams,
                "prefix": prefix,
                "tokens_per_s_ratio": round(a["tokens_per_s"] / b["tokens_per_s"], 2),
                "first_token_ratio": round(a["ttft_p50_s"] / b["ttft_p50_s"], 2),
            }
        )
    eight = [c["tokens_per_s_ratio"] for c in ratios if c["streams"] == 8]
    return {
        "cells": ratios,
        "tokens_per_s_8_streams_met": bool(eight) and min(eight) >= 1.5,
        "first_token_met": bool(ratios) and max(c["first_token_ratio"] for c in ratios) <= 0.5,
        "roofline_met": roof["decode_share_of_roofline"] >= 0.85,
    }


def measure_target(starter: Any, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Any]:
    with starter(args) as target:
        results = asyncio.run(bt.measure(target, args))
        return [bt._rounded(asdict(r)) for r in results], dict(target.server)


def write(path: Path, label: str, entry: Mapping[str, Any]) -> None:
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    doc.setdefault("runs", {})[label] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True, help="the run's key in the results file")
    p.add_argument("--emulate-avx2", action="store_true", help="both servers capped to AVX2")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--prefix", nargs="+", default=["miss", "hit"], choices=["miss", "hit"])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=260)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--backend-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--backend-arg", action="append", default=[], help="extra backend option")
    p.add_argument("--no-vllm", action="store_true", help="our backend and the roofline only")
    args = p.parse_args(argv)
    # What the throughput harness's starters read.
    args.name, args.model, args.backend_model = None, "smollm2", "smollm2"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine = describe()
    roof = roofline(args)
    print(json.dumps({"roofline": roof}), flush=True)
    rows, servers = [], {}
    targets = [("kvfence-backend", backend_target)]
    if not args.no_vllm:
        targets.append((f"vllm-cpu-{args.vllm_dtype}", vllm_target))
    for name, starter in targets:
        got, servers[name] = measure_target(starter, args)
        rows += got
    verdict = judge(rows, "kvfence-backend", f"vllm-cpu-{args.vllm_dtype}", roof)
    print(json.dumps(verdict, indent=1))
    entry = {
        "recorded_at": started,
        "command": "python -m bench.backend_side_by_side " + " ".join(sys.argv[1:]),
        "machine": machine,
        "isa_caps": AVX2_CAPS if args.emulate_avx2 else {},
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "servers": servers,
        "scenario": {k: getattr(args, k) for k in ("max_tokens", "prompt_words", "rounds")},
        "roofline": roof,
        "results": rows,
        "goals": GOALS,
        "verdict": verdict,
    }
    write(args.output, args.label, entry)
    print(f"wrote {args.output} [{args.label}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
