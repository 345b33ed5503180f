"""An upstream that answers slowly (so requests sent together are in flight together) in every
framing a server uses for its usage: a plain body with or without usage, a usage-only event, usage
on the last chunk with choices, CRLF framing, a stream without usage. Each answer with usage says
13 tokens. For the reservation tests and bench/control_plane.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
FRAMINGS = ("plain", "plain_no_usage", "sse_usage_event", "sse_usage_last_chunk", "sse_crlf",
            "sse_no_usage")  # fmt: skip


def _chunk(text: str, usage: dict[str, int] | None = None, finish: str | None = None) -> bytes:
    doc: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "smollm2",
                           "choices": [{"index": 0, "delta": {"content": text},
                                        "finish_reason": finish}]}  # fmt: skip
    if usage is not None:
        doc["usage"] = usage
    return orjson.dumps(doc)


def events(framing: str) -> bytes:
    end = b"\r\n\r\n" if framing == "sse_crlf" else b"\n\n"
    out = [_chunk("Hello"), _chunk(" there")]
    if framing == "sse_usage_last_chunk":
        out.append(_chunk("!", USAGE, "stop"))
    else:
        out.append(_chunk("!", None, "stop"))
    if framing in ("sse_usage_event", "sse_crlf"):
        out.append(orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                                 "usage": USAGE}))  # fmt: skip
    return b"".join(b"data: " + e + end for e in [*out, b"[DONE]"])


class SlowUpstream:
    """Answers after `delay_s`, so the requests of a wave are in flight together."""

    def __init__(self, framing: str, delay_s: float = 0.3) -> None:
        self.framing, self.delay_s, self.url = framing, delay_s, ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.Response()
        await request.read()
        await asyncio.sleep(self.delay_s)
        if self.framing.startswith("plain"):
            message = {"role": "assistant", "content": "Hello there!"}
            choice = {"index": 0, "finish_reason": "stop", "message": message}
            doc: dict[str, Any] = {"id": "c1", "object": "chat.completion", "model": "smollm2",
                                   "choices": [choice]}  # fmt: skip
            if self.framing == "plain":
                doc["usage"] = USAGE
            return web.json_response(doc)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(events(self.framing))
        await resp.write_eof()
        return resp

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
