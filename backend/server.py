"""The backend's HTTP server. Every generation request is checked for a valid signed handle
before anything else, and only the verifier's `Namespace` reaches the engine.

Invariant: a request without a valid handle never reaches the engine (see `_admit`).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import generate_latest

from backend import openai_api as api
from backend.model.chat_template import ChatTemplateError
from backend.openai_api import BadRequest, GenerationRequest
from backend.prompt import UnsafeTemplate, chat_prompt_ids
from backend.response import Generation
from backend.service import Backend, error_response
from backend.worker import EngineFailed
from kvfence.capability import Namespace
from kvfence.handle import (
    HANDLE_HEADER,
    TokenError,
)

log = logging.getLogger("kvfence.backend")


BACKEND = web.AppKey("backend", Backend)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    backend = request.app[BACKEND]
    endpoint = "chat" if kind == "chat" else "completions"
    try:
        req, namespace, request_id, prompt = await _admit(request, backend, kind)
    except _Refused as exc:
        backend.metrics.requests.labels(endpoint, str(exc.status)).inc()
        return error_response(exc.status, str(exc), exc.kind, exc.code)
    try:
        key, stream = backend.worker.submit(
            namespace, prompt, req.sampling, () if req.ignore_eos else backend.eos
        )
    except EngineFailed:
        backend.metrics.requests.labels(endpoint, "503").inc()
        return error_response(503, "the engine is not running", "server_error", "engine_down")
    run = Generation(backend, req, request_id, namespace, prompt, key, stream)
    try:
        response = await (run.stream(request) if req.stream else run.collect())
    finally:
        backend.worker.abort(key)  # no-op once finished; frees blocks at once on disconnect
    backend.metrics.requests.labels(endpoint, str(response.status)).inc()
    return response


async def _admit(
    request: web.Request, backend: Backend, kind: str
) -> tuple[GenerationRequest, Namespace, str, list[int]]:
    token = request.headers.get(HANDLE_HEADER)
    if not token:
        backend.metrics.refused.labels("missing").inc()
        raise _Refused(
            401, "a signed namespace handle is required", "authentication_error", "missing_handle"
        )
    try:
        req = api.parse_generation(api.parse_body(await request.read()), kind)
    except BadRequest as exc:
        raise _Refused(400, str(exc), "invalid_request_error", "bad_request") from None
    try:
        handle = backend.verifier.verify(token, req.model)
    except TokenError as exc:
        backend.metrics.refused.labels(exc.code).inc()
        kind_ = "authentication_error" if exc.status == 401 else "permission_error"
        raise _Refused(exc.status, str(exc), kind_, exc.code) from None
    if req.model != backend.model.name or handle.revision != backend.model.revision:
        raise _Refused(
            404,
            f"model {req.model!r} (this revision) is not served here",
            "invalid_request_error",
            "model_not_found",
        )
    prompt = _tokenize(backend, req)
    if len(prompt) + req.sampling.max_tokens > backend.model.max_positions:
        raise _Refused(
            400,
            f"prompt ({len(prompt)} tokens) plus max_tokens exceeds the "
            f"context of {backend.model.max_positions}",
            "invalid_request_error",
            "context_length_exceeded",
        )
    return req, handle.namespace, handle.request_id, prompt


def _tokenize(backend: Backend, req: GenerationRequest) -> list[int]:
    tok = backend.tokenizer
    if req.kind == "completion":
        return list(tok.encode(req.prompt))  # a raw prompt is the caller's own, specials included
    try:
        return chat_prompt_ids(tok, req.messages, backend.specials)
    except (ChatTemplateError, UnsafeTemplate) as exc:
        raise _Refused(
            400, f"cannot render the chat: {exc}", "invalid_request_error", "bad_chat"
        ) from None


async def models(request: web.Request) -> web.Response:
    model = request.app[BACKEND].model
    body = {
        "object": "list",
        "data": [{"id": model.name, "object": "model", "created": 0, "owned_by": "kvfence"}],
    }
    return web.json_response(body, dumps=lambda o: orjson.dumps(o).decode())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if not request.app[BACKEND].worker.healthy:
        return web.json_response({"status": "engine down"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    backend.metrics.observe_stats(await backend.worker.call(lambda engine: engine.stats()))
    return web.Response(
        body=generate_latest(backend.metrics.registry), content_type="text/plain", charset="utf-8"
    )


async def admin_flush(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    token = request.headers.get(HANDLE_HEADER)
    if not token:
        return error_response(
            401, "a signed admin handle is required", "authentication_error", "missing_handle"
        )
    try:
        admin = backend.verifier.verify_admin(token, "flush")
    except TokenError as exc:
        backend.metrics.refused.labels(exc.code).inc()
        kind = "authentication_error" if exc.status == 401 else "permission_error"
        return error_response(exc.status, str(exc), kind, exc.code)
    namespace = admin.namespace
    dropped = await backend.worker.call(lambda engine: engine.flush(namespace))
    backend.metrics.flushes.inc(dropped)
    log.info("flush", extra={"namespace": namespace.digest, "blocks": dropped})
    return web.json_response({"flushed_blocks": dropped, "namespace": namespace.digest})


def create_app(backend: Backend, max_body_bytes: int = 4 * 1024 * 1024) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)
    app[BACKEND] = backend

    async def engine_ctx(app: web.Application) -> Any:
        backend.worker.start()
        yield
        await backend.worker.stop()

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/flush", admin_flush)
    return app
