"""The figure a user would get: an external load tool (hey at a fixed rate, wrk or hey at the
highest rate) against a static nginx upstream directly, through nginx as a plain proxy, and
through real `kvfence gateway`s (bare, and as users run it: the audit log on, `fsync: always`;
and `fsync: batch`; with `--configs budget`, as users run it for a tenant with a token
budget), in one run, with each gateway's CPU time per request, peak memory, cold
start, and (`--components`) where its CPU goes.
Run: .venv/bin/python -m bench.gateway.side_by_side [--compare main] [--rounds 2] [--floor]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/gateway/side_by_side.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import machine
from bench.gateway import components, drivers, litellm, nginx, procs
from bench.gateway.drivers import Load, Target
from bench.gateway.traffic import scenarios

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "gateway_side_by_side.json"
REFERENCES = ("direct", "nginx")  # the hops the others are compared with
MODEL_SSE = "smollm2-sse"  # its own backend: nginx cannot pick an answer by the body
PATHS = {"responses": "/v1/responses"}  # the others are chat completions
_AUDIT = "  audit_log: {path: audit.jsonl, key: {env: KVFENCE_BENCH_AUDIT_KEY}%s}\n"
_BUDGET = "    budgets: {day: 1000000000000000}\n"  # never spent: every request is admitted
# Gateway configurations: the target's name, what it is, its policy's `gateway:` lines, the
# tenant's own lines.
CONFIGS = {
    "bare": ("gateway", "no audit log", "", ""),
    "default": ("gateway-default", "audit log, fsync: always (the default)", _AUDIT % "", ""),
    "batch": ("gateway-batch", "audit log, fsync: batch", _AUDIT % ", fsync: batch", ""),
    "budget": (
        "gateway-budget",
        "audit log, fsync: always, and a daily token budget (the embedded control database)",
        _AUDIT % "",
        _BUDGET,
    ),
}
FLOOR = "aiohttp-floor"
GOALS = {
    "cpu_us_per_request": 200,
    "rps_per_worker": 5000,
    "added_p50_ms": 0.3,
    "added_p99_ms": 1.0,
}


@dataclass(frozen=True, slots=True)
class Hop:
    """One target: its URL, and the pid whose process tree's CPU time is charged to it."""

    name: str
    url: str
    pid: int | None
    key: str  # each gateway mints its own tenant key; the other hops ignore it


@dataclass(frozen=True, slots=True)
class Run:
    scenario: str
    mode: str  # "rate" (hey -q) or "max"
    target: str
    round: int
    load: Load
    cost: Cost | None  # the gateway's rows only


@dataclass(frozen=True, slots=True)
class Cost:
    """The gateway's time per answered request, in microseconds."""

    cpu_us: float  # user + system
    system_us: float  # of which in the kernel (syscalls, the network stack)
    wait_us: float  # runnable but waiting for its core (other processes had it)


def _body(scenario: str) -> bytes:
    if scenario == "responses":
        doc = {"model": procs.MODEL, "input": "Say hello in three words.", "max_output_tokens": 16}
        return json.dumps(doc).encode()
    body = scenarios()[scenario].body
    return body.replace(b'"smollm2"', f'"{MODEL_SSE}"'.encode()) if "sse" in scenario else body


def _measure(
    hop: Hop, drive: Drive, body: bytes, core: int | None, nice: int
) -> tuple[Load, Cost | None]:
    headers = {"Authorization": f"Bearer {hop.key}", "Content-Type": "application/json"}
    if hop.pid is None:
        return drive(hop.url, Target(body, headers, core, nice)), None
    (user, system), wait = procs.tree_cpu_split(hop.pid), procs.runqueue_wait_seconds(hop.pid)
    load = drive(hop.url, Target(body, headers, core, nice))
    if not load.completed:
        return load, None
    user_after, system_after = procs.tree_cpu_split(hop.pid)
    wait = procs.runqueue_wait_seconds(hop.pid) - wait
    per = 1e6 / load.completed
    cpu = (user_after - user + system_after - system) * per
    return load, Cost(cpu, (system_after - system) * per, wait * per)


