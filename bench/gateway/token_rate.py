"""Streaming at a GPU's token rate: `--streams` chat streams at once, each `--tokens` token events
`--gap-ms` apart (200 x 200 x 10 ms by default: 20,000 events/s offered), from the paced upstream
through (a) the bare aiohttp relay and (b) a one-worker `kvfence gateway` as users run it (the
audit log on, `fsync: always`), side by side in one run, and with `--compare REV` also through
the gateway code of REV. Per target: token events delivered per second, the relay process's
CPU per event, and each event's latency from the upstream's write to the client's read.
Run: .venv/bin/python -m bench.gateway.token_rate [--compare main] [--streams 100] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import machine
from bench.gateway import procs, token_profile
from bench.gateway.token_legs import HEADER, Leg, Shape, Target, line, measure

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "token_rate.json"
FLOOR = "aiohttp-floor"
GOALS = {"cpu_vs_floor": 1.5, "events_per_s": 20000, "added_p99_ms": 5.0}


def summarize(legs: list[Leg]) -> list[dict[str, Any]]:
    """Per target, the median over rounds; a gateway's figures against the floor's."""
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(leg.target for leg in legs):
        mine = [leg for leg in legs if leg.target == name]
        row: dict[str, Any] = {"target": name, "rounds": len(mine)}
        for key in ("events_per_s", "cpu_us", "system_us", "wait_us", "p50_ms", "p99_ms"):
            row[key] = statistics.median(getattr(leg, key) for leg in mine)
        row["errors"] = sum(leg.errors for leg in mine)
        rows.append(row)
    floor = next((r for r in rows if r["target"] == FLOOR), None)
    for row in rows:
        if floor is not None and row is not floor:
            row["cpu_vs_floor"] = row["cpu_us"] / floor["cpu_us"]
            row["added_p50_ms"] = row["p50_ms"] - floor["p50_ms"]
            row["added_p99_ms"] = row["p99_ms"] - floor["p99_ms"]
            row["goals_met"] = {
                "cpu_vs_floor": row["cpu_vs_floor"] <= GOALS["cpu_vs_floor"],
                "events_per_s": row["events_per_s"] >= GOALS["events_per_s"],
                "added_p99_ms": row["added_p99_ms"] <= GOALS["added_p99_ms"],
            }
    return rows


def _print_summary(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'target':<22}{'events/s':>10}{'cpu us':>8}{'x floor':>8}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'+p50':>8}{'+p99':>8}{'err':>5}"
    )
    for r in rows:
        extra = (
            f"{r['cpu_vs_floor']:>8.2f}" if "cpu_vs_floor" in r else f"{'-':>8}",
            f"{r['added_p50_ms']:>8.2f}" if "added_p50_ms" in r else f"{'-':>8}",
            f"{r['added_p99_ms']:>8.2f}" if "added_p99_ms" in r else f"{'-':>8}",
        )
        print(
            f"{r['target']:<22}{r['events_per_s']:>10.0f}{r['cpu_us']:>8.1f}{extra[0]}"
            f"{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{extra[1]}{extra[2]}{r['errors']:>5}"
        )
    print(f"goals: {GOALS} (events/s judged only at the default offered rate)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200, help="streams open at once (<= 250)")
    parser.add_argument("--tokens", type=int, default=200, help="token events per stream")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="between a stream's tokens")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per leg")
    parser.add_argument("--warmup", type=float, default=1.0, help="after every stream started")
    parser.add_argument("--rounds", type=int, default=2, help="each target once per round")
    parser.add_argument("--compare", metavar="REV", help="also the gateway code of REV")
    parser.add_argument("--no-floor", dest="floor", action="store_false")
    parser.add_argument("--spy", action="store_true", help="then py-spy this tree's gateway")
    parser.add_argument("--profile", action="store_true", help="then cProfile one of this tree")
    parser.add_argument("--top", type=int, default=25, help="functions listed by a profile")
    parser.add_argument("--keep-stacks", type=Path, help="write --spy's collapsed stacks here")
    parser.add_argument("--keep-profile", type=Path, help="copy --profile's pstats file here")
    parser.add_argument("--nice", type=int, default=0, help="niceness of every process (root)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser


def _targets(
    args: argparse.Namespace, stack: contextlib.ExitStack, up: procs.Server
) -> list[Target]:
    """The floor, this tree's gateway and, with --compare, REV's; all on core 1."""
    targets: list[Target] = []
    if args.floor:
        url = f"http://127.0.0.1:{up.port}"
        targets.append(Target(FLOOR, stack.enter_context(procs.floor(url, 1, args.nice)), ""))
    trees: list[tuple[str, Path | None]] = [("gateway", None)]
    if args.compare:
        before = stack.enter_context(procs.exported(REPO_ROOT, args.compare))
        trees.append((f"gateway@{args.compare}", before))
    for name, tree in trees:
        server, key = stack.enter_context(
            procs.gateway(
                up.port,
                1,
                args.nice,
                tree,
                gateway_lines=token_profile.AUDIT,
                env_extra=token_profile.audit_env(),
            )
        )
        targets.append(Target(name, server, key))
    return targets


def _profiles(
    args: argparse.Namespace,
    shape: Shape,
    up: procs.Server,
    targets: list[Target],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mine = next(t for t in targets if t.name == "gateway")
    if args.spy:
        out["py-spy"] = token_profile.spy(shape, mine, up, args.top, args.keep_stacks)
    if args.profile:
        cpu_us = next((r["cpu_us"] for r in rows if r["target"] == "gateway"), None)
        out["cProfile"] = token_profile.cprofile(
            shape, up, args.nice, args.top, cpu_us, args.keep_profile
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.streams <= 250:  # the gateway's default allows 256 connections per address
        raise SystemExit("--streams must be between 1 and 250")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the servers
    host, started = machine.describe(torch_info=False), time.time()
    shape = Shape(args.streams, args.tokens, args.gap_ms, args.seconds, args.warmup)
    print(
        f"{shape.streams} streams x {shape.tokens} tokens, {shape.gap_ms:g} ms apart: "
        f"{shape.offered:.0f} events/s offered; {shape.seconds:g} s windows; "
        f"{host['cpu_model']}, {host['cores']} cores",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(procs.paced_upstream(0, args.tokens, args.gap_ms, args.nice))
        targets = _targets(args, stack, up)
        procs.place(0, args.nice)  # the client beside the upstream, off the relays' core
        print(HEADER, flush=True)
        legs: list[Leg] = []
        for round_ in range(args.rounds):
            for target in targets:
                print(f"round {round_ + 1}/{args.rounds}: {target.name}", file=sys.stderr)
                legs.append(measure(shape, target, up, round_))
                print(line(legs[-1]), flush=True)
        rows = summarize(legs)
        profiles = _profiles(args, shape, up, targets, rows)
    _print_summary(rows)
    result = {
        "machine": host,
        "setup": {
            "source": procs.source_state(REPO_ROOT),
            "compare": (
                {"rev": args.compare, "commit": procs.commit_of(REPO_ROOT, args.compare)}
                if args.compare
                else None
            ),
            "shape": asdict(shape),
            "offered_events_per_s": shape.offered,
            "rounds": args.rounds,
            "pinning": {"relays": 1, "upstream and client": 0},
            "gateway": "kvfence gateway --workers 1 --log-level warning, access_log: false, "
            "audit log on (fsync: always), one vllm-kind backend, verify.canary: false",
            "latency": "per token event: the client's CLOCK_MONOTONIC at its read minus the "
            "upstream's at its write (stamped in the event); queueing included",
            "wall_s": round(time.time() - started, 1),
        },
        "summary": rows,
        "profiles": profiles,
        "legs": [asdict(leg) for leg in legs],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
