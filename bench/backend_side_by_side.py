"""Our backend beside vLLM in one run: the roofline (bench.roofline, in a process of its own under
the servers' environment), then the streaming scenarios of bench.backend_throughput with every
server up at once and their rounds interleaved (the order rotating each round), so load from
other work on the host falls on all of them alike; the goals are judged on the same run. Each
round starts after a pause (`--settle-s`): a server's work after its last answer (vLLM's engine
keeps a core busy for about a second) must not land on the next server's round.

Invariant: figures are compared only within one run; each run is recorded under its label with
the host, every server's settings and the goals, and replaces only that label's entry.
`--compare DIR` adds our backend from another checkout (say, an export of main) as a third
server, with its own roofline. Servers start in that order (ours, the other checkout, vLLM);
`--start-reversed` starts them the other way round: on a shared VM the server started first
has run 4-20% slower than an identical one started after it (bench/README.md).

    .venv/bin/python -m bench.backend_side_by_side --label after [--compare DIR] [--emulate-avx2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench import backend_throughput as bt
from bench.hog import cpu_hog
from bench.machine import describe
from bench.targets import (
    AVX2_CAPS,
    REPO_ROOT,
    Target,
    _dtype_arg,
    backend_target,
    server_env,
    vllm_target,
)

DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "backend_side_by_side.json"
ROOFLINE_GOAL = 0.60  # batch-1 decode's share of the memory roofline
GOALS = {
    "tokens_per_s_8_streams_vs_vllm": ">= 1.5x, miss and hit",
    "first_token_vs_vllm": "<= 0.5x in every cell",
    "batch1_decode_share_of_roofline": f">= {ROOFLINE_GOAL:.2f}",
}


def roofline(args: argparse.Namespace, root: Path = REPO_ROOT) -> dict[str, Any]:
    """bench.roofline of the checkout at `root`, in a fresh interpreter with the servers' caps
    (torch reads them at import)."""
    command = [sys.executable, "-m", "bench.roofline", "--threads", str(args.backend_threads)]
    command += ["--dtype", _dtype_arg(args.backend_arg)]
    command += ["--steps", str(args.roofline_steps), "--runs", str(args.roofline_runs)]
    with server_env(args) as env:
        paths = (str(root), str(REPO_ROOT), env.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        out = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True)
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
        "roofline_met": roof["decode_share_of_roofline_best"] >= ROOFLINE_GOAL,
    }


async def interleaved(targets: list[Target], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every scenario's rounds, each round run on every target in turn (the first one rotating),
    so a burst of other work on the host lands on each target about equally."""
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    timeout=timeout, connector=aiohttp.TCPConnector(limit=max(args.streams) + 1)
                )
            )
            for _ in targets
        ]
        for http, target in zip(sessions, targets, strict=True):  # one-off costs of a fresh server
            await bt.stream_once(http, target, bt.make_prompt(args.prompt_words), args.max_tokens)
        rows = []
        for streams in args.streams:
            for hit in [p == "hit" for p in args.prefix]:
                got: list[list[bt.StreamSample]] = [[] for _ in targets]
                wall = [0.0 for _ in targets]
                for r in range(args.rounds):
                    for k in range(len(targets)):
                        i = (k + r) % len(targets)
                        await asyncio.sleep(args.settle_s)
                        samples, seconds = await bt.run_round(
                            sessions[i], targets[i], streams, hit, args
                        )
                        got[i] += samples
                        wall[i] += seconds
                for i, target in enumerate(targets):
                    result = bt.summarize(target.name, streams, hit, args.rounds, got[i], wall[i])
                    bt.print_row(result)
                    rows.append(bt._rounded(asdict(result)))
        return rows