Drive = Callable[[str, Target], Load]


def _drivers(args: argparse.Namespace) -> dict[str, Drive]:
    def at_rate(url: str, target: Target) -> Load:
        return drivers.hey(url, target, args.conns, args.seconds, args.rate)

    def at_max(url: str, target: Target) -> Load:
        if args.max_tool == "wrk":
            return drivers.wrk(url, target, args.max_conns, args.seconds)
        return drivers.hey(url, target, args.max_conns, args.seconds)

    return {"rate": at_rate, "max": at_max}


Gateways = dict[str, tuple[procs.Server, str]]


Floors = dict[bool, procs.Server]  # by streaming: each relays one nginx port


def _hops(
    ng: nginx.Nginx, gateways: Gateways, scenario: str, floors: Floors, peers: Gateways
) -> list[Hop]:
    path, sse = PATHS.get(scenario, "/v1/chat/completions"), "sse" in scenario
    up, proxy = (ng.sse_port, ng.proxy_sse_port) if sse else (ng.json_port, ng.proxy_json_port)
    key = next(iter(gateways.values()))[1]
    hops = [Hop("direct", f"http://127.0.0.1:{up}{path}", None, key)]
    hops.append(Hop("nginx", f"http://127.0.0.1:{proxy}{path}", None, key))
    if sse in floors:
        floor = floors[sse]
        hops.append(Hop(FLOOR, f"http://127.0.0.1:{floor.port}{path}", floor.pid, key))
    for name, (server, own_key) in [*gateways.items(), *peers.items()]:
        if name == "litellm" and scenario == "responses":
            continue  # its /v1/responses calls the upstream's own, a different hop count
        hops.append(Hop(name, f"http://127.0.0.1:{server.port}{path}", server.pid, own_key))
    return hops


def _run_all(
    args: argparse.Namespace, ng: nginx.Nginx, gateways: Gateways, floors: Floors, peers: Gateways
) -> list[Run]:
    core = 0 if args.pin else None
    runs: list[Run] = []
    for scenario in args.scenario:
        body = _body(scenario)
        hops = _hops(ng, gateways, scenario, floors, peers)
        for hop in hops:  # warm-up: connections, caches, the gateway's first requests
            warm = Target(body, {"Authorization": f"Bearer {hop.key}"}, core, args.nice)
            drivers.hey(hop.url, warm, args.conns, 1.0, args.rate)
        for round_ in range(args.rounds):
            for mode, drive in _drivers(args).items():
                if mode not in args.mode:
                    continue
                for hop in hops:
                    load, cost = _measure(hop, drive, body, core, args.nice)
                    runs.append(Run(scenario, mode, hop.name, round_, load, cost))
                    print(_line(runs[-1]), flush=True)
    return runs


def _line(run: Run) -> str:
    c = run.cost
    cpu, sys_, wait = (
        (f"{c.cpu_us:9.0f}", f"{c.system_us:8.0f}", f"{c.wait_us:8.0f}")
        if c is not None
        else (f"{'-':>9}", f"{'-':>8}", f"{'-':>8}")
    )
    load = run.load
    return (
        f"{run.scenario:<10}{run.mode:<5}{run.target:<24}{run.round:>3}{load.completed:>8}"
        f"{load.errors:>6}{load.rps:>9.0f}{load.p50_ms:>8.3f}{load.p99_ms:>8.3f}{cpu}{sys_}{wait}"
    )


