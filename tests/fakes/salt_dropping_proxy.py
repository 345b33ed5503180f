"""A careless proxy in front of an OpenAI-compatible server (a real aiohttp app on port 0): it
rewrites each request (by default: drops `cache_salt`, as a gateway that pools its customers
behind one upstream scope would), or only the requests `when` picks (by path, size, streaming:
tests/fakes/leaky_layers.py), and can strip `usage` from answers, so only timing is left, or
report every cached-token count as 0 (`zero_cached`: a count that lies).

Streams pass through event by event as they arrive, so first-token times stay the upstream's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

Request = tuple[dict[str, Any], dict[str, str]]  # (JSON body, headers)
Rewrite = Callable[[dict[str, Any], dict[str, str]], Request]  # what goes upstream instead
When = Callable[[str, dict[str, Any]], bool]  # (path, body): rewrite this request?
FORWARDED = ("authorization", "content-type")


def drop_salt(body: dict[str, Any], headers: dict[str, str]) -> Request:
    return {k: v for k, v in body.items() if k != "cache_salt"}, headers


def strip_event(event: bytes) -> bytes:
    """One SSE event without `usage`; a usage-only chunk disappears entirely."""
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        data = line.removeprefix(b"data:").strip()
        if not line.startswith(b"data:") or not data.startswith(b"{"):
            continue
        chunk = orjson.loads(data)
        if "usage" not in chunk:
            return event
        chunk.pop("usage")
        if not chunk.get("choices"):
            return b""
        lines[i] = b"data: " + orjson.dumps(chunk)
    return b"\n".join(lines)


def zero_counts(doc: Any) -> Any:
    """`doc` with every cached-token count (total and per tier) set to 0."""
    if isinstance(doc, dict):
        return {
            k: 0 if k in ("cached_tokens", "prompt_cache_hit_tokens") else zero_counts(v)
            for k, v in doc.items()
            if k != "cached_tokens_details"
        }
    if isinstance(doc, list):
        return [zero_counts(v) for v in doc]
    return doc


def zero_event(event: bytes) -> bytes:
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        data = line.removeprefix(b"data:").strip()
        if line.startswith(b"data:") and data.startswith(b"{") and b"cached" in data:
            lines[i] = b"data: " + orjson.dumps(zero_counts(orjson.loads(data)))
    return b"\n".join(lines)


class RewritingProxy:
    def __init__(
        self,
        upstream: str,
        rewrite: Rewrite = drop_salt,
        strip_usage: bool = False,
        *,
        when: When | None = None,
        zero_cached: bool = False,
    ):
        self.upstream, self.rewrite, self.strip_usage = upstream.rstrip("/"), rewrite, strip_usage
        self.when, self.zero_cached = when, zero_cached
        self.forwarded = 0
        self.rewritten = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> RewritingProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k.lower(): v for k, v in request.headers.items()}
        body = orjson.loads(await request.read())
        out_headers = {k: v for k, v in headers.items() if k in FORWARDED or k.startswith("x-")}
        if self.when is None or self.when(request.path, body):
            body, out_headers = self.rewrite(body, out_headers)
            self.rewritten += 1
        self.forwarded += 1
        url = self.upstream + request.path
        async with self._session.post(url, data=orjson.dumps(body), headers=out_headers) as up:
            kind = up.headers.get("content-type", "application/json")
            if not kind.startswith("text/event-stream"):
                doc = await up.read()
                if self.strip_usage and up.status == 200:
                    doc = orjson.dumps({k: v for k, v in orjson.loads(doc).items() if k != "usage"})
                if self.zero_cached and up.status == 200:
                    doc = orjson.dumps(zero_counts(orjson.loads(doc)))
                return web.Response(status=up.status, body=doc, content_type=kind.split(";")[0])
            resp = web.StreamResponse(status=up.status, headers={"content-type": kind})
            await resp.prepare(request)
            pending = b""
            edit = strip_event if self.strip_usage else zero_event if self.zero_cached else None
            async for data in up.content.iter_any():
                if edit is None:
                    await resp.write(data)
                    continue
                *events, pending = (pending + data).split(b"\n\n")
                out = b"".join(e + b"\n\n" for e in map(edit, events) if e)
                if out:
                    await resp.write(out)
            with contextlib.suppress(ConnectionResetError):  # the client may leave at [DONE]
                if pending:
                    await resp.write(pending)
                await resp.write_eof()
            return resp
