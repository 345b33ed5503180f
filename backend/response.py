"""One admitted generation: reads the engine's outputs for each of its choices, signs the
attestation, writes the OpenAI-shaped answer (JSON or SSE).

Invariant: no response body byte is written before the attestation is signed, and it is signed
only once every choice's first output (which carries the namespaces of the blocks that choice's
sequence used, and its prompt's block runs) has arrived, so it covers all of them; when
streaming, the attestation is the first SSE event, and a failed stream never ends with [DONE].
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

from backend import shapes
from backend.choice import Choice
from backend.engine.engine import StepOutput
from backend.errors import BackendError, GenerationFailed, error_body
from backend.openai_api import GenerationRequest
from backend.service import Backend
from backend.worker import Outputs
from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD, ATTESTATION_HEADER
from kvfence.capability import Namespace

Tagged = tuple[int, StepOutput]  # (choice index, output)


class Generation:
    """One admitted request: reads engine outputs, signs the attestation, writes the answer."""

    def __init__(
        self,
        backend: Backend,
        req: GenerationRequest,
        request_id: str,
        namespace: Namespace,
        prompt: list[int],
        stream_ids: tuple[int, ...],
        outputs: Outputs,
    ) -> None:
        self.backend, self.req, self.request_id = backend, req, request_id
        self.namespace, self.prompt = namespace, prompt
        self.stream_ids, self.outputs = stream_ids, outputs
        self.choices = [
            Choice(i, backend.tokenizer, backend.eos, req.stop) for i in range(len(stream_ids))
        ]
        self.cached = 0
        self.attestation = ""  # signed by _start
        self.rid = ("chatcmpl-" if req.endpoint == "chat" else "cmpl-") + uuid.uuid4().hex
        self.started = time.perf_counter()

    async def _start(self) -> list[Tagged]:
        """Reads outputs until every choice has its first one, then signs the attestation;
        returns what was read, in order, for the answer."""
        read: list[Tagged] = []
        firsts: dict[int, StepOutput] = {}
        while len(firsts) < len(self.choices):
            index, out = await self._next()
            read.append((index, out))
            firsts.setdefault(index, out)
        self.attestation = self._attest(firsts)
        return read

    def _attest(self, firsts: dict[int, StepOutput]) -> str:
        # Usage reports the prompt once; its cached tokens are those the first choice found.
        self.cached = firsts[0].cached_tokens or 0
        m = self.backend.metrics
        m.ttft.observe(time.perf_counter() - self.started)
        m.prompt_tokens.inc(len(self.prompt))
        m.cached_tokens.inc(self.cached)
        used = {ns.value for out in firsts.values() for ns in out.block_namespaces or ()}
        return self.backend.signer.sign(
            request_id=self.request_id,
            namespace=self.namespace.value,
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            block_namespaces=sorted(used),
            block_runs=_prompt_runs(firsts.values()),
        )

    async def _next(self) -> Tagged:
        """The next output; the engine's refusal (a BackendError) or failure is raised."""
        item = await self.outputs.get()
        if isinstance(item, BackendError):
            raise item
        if isinstance(item, BaseException):
            raise GenerationFailed(f"generation failed: {item}") from item
        return item

    def _take(self, index: int, out: StepOutput) -> tuple[Choice, str]:
        """Gives the output to its choice; a choice that is done frees its sequence at once."""
        choice = self.choices[index]
        if choice.done:
            return choice, ""
        piece = choice.take(out)
        self.backend.metrics.generated_tokens.inc()
        if choice.done:
            self.backend.worker.abort(self.stream_ids[index])
        return choice, piece

    @property
    def _done(self) -> bool:
        return all(c.done for c in self.choices)

    def _usage(self) -> dict[str, Any]:
        generated = sum(c.generated for c in self.choices)
        return shapes.usage(len(self.prompt), generated, self.cached)

    async def collect(self) -> web.Response:
        for index, out in await self._start():
            self._take(index, out)
        while not self._done:
            self._take(*await self._next())
        endpoint, logprobs = self.req.endpoint, self.req.logprobs
        choices = [
            shapes.choice_body(
                self.req,
                c.index,
                "".join(c.parts),
                c.finish,
                c.shaped(endpoint) if logprobs else None,
            )
            for c in self.choices
        ]
        body = shapes.completion_body(self.req, self.rid, choices, self._usage())
        return web.Response(
            body=orjson.dumps(body),
            content_type="application/json",
            headers={ATTESTATION_HEADER: self.attestation},
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        read = await self._start()  # an error before then is a plain error answer
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        # A client that left is a normal exit, not an error to log: its streams are aborted.
        with contextlib.suppress(ConnectionResetError):
            await self._relay(response, read)
        return response

    async def _relay(self, response: web.StreamResponse, read: list[Tagged]) -> None:
        created = int(time.time())
        await response.write(self._head(created))
        try:
            for index, out in read:
                await self._send(response, created, index, out)
            while not self._done:
                await self._send(response, created, *await self._next())
        except BackendError as exc:
            await response.write(b"event: error\ndata: " + error_body(exc) + b"\n\n")
            return  # no [DONE]: a truncated answer must not look complete
        if self.req.include_usage:
            await response.write(shapes.usage_chunk(self.req, self.rid, created, self._usage()))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    def _head(self, created: int) -> bytes:
        """The attestation as a named event whose data is also a valid first chunk (each
        choice's assistant role, no text), so OpenAI clients that ignore event names parse it."""
        head = shapes.chunk_body(self.req, self.rid, created, "", None)
        first = head["choices"][0]
        if self.req.endpoint == "chat":
            first["delta"] = {"role": "assistant", "content": ""}
        head["choices"] = [{**first, "index": c.index} for c in self.choices]
        head[ATTESTATION_FIELD] = self.attestation
        return f"event: {ATTESTATION_EVENT}\n".encode() + shapes.sse(head)

    async def _send(
        self, response: web.StreamResponse, created: int, index: int, out: StepOutput
    ) -> None:
        if self.choices[index].done:
            return  # outputs still in flight after a stop string
        choice, piece = self._take(index, out)
        fresh = choice.unsent()
        logprobs = choice.shaped(self.req.endpoint, fresh) if self.req.logprobs else None
        if piece or fresh.start != fresh.stop:
            chunk = shapes.chunk_body(self.req, self.rid, created, piece, None, index, logprobs)
            await response.write(shapes.sse(chunk))
        if choice.done:
            end = shapes.chunk_body(self.req, self.rid, created, None, choice.finish, index)
            await response.write(shapes.sse(end))


def _prompt_runs(firsts: Iterable[StepOutput]) -> list[tuple[str, int]]:
    """The prompt's block runs, the same for every choice since they share the prompt and its
    public segments. Choices that disagree (a bug) get none signed: the attestation then does
    not account for a public block block by block, and the gateway's check refuses it."""
    found = {out.block_runs or () for out in firsts}
    if len(found) != 1:
        return []
    return [(ns.value, n) for ns, n in found.pop()]