def summarize(runs: list[Run], workers: int) -> list[dict[str, Any]]:
    """Per scenario, mode and target: medians over rounds, and what it adds over nginx."""
    keys = dict.fromkeys((r.scenario, r.mode, r.target) for r in runs)
    rows: list[dict[str, Any]] = []
    for scenario, mode, target in keys:
        mine = [r for r in runs if (r.scenario, r.mode, r.target) == (scenario, mode, target)]
        costs = [r.cost for r in mine if r.cost is not None]
        cpu = [c.cpu_us for c in costs]
        rows.append(
            {
                "scenario": scenario,
                "mode": mode,
                "target": target,
                "rounds": len(mine),
                "errors": sum(r.load.errors for r in mine),
                "rps": statistics.median(r.load.rps for r in mine),
                "p50_ms": statistics.median(r.load.p50_ms for r in mine),
                "p99_ms": statistics.median(r.load.p99_ms for r in mine),
                "cpu_us_per_request": statistics.median(cpu) if cpu else None,
                "system_us_per_request": (
                    statistics.median(c.system_us for c in costs) if costs else None
                ),
                "wait_us_per_request": statistics.median(c.wait_us for c in costs)
                if costs
                else None,
                # What one fully used core would serve at that CPU cost (contention aside).
                "cpu_bound_rps": 1e6 / statistics.median(cpu) if cpu else None,
                "rps_per_worker": (
                    statistics.median(r.load.rps for r in mine) / workers
                    if target not in REFERENCES
                    else None
                ),
            }
        )
    for row in rows:
        base = next(
            (r for r in rows if (r["scenario"], r["mode"], r["target"]) == (*_sm(row), "nginx")),
            None,
        )
        if base is not None and row["target"] not in REFERENCES:
            row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
            row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"]
    return rows


def _sm(row: dict[str, Any]) -> tuple[str, str]:
    return row["scenario"], row["mode"]


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's goals, judged on its small non-streamed rows (this tree)."""

    def find(mode: str) -> dict[str, Any]:
        return next(
            (
                r
                for r in rows
                if (r["scenario"], r["mode"], r["target"]) == ("small", mode, "gateway")
            ),
            {},
        )

    rate, top = find("rate"), find("max")
    figures = {
        "cpu_us_per_request": rate.get("cpu_us_per_request"),
        "rps_per_worker": top.get("rps_per_worker"),
        "added_p50_ms": rate.get("added_p50_ms"),
        "added_p99_ms": rate.get("added_p99_ms"),
    }
    out: dict[str, Any] = {}
    for name, goal in GOALS.items():
        value = figures[name]
        met = (
            None
            if value is None
            else (value >= goal if name == "rps_per_worker" else value <= goal)
        )
        out[name] = {"goal": goal, "measured": value, "met": met}
    return out


def _row(rows: list[dict[str, Any]], scenario: str, mode: str, target: str) -> dict[str, Any]:
    return next(
        (r for r in rows if (r["scenario"], r["mode"], r["target"]) == (scenario, mode, target)),
        {},
    )


def leads(rows: list[dict[str, Any]], fsync: dict[str, float]) -> dict[str, Any]:
    """The audit's cost and the CPU against the bare aiohttp relay, judged against their goals:
    CPU per request within 1.5x of the floor (plain and streamed, at the rate and the highest
    rate); the default configuration's added p50 at the rate within one sync of the bare
    gateway's; its highest rate within 15% of `fsync: batch`'s."""
    out: dict[str, Any] = {"cpu_vs_floor": {}, "fsync_p50_ms": fsync.get("p50_ms")}
    for target in (CONFIGS["bare"][0], CONFIGS["default"][0]):
        for scenario in ("small", "small-sse"):
            for mode in ("rate", "max"):
                mine = _row(rows, scenario, mode, target).get("cpu_us_per_request")
                floor = _row(rows, scenario, mode, FLOOR).get("cpu_us_per_request")
                ratio = mine / floor if mine and floor else None
                out["cpu_vs_floor"][f"{target} {scenario} {mode}"] = {
                    "cpu_us": mine,
                    "floor_cpu_us": floor,
                    "ratio": ratio,
                    "met": None if ratio is None else ratio <= 1.5,
                }
    for scenario in ("small", "small-sse", "responses"):
        bare = _row(rows, scenario, "rate", CONFIGS["bare"][0]).get("p50_ms")
        default = _row(rows, scenario, "rate", CONFIGS["default"][0]).get("p50_ms")
        added = default - bare if default is not None and bare is not None else None
        sync = fsync.get("p50_ms")
        out[f"audit_added_p50_ms {scenario}"] = {
            "measured": added,
            "goal": sync,
            "met": None if added is None or sync is None else added <= sync,
        }
        top = _row(rows, scenario, "max", CONFIGS["default"][0]).get("rps")
        batch = _row(rows, scenario, "max", CONFIGS["batch"][0]).get("rps")
        share = top / batch if top and batch else None
        out[f"always_vs_batch_max_rps {scenario}"] = {
            "measured": share,
            "goal": 0.85,
            "met": None if share is None else share >= 0.85,
        }
    return out


