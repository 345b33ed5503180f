"""The floor under any aiohttp gateway: an aiohttp server whose one handler reads the body,
posts it upstream with an aiohttp ClientSession set up as the gateway's is, reads the answer
and returns it (an event stream chunk by chunk, as it arrives). No filter, no audit: what the
two aiohttp halves cost by themselves.
Run: python -m bench.gateway.floor --upstream http://127.0.0.1:PORT (prints `PORT <n>`).
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web
from yarl import URL

SESSION = web.AppKey("floor_session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("floor_upstream", URL)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app[UPSTREAM].with_path(request.path)
    headers = {"content-type": "application/json"}
    async with request.app[SESSION].post(url, data=body, headers=headers) as upstream:
        if upstream.content_type == "text/event-stream":
            out = web.StreamResponse(
                status=upstream.status, headers={"content-type": "text/event-stream"}
            )
            try:
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionResetError:  # the client left (the load tool stopped): not news
                pass
            return out
        answer = await upstream.read()
        return web.Response(
            body=answer, status=upstream.status, headers={"content-type": upstream.content_type}
        )


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    ) as session:
        app[SESSION] = session
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    app = web.Application()
    app[UPSTREAM] = URL(args.upstream)
    app.cleanup_ctx.append(_session)
    app.router.add_post("/{tail:.*}", relay)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, access_log=None, print=None, loop=uvloop.new_event_loop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
