"""One admitted generation: reads the engine's outputs, signs the attestation, writes the
OpenAI-shaped answer (JSON or SSE).

Invariant: no response body byte is written before the attestation is signed; when streaming,
the attestation is the first SSE event, and a failed stream never ends with [DONE].
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from backend import openai_api as api
from backend.engine.engine import StepOutput
from backend.errors import BackendError, GenerationFailed, error_body
from backend.openai_api import GenerationRequest
from backend.service import Backend
from backend.textstream import TextStream
from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD, ATTESTATION_HEADER
from kvfence.capability import Namespace


class Generation:
    """One admitted request: reads engine outputs, signs the attestation, writes the answer."""

    def __init__(
        self,
        backend: Backend,
        req: GenerationRequest,
        request_id: str,
        namespace: Namespace,
        prompt: list[int],
        outputs: asyncio.Queue[StepOutput | BaseException],
    ) -> None:
        self.backend, self.req, self.request_id = backend, req, request_id
        self.namespace, self.prompt, self.outputs = namespace, prompt, outputs
        self.text = TextStream(backend.tokenizer.incremental(), req.stop)
        self.cached = 0
        self.generated = 0
        self.finish = "stop"
        self.rid = ("chatcmpl-" if req.endpoint == "chat" else "cmpl-") + uuid.uuid4().hex
        self.started = time.perf_counter()

    def _attest(self, first: StepOutput) -> str:
        self.cached = first.cached_tokens or 0
        m = self.backend.metrics
        m.ttft.observe(time.perf_counter() - self.started)
        m.prompt_tokens.inc(len(self.prompt))
        m.cached_tokens.inc(self.cached)
        used = sorted(ns.value for ns in (first.block_namespaces or frozenset()))
        runs = [(ns.value, n) for ns, n in (first.block_runs or ())]
        return self.backend.signer.sign(
            request_id=self.request_id,
            namespace=self.namespace.value,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            block_namespaces=used,
            block_runs=runs,
        )

    async def _next(self) -> StepOutput:
        """The next output; the engine's refusal (a BackendError) or failure is raised."""
        item = await self.outputs.get()
        if isinstance(item, BackendError):
            raise item
        if isinstance(item, BaseException):
            raise GenerationFailed(f"generation failed: {item}") from item
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
        first = await self._next()
        attestation = self._attest(first)
        parts, (piece, done) = [], self._take(first)
        parts.append(piece)
        while not done:
            piece, done = self._take(await self._next())
            parts.append(piece)
        body = api.completion_body(self.req, self.rid, "".join(parts), self.finish, self._usage())
        return web.Response(
            body=orjson.dumps(body),
            content_type="application/json",
            headers={ATTESTATION_HEADER: attestation},
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        first = await self._next()  # an error before the first token is a plain error answer
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        attestation = self._attest(first)
        created = int(time.time())
        # The attestation travels as a named event whose data is also a valid first chunk (the
        # assistant role, no text), so OpenAI clients that ignore event names still parse it.
        head = api.chunk_body(self.req, self.rid, created, "", None)
        if self.req.endpoint == "chat":
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
        except BackendError as exc:
            await response.write(b"event: error\ndata: " + error_body(exc) + b"\n\n")
            return response  # no [DONE]: a truncated answer must not look complete
        end = api.chunk_body(self.req, self.rid, created, None, self.finish)
        await response.write(api.sse(end))
        if self.req.include_usage:
            await response.write(api.usage_chunk(self.req, self.rid, created, self._usage()))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
