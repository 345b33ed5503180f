"""The connection to the Redis that gateway replicas share: key names, the sealer of every
value, reachability, the one place a Redis failure is caught, logged (once per change) and counted,
and how a key of the wrong Redis type reads (`typed`: as a value that is not ours).

Invariant: no key name or value carries a tenant id or backend name in the clear (names are
HMACs, values are sealed with the name bound into their tag), and no value holds a prompt, key
or credential; both derive from the gateway's API-key pepper (`shared_secret`), so whoever can
only reach Redis can neither read a name nor write a value a gateway accepts; every command has
a deadline (`shared.redis.timeout_s`), so an unreachable Redis costs a request at most that long.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import Awaitable
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from gateway.fleet.metrics import FleetMetrics
from gateway.fleet.sealed import Sealer
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.model import OnSharedFailure, Policy, SharedSettings

T = TypeVar("T")
PREFIX: Final = "kvf2:"  # v2: names under the pepper, every value sealed
log = logging.getLogger("kvfence.gateway.shared")


# The gateways' ACL user may send only what the gateway needs (docs/fleet.md): a connection
# sends AUTH and nothing else, so no CLIENT SETINFO (`driver_info` from redis-py 7.1 on).
_NO_CLIENT_INFO: Final[dict[str, Any]] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(aioredis.Redis.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def shared_secret(policy: Policy) -> bytes:
    """The secret the shared state's names and seals derive from: the API-key pepper, which
    every replica holds and which changes only with every tenant's key digest (so rotating the
    namespace key leaves the shared state readable; docs/fleet.md says how to rotate it)."""
    return hmac.new(
        policy.gateway.api_key_pepper.value, b"kvfence shared state v2", hashlib.sha256
    ).digest()


def as_bytes(value: bytes | str | None) -> bytes | None:
    """A value as Redis returned it (bytes: the client never decodes)."""
    return value.encode() if isinstance(value, str) else value


def wrong_type(exc: BaseException) -> bool:
    """Whether Redis refused a command because the key holds another type (WRONGTYPE)."""
    message = str(exc)  # a pipeline prefixes "Command # N (...) of pipeline caused error: "
    return isinstance(exc, ResponseError) and (
        message.startswith("WRONGTYPE") or "caused error: WRONGTYPE" in message
    )


async def typed(awaitable: Awaitable[Any], wrong: object) -> Any:
    """A read's result, or `wrong` when the key holds another Redis type: such a key holds
    nothing a gateway wrote, so the caller reads it as a value that is not authentic (and
    counts it refused), never as an error; any other failure passes on."""
    try:
        return await awaitable
    except ResponseError as exc:
        if not wrong_type(exc):
            raise
        return wrong


class SharedStore:
    def __init__(self, settings: SharedSettings, policy: Policy, metrics: FleetMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        secret = shared_secret(policy)
        self._name_key = hmac.new(secret, b"names", hashlib.sha256).digest()
        self.sealer = Sealer(hmac.new(secret, b"values", hashlib.sha256).digest())
        password = settings.password.value.decode() if settings.password is not None else None
        tls: dict[str, Any] = {}
        if settings.ca_file is not None:
            tls = {"ssl_ca_certs": str(settings.ca_file), "ssl_cert_reqs": "required"}
        self.client = aioredis.Redis.from_url(
            settings.redis_url,
            username=settings.username,
            password=password,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            retry=Retry(NoBackoff(), 0),  # one try: on_failure decides, not a retry loop
            **tls,
            **_NO_CLIENT_INFO,
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
