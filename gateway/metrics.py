"""Prometheus metrics, one `CollectorRegistry` per app so many apps can live in one process;
with `--workers N` every worker writes its values to files in one folder (prometheus-client's
multiprocess mode) and any worker's scrape reports the sum over all of them.

Invariant: label values are bounded by the policy (tenant ids, model and backend names) or by
fixed sets; a scrape of any worker reports the totals of every worker of the gateway.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

M = TypeVar("M", Counter, Histogram, Gauge)

_FAST = (0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.0015, 0.003, 0.005, 0.01, 0.05)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_FIRST = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_shared(folder: Path) -> None:
    """In the parent, before forking workers: an empty folder for their values (a previous
    run's files would add to this run's totals)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)


def share_values(folder: Path) -> None:
    """In a worker, before its `Metrics` is built: every value lives in `folder`."""
    os.environ[_MULTIPROC_ENV] = str(folder)
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call]


def worker_exited(folder: Path, pid: int) -> None:
    """In the parent, when a worker exits: its live gauges (in flight) stop counting."""
    mark_process_dead(pid, str(folder))  # type: ignore[no-untyped-call]


class Metrics:
    """All gateway metrics, prefixed `kvfence_gateway_`."""

    def __init__(self, shared: Path | None = None) -> None:
        """`shared`: the folder of `share_values` (workers), else values stay in this process."""
        r = self.registry = CollectorRegistry()
        self._shared = shared
        self._collectors: list[Collector] = []
        p = "kvfence_gateway_"
        self.requests = Counter(
            p + "requests",
            "Requests answered, by the status the client got",
            ["tenant", "model", "backend", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens",
            "Prompt tokens the backend reported",
            ["tenant", "model"],
            registry=r,
        )
        self.completion_tokens = Counter(
            p + "completion_tokens",
            "Completion tokens the backend reported",
            ["tenant", "model"],
            registry=r,
        )
        self.first_token = Histogram(
            p + "time_to_first_token_seconds",
            "Streamed answers: from sending the request upstream to its first event",
            ["tenant", "model"],
            buckets=_FIRST,
            registry=r,
        )
        self.in_flight = Gauge(
            p + "in_flight",
            "Requests sent upstream and not yet answered in full",
            ["tenant", "model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.latency = Histogram(
            p + "request_seconds",
            "Time to the full answer",
            ["backend"],
            buckets=_SLOW,
            registry=r,
        )
        self.added = Histogram(
            p + "added_seconds", "Time the gateway itself adds", buckets=_FAST, registry=r
        )
        self.namespaces_injected = Counter(
            p + "namespaces_injected", "Namespaces injected", ["backend"], registry=r
        )
        self.client_inputs = Counter(
            p + "client_inputs",
            "Client cache-scoping inputs found",
            ["tenant", "input", "action"],
            registry=r,
        )
        self.unknown_fields = Counter(
            p + "unknown_fields",
            "Body fields not forwarded (dropped, or the request rejected)",
            ["backend", "field", "action"],
            registry=r,
        )
        self.cached_tokens = Counter(
            p + "cached_tokens",
            "Cached prompt tokens the backend reported",
            ["tenant", "model"],
            registry=r,
        )
        self.reloads = Counter(
            p + "policy_reloads", "Policy reloads by result", ["result"], registry=r
        )
        self.registry_loads = Counter(
            p + "registry_loads",
            "Tenant registry documents read by result (ok, or refused: unreadable, forged)",
            ["result"],
            registry=r,
        )
        self.control_rollbacks = Counter(
            p + "control_rollbacks",
            "Times the control database was found behind a registry version this gateway saw "
            "(restored from an older backup, or recreated): the newer one was written back",
            registry=r,
        )
        self.control_failures = Counter(
            p + "control_failures",
            "Control database operations that failed (unreachable, timed out), by operation",
            ["op"],
            registry=r,
        )
        self.malformed = Counter(
            p + "malformed_requests",
            "Requests refused at the edge or by the HTTP parser",
            ["reason"],
            registry=r,
        )
        self.auth_failures = Counter(
            p + "auth_failures", "Refused authentications", ["reason"], registry=r
        )

        self.verdicts = Counter(
            p + "verdicts", "Audit verdicts by backend", ["backend", "verdict"], registry=r
        )
        self.audit_failures = Counter(
            p + "audit_write_failures", "Audit records that could not be written", registry=r
        )
        self.limited = Counter(
            p + "limited",
            "Requests refused by a tenant limit (429)",
            ["tenant", "reason"],
            registry=r,
        )
        self.budget_refusals = Counter(
            p + "budget_refusals",
            "Requests refused because a token budget is spent (429 budget_exceeded)",
            ["tenant", "of", "period"],
            registry=r,
        )
        self.key_tokens = Counter(
            p + "key_tokens",
            "Prompt plus completion tokens per registry key (spend per key)",
            ["tenant", "key"],
            registry=r,
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "Requests on connections over a cap answered 503 (cap: total or per_client)",
            ["cap"],
            registry=r,
        )
        self.connections_reclaimed = Counter(
            p + "connections_reclaimed",
            "Connections without a request (idle or trickling) closed to make room",
            registry=r,
        )
        self.overloaded = Counter(
            p + "overloaded", "Requests refused at the in-flight cap (503)", registry=r
        )
        self.canary_rounds = Counter(
            p + "canary_rounds", "Canary rounds by outcome", ["backend", "outcome"], registry=r
        )
        self.violations = Counter(
            p + "violations",
            "Isolation violations found in answers, by kind (marker, detective)",
            ["backend", "kind"],
            registry=r,
        )
        self.canary_requests = Counter(
            p + "canary_requests",
            "Requests canary rounds sent, by what started the round",
            ["backend", "trigger"],
            registry=r,
        )
        self.canary_shapes = Counter(
            p + "canary_shape_rounds",
            "Canary rounds by the path and streaming of the shape they sent",
            ["backend", "path", "stream"],
            registry=r,
        )
        self.canary_triggered = Counter(
            p + "canary_triggered",
            "Canary rounds tenants' answers triggered (or asked for and refused by the limits)",
            ["backend", "finding", "result"],
            registry=r,
        )
        self.verdict_reasons = Counter(
            p + "verdict_reasons",
            "Why external servers' answers were unverified or unexplained",
            ["backend", "verdict", "reason"],
            registry=r,
        )
        self.retries = Counter(
            p + "retries",
            "Requests retried on another backend after this one failed before answering",
            ["backend"],
            registry=r,
        )
        self.ejections = Counter(
            p + "ejections",
            "Backends ejected by this worker after consecutive errors",
            ["backend"],
            registry=r,
        )
        self.quarantine_transitions = Counter(
            p + "quarantine_transitions",
            "Backends quarantined or released",
            ["backend", "event"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: M, *values: str) -> M:
        """`metric.labels(*values)`, looked up once per label set (the registry keeps every
        child anyway, so this cache holds no more than it does)."""
        key = (metric, *values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def add_collector(self, collector: Collector) -> None:
        """A collector read at scrape time, by the worker that answers the scrape."""
        if self._shared is None:
            self.registry.register(collector)
        else:
            self._collectors.append(collector)

    def totals(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of the counter `name` (its `_total` series), summed over workers: for
        /status, which shows some of them."""
        if self._shared is None:
            registry = self.registry
        else:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self._shared))  # type: ignore[no-untyped-call]
        return [
            (dict(sample.labels), sample.value)
            for metric in registry.collect()
            if metric.name == name
            for sample in metric.samples
            if sample.name == name + "_total"
        ]

    def render(self) -> bytes:
        if self._shared is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self._shared))  # type: ignore[no-untyped-call]
        for collector in self._collectors:
            registry.register(collector)
        return generate_latest(registry)


METRICS = web.AppKey("kvfence_metrics", Metrics)