def _components(
    args: argparse.Namespace, ng: nginx.Nginx, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The default configuration under cProfile at the rate, per scenario: each component's
    share of the loop thread's self time, applied to the same scenario's unprofiled CPU per
    request (cProfile's own cost inflates the absolute times, less their shares), and the audit
    writer thread's CPU, writes and syncs per request, measured without the profiler's help."""
    out: dict[str, Any] = {}
    core = 0 if args.pin else None
    models = {procs.MODEL: ng.json_port, MODEL_SSE: ng.sse_port}
    for scenario in [s for s in args.scenario if s in ("small", "small-sse", "responses")]:
        with tempfile.TemporaryDirectory(prefix="kvfence-prof-") as tmp:
            prefix = Path(tmp) / "gateway"
            wrapper = ("-m", "bench.gateway.components", str(prefix))
            with procs.gateway(
                0,
                1 if args.pin else None,
                args.nice,
                models=models,
                gateway_lines=CONFIGS["default"][2],
                env_extra=_audit_env(),
                wrapper=wrapper,
            ) as (server, key):
                url = _hops(ng, {"profiled": (server, key)}, scenario, {}, {})[-1].url
                hop, body = Hop("profiled", url, server.pid, key), _body(scenario)
                warm = Target(body, {"Authorization": f"Bearer {key}"}, core, args.nice)
                drivers.hey(hop.url, warm, args.conns, 1.0, args.rate)
                os.kill(server.pid, signal.SIGUSR1)
                load, cost = _measure(hop, _drivers(args)["rate"], body, core, args.nice)
                os.kill(server.pid, signal.SIGUSR2)
                seen = components.written(prefix.with_suffix(".json"))
                share = components.shares(prefix.with_suffix(".prof"))
                if args.profiles is not None:
                    args.profiles.mkdir(parents=True, exist_ok=True)
                    kept = args.profiles / f"gateway-default-{scenario}.prof"
                    shutil.copyfile(prefix.with_suffix(".prof"), kept)
        plain = _row(rows, scenario, "rate", CONFIGS["default"][0]).get("cpu_us_per_request")
        done = max(load.completed, 1)
        out[scenario] = {
            "requests": load.completed,
            "profiled_cpu_us_per_request": cost.cpu_us if cost else None,
            "unprofiled_cpu_us_per_request": plain,
            "loop_shares": share,
            "loop_us_per_request": {k: v * plain for k, v in share.items()} if plain else None,
            "audit_writer_thread_cpu_us_per_request": seen["writer_cpu_s"] * 1e6 / done,
            "audit_records_per_request": seen["writes"] / done,
            "audit_syncs_per_request": seen["syncs"] / done,
            "audit_records_per_sync": seen["writes"] / max(seen["syncs"], 1),
            "audit_head_moves_per_request": seen["marks"] / done,
        }
        print(f"\ncomponents, {scenario} (default configuration, {load.completed} requests):")
        for name, value in share.items():
            us = f"{value * plain:6.0f} us" if plain else ""
            print(f"  {name:<42}{value:6.1%} {us}")
        mine = out[scenario]
        writer = mine["audit_writer_thread_cpu_us_per_request"]
        per_sync = mine["audit_records_per_sync"]
        print(f"  audit writer thread: {writer:.0f} us/request, {per_sync:.1f} records per sync")
    return out


def _audit_env() -> dict[str, str]:
    return {"KVFENCE_BENCH_AUDIT_KEY": secrets.token_urlsafe(32)}


def _print_summary(rows: list[dict[str, Any]], judged: dict[str, Any]) -> None:
    print(
        f"\n{'scenario':<10}{'mode':<5}{'target':<24}{'rps':>8}{'p50ms':>8}{'p99ms':>8}"
        f"{'+p50':>8}{'+p99':>8}{'cpu us':>8}{'rps/wk':>8}{'rps/cpu':>8}{'err':>5}"
    )
    for r in rows:

        def fmt(v: float | None, spec: str) -> str:
            return format(v, spec) if v is not None else f"{'-':>8}"

        print(
            f"{r['scenario']:<10}{r['mode']:<5}{r['target']:<24}{r['rps']:>8.0f}"
            f"{r['p50_ms']:>8.3f}{r['p99_ms']:>8.3f}{fmt(r.get('added_p50_ms'), '>8.3f')}"
            f"{fmt(r.get('added_p99_ms'), '>8.3f')}{fmt(r['cpu_us_per_request'], '>8.0f')}"
            f"{fmt(r['rps_per_worker'], '>8.0f')}{fmt(r['cpu_bound_rps'], '>8.0f')}{r['errors']:>5}"
        )
    print("\ngoals (small, non-streamed, this tree's gateway):")
    for name, g in judged.items():
        state = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        print(f"  {name:<20} goal {g['goal']:<6} measured {g['measured']}  {state}")


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for tool, flag in (("nginx", "-v"), ("wrk", "-v")):
        if shutil.which(tool):
            done = subprocess.run([tool, flag], capture_output=True, text=True, check=False)
            out[tool] = (done.stdout + done.stderr).strip().splitlines()[0]
    out["hey"] = "hey (no version flag)" if shutil.which("hey") else "missing"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=500, help="hey's total rate (req/s)")
    parser.add_argument("--conns", type=int, default=5, help="hey's connections at --rate")
    parser.add_argument("--max-conns", type=int, default=50, help="connections at the max rate")
    parser.add_argument("--max-tool", choices=("wrk", "hey"), default="wrk")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--scenario", nargs="+", default=["small", "small-sse", "responses"])
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=["bare", "default", "batch"],
        help="gateway configurations: bare (no audit log), default, batch (fsync: batch), "
        "budget (default, and the tenant has a daily token budget)",
    )
    parser.add_argument(
        "--components",
        action="store_true",
        help="then profile the default configuration at --rate: CPU per component",
    )
    parser.add_argument("--profiles", type=Path, help="keep the --components profiles here")
    parser.add_argument("--litellm", type=Path, help="also LiteLLM's proxy (its executable)")
    parser.add_argument("--mode", nargs="+", choices=("rate", "max"), default=["rate", "max"])
    parser.add_argument("--compare", metavar="REV", help="also run the gateway code of REV")
    parser.add_argument(
        "--floor", action="store_true", help="also a bare aiohttp relay (bench.gateway.floor)"
    )
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="no core pinning")
    parser.add_argument("--nice", type=int, default=0, help="niceness of every process (root)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    # The servers run in sessions of their own (see procs.place): a terminal's signals miss
    # them, so a stopped harness must unwind its contexts to stop them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    missing = drivers.ensure_tools()
    if missing:
        print(f"missing {' '.join(missing)}; install with: {' '.join(drivers.INSTALL)}")
        return 2
    host = machine.describe(torch_info=False)
    started = time.time()
    gw_core = 1 if args.pin else None
    per_conn = args.rate / args.conns
    with contextlib.ExitStack() as stack:
        ng = stack.enter_context(
            nginx.serve(str(shutil.which("nginx")), 0 if args.pin else None, args.nice)
        )
        models = {procs.MODEL: ng.json_port, MODEL_SSE: ng.sse_port}
        gateways: Gateways = {}
        for config in args.configs:
            name, _, lines, tenant = CONFIGS[config]
            gateways[name] = stack.enter_context(
                procs.gateway(
                    0,
                    gw_core,
                    args.nice,
                    models=models,
                    workers=args.workers,
                    gateway_lines=lines,
                    tenant_lines=tenant,
                    env_extra=_audit_env(),
                )
            )
        if args.compare:  # each configuration again, with the gateway code of REV
            tree = stack.enter_context(procs.exported(REPO_ROOT, args.compare))
            for config in args.configs:
                name, _, lines, tenant = CONFIGS[config]
                gateways[f"{name}@{args.compare}"] = stack.enter_context(
                    procs.gateway(
                        0,
                        gw_core,
                        args.nice,
                        tree,
                        models=models,
                        workers=args.workers,
                        gateway_lines=lines,
                        tenant_lines=tenant,
                        env_extra=_audit_env(),
                    )
                )
        print(
            f"{'scenario':<10}{'mode':<5}{'target':<24}{'rnd':>3}{'ok':>8}{'err':>6}"
            f"{'rps':>9}{'p50ms':>8}{'p99ms':>8}{'cpu us':>9}{'sys us':>8}{'wait us':>8}"
        )
        floors: Floors = {}
        if args.floor:
            for sse, port in ((False, ng.json_port), (True, ng.sse_port)):
                url = f"http://127.0.0.1:{port}"
                floors[sse] = stack.enter_context(procs.floor(url, gw_core, args.nice))
        peers: Gateways = {}
        if args.litellm:
            peers["litellm"] = stack.enter_context(
                litellm.proxy(args.litellm, models, gw_core, args.nice)
            )
        fsync = procs.fsync_latency(Path(tempfile.gettempdir()))
        print(f"fsync of a 4 KiB write in {tempfile.gettempdir()}: {fsync}", flush=True)
        runs = _run_all(args, ng, gateways, floors, peers)
        servers = {
            name: {"cold_start_s": server.ready_s, "peak_rss_mib": procs.peak_rss_mib(server.pid)}
            for name, (server, _) in [*gateways.items(), *peers.items()]
        }
        for sse, floor in floors.items():
            servers[f"{FLOOR}{'-sse' if sse else ''}"] = {
                "peak_rss_mib": procs.peak_rss_mib(floor.pid)
            }
        rows = summarize(runs, args.workers)
        parts = _components(args, ng, rows) if args.components else None
    judged = goals(rows)
    _print_summary(rows, judged)
    cpu_goals = leads(rows, fsync)
    print("\nservers:", json.dumps(servers, indent=1))
    print("goals, per scenario:", json.dumps(cpu_goals, indent=1))
    result = {
        "machine": host,
        "tools": _versions(),
        "setup": {
            "source": procs.source_state(REPO_ROOT),
            "compare": (
                {"rev": args.compare, "commit": procs.commit_of(REPO_ROOT, args.compare)}
                if args.compare
                else None
            ),
            "pinning": {"gateway": gw_core, "nginx and load tool": 0 if args.pin else None},
            "gateway": f"kvfence gateway --workers {args.workers} --log-level warning, "
            "access_log: false, vllm-kind backends, verify.canary: false (nginx has no cache "
            "to probe; the detective and the marker scan stay on)",
            "configs": {CONFIGS[c][0]: CONFIGS[c][1] for c in args.configs},
            "audit_folder": tempfile.gettempdir(),
            "rate_run": f"hey -c {args.conns} -q {per_conn:g} (total {args.rate} req/s)",
            "max_run": f"{args.max_tool} {args.max_conns} connections",
            "nice": args.nice,
            "latency_resolution_ms": 0.1,  # hey's CSV prints seconds with 4 decimals
            "seconds": args.seconds,
            "rounds": args.rounds,
            "wall_s": round(time.time() - started, 1),
        },
        "fsync_4k": fsync,
        "servers": servers,
        "summary": rows,
        "goals": judged,
        "cpu_goals": cpu_goals,
        "components": parts,
        "runs": [asdict(r) for r in runs],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