def write(path: Path, label: str, entry: Mapping[str, Any]) -> None:
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    doc.setdefault("runs", {})[label] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", required=True, help="the run's key in the results file")
    p.add_argument("--emulate-avx2", action="store_true", help="both servers capped to AVX2")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--prefix", nargs="+", default=["miss", "hit"], choices=["miss", "hit"])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=260)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--settle-s", type=float, default=2.0, help="pause before each server's round (seconds)"
    )
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--backend-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--backend-arg", action="append", default=[], help="extra backend option")
    p.add_argument("--no-vllm", action="store_true", help="our backend and the roofline only")
    p.add_argument("--roofline-steps", type=int, default=64, help="decode steps per timed run")
    p.add_argument("--roofline-runs", type=int, default=5, help="timed batch-1 decode runs")
    p.add_argument(
        "--hog", action="store_true", help="a CPU hog on every core for the whole run (bench.hog)"
    )
    p.add_argument("--compare", type=Path, help="also our backend from this checkout")
    p.add_argument("--compare-name", default="before", help="its name: kvfence-backend@NAME")
    p.add_argument(
        "--start-reversed",
        action="store_true",
        help="start the servers in reverse order (vLLM first, our backend last): on some hosts "
        "the server started first runs slower, so a fair comparison takes both orders",
    )
    args = p.parse_args(argv)
    # What the throughput harness's starters read.
    args.name, args.model, args.backend_model = None, "smollm2", "smollm2"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine = describe()
    with cpu_hog(None if args.hog else 0) as hogs:
        entry = measured(args, hogs)
    words = sys.argv[1:] if argv is None else list(argv)
    entry = {
        "recorded_at": started,
        "command": "python -m bench.backend_side_by_side " + " ".join(words),
        "machine": machine,
        **entry,
    }
    write(args.output, args.label, entry)
    print(f"wrote {args.output} [{args.label}]")
    return 0


def start_all(
    stack: contextlib.ExitStack,
    starters: Sequence[Callable[[], contextlib.AbstractContextManager[Target]]],
    reverse: bool,
) -> list[Target]:
    """Every server started and kept up until `stack` closes: in the starters' order, or the
    last first with `reverse`. The targets come back in the starters' order either way."""
    order = list(reversed(starters)) if reverse else list(starters)
    started = [stack.enter_context(start()) for start in order]
    return started[::-1] if reverse else started


def measured(args: argparse.Namespace, hogs: int) -> dict[str, Any]:
    """The rooflines, every server's rows and the goals judged on them (`hogs` busy processes
    beside the whole run)."""
    roofs = {"kvfence-backend": roofline(args)}
    if args.compare:
        roofs[f"kvfence-backend@{args.compare_name}"] = roofline(args, args.compare.resolve())
    print(json.dumps({"roofline": roofs}), flush=True)
    peer = f"vllm-cpu-{args.vllm_dtype}"
    with contextlib.ExitStack() as stack:
        starters = [lambda: backend_target(args)]
        if args.compare:
            root, name = args.compare.resolve(), f"kvfence-backend@{args.compare_name}"
            starters.append(lambda: backend_target(args, root, name))
        if not args.no_vllm:
            starters.append(lambda: vllm_target(args))
        targets = start_all(stack, starters, args.start_reversed)
        servers = {t.name: dict(t.server) for t in targets}
        start_order = [t.name for t in (targets[::-1] if args.start_reversed else targets)]
        rows = asyncio.run(interleaved(targets, args))
    verdict = {name: judge(rows, name, peer, roof) for name, roof in roofs.items()}
    print(json.dumps(verdict, indent=1))
    return {
        "hog_processes": hogs,
        "isa_caps": AVX2_CAPS if args.emulate_avx2 else {},
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "servers": servers,
        "start_order": start_order,
        "scenario": {
            k: getattr(args, k) for k in ("max_tokens", "prompt_words", "rounds", "settle_s")
        },
        "roofline": roofs,
        "results": rows,
        "goals": GOALS,
        "verdict": verdict,
    }


if __name__ == "__main__":
    raise SystemExit(main())
