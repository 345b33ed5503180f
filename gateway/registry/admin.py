"""The tenant registry for one gateway app (its store, and the watch that keeps every worker on
its current document), where the token budgets count, and the registry's routes on the admin
listener: `GET /tenants` (with each tenant's spend when the app has a `SPEND` source),
`POST /tenants`, `POST /tenants/{id}/set`, `POST /tenants/{id}/remove`, `GET /keys`, `POST /keys`
(a new key, shown once in the answer), `POST /keys/{id}/revoke`, `POST /keys/{id}/expire`.

Invariant: every registry route needs the admin token, reads included (they name tenants); a new
key exists only in the answer that mints it, never in a log or at rest; nothing changes a
tenant the policy file defines.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from gateway.audit.sink import AUDIT_SINK
from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.control.registry import DatabaseRegistryStore
from gateway.control.service import CONTROL, origin
from gateway.control.store import ControlStore, Version
from gateway.control.witness import Witness
from gateway.fleet.registry_watch import REGISTRY, RegistryWatch
from gateway.fleet.unavailable import SharedUnavailable
from gateway.metrics import METRICS
from gateway.policy import registry as reg
from gateway.policy.model import Policy
from gateway.policy.registry import RegistryError
from gateway.policy.registry_view import (
    check_record,
    keys_view,
    tenant_ids,
    tenant_record,
    tenants_view,
)
from gateway.policy.reload import HOLDER
from kvfence.keys.apikey import key_digest, mint_key

Handler = Callable[[web.Application, web.Request], Awaitable[web.StreamResponse]]


class SpendSource(Protocol):
    """Tokens a budget subject (`tenant:ID`, as the budgeter names it) spent in the current
    `hour`, `day` and `month` windows."""

    async def spent(self, subject: str) -> dict[str, int]: ...


SPEND = web.AppKey("kvfence_spend", SpendSource)  # absent: `GET /tenants` shows no spend


def open_registry(app: web.Application, policy: Policy, state_dir: Path) -> None:
    """With `registry` in the policy: the control database holds it, a watch follows it, and
    the newest version (or this gateway's witness of it) is read before the first request.
    Call after the control database is open."""
    if policy.registry is None:
        return
    store = registry_store(app[CONTROL], policy, state_dir)
    metrics = app[METRICS]

    async def noted(what: str, version: Version) -> None:
        if what == "rollback":
            metrics.control_rollbacks.inc()
        record = {"event": f"registry_{what}", "version": version.number, "sha256": version.sha256}
        if AUDIT_SINK in app:
            await app[AUDIT_SINK].event(app[HOLDER].runtime.policy.gateway.audit_log, record)

    store.noted = noted
    app[REGISTRY] = RegistryWatch(app[HOLDER], store, metrics)
    app.cleanup_ctx.append(_watch_ctx)


def registry_store(control: ControlStore, policy: Policy, state_dir: Path) -> DatabaseRegistryStore:
    assert policy.registry is not None
    witness = Witness(state_dir / "control-witness.json", policy.gateway.api_key_pepper.value)
    return DatabaseRegistryStore(control, witness, origin(), policy.registry.path)


async def _watch_ctx(app: web.Application) -> AsyncIterator[None]:
    watch = app[REGISTRY]
    assert isinstance(watch.store, DatabaseRegistryStore)
    first = await watch.store.start()  # before the first request: its tenants are known
    if first is not None:
        app[HOLDER].swap(registry=first)
    task = asyncio.create_task(watch.run())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await watch.store.close()


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, code: str, message: str) -> web.Response:
    return _json({"error": {"message": message, "type": "admin_error", "code": code}}, status)


def _guarded(
    gateway: web.Application, handler: Handler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Registry routes: the admin token is required (even to read), the gateway must have a
    registry, and a refused change is one line."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        runtime = gateway[HOLDER].runtime
        if runtime.policy.gateway.admin.token is None:
            return _error(
                403,
                "admin_token_required",
                "set gateway.admin.token to manage tenants here (or change the registry file "
                "itself: --offline)",
            )
        if runtime.policy.registry is None or REGISTRY not in gateway:
            return _error(
                404, "no_registry", "this gateway's policy has no tenant registry (registry: true)"
            )
        try:
            return await handler(gateway, request)
        except RegistryError as exc:
            return _error(400, "registry_refused", str(exc))
        except SharedUnavailable:
            return _error(503, "shared_state_unavailable", "the shared registry cannot be reached")
        except ControlUnavailable as exc:
            gateway[METRICS].control_failures.labels("registry").inc()
            return _error(503, "control_unavailable", f"nothing changed: {exc}; retry shortly")
        except ControlRefused as exc:
            return _error(503, "control_refused", str(exc))

    return wrapped


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=orjson.loads)
    except (ValueError, UnicodeDecodeError):
        raise RegistryError("the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise RegistryError("the request body must be a JSON object")
    return body


async def list_tenants(gateway: web.Application, request: web.Request) -> web.Response:
    runtime, doc = gateway[HOLDER].runtime, gateway[HOLDER].registry or reg.empty_document()
    spend = None
    if SPEND in gateway:
        source = gateway[SPEND]
        ids = [t.id for t in (*runtime.policy.tenants, *runtime.registry.tenants)]
        spend = {tid: await source.spent(f"tenant:{tid}") for tid in ids}
    return _json(tenants_view(runtime.policy, runtime.registry, doc, time.time(), spend))


async def add_tenant(gateway: web.Application, request: web.Request) -> web.Response:
    policy = gateway[HOLDER].runtime.policy
    record = tenant_record(policy, await _body(request))
    ids = [t.id for t in policy.tenants]
    added = await gateway[REGISTRY].update(lambda doc: reg.add_tenant(doc, record, ids))
    return _json({"added": added})


async def set_tenant(gateway: web.Application, request: web.Request) -> web.Response:
    policy = gateway[HOLDER].runtime.policy
    changes = await _body(request)
    ids = [t.id for t in policy.tenants]
    tid = request.match_info["tenant"]

    def change(doc: reg.Document) -> reg.Document:
        return reg.set_tenant(doc, tid, changes, ids, check=lambda t, r: check_record(policy, t, r))

    return _json({"changed": await gateway[REGISTRY].update(change)})


async def remove_tenant(gateway: web.Application, request: web.Request) -> web.Response:
    ids = [t.id for t in gateway[HOLDER].runtime.policy.tenants]
    tid = request.match_info["tenant"]
    removed = await gateway[REGISTRY].update(lambda doc: reg.remove_tenant(doc, tid, ids))
    return _json({"removed": removed})


async def list_keys(gateway: web.Application, request: web.Request) -> web.Response:
    runtime = gateway[HOLDER].runtime
    tenant = request.query.get("tenant") or None
    return _json({"keys": keys_view(runtime.policy, runtime.registry, tenant, time.time())})


async def new_key(gateway: web.Application, request: web.Request) -> web.Response:
    body = await _body(request)
    policy = gateway[HOLDER].runtime.policy
    expires = body.get("expires")
    if expires is not None and not isinstance(expires, int | float):
        raise RegistryError("expires must be a time in seconds since the epoch, or null")
    key = mint_key()
    digest = key_digest(policy.gateway.api_key_pepper.value, key)

    def change(doc: reg.Document) -> reg.Document:
        return reg.new_key(
            doc,
            str(body.get("tenant", "")),
            digest,
            known=tenant_ids(policy, doc),
            label=str(body.get("label") or ""),
            expires=expires,
            budgets=body.get("budgets") or None,
        )

    created = await gateway[REGISTRY].update(change)
    return _json({"key": key, **created})


async def revoke_key(gateway: web.Application, request: web.Request) -> web.Response:
    ref = request.match_info["key"]
    done = await gateway[REGISTRY].update(lambda doc: reg.revoke_key(doc, ref))
    return _json({"revoked": done})


async def expire_key(gateway: web.Application, request: web.Request) -> web.Response:
    body = await _body(request)
    at = body.get("at", time.time())
    if not isinstance(at, int | float):
        raise RegistryError("at must be a time in seconds since the epoch")
    ref = request.match_info["key"]
    done = await gateway[REGISTRY].update(lambda doc: reg.expire_key(doc, ref, at))
    return _json({"expired": done})


def add_routes(admin: web.Application, gateway: web.Application) -> None:
    admin.router.add_get("/tenants", _guarded(gateway, list_tenants))
    admin.router.add_post("/tenants", _guarded(gateway, add_tenant))
    admin.router.add_post("/tenants/{tenant}/set", _guarded(gateway, set_tenant))
    admin.router.add_post("/tenants/{tenant}/remove", _guarded(gateway, remove_tenant))
    admin.router.add_get("/keys", _guarded(gateway, list_keys))
    admin.router.add_post("/keys", _guarded(gateway, new_key))
    admin.router.add_post("/keys/{key}/revoke", _guarded(gateway, revoke_key))
    admin.router.add_post("/keys/{key}/expire", _guarded(gateway, expire_key))
