"""The app's one pooled upstream session: created when the app starts, closed when it stops,
shared by every upstream call, health check and canary round of the worker.

Invariant: no cookie jar (a cookie one tenant's answer set must never ride along with another
tenant's request), no automatic decompression, no headers of its own beyond what a caller sets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

SESSION = web.AppKey("kvfence_upstream_session", aiohttp.ClientSession)


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),  # and no jar is consulted per request
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    ) as session:
        app[SESSION] = session
        yield
