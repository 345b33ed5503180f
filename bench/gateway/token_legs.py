"""One leg of the token-rate benchmark: `Shape.streams` streams through one target (the bare
relay or a gateway) from the paced upstream, and what its measured window saw: token events
delivered per second, the target's CPU per event, each event's latency (see `stream_client`).

Invariant: every figure of a leg covers its measured window only (warm-up and run-out excluded).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import uvloop

from bench.gateway import procs
from bench.gateway.report import percentile
from bench.gateway.stream_client import Client

HEADER = (
    f"{'round':>5} {'target':<22}{'events/s':>10}{'cpu us':>8}{'sys us':>8}{'wait us':>8}"
    f"{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'max ms':>8}{'streams':>8}{'err':>5}"
    f"{'up us':>7}{'cli us':>7}"
)


@dataclass(frozen=True, slots=True)
class Shape:
    """The offered load: `streams` at once, each `tokens` events `gap_ms` apart; a window of
    `seconds` after every stream started and `warmup_s` more."""

    streams: int
    tokens: int
    gap_ms: float
    seconds: float
    warmup_s: float

    @property
    def stream_s(self) -> float:
        return self.tokens * self.gap_ms / 1000

    @property
    def offered(self) -> float:
        return self.streams * 1000 / self.gap_ms


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    server: procs.Server
    key: str  # the gateway's tenant key; the floor ignores it


@dataclass(frozen=True, slots=True)
class Leg:
    """One target's measured window: per token event, CPU in microseconds, latency in ms."""

    target: str
    round: int
    events: int
    window_s: float
    events_per_s: float
    cpu_us: float  # the relay process, user + system
    system_us: float
    wait_us: float  # the relay runnable but waiting for its core
    upstream_cpu_us: float
    client_cpu_us: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    streams: int
    errors: int
    first_error: str


def request(key: str, shape: Shape) -> bytes:
    body = orjson.dumps(  # compact, as the gateway sends it on: the upstream reads it so
        {
            "model": procs.MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": shape.tokens,
            "stream": True,
        }
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _cpu(pid: int) -> tuple[float, float, float]:
    user, system = procs.tree_cpu_split(pid)
    return user + system, system, procs.runqueue_wait_seconds(pid)


def measure(
    shape: Shape,
    target: Target,
    upstream: procs.Server,
    round_: int,
    hook: Callable[[bool], None] | None = None,
) -> Leg:
    """One window through `target`, after a warm-up that starts every stream; `hook(True)`
    runs as the window opens, `hook(False)` as it closes."""
    client = Client("127.0.0.1", target.server.port, request(target.key, shape), shape.streams)
    marks: list[tuple[tuple[float, float, float], float, float]] = []

    def mark() -> None:
        own = os.times()
        marks.append((_cpu(target.server.pid), procs.cpu_seconds(upstream.pid), own[0] + own[1]))
        if hook is not None:
            hook(len(marks) == 1)

    spread_s = shape.stream_s  # the streams' phases spread over one stream's length
    window = uvloop.run(client.run(spread_s, spread_s + shape.warmup_s, shape.seconds, mark))
    (relay0, up0, cli0), (relay1, up1, cli1) = marks
    tally = client.tally
    ms = sorted(ns / 1e6 for ns in tally.latency_ns)
    per = 1e6 / len(ms) if ms else float("nan")
    return Leg(
        target=target.name,
        round=round_,
        events=len(ms),
        window_s=window,
        events_per_s=len(ms) / window,
        cpu_us=(relay1[0] - relay0[0]) * per,
        system_us=(relay1[1] - relay0[1]) * per,
        wait_us=(relay1[2] - relay0[2]) * per,
        upstream_cpu_us=(up1 - up0) * per,
        client_cpu_us=(cli1 - cli0) * per,
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        max_ms=ms[-1] if ms else float("nan"),
        streams=tally.streams,
        errors=tally.errors,
        first_error=tally.first_error,
    )


def line(leg: Leg) -> str:
    return (
        f"{leg.round:>5} {leg.target:<22}{leg.events_per_s:>10.0f}{leg.cpu_us:>8.1f}"
        f"{leg.system_us:>8.1f}{leg.wait_us:>8.1f}{leg.p50_ms:>8.2f}{leg.p90_ms:>8.2f}"
        f"{leg.p99_ms:>8.2f}{leg.max_ms:>8.1f}{leg.streams:>8}{leg.errors:>5}"
        f"{leg.upstream_cpu_us:>7.1f}{leg.client_cpu_us:>7.1f}"
    )
