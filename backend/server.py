"""The backend's HTTP server. Every generation request is checked for a valid signed handle
before anything else, and only the verifier's `Namespace` reaches the engine.

Invariant: no response body byte is written before the response's attestation is signed; when
streaming, the attestation is the first SSE event.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import generate_latest

from backend import openai_api as api
from backend.engine.engine import StepOutput
from backend.engine.scheduler import PromptTooLongError
from backend.model.chat_template import ChatTemplateError
from backend.openai_api import BadRequest, GenerationRequest
from backend.prompt import UnsafeTemplate, chat_prompt_ids, special_strings
from backend.textstream import TextStream
from backend.worker import EngineFailed, EngineWorker
from kvfence.attestation import AttestationSigner
from kvfence.capability import Namespace
from kvfence.handle import (
    ATTESTATION_EVENT,
    ATTESTATION_FIELD,
    ATTESTATION_HEADER,
    HANDLE_HEADER,
    HandleVerifier,
    TokenError,
)

from .metrics import BackendMetrics

log = logging.getLogger("kvfence.backend")


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    revision: str
    max_positions: int


class Backend:
    """Everything a request handler needs; built once at start-up."""

    def __init__(
        self,
        worker: EngineWorker,
        tokenizer: Any,
        model: ServedModel,
        verifier: HandleVerifier,
        signer: AttestationSigner,
    ) -> None:
        self.worker = worker
        self.tokenizer = tokenizer
        self.model = model
        self.verifier = verifier
        self.signer = signer
        self.metrics = BackendMetrics()
        self.eos = tuple(tokenizer.eos_ids)
        self.specials = special_strings(tokenizer)


BACKEND = web.AppKey("backend", Backend)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


def _error(status: int, message: str, kind: str, code: str) -> web.Response:
    body = api.error_body(message, kind, code)
    return web.Response(status=status, body=body, content_type="application/json")


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
        return _error(exc.status, str(exc), exc.kind, exc.code)
    try:
        key, stream = backend.worker.submit(namespace, prompt, req.sampling, backend.eos)
    except EngineFailed:
        backend.metrics.requests.labels(endpoint, "503").inc()
        return _error(503, "the engine is not running", "server_error", "engine_down")
    run = _Run(backend, req, request_id, namespace, prompt, key, stream)
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


class _Run:
    """One admitted request: reads engine outputs, signs the attestation, writes the answer."""

    def __init__(
        self,
        backend: Backend,
        req: GenerationRequest,
        request_id: str,
        namespace: Namespace,
        prompt: list[int],
        key: int,
        outputs: asyncio.Queue[StepOutput | BaseException],
    ) -> None:
        self.backend, self.req, self.request_id = backend, req, request_id
        self.namespace, self.prompt, self.key, self.outputs = namespace, prompt, key, outputs
        self.text = TextStream(backend.tokenizer.incremental(), req.stop)
        self.cached = 0
        self.generated = 0
        self.finish = "stop"
        self.rid = ("chatcmpl-" if req.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.started = time.perf_counter()

    def _attest(self, first: StepOutput) -> str:
        self.cached = first.cached_tokens or 0
        m = self.backend.metrics
        m.ttft.observe(time.perf_counter() - self.started)
        m.prompt_tokens.inc(len(self.prompt))
        m.cached_tokens.inc(self.cached)
        used = sorted(ns.value for ns in (first.block_namespaces or frozenset()))
        return self.backend.signer.sign(
            request_id=self.request_id,
            namespace=self.namespace.value,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            block_namespaces=used,
        )

    async def _next(self) -> StepOutput:
        item = await self.outputs.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def _take(self, out: StepOutput) -> tuple[str, bool]:
        """Returns the new final text and whether the response is complete."""
        self.generated += 1
        self.backend.metrics.generated_tokens.inc()
        piece = "" if out.token_id in self.backend.eos else self.text.push(out.token_id)
        if self.text.stopped:
            self.finish = "stop"
            return piece, True
        if out.finished:
            self.finish = "length" if out.finish_reason == "length" else "stop"
            return piece + self.text.finish(), True
        return piece, False

    def _usage(self) -> dict[str, Any]:
        return api.usage(len(self.prompt), self.generated, self.cached)

    async def collect(self) -> web.Response:
        try:
            first = await self._next()
            attestation = self._attest(first)
            parts, (piece, done) = [], self._take(first)
            parts.append(piece)
            while not done:
                piece, done = self._take(await self._next())
                parts.append(piece)
        except (EngineFailed, ValueError) as exc:
            return _failed(exc)
        body = api.completion_body(self.req, self.rid, "".join(parts), self.finish, self._usage())
        return web.Response(
            body=orjson.dumps(body),
            content_type="application/json",
            headers={ATTESTATION_HEADER: attestation},
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            first = await self._next()
        except (EngineFailed, ValueError) as exc:
            return _failed(exc)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        attestation = self._attest(first)
        created = int(time.time())
        # The attestation travels as a named event whose data is also a valid first chunk (the
        # assistant role, no text), so OpenAI clients that ignore event names still parse it.
        head = api.chunk_body(self.req, self.rid, created, "", None)
        if self.req.kind == "chat":
            head["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        head[ATTESTATION_FIELD] = attestation
        await response.write(f"event: {ATTESTATION_EVENT}\n".encode() + api.sse(head))
        out: StepOutput | None = first
        try:
            while True:
                piece, done = self._take(out if out is not None else await self._next())
                out = None
                if piece:
                    await response.write(
                        api.sse(api.chunk_body(self.req, self.rid, created, piece, None))
                    )
                if done:
                    break
        except EngineFailed:
            error = {"error": {"message": "generation failed", "type": "server_error"}}
            await response.write(b"event: error\n" + api.sse(error))
            return response  # no [DONE]: a truncated answer must not look complete
        end = api.chunk_body(self.req, self.rid, created, None, self.finish)
        await response.write(api.sse(end))
        if self.req.include_usage:
            await response.write(api.usage_chunk(self.req, self.rid, created, self._usage()))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _failed(exc: Exception) -> web.Response:
    if isinstance(exc, PromptTooLongError):
        return _error(400, str(exc), "invalid_request_error", "context_length_exceeded")
    return _error(503, f"generation failed: {exc}", "server_error", "engine_error")


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
        return _error(
            401, "a signed admin handle is required", "authentication_error", "missing_handle"
        )
    try:
        admin = backend.verifier.verify_admin(token, "flush")
    except TokenError as exc:
        backend.metrics.refused.labels(exc.code).inc()
        kind = "authentication_error" if exc.status == 401 else "permission_error"
        return _error(exc.status, str(exc), kind, exc.code)
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
