"""Prometheus metrics of one backend process. Namespaces appear only as their labels
(`kvfence.namespace.namespace_label`), the same labels the gateway's audit records carry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class BackendMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kvfence_backend_requests",
            "Requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.refused = Counter(
            "kvfence_backend_handles_refused",
            "Requests refused before the engine, by reason",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("kvfence_backend_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter(
            "kvfence_backend_cached_tokens",
            "Prompt tokens served from the prefix cache",
            registry=r,
        )
        self.generated_tokens = Counter(
            "kvfence_backend_generated_tokens", "Tokens generated", registry=r
        )
        self.ttft = Histogram(
            "kvfence_backend_time_to_first_token_seconds",
            "Time to the first token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.blocks_used = Gauge("kvfence_backend_kv_blocks_used", "KV blocks in use", registry=r)
        self.blocks_free = Gauge("kvfence_backend_kv_blocks_free", "KV blocks free", registry=r)
        self.blocks_cached = Gauge(
            "kvfence_backend_kv_blocks_cached", "KV blocks held by the prefix cache", registry=r
        )
        self.queue_depth = Gauge("kvfence_backend_queue_depth", "Requests waiting", registry=r)
        self.running = Gauge("kvfence_backend_running", "Requests running", registry=r)
        self.namespace_blocks = Gauge(
            "kvfence_backend_namespace_blocks",
            "KV blocks per namespace (by label)",
            ["namespace"],
            registry=r,
        )
        self.group_blocks = Gauge(
            "kvfence_backend_group_blocks",
            "KV blocks per capacity group (an opaque tenant label): held, and the floor kept",
            ["group", "kind"],
            registry=r,
        )
        self.engine_threads = Gauge(
            "kvfence_backend_engine_threads",
            "Threads the engine's kernels use now (fewer while other work takes the cores)",
            registry=r,
        )
        self.flushes = Counter(
            "kvfence_backend_flushed_blocks", "Blocks dropped by admin flushes", registry=r
        )

    def observe_stats(self, stats: Any, threads: int) -> None:
        """Copies an engine stats snapshot and the engine's thread count into the gauges (called
        at scrape time)."""
        self.engine_threads.set(threads)
        self.blocks_used.set(stats.blocks_used)
        self.blocks_free.set(stats.blocks_free)
        self.blocks_cached.set(stats.blocks_cached)
        self.queue_depth.set(stats.waiting)
        self.running.set(stats.running)
        self.namespace_blocks.clear()
        for label, count in stats.namespace_blocks.items():
            self.namespace_blocks.labels(label).set(count)
        self.group_blocks.clear()
        for group, (held, floor) in stats.group_blocks.items():
            self.group_blocks.labels(group, "held").set(held)
            self.group_blocks.labels(group, "floor").set(floor)
