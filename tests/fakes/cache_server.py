"""A fake inference server with a prefix cache of its own (a real aiohttp app on port 0), for
chat, completions and Responses, plain or streamed. "Tokens" are words; a chat message renders
as its role word and its text (content parts joined by a newline, as vLLM joins them). The
first token takes `base_s` plus `token_s` per uncached prompt token (and `jitter_s` of noise),
so timing tells hits from misses as on a real server. Options make it misbehave as servers
that are not ours do:

- `honours_salt=False`: one cache for every salt (a MAX Serve started without its salt flag);
- `host="unsalted"`: a write-through host tier keyed without the salt (an offload tier that
  drops the scope), hits reported per tier in `cached_tokens_details` (as SGLang does);
- `counter`: "honest"; "zero" (always 0: a count that lies); "none" (no count); "pd" (the
  prompt less one token on every request, as vLLM's disaggregated prefill reports);
- `caching=False`: caches nothing (a hybrid / Mamba model);
- `leak_markers=True`: restores the last canary marker it saw into other answers;
- `echo=True`: answers with the prompt's last words (a model that repeats what it was told);
- `slow_s`, `down()`: a slow server, and one restarting (503s, its cache lost).

Named a fake: it stands in for the misbehaving servers a real vLLM cannot be made into here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.cache_model import PrefixCache

_MARKER = re.compile(r"kvfc[0-9a-f]{20}")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content or "")


def tokens(path: str, doc: dict[str, Any]) -> list[str]:
    """The prompt's "tokens" as this server renders them."""
    if path.endswith("/completions") and "messages" not in doc:
        prompt = doc.get("prompt")
        if isinstance(prompt, list):
            return [str(t) for t in prompt]
        return str(prompt or "").split()
    turns = doc.get("messages") if "messages" in doc else doc.get("input")
    if isinstance(turns, str):
        turns = [{"role": "user", "content": turns}]
    out = [f"<{'system'}>", *_text(doc["instructions"]).split()] if doc.get("instructions") else []
    for m in turns or []:
        out += [f"<{m.get('role')}>", *_text(m.get("content")).split()]
    return out


@dataclass
class CacheServer:
    honours_salt: bool = True
    host: str = ""
    counter: str = "honest"
    caching: bool = True
    leak_markers: bool = False
    echo: bool = False
    block: int = 16
    device_blocks: int = 4096
    base_s: float = 0.002
    token_s: float = 0.0002
    jitter_s: float = 0.0
    slow_s: float = 0.0
    seed: int = 0
    served: list[tuple[str, int]] = field(default_factory=list)  # (salt, tokens hit) per answer
    url: str = ""

    def __post_init__(self) -> None:
        self.cache = PrefixCache(self.block, self.device_blocks, self.host, enabled=self.caching)
        self._marker = ""
        self._runner: web.AppRunner | None = None
        self._down_until = 0.0
        self._rng = random.Random(self.seed)

    async def start(self) -> str:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            app.router.add_post(path, self._answer)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def down(self, seconds: float) -> None:
        """Restart: 503 for `seconds`, then an empty cache."""
        self._down_until = time.monotonic() + seconds
        self.cache.clear()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if time.monotonic() < self._down_until else 200)

    def _usage(self, prompt: int, device: int, host: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": 3,
            "total_tokens": prompt + 3,
        }
        if self.counter == "none":
            return usage
        cached = {"honest": device + host, "zero": 0, "pd": max(prompt - 1, 0)}[self.counter]
        details: dict[str, Any] = {"cached_tokens": cached}
        if self.host and self.counter == "honest":
            details["cached_tokens_details"] = {"device": device, "host": host}
        usage["prompt_tokens_details"] = details
        return usage

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if time.monotonic() < self._down_until:
            return web.json_response({"error": {"message": "restarting"}}, status=503)
        doc = orjson.loads(await request.read())
        words = tokens(request.path, doc)
        found = _MARKER.search(" ".join(words))
        text = "Hello there."
        if found:
            self._marker = found.group(0)
        elif self.leak_markers and self._marker:
            text = f"I remember {self._marker} from before."
        elif self.echo:
            text = " ".join(words[-12:])
        scope = str(doc.get("cache_salt", "")) if self.honours_salt else ""
        device, host = self.cache.lookup_and_store(scope, words)
        uncached = len(words) - device - host
        delay = self.base_s + self.token_s * uncached + self.slow_s
        if self.jitter_s:
            delay += self._rng.expovariate(1 / self.jitter_s)
        await asyncio.sleep(delay)
        self.served.append((scope, device + host))
        usage = self._usage(len(words), device, host)
        if doc.get("stream"):
            with contextlib.suppress(ConnectionResetError):  # the client gave up waiting
                return await self._stream(request, text, usage)
            return web.Response(status=499)
        return web.json_response(_plain(request.path, doc, text, usage))

    async def _stream(
        self, request: web.Request, text: str, usage: dict[str, Any]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        responses = request.path.endswith("/responses")
        # Two characters per event: a marker always arrives split over many events.
        for i in range(0, len(text), 2):
            piece = text[i : i + 2]
            if responses:
                chunk: dict[str, Any] = {"type": "response.output_text.delta", "delta": piece}
            elif request.path.endswith("/chat/completions"):
                delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [delta]}
            else:
                chunk = {
                    "id": "x",
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": piece, "finish_reason": None}],
                }
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(0)
        if responses:
            done = {
                "type": "response.completed",
                "response": {
                    "status": "completed",
                    "output_text": text,
                    "usage": _responses_usage(usage),
                },
            }
            await resp.write(b"data: " + orjson.dumps(done) + b"\n\n")
        else:
            end = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await resp.write(b"data: " + orjson.dumps(end) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    out = {
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": 3,
        "total_tokens": usage["total_tokens"],
    }
    if "prompt_tokens_details" in usage:
        out["input_tokens_details"] = usage["prompt_tokens_details"]
    return out


def _plain(path: str, doc: dict[str, Any], text: str, usage: dict[str, Any]) -> dict[str, Any]:
    if path.endswith("/responses"):
        output = [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        ]
        return {
            "id": "r",
            "object": "response",
            "status": "completed",
            "output": output,
            "usage": _responses_usage(usage),
        }
    if path.endswith("/chat/completions"):
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    return {
        "id": "x",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": doc["model"],
        "choices": [{**choice, "finish_reason": "stop"}],
        "usage": usage,
    }
