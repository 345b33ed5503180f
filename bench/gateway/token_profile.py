"""Where a gateway's CPU goes under the token-rate load, two ways: py-spy sampling the running
gateway (`spy`: no pause, so the event loop's C time shows as the runner's own; coroutine
stacks may mix two moments, self time is what to read), and cProfile in a gateway of its own
(`cprofile`, through `bench.gateway.components`: the loop thread only, every function's own
time, the audit writer thread's CPU beside it).

Invariant: a profiled window is never one of the benchmark's measured legs: its figures are
printed and recorded apart, and cProfile's shares are applied to the unprofiled CPU per event.
"""

from __future__ import annotations

import os
import pstats
import secrets
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from bench.gateway import components, procs, profile
from bench.gateway.token_legs import HEADER, Shape, Target, line, measure

AUDIT = "  audit_log: {path: audit.jsonl, key: {env: KVFENCE_BENCH_AUDIT_KEY}}\n"


def audit_env() -> dict[str, str]:
    return {"KVFENCE_BENCH_AUDIT_KEY": secrets.token_urlsafe(32)}


def spy(shape: Shape, target: Target, up: procs.Server, top: int, keep: Path | None) -> Any:
    """py-spy on `target` during one more window (its warm-up included)."""
    with profile.recording(target.server.pid, shape.seconds + shape.stream_s + shape.warmup_s) as s:
        leg = measure(shape, target, up, 0)
    print(f"\npy-spy on {target.name}, during:\n{HEADER}\n{line(leg)}")
    if keep is not None and s:
        keep.write_text(s[0])
    return {"leg": line(leg)} | profile.report(s[0] if s else "", top)


def cprofile(
    shape: Shape,
    up: procs.Server,
    nice: int,
    top: int,
    cpu_us: float | None,
    keep: Path | None = None,
) -> Any:
    """A gateway of this tree under cProfile for one window: its loop thread's top functions by
    own time and its components' shares (in microseconds per event of `cpu_us`, the unprofiled
    gateway's CPU per event, when given), and the audit writer thread's CPU per event."""
    with tempfile.TemporaryDirectory(prefix="kvfence-prof-") as tmp:
        prefix = Path(tmp) / "gateway"
        wrapper = ("-m", "bench.gateway.components", str(prefix))
        with procs.gateway(
            up.port, 1, nice, gateway_lines=AUDIT, env_extra=audit_env(), wrapper=wrapper
        ) as (server, key):

            def switch(opening: bool) -> None:
                os.kill(server.pid, signal.SIGUSR1 if opening else signal.SIGUSR2)

            leg = measure(shape, Target("gateway (cProfile)", server, key), up, 0, switch)
            seen = components.written(prefix.with_suffix(".json"))
        if keep is not None:
            shutil.copyfile(prefix.with_suffix(".prof"), keep)
        stats: dict[Any, Any] = pstats.Stats(str(prefix.with_suffix(".prof"))).stats  # type: ignore[attr-defined]
        shares = components.shares(prefix.with_suffix(".prof"))
    total = sum(entry[2] for entry in stats.values()) or 1.0
    own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    functions = [
        (f"{name} ({Path(path).name}:{at})", entry[2] / total) for (path, at, name), entry in own
    ]
    print(f"\ncProfile, the loop thread (profiled: {line(leg).strip()})")
    for name, share in functions:
        per = f"{share * cpu_us:6.1f} us" if cpu_us else ""
        print(f"{100 * share:6.1f}%  {per}  {name}")
    print("\nby component:")
    for name, share in shares.items():
        per = f"{share * cpu_us:6.1f} us" if cpu_us else ""
        print(f"{100 * share:6.1f}%  {per}  {name}")
    writer_us = seen["writer_cpu_s"] * 1e6 / max(leg.events, 1)
    print(f"audit writer thread: {writer_us:.1f} us per event (not in the loop's shares)")
    return {
        "leg": line(leg),
        "unprofiled_cpu_us_per_event": cpu_us,
        "functions": functions,
        "components": shares,
        "audit_writer_thread_cpu_us_per_event": writer_us,
    }
