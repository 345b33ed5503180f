"""A fake inference server with a prefix cache of its own (a real aiohttp app on port 0): it
scopes its cache by `cache_salt` like vLLM, or shares it (`shared=True`), and can leak the
last canary marker it saw into other requests' answers while reporting `cached_tokens: 0`
(`leak_markers=True`), as a server that restores another conversation's content would.

Named a fake: it stands in for the misbehaving servers a real vLLM cannot be made into here.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

_MARKER = re.compile(r"kvfc[0-9a-f]{20}")
BLOCK = 16  # "tokens" are words here


def _words(doc: dict[str, Any]) -> list[str]:
    messages = doc.get("messages") or []
    return " ".join(str(m.get("content", "")) for m in messages).split()


@dataclass
class CacheServer:
    shared: bool = False
    leak_markers: bool = False
    served: list[str] = field(default_factory=list)  # the text of every answer
    _cache: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)
    _marker: str = ""
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _cached(self, salt: str, words: list[str]) -> int:
        """Whole blocks of `words` this scope cached before; caches all of them now."""
        scope = "" if self.shared else salt
        hit = 0
        for end in range(BLOCK, len(words) + 1, BLOCK):
            key = (scope, tuple(words[:end]))
            if key in self._cache and hit == end - BLOCK:
                hit = end
            self._cache.add(key)
        return hit

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        doc = orjson.loads(await request.read())
        words = _words(doc)
        found = _MARKER.search(" ".join(words))
        text = "Hello there."
        if found:
            self._marker = found.group(0)
        elif self.leak_markers and self._marker:
            text = f"I remember {self._marker} from before."
        cached = self._cached(str(doc.get("cache_salt", "")), words)
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": 3,
            "total_tokens": len(words) + 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        self.served.append(text)
        if doc.get("stream"):
            return await self._stream(request, text, usage)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        body = {
            "id": "x",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": doc["model"],
            "choices": [{**choice, "finish_reason": "stop"}],
            "usage": usage,
        }
        return web.json_response(body)

    async def _stream(
        self, request: web.Request, text: str, usage: dict[str, Any]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        # Two characters per event: a marker always arrives split over many events.
        for i in range(0, len(text), 2):
            delta = {"index": 0, "delta": {"content": text[i : i + 2]}, "finish_reason": None}
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [delta]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(0)
        end = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(end) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp
