"""External load generators for the side-by-side benchmark: `hey` at a fixed rate (per-request
times from its CSV) and `wrk` (or `hey` without a rate) at the highest rate it reaches.

Invariant: a driver's figures count only answers with status 200; anything else is an error,
reported beside them, never folded into the latency.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.gateway import procs

INSTALL = ["apt-get", "install", "-y", "hey", "wrk", "nginx"]
TOOLS = ("hey", "wrk", "nginx")


@dataclass(frozen=True, slots=True)
class Target:
    """What a driver sends (the same body and headers to every hop) and where it runs."""

    body: bytes
    headers: dict[str, str]
    core: int | None
    nice: int = 0


@dataclass(frozen=True, slots=True)
class Load:
    """What one driver run measured (latencies in milliseconds)."""

    tool: str
    completed: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def ensure_tools() -> list[str]:
    """Install hey, wrk and nginx with apt-get when missing and allowed; returns what is still
    missing (the caller prints the command)."""
    missing = missing_tools()
    if missing and shutil.which("apt-get") and os.geteuid() == 0:
        print(f"installing {' '.join(missing)}: {' '.join(INSTALL)}", file=sys.stderr)
        subprocess.run(INSTALL, stdout=subprocess.DEVNULL, check=False)
        missing = missing_tools()
    return missing


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def hey(url: str, target: Target, conns: int, seconds: float, rate: int | None = None) -> Load:
    """hey with `conns` workers, at `rate` req/s in all (hey's -q is per worker) or unlimited."""
    with tempfile.NamedTemporaryFile(suffix=".json") as payload:
        payload.write(target.body)
        payload.flush()
        cmd = [
            "hey",
            "-z",
            f"{seconds:g}s",
            "-c",
            str(conns),
            "-m",
            "POST",
        ]
        if rate is not None:
            cmd += ["-q", f"{rate / conns:g}"]
        cmd += ["-D", payload.name, "-o", "csv", "-disable-compression"]
        cmd += [*_header_args(target.headers), url]
        out = _run(cmd, target)
    return _from_csv(out, seconds)


def _run(cmd: list[str], target: Target) -> str:
    place = procs.placement(target.core, target.nice)
    return subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=place).stdout


def _header_args(headers: dict[str, str]) -> list[str]:
    return [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]


def _from_csv(out: str, seconds: float) -> Load:
    """hey's CSV: response-time (s), ..., status-code, offset (s from the start)."""
    ok: list[float] = []
    errors = 0
    last = 0.0
    for record in csv.DictReader(io.StringIO(out)):
        last = max(last, float(record["offset"]))
        if record["status-code"] == "200":
            ok.append(float(record["response-time"]) * 1000)
        else:
            errors += 1
    ok.sort()
    span = max(last, seconds)
    p50, p99 = _percentile(ok, 0.5), _percentile(ok, 0.99)
    return Load("hey", len(ok), errors, span, len(ok) / span, p50, p99)


_WRK_LUA = """wrk.method = "POST"
wrk.body = io.open("{body}", "rb"):read("*a")
{headers}
done = function(summary, latency, requests)
  io.write(string.format("KV %d %d %d %.3f %.3f\\n", summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(url: str, target: Target, conns: int, seconds: float) -> Load:
    """wrk, one thread, `conns` connections, as fast as answers come back."""
    with tempfile.TemporaryDirectory(prefix="kvfence-wrk-") as tmp:
        payload = Path(tmp) / "body.json"
        payload.write_bytes(target.body)
        lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in target.headers.items())
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_LUA.format(body=payload, headers=lines))
        cmd = [
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{seconds:g}s",
            "-s",
            str(script),
            url,
        ]
        out = _run(cmd, target)
    found = re.search(r"^KV (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)$", out, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    requests, errors, duration_us = (int(found.group(i)) for i in (1, 2, 3))
    span = duration_us / 1e6
    ok = requests - errors
    p50, p99 = float(found.group(4)) / 1000, float(found.group(5)) / 1000
    return Load("wrk", ok, errors, span, ok / span, p50, p99)
