"""How soon each server answers after it starts, and what a gateway's workers hold: `kvfence
gateway` with 1 and 4 workers (seconds to its first /healthz 200; the processes' summed PSS,
RSS and private dirty memory once up) and `kvfence backend` with the real model (seconds to its
first /health 200), this tree and with `--compare REV` the code of REV, alternated in one run.
Run: .venv/bin/python -m bench.startup [--compare REV] [--rounds 3] [--no-backend]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import machine
from bench.backend_throughput import parse_args as backend_args
from bench.gateway import procs
from bench.targets import backend_target

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "results" / "startup.json"
SETTLE_S = 2.0  # after /healthz: the workers' memory once their start-up work is done
MEMORY_KEYS = ("Pss", "Rss", "Private_Dirty")


@contextlib.contextmanager
def _code_of(rev: str | None) -> Iterator[Path]:
    """This checkout, or `kvfence/`, `gateway/` and `backend/` as of `rev` in a temporary one."""
    if rev is None:
        yield REPO_ROOT
        return
    with tempfile.TemporaryDirectory(prefix="kvfence-rev-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", rev, "kvfence", "gateway", "backend"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def _memory_mib(pid: int) -> dict[str, float]:
    """The process and its children, summed (KiB in smaps_rollup)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    total = dict.fromkeys(MEMORY_KEYS, 0.0)
    for one in [pid, *map(int, children.split())]:
        for line in Path(f"/proc/{one}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in total:
                total[key] += int(value.split()[0]) / 1024
    return total


def gateway_leg(source: Path, workers: int) -> dict[str, Any]:
    with procs.gateway(procs.free_port(), None, source=source, workers=workers) as (server, _):
        time.sleep(SETTLE_S)
        return {"ready_s": server.ready_s, **_memory_mib(server.pid)}


def backend_leg(root: Path) -> dict[str, Any]:
    start = time.monotonic()
    with backend_target(backend_args(["--backend"]), root=root):
        return {"ready_s": time.monotonic() - start}


def _legs(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    for workers in args.workers:
        yield f"gateway x{workers}", f"gateway:{workers}"
    if args.backend:
        yield "backend", "backend"


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r["leg"], r["code"]) for r in rows):
        mine = [r for r in rows if (r["leg"], r["code"]) == key]
        row: dict[str, Any] = {"leg": key[0], "code": key[1], "rounds": len(mine)}
        for field in ("ready_s", *MEMORY_KEYS):
            if field in mine[0]:
                row[field] = statistics.median(r[field] for r in mine)
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", metavar="REV", help="also the code of REV, alternated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--no-backend", dest="backend", action="store_false")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    codes = ["this tree"] + ([f"@{args.compare}"] if args.compare else [])
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        roots = {"this tree": REPO_ROOT}
        if args.compare:
            roots[f"@{args.compare}"] = stack.enter_context(_code_of(args.compare))
        for n in range(args.rounds):
            for name, leg in _legs(args):
                for code in codes if n % 2 == 0 else reversed(codes):
                    kind, _, workers = leg.partition(":")
                    if kind == "gateway":
                        found = gateway_leg(roots[code], int(workers))
                    else:
                        found = backend_leg(roots[code])
                    rows.append({"round": n, "leg": name, "code": code, **found})
                    shown = "  ".join(f"{k} {v:.2f}" for k, v in found.items())
                    print(f"round {n + 1}/{args.rounds}  {name:<12} {code:<16} {shown}", flush=True)
    summary = _summary(rows)
    print(f"\n{'leg':<12} {'code':<16} {'ready s':>8} {'PSS MiB':>8} {'RSS MiB':>8} {'private':>8}")
    for r in summary:
        mem = "".join(f" {r[k]:>8.1f}" if k in r else f" {'-':>8}" for k in MEMORY_KEYS)
        print(f"{r['leg']:<12} {r['code']:<16} {r['ready_s']:>8.2f}{mem}")
    result = {
        "machine": machine.describe(),
        "source": procs.source_state(REPO_ROOT),
        "compare": args.compare and procs.commit_of(REPO_ROOT, args.compare),
        "rows": rows,
        "summary": summary,
    }
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
