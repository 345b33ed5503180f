"""Whether each backend is up: every worker checks each backend's health path (its adapter's
`health_path`: `/readyz` for ours, `/health` for vLLM and most servers) every `INTERVAL_S` in the
background. `/readyz` answers 503 while this worker cannot serve: a backend the policy marks
`required` (the default) is down, no audit record can be written, or the shared state is out of
reach under `on_failure: closed`; a worker that is only busy stays ready (and says so). The
admin `/status` and `/metrics` show every backend's state.

Invariant: a backend is up only once a check got an answer below 500. A refusal, a reset or an
answer of 500 or more marks it down at once; a check that ran out of time does only when the
check before it failed too (a server busy generating can be slow to answer its health path; two
checks in a row without an answer, `INTERVAL_S` apart, are not busy). Before the first round of
checks ends no backend counts as up, so readiness never claims what was not checked. Every
change is logged once, with the URL and what failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.adapters.kinds import ADAPTERS
from gateway.audit.sink import AUDIT_SINK
from gateway.errors import NotReady
from gateway.fleet.limiter import LIMITER
from gateway.listener.load import busy
from gateway.policy.backend_model import Backend
from gateway.policy.model import Policy
from gateway.policy.reload import HOLDER, PolicyHolder
from gateway.receipts.service import RECEIPTS
from gateway.relay.failures import describe
from gateway.relay.session import SESSION
from gateway.state import RUNTIME

INTERVAL_S: Final = 2.0
TIMEOUT_S: Final = 2.0
log = logging.getLogger("kvfence.gateway.liveness")


@dataclass(slots=True)
class BackendLiveness:
    up: bool | None = None  # None: not checked yet
    missed: int = 0  # checks in a row that failed (a first timeout alone leaves `up` as it was)
    url: str = ""  # what was checked
    status: int | None = None  # the last check's HTTP status
    error: str = ""  # why the last check failed
    checked_at: float = 0.0  # wall-clock time of the last check
    since: float = 0.0  # when `up` last changed

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Liveness:
    """This worker's view of its backends; `run` keeps it current."""

    def __init__(self) -> None:
        self.view: dict[str, BackendLiveness] = {}
        self.first_round = asyncio.Event()

    def get(self, name: str) -> BackendLiveness:
        return self.view.get(name) or BackendLiveness()

    def down(self, policy: Policy) -> list[str]:
        """The required backends that are not up (readiness fails while any is)."""
        return [b.name for b in policy.backends if b.required and not self.get(b.name).up]

    async def run(self, app: web.Application) -> None:
        while True:
            policy = app[HOLDER].runtime.policy
            await asyncio.gather(*(self.check(app[SESSION], b) for b in policy.backends))
            names = {b.name for b in policy.backends}
            self.view = {n: state for n, state in self.view.items() if n in names}
            self.first_round.set()
            await asyncio.sleep(INTERVAL_S)

    async def check(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        url = backend.url + ADAPTERS[backend.kind].health_path
        status, error, slow = None, "", False
        try:
            async with asyncio.timeout(TIMEOUT_S), session.get(url) as resp:
                status = resp.status
                await resp.read()
        except TimeoutError as exc:
            error, slow = describe(exc), True
        except (aiohttp.ClientError, OSError) as exc:
            error = describe(exc)
        if status is not None and status >= 500:
            error = f"answered {status}"
        self._record(backend.name, url, status, error, slow)

    def _record(self, name: str, url: str, status: int | None, error: str, slow: bool) -> None:
        now, before = time.time(), self.get(name)
        missed = before.missed + 1 if error else 0
        up = not error or (slow and missed == 1 and before.up is True)
        changed = before.up is not up
        self.view[name] = BackendLiveness(
            up, missed, url, status, error, now, now if changed else before.since
        )
        if changed and up:
            log.info("backend up", extra={"backend": name, "url": url, "status": status})
        elif changed:
            log.warning("backend down", extra={"backend": name, "url": url, "error": error})

    async def ready(self, policy: Policy) -> list[str]:
        """`down(policy)` once the first round of checks ended (waiting for it at most a
        check's deadline)."""
        try:
            async with asyncio.timeout(TIMEOUT_S + 1):
                await self.first_round.wait()
        except TimeoutError:
            pass
        return self.down(policy)


LIVENESS = web.AppKey("kvfence_liveness", Liveness)


async def broken(app: web.Application, policy: Policy) -> list[str]:
    """What keeps this worker from serving, in words (empty: nothing)."""
    out = []
    down = await app[LIVENESS].ready(policy)
    if down:
        out.append(f"{len(down)} required backend(s) down")
    if await app[AUDIT_SINK].unwritable(policy.gateway.audit_log) is not None:
        out.append("no audit record can be written")
    if await app[RECEIPTS].unwritable(app, policy) is not None:
        out.append("no receipt can be written")
    store = app[LIMITER].store
    if store is not None and store.closed and store.up is False:
        out.append("the shared state is out of reach (on_failure: closed)")
    return out


async def readyz(request: web.Request) -> web.Response:
    """200 while this worker can serve, busy or not (the body says which caps are reached);
    else 503 saying what is broken, without naming backends (the tenant port is public: the
    admin `/status` says which are down and why)."""
    found = await broken(request.app, request[RUNTIME].policy)
    if found:
        raise NotReady(f"not ready: {'; '.join(found)} (see the admin /status)")
    at = busy(request.app)
    return web.Response(text=f"ready, busy: {', '.join(at)}\n" if at else "ready\n")


class LivenessCollector(Collector):
    """`kvfence_gateway_backend_up{backend}` and `kvfence_gateway_ready`, from the answering
    worker's own checks."""

    def __init__(self, liveness: Liveness, holder: PolicyHolder) -> None:
        self.liveness, self.holder = liveness, holder

    def collect(self) -> Iterator[Metric]:
        policy = self.holder.runtime.policy
        up = GaugeMetricFamily(
            "kvfence_gateway_backend_up",
            "1 while the backend answers its health check",
            labels=["backend"],
        )
        for backend in policy.backends:
            up.add_metric([backend.name], float(bool(self.liveness.get(backend.name).up)))
        ready = GaugeMetricFamily(
            "kvfence_gateway_ready", "1 while every required backend is up (/readyz answers 200)"
        )
        ready.add_metric([], float(not self.liveness.down(policy)))
        yield from (up, ready)
