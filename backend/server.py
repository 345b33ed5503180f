"""The backend's HTTP server. Every request that reaches the engine first passes `_checked`,
the one place a handle is checked, before any byte of its body is read; the raw body is then
compared with the handle's digest before it is parsed, and only then is the request id spent;
only the verifier's `Namespace` (and the public namespaces it grants, for the leading blocks
`backend.public` finds in the body) reaches the engine. `answer_errors` is the one place an error
becomes HTTP.

Invariant: a request without a valid handle never reaches the engine, and its body is not read;
a body other than the one its handle was signed for is refused (403 `body_mismatch`) unparsed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import orjson
from aiohttp import web
from prometheus_client import generate_latest

from backend import openai_api as api
from backend.errors import BackendError, HandleRefused, ModelNotFound, error_body
from backend.prompt import prompt_ids
from backend.response import Generation
from backend.service import Backend
from kvfence.handle import HANDLE_HEADER
from kvfence.token import TokenError

log = logging.getLogger("kvfence.backend")

BACKEND = web.AppKey("backend", Backend)
_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except BackendError as exc:
        response = web.Response(
            status=exc.status, body=error_body(exc), content_type="application/json"
        )
    endpoint = _ENDPOINTS.get(request.path)
    if endpoint is not None:
        request.app[BACKEND].metrics.requests.labels(endpoint, str(response.status)).inc()
    return response


def _checked(request: web.Request, check: Callable[[str | None], T]) -> T:
    """The one place a handle is checked: `check` gets the handle header's value (the
    verifier's `verify`, or `verify_admin` for an action); a refusal is counted and raised as
    HandleRefused, which the middleware answers."""
    try:
        return check(request.headers.get(HANDLE_HEADER))
    except TokenError as exc:
        request.app[BACKEND].metrics.refused.labels(exc.code).inc()
        raise HandleRefused(exc) from None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    backend = request.app[BACKEND]
    signed = _checked(request, backend.verifier.check)
    raw = await request.read()
    handle = _checked(request, lambda _: backend.verifier.admit(signed, raw))
    req = api.parse_generation(api.parse_body(raw), endpoint)
    _checked(request, lambda _: handle.check_model(req.model))
    if req.model != backend.model.name or handle.revision != backend.model.revision:
        raise ModelNotFound(f"model {req.model!r} (this revision) is not served here", "model")
    prompt = prompt_ids(backend.tokenizer, backend.specials, req, backend.model.max_positions)
    public = _checked(request, lambda _: backend.public_segments(req, prompt, handle.public))
    choices = [req.choice_sampling(i) for i in range(req.n)]  # each with the same public grant
    stream_ids, outputs = backend.worker.submit(
        handle.namespace, prompt, choices, () if req.ignore_eos else backend.eos, public
    )
    run = Generation(backend, req, handle.request_id, handle.namespace, prompt, stream_ids, outputs)
    try:
        return await (run.stream(request) if req.stream else run.collect())
    finally:
        for stream_id in stream_ids:  # no-op once finished; frees blocks at once on disconnect
            backend.worker.abort(stream_id)


def _model_card(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvfence"}


async def models(request: web.Request) -> web.Response:
    body = {"object": "list", "data": [_model_card(request.app[BACKEND].model.name)]}
    return web.json_response(body, dumps=lambda o: orjson.dumps(o).decode())


async def model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    if name != request.app[BACKEND].model.name:
        raise ModelNotFound(f"model {name[:200]!r} is not served here", "model")
    return web.json_response(_model_card(name), dumps=lambda o: orjson.dumps(o).decode())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if not request.app[BACKEND].worker.healthy:
        return web.json_response({"status": "engine down"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    stats = await backend.worker.call(lambda engine: engine.stats())
    backend.metrics.observe_stats(stats, backend.worker.threads)
    return web.Response(
        body=generate_latest(backend.metrics.registry), content_type="text/plain", charset="utf-8"
    )


async def admin_flush(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    admin = _checked(request, lambda token: backend.verifier.verify_admin(token, "flush"))
    namespace = admin.namespace
    dropped = await backend.worker.call(lambda engine: engine.flush(namespace))
    backend.metrics.flushes.inc(dropped)
    log.info("flush", extra={"namespace": namespace.label, "blocks": dropped})
    return web.json_response({"flushed_blocks": dropped, "namespace": namespace.label})


def create_app(backend: Backend, max_body_bytes: int = 4 * 1024 * 1024) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[answer_errors])
    app[BACKEND] = backend

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        backend.worker.start()
        yield
        await backend.worker.stop()

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/flush", admin_flush)
    return app
