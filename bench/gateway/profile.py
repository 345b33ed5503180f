"""Where a one-worker gateway spends its CPU: py-spy samples the real gateway process while the
overhead benchmark's open-loop client drives it, then the self and inclusive shares are printed.
Run: .venv/bin/python -m bench.gateway.profile [--rate 1500] [--seconds 8] [--scenario small]
(needs `py-spy` next to the interpreter, and ptrace permission on the gateway process).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import uvloop

from bench.gateway import procs
from bench.gateway.overhead import REPO_ROOT, Bench
from bench.gateway.report import row
from bench.gateway.traffic import scenarios


def _frame_name(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`; lines vary within one function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rsplit(':', 1)[0]).name})" if where else name


def shares(collapsed: str) -> tuple[Counter[str], Counter[str], int]:
    """Self and inclusive sample counts per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    return own, inclusive, total


# First match from the leaf up decides a sample's layer; order matters (gateway before aiohttp).
LAYERS: tuple[tuple[str, str], ...] = (
    ("prometheus_client/", "metrics (prometheus_client)"),
    ("asyncio/timeouts.py", "asyncio.timeout"),
    ("gateway/filters/", "gateway filters (authn, body, route, scrub, namespace, adapter)"),
    ("gateway/audit", "gateway audit"),
    ("gateway/relay/", "gateway relay"),
    ("gateway/", "gateway app and proxy code"),
    ("aiohttp/client", "aiohttp client (the upstream request)"),
    ("aiohttp/connector.py", "aiohttp client (the upstream request)"),
    ("aiohttp/web_", "aiohttp server (dispatch, request, response)"),
    ("aiohttp/http_writer.py", "aiohttp server (dispatch, request, response)"),
    ("aiohttp/", "aiohttp streams and payloads"),
    ("asyncio/runners.py", "event loop, syscalls, C HTTP parser (no Python frame)"),
)


def layers(collapsed: str) -> tuple[Counter[str], int]:
    """Samples per layer of the stack (see LAYERS), from py-spy's collapsed stacks."""
    counts: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        layer = next(
            (name for frame in reversed(stack.split(";")) for key, name in LAYERS if key in frame),
            "other",
        )
        counts[layer] += int(count)
    return counts, total


def _print_top(title: str, counts: Counter[str], total: int, top: int) -> None:
    print(f"\n{title} (share of {total} samples)")
    for name, n in counts.most_common(top):
        print(f"{100 * n / total:6.1f}%  {name}")


@contextlib.contextmanager
def recording(pid: int, seconds: float, spy_args: Sequence[str] = ()) -> Iterator[list[str]]:
    """py-spy samples `pid` for `seconds` from the block's start; once the block and the
    sampling are done, the list it yields holds the collapsed stacks (empty if none came)."""
    spy = Path(sys.executable).parent / "py-spy"
    stacks: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stacks.txt"
        # --native must pause the process to unwind C frames; otherwise sample without pausing.
        pause = [] if "--native" in spy_args else ["--nonblocking"]
        cmd = [str(spy), "record", "--pid", str(pid), "--rate", "400", *pause, *spy_args]
        cmd += ["--format", "raw", "--output", str(out), "--duration", str(int(seconds))]
        # The sampler runs beside the client, off the gateway's core.
        pin = functools.partial(os.sched_setaffinity, 0, {0})
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, preexec_fn=pin) as recorder:
            yield stacks
            recorder.wait()
        if out.exists():
            stacks.append(out.read_text())


def report(collapsed: str, top: int) -> dict[str, object]:
    """Prints the top functions (self and inclusive) and the layers; returns their shares."""
    own, inclusive, total = shares(collapsed)
    by_layer, _ = layers(collapsed)
    tables = {"self time": own, "inclusive time": inclusive, "by layer": by_layer}
    for title, counts in tables.items():
        _print_top(title, counts, total, top if title != "by layer" else len(LAYERS) + 1)
    return {"samples": total} | {
        title: [(name, n / total) for name, n in counts.most_common(top)] if total else []
        for title, counts in tables.items()
    }


async def _drive(bench: Bench, scenario: str, rate: float, seconds: float) -> None:
    point = await bench.measure(scenarios()[scenario], "gateway", rate, seconds)
    print(row(point, None))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=1500)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--scenario", default="small", choices=list(scenarios()))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rev", help="profile the gateway code of this git revision")
    parser.add_argument("--keep", type=Path, help="also write the collapsed stacks here")
    parser.add_argument("--spy-arg", action="append", default=[], help="extra py-spy option")
    parser.add_argument("--nice", type=int, default=0, help="niceness of the servers (root)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(procs.exported(REPO_ROOT, args.rev)) if args.rev else None
        up = stack.enter_context(procs.upstream(0, args.nice))
        gw, key = stack.enter_context(procs.gateway(up.port, 1, args.nice, tree))
        procs.place(0, args.nice)
        bench = Bench(up, gw, key, args.seconds, 0.5, 1, 0)
        uvloop.run(_drive(bench, args.scenario, 500, 1.0))  # warm-up
        with recording(gw.pid, args.seconds, args.spy_arg) as stacks:
            uvloop.run(_drive(bench, args.scenario, args.rate, args.seconds))
    if not stacks:
        print("py-spy wrote no profile", file=sys.stderr)
        return 1
    if args.keep:
        args.keep.write_text(stacks[0])
    report(stacks[0], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
