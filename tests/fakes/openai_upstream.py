"""A fake OpenAI-compatible inference server (a real aiohttp app on port 0) that records exactly
what it received and can answer, stream, die, or stall on demand."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

CACHED_TOKENS = 7
LONG = 64  # events of a `long` stream


@dataclass
class Received:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    def header_values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


def _chunk(i: int, text: str, usage: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "smollm2",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    if usage:
        out["usage"] = None
    return out


def usage_event(completion_tokens: int = 3) -> bytes:
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": completion_tokens,
        "total_tokens": 12 + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "smollm2",
        "choices": [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def sse_events(include_usage: bool) -> list[bytes]:
    """The events a stream sends, in order (each ends with a blank line)."""
    words = ["Hello", " there", "!"]
    events = [
        b"data: " + orjson.dumps(_chunk(i, w, include_usage)) + b"\n\n" for i, w in enumerate(words)
    ]
    if include_usage:
        events.append(usage_event())
    return [*events, b"data: [DONE]\n\n"]


def completion() -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "smollm2",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        },
    }


# vLLM's model cards: `smollm2` (the fixtures' model) and one no fixture tenant may use.
MODEL_CARDS: list[dict[str, Any]] = [
    {"id": "smollm2", "object": "model", "created": 1700000000, "owned_by": "vllm",
     "root": "/models/smollm2-hf", "parent": None, "max_model_len": 4096,
     "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}]},
    {"id": "not-yours", "object": "model", "created": 1700000000, "owned_by": "vllm",
     "root": "/models/not-yours", "parent": None, "max_model_len": 2048, "permission": []},
]  # fmt: skip


@dataclass
class FakeUpstream:
    """`mode`: ok | die_before | die_mid | stall_before | hold | flood (a stream of 16 MiB) |
    huge (a 2 MiB plain answer) | no_done (a stream that ends without `[DONE]`) | long (a stream
    of `LONG` one-token events, a few milliseconds apart, then its usage) | no_usage (answers,
    plain or streamed, that report no usage even when asked) | detail (404 `{"detail": "Not
    Found"}`, FastAPI's shape, as vLLM answers a path it does not serve). `split` sends each
    stream event in two writes, so the gateway sees chunks that cut events in half. `GET
    /v1/models` answers MODEL_CARDS, vLLM's way, unrecorded (as `/health`)."""

    mode: str = "ok"
    split: bool = False
    received: list[Received] = field(default_factory=list)
    health_checks: int = 0
    unhealthy: bool = False  # GET /health answers 503
    set_cookie: str = ""  # sent as Set-Cookie with every plain answer
    plain_type: str = "application/json"  # a plain answer's Content-Type
    sse_type: str = "text/event-stream"  # a stream's Content-Type
    plain_delay_s: float = 0.0  # a plain answer's headers come only after this (as vLLM's do)
    # A plain answer's body after its headers: in this many pieces, each `trickle_s` after the
    # one before (0: whole, with its headers).
    trickle: int = 0
    trickle_s: float = 0.0
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/health":
            self.health_checks += 1  # the gateway's background check: not a request to record
            return web.Response(status=503 if self.unhealthy else 200)
        if request.method == "GET" and request.path == "/v1/models":
            return web.json_response({"object": "list", "data": MODEL_CARDS})
        body = await request.read()
        self.received.append(
            Received(request.method, request.path, list(request.headers.items()), body)
        )
        if self.mode == "die_before":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if self.mode == "stall_before":
            await asyncio.sleep(3600)
        doc = orjson.loads(body) if body else {}
        if self.mode == "detail":
            return web.json_response({"detail": "Not Found"}, status=404)
        if doc.get("stream") is True:
            return await self._stream(request, doc)
        await asyncio.sleep(self.plain_delay_s)
        answer = completion()
        if self.mode == "huge":
            answer["choices"][0]["message"]["content"] = "x" * (2 << 20)
        if self.mode == "no_usage":
            del answer["usage"]
        if self.trickle:
            return await self._trickled(request, orjson.dumps(answer))
        resp = web.Response(body=orjson.dumps(answer), headers={"content-type": self.plain_type})
        if self.set_cookie:
            resp.headers["set-cookie"] = self.set_cookie
        return resp

    async def _trickled(self, request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": self.plain_type})
        await resp.prepare(request)
        step = -(-len(body) // self.trickle)
        with contextlib.suppress(ConnectionError):
            for at in range(0, len(body), step):
                await asyncio.sleep(self.trickle_s)
                await resp.write(body[at : at + step])
            await resp.write_eof()
        return resp

    async def _stream(self, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
        options = doc.get("stream_options") or {}
        resp = web.StreamResponse(headers={"content-type": self.sse_type})
        await resp.prepare(request)
        events = sse_events(bool(options.get("include_usage")) and self.mode != "no_usage")
        if self.mode == "flood":
            big = b"data: " + orjson.dumps(_chunk(0, "y" * 8000, False)) + b"\n\n"
            events = [big] * 2048 + events
        if self.mode == "no_done":
            events = events[:-1]
        if self.mode == "long":
            words = [b"data: " + orjson.dumps(_chunk(i, " w", True)) + b"\n\n" for i in range(LONG)]
            events = [*words, usage_event(LONG), b"data: [DONE]\n\n"]
        try:
            for i, event in enumerate(events):
                if self.mode == "die_mid" and i == 2:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if self.mode == "hold" and i == 1:
                    await asyncio.sleep(3600)
                if self.mode == "long":
                    await asyncio.sleep(0.002)
                if self.split:
                    await resp.write(event[:7])
                    await resp.write(event[7:])
                else:
                    await resp.write(event)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp
