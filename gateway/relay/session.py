"""The app's upstream clients, created when the app starts and closed when it stops: the relay's
own (`gateway.relay.client`) for every forwarded request, and one pooled aiohttp session shared
by the health checks, canary rounds and model lists of the worker.

Invariant: neither keeps cookies (a cookie one tenant's answer set must never ride along with
another tenant's request), decompresses, or sends headers of its own beyond what a caller sets
(and the request's length and Host).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from gateway.relay.client import UpstreamClient

SESSION = web.AppKey("kvfence_upstream_session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("kvfence_upstream_client", UpstreamClient)


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),  # and no jar is consulted per request
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    ) as session:
        app[SESSION] = session
        app[UPSTREAM] = client = UpstreamClient()
        try:
            yield
        finally:
            client.close()
