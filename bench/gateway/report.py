"""Figures for the overhead benchmark: percentiles of one run, the sustain rule, the printed
table and the machine description recorded with the results.

Invariant: a run's figures cover only its measured window (warm-up requests excluded).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from bench.gateway.loadgen import Tally

SUSTAIN_P99_MS = 50.0
SUSTAIN_SHARE = 0.97  # of the offered rate that must come back in the window


@dataclass(frozen=True, slots=True)
class Cpu:
    """CPU seconds spent during the measured window."""

    gateway_s: float
    upstream_s: float
    client_s: float
    gateway_core_s: float  # everything that ran on the gateway's core
    client_core_s: float  # everything that ran on the client's and upstream's core
    gateway_wait_s: float  # the gateway runnable but waiting for its core


@dataclass(frozen=True, slots=True)
class Point:
    """One run: one scenario, one target, one offered rate."""

    scenario: str
    target: str  # "direct" or "gateway"
    rate: float
    completed: int
    errors: int
    first_error: str
    achieved_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    due_p99_ms: float  # from when each request was due: includes any queueing in the client
    gateway_cpu_us: float | None  # per completed request
    upstream_cpu_us: float
    client_cpu_us: float
    others_gateway_core_pct: float  # other processes' use of the gateway's core in the window
    others_client_core_pct: float
    gateway_runqueue_us: float | None  # per completed request: waiting for its core, not running

    @property
    def sustained(self) -> bool:
        return (
            self.errors == 0
            and self.due_p99_ms < SUSTAIN_P99_MS
            and self.achieved_rps >= SUSTAIN_SHARE * self.rate
        )


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; `ordered` sorted ascending, q in [0, 100]."""
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(
    scenario: str, target: str, rate: float, tally: Tally, window_s: float, cpu: Cpu
) -> Point:
    sent = sorted(tally.sent_ms)
    due = sorted(tally.due_ms)
    done = len(sent)
    per = 1e6 / done if done else float("nan")
    share = 100 / window_s if window_s > 0 else float("nan")
    gateway_own = cpu.gateway_s if target == "gateway" else 0.0
    return Point(
        scenario=scenario,
        target=target,
        rate=rate,
        completed=done,
        errors=tally.errors,
        first_error=tally.first_error,
        achieved_rps=done / window_s if window_s > 0 else 0.0,
        p50_ms=percentile(sent, 50),
        p90_ms=percentile(sent, 90),
        p99_ms=percentile(sent, 99),
        max_ms=sent[-1] if sent else float("nan"),
        due_p99_ms=percentile(due, 99),
        gateway_cpu_us=cpu.gateway_s * per if target == "gateway" else None,
        upstream_cpu_us=cpu.upstream_s * per,
        client_cpu_us=cpu.client_s * per,
        gateway_runqueue_us=cpu.gateway_wait_s * per if target == "gateway" else None,
        others_gateway_core_pct=max(0.0, cpu.gateway_core_s - gateway_own) * share,
        others_client_core_pct=max(0.0, cpu.client_core_s - cpu.upstream_s - cpu.client_s) * share,
    )


def added(direct: Point, via: Point) -> dict[str, float]:
    return {
        "added_p50_ms": via.p50_ms - direct.p50_ms,
        "added_p90_ms": via.p90_ms - direct.p90_ms,
        "added_p99_ms": via.p99_ms - direct.p99_ms,
    }


def _cell(value: float | None, width: int, digits: int = 3) -> str:
    return f"{'-' if value is None else f'{value:.{digits}f}':>{width}}"


HEADER = (
    f"{'scenario':<12}{'rate':>6} {'target':<8}{'ok':>7}{'err':>5}{'rps':>8}"
    f"{'p50ms':>8}{'p90ms':>8}{'p99ms':>8}{'+p50':>8}{'+p99':>8}{'gw us/req':>10}"
    f"{'up us':>7}{'cli us':>7}{'rq us':>7}{'other%':>7}"
)


def row(point: Point, extra: dict[str, float] | None) -> str:
    extra = extra or {}
    return (
        f"{point.scenario:<12}{point.rate:>6.0f} {point.target:<8}{point.completed:>7}"
        f"{point.errors:>5}{point.achieved_rps:>8.0f}"
        f"{_cell(point.p50_ms, 8)}{_cell(point.p90_ms, 8)}{_cell(point.p99_ms, 8)}"
        f"{_cell(extra.get('added_p50_ms'), 8)}{_cell(extra.get('added_p99_ms'), 8)}"
        f"{_cell(point.gateway_cpu_us, 10, 0)}{_cell(point.upstream_cpu_us, 7, 0)}"
        f"{_cell(point.client_cpu_us, 7, 0)}{_cell(point.gateway_runqueue_us, 7, 0)}"
        f"{_cell(point.others_gateway_core_pct, 7, 0)}"
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        return platform.processor()
    return platform.processor()


def machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": version("aiohttp"),
        "uvloop": version("uvloop"),
        "orjson": version("orjson"),
    }
