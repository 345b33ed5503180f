"""The connection to the Redis that gateway replicas share: key names, reachability, and the
one place a Redis failure is caught, logged (once per change) and counted.

Invariant: no key name carries a tenant id or backend name in the clear (each is an HMAC under
a key derived from the active namespace key), and no value holds a prompt, key or credential;
every command has a deadline (`shared.redis.timeout_s`), so an unreachable Redis costs a
request at most that long.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable
from typing import Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.fleet.metrics import FleetMetrics
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.model import OnSharedFailure, Policy, SharedSettings

T = TypeVar("T")
PREFIX: Final = "kvf1:"
log = logging.getLogger("kvfence.gateway.shared")


class SharedStore:
    def __init__(self, settings: SharedSettings, policy: Policy, metrics: FleetMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._name_key = hmac.new(
            policy.gateway.active_key.secret.value, b"kvfence shared state v1", hashlib.sha256
        ).digest()
        password = settings.password.value.decode() if settings.password is not None else None
        self.client = aioredis.Redis.from_url(
            settings.redis_url,
            password=password,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 0),  # one try: on_failure decides, not a retry loop
        )
        self.up: bool | None = None  # None: not tried yet
        self.since = time.time()

    @property
    def closed(self) -> bool:
        """Whether a request must be refused while Redis cannot be reached."""
        return self.settings.on_failure is OnSharedFailure.CLOSED

    def key(self, kind: str, name: str = "") -> str:
        tag = hmac.new(self._name_key, f"{kind}\0{name}".encode(), hashlib.sha256).hexdigest()
        return PREFIX + tag[:32]

    async def call(self, op: str, awaitable: Awaitable[T]) -> T:
        """Await one Redis operation; a failure marks the store down and raises
        `SharedUnavailable` (the caller decides what that means)."""
        try:
            result = await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancel that met the client's own deadline comes out as a timeout: it is
                # still a cancel (else a cancelled loop would run on, and shutdown wait for ever).
                raise asyncio.CancelledError from exc
            self.metrics.shared_failures.labels(op).inc()
            self._mark(False, f"{op}: {type(exc).__name__}: {exc}")
            raise SharedUnavailable(op) from exc
        self._mark(True, "")
        return result

    def _mark(self, up: bool, error: str) -> None:
        if self.up is up:
            return
        self.up, self.since = up, time.time()
        if up:
            log.info("shared state reachable", extra={"url": self.settings.redis_url})
        else:
            action = self.settings.on_failure.value
            log.error(
                "shared state unreachable",
                extra={"url": self.settings.redis_url, "error": error, "on_failure": action},
            )

    async def close(self) -> None:
        await self.client.aclose()
